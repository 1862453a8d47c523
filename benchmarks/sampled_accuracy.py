"""Accuracy of sampled training (issue #26): the mini-batch engine with the default fanouts against the same engine
with every neighbour (``--fanouts=-1,-1``), GCN and GAT, on Amazon Computers, with the in-memory full-graph engine
as the reference.

    .venv/bin/python benchmarks/sampled_accuracy.py
    .venv/bin/python benchmarks/sampled_accuracy.py --models gcn --seeds 0 --epochs 5 --no-save
    .venv/bin/python benchmarks/sampled_accuracy.py --root /data/datasets --no-inmemory --no-graph-norm

The acceptance point: "Sampled GCN with default fanouts within 2 points of full-neighbour sampled GCN on Amazon
Computers (median of 3 seeds, 30 epochs, batch 64), and the same for GAT".

The graph is ``<root>/gnn-benchmark/amazon_electronics_computers.npz`` (``--root``, default ``../shared/datasets``
from the repository root; when the file is missing the script says so and exits 0 without running anything), with
gnnscale's npz split: 20 training and 30 validation vertices per class, the rest for testing, drawn with the
seed, so each ``--seeds`` value is another split as well as another initialisation and other samples.

Per ``--models`` value (default ``gcn,gat``) and seed (default ``0,1,2``) one subprocess per configuration, run
one after another (never two at once), every one with ``OMP_NUM_THREADS=--omp-threads`` (default 1)::

    python -m gnnscale train --dataset npz:FILE --model M --epochs 30 --seed S --device D --metrics F --quiet \\
        --engine minibatch --batch-size 64                                  # default fanouts (15,10), sampled norm
        --engine minibatch --batch-size 64 --fanouts=-1,-1                  # every neighbour, sampled norm
        --engine minibatch --batch-size 64 --sample-norm graph              # GCN only: the whole graph's degrees
        --engine minibatch --batch-size 64 --fanouts=-1,-1 --sample-norm graph
        --engine inmemory                                                   # full-graph reference

(``--no-graph-norm`` and ``--no-inmemory`` leave the last three out.) Evaluation is gnnscale's default for the
mini-batch engine: exact layer-wise full-neighbour inference over the whole graph after every epoch, so every
configuration is judged on the same split in the same way; only training is sampled.

From each run's ``--metrics`` file: the test accuracy at the best validation epoch (``test_acc_at_best_val``, the
figure the CLI prints first; the first epoch of best validation accuracy on ties), the final test accuracy, the
best epoch, every epoch's loss / validation / test accuracy, and the median ``epoch_time_s`` (training only,
without the evaluation) and the process's wall time. One JSON line per run (``"kind": "run"``) and one per
(model, fanouts, norm) group (``"kind": "summary"``: medians over the seeds and, for the default-fanout groups, the
difference to the every-neighbour group of the same model and norm in points) are appended to ``--out`` (default
benchmarks/results/sampled_accuracy.jsonl), with the environment (date, device, torch/PyG versions, git revision
of the code measured and whether ``gnnscale/`` had uncommitted changes, command, ``OMP_*`` variables).

The printed table has per group the median over the seeds of both accuracies (in %), the per-seed values, the
median epoch time, and for default fanouts ``default - all`` in points with PASS when ``|default - all| <=
--bound`` (2 points) for the test accuracy at best validation (the acceptance's figure). The final-accuracy
difference is shown beside it, not judged. Epoch times on a shared 2-core machine are indicative only.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

try:  # run as a script (its folder is on sys.path) or imported as benchmarks.sampled_accuracy
    from offload import append_records, environment
except ImportError:  # pragma: no cover
    from benchmarks.offload import append_records, environment

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_ROOT = ROOT.parent / "shared" / "datasets"
AMAZON = Path("gnn-benchmark") / "amazon_electronics_computers.npz"
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "sampled_accuracy.jsonl"
BOUND_POINTS = 2.0
"""default-fanout sampled training must be within this many points of full-neighbour sampled training."""


def _list(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def configurations(model: str, graph_norm: bool, inmemory: bool) -> list[dict[str, Any]]:
    """The runs of one (model, seed): engine, fanouts label, norm label and the extra CLI flags."""
    cfgs = [{"engine": "minibatch", "fanouts": "default", "norm": "sampled", "flags": []},
            {"engine": "minibatch", "fanouts": "all", "norm": "sampled", "flags": ["--fanouts=-1,-1"]}]
    if graph_norm and model == "gcn":
        cfgs += [{"engine": "minibatch", "fanouts": "default", "norm": "graph", "flags": ["--sample-norm", "graph"]},
                 {"engine": "minibatch", "fanouts": "all", "norm": "graph",
                  "flags": ["--fanouts=-1,-1", "--sample-norm", "graph"]}]
    if inmemory:
        cfgs.append({"engine": "inmemory", "fanouts": "-", "norm": "-", "flags": []})
    return cfgs


def command(args: argparse.Namespace, spec: str, model: str, seed: int, cfg: dict[str, Any],
            metrics: Path) -> list[str]:
    """The ``gnnscale train`` command of one run."""
    cmd = [sys.executable, "-m", "gnnscale", "train", "--dataset", spec, "--model", model,
           "--epochs", str(args.epochs), "--seed", str(seed), "--device", args.device,
           "--engine", cfg["engine"], "--metrics", str(metrics), "--quiet"]
    if args.lr is not None:
        cmd += ["--lr", str(args.lr)]
    if cfg["engine"] == "minibatch":
        cmd += ["--batch-size", str(args.batch_size), *cfg["flags"]]
    return cmd


def run_one(cmd: list[str], env: dict[str, str], metrics: Path, timeout: float) -> dict[str, Any]:
    """Run one training; its figures, or why it failed."""
    metrics.unlink(missing_ok=True)
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout:.0f} s", "wall_s": time.perf_counter() - t0}
    wall = time.perf_counter() - t0
    out: dict[str, Any] = {"returncode": p.returncode, "wall_s": wall, "stdout": p.stdout[-1500:]}
    if p.returncode != 0 or not metrics.exists():
        return {**out, "ok": False, "error": f"exit status {p.returncode}", "stderr_tail": p.stderr[-3000:]}
    recs = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    epochs = [r for r in recs if not r.get("summary")]
    summary: dict[str, Any] | None = next((r for r in recs if r.get("summary")), None)
    if summary is None or not epochs:
        return {**out, "ok": False, "error": "no summary record", "stderr_tail": p.stderr[-3000:]}
    return {**out, "ok": True,
            "test_acc_at_best_val": summary["test_acc_at_best_val"], "final_test_acc": summary["final_test_acc"],
            "best_val_acc": summary["best_val_acc"], "best_by": summary["best_by"],
            "best_epoch": summary["best_epoch"], "engine_detail": summary.get("engine_detail"),
            "median_epoch_s": statistics.median(r["epoch_time_s"] for r in epochs),
            "mean_epoch_s": summary.get("timings", {}).get("epoch_s"),
            "total_time_s": summary.get("total_time_s"), "ready_s": summary.get("timings", {}).get("ready_s"),
            "losses": [r["loss"] for r in epochs], "val_accs": [r["val_acc"] for r in epochs],
            "test_accs": [r["test_acc"] for r in epochs], "epoch_times": [r["epoch_time_s"] for r in epochs],
            "sampled_edges": [r.get("sampled_edges") for r in epochs][-1], "batches": epochs[-1].get("batches"),
            "config": summary.get("config")}


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.2f}"


def _git(*cmd: str) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(ROOT), *cmd], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def summarise(runs: list[dict[str, Any]], bound: float) -> list[dict[str, Any]]:
    """One record per (model, engine, fanouts, norm): medians over the seeds, and default - all in points."""
    groups: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["model"], r["engine"], r["fanouts"], r["norm"]), []).append(r)
    out = []
    for (model, engine, fanouts, norm), rs in groups.items():
        ok = [r for r in rs if r["ok"]]
        s: dict[str, Any] = {"kind": "summary", "model": model, "engine": engine, "fanouts": fanouts, "norm": norm,
                             "seeds": [r["seed"] for r in ok], "failed_seeds": [r["seed"] for r in rs if not r["ok"]]}
        for k in ("test_acc_at_best_val", "final_test_acc", "median_epoch_s"):
            s[f"per_seed_{k}"] = [r[k] for r in ok]
            s[f"median_{k}"] = statistics.median(r[k] for r in ok) if ok else None
        out.append(s)
    by_key = {(s["model"], s["engine"], s["fanouts"], s["norm"]): s for s in out}
    for s in out:
        ref = by_key.get((s["model"], "minibatch", "all", s["norm"]))
        if s["fanouts"] != "default" or ref is None:
            continue
        complete = not s["failed_seeds"] and not ref["failed_seeds"] and s["seeds"] and ref["seeds"]
        for k in ("test_acc_at_best_val", "final_test_acc"):
            a, b = s[f"median_{k}"], ref[f"median_{k}"]
            s[f"diff_points_{k}"] = None if a is None or b is None else 100 * (a - b)
        d = s["diff_points_test_acc_at_best_val"]
        s["bound_points"] = bound
        s["within_bound"] = bool(complete and d is not None and abs(d) <= bound)
    return out


def print_table(summary: list[dict[str, Any]]) -> None:
    """The summary as a Markdown table (accuracies in %, differences in points)."""
    print("\n| model | engine | fanouts | GCN norm | test acc at best val, median (seeds) | final test acc, median "
          "(seeds) | median epoch s | default - all, best val (pts) | within 2 | default - all, final (pts) |")
    print("|---|---|---|---|---|---|---:|---:|---|---:|")
    def seeds(s: dict[str, Any], k: str) -> str:
        return ", ".join(_pct(v) for v in s[f"per_seed_{k}"])

    for s in summary:
        d, f = s.get("diff_points_test_acc_at_best_val"), s.get("diff_points_final_test_acc")
        verdict = "-" if "within_bound" not in s else ("PASS" if s["within_bound"] else "FAIL")
        fail = f" (failed seeds {s['failed_seeds']})" if s["failed_seeds"] else ""
        print(f"| {s['model']} | {s['engine']} | {s['fanouts']} | {s['norm']} | "
              f"**{_pct(s['median_test_acc_at_best_val'])}** ({seeds(s, 'test_acc_at_best_val')}){fail} | "
              f"{_pct(s['median_final_test_acc'])} ({seeds(s, 'final_test_acc')}) | "
              f"{'-' if s['median_median_epoch_s'] is None else format(s['median_median_epoch_s'], '.3f')} | "
              f"{'-' if d is None else format(d, '+.2f')} | {verdict} | {'-' if f is None else format(f, '+.2f')} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=DEFAULT_ROOT,
                    help=f"datasets folder holding {AMAZON} (default {DEFAULT_ROOT})")
    ap.add_argument("--models", default="gcn,gat", help="comma-separated models (default gcn,gat)")
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, help="the children's --lr, every run alike (default: gnnscale's, 0.01)")
    ap.add_argument("--device", default="auto", help="the children's --device (default auto)")
    ap.add_argument("--omp-threads", type=int, default=1, help="OMP_NUM_THREADS of every run (default 1)")
    ap.add_argument("--no-graph-norm", action="store_true", help="leave out the GCN --sample-norm graph runs")
    ap.add_argument("--no-inmemory", action="store_true", help="leave out the in-memory full-graph reference")
    ap.add_argument("--bound", type=float, default=BOUND_POINTS, help="points default - all may differ (2)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds one run may take (default 1800)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON Lines file to append to")
    ap.add_argument("--no-save", action="store_true", help="print the table only")
    args = ap.parse_args(argv)

    npz = args.root / AMAZON
    if not npz.exists():
        print(f"skipped: {npz} is missing (Amazon Computers, the gnn-benchmark npz); pass --root DIR holding "
              f"{AMAZON}")
        return 0
    spec = f"npz:{npz.resolve()}"
    torch.set_num_threads(args.omp_threads)  # so the environment reports the children's thread count
    env_rec = environment(torch.device("cpu") if args.device in ("auto", "cpu") else torch.device(args.device))
    env_rec["code_rev"] = _git("rev-parse", "--short", "HEAD")
    env_rec["gnnscale_dirty"] = bool(_git("status", "--short", "gnnscale"))
    child_env = {**os.environ, "OMP_NUM_THREADS": str(args.omp_threads), "PYTHONPATH": str(ROOT)}
    print(f"gnnscale {env_rec['code_rev']}{' (gnnscale/ has uncommitted changes)' if env_rec['gnnscale_dirty'] else ''}"
          f", torch {torch.__version__}, {env_rec['device_name']}")

    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gnnscale-sampled-acc-") as tmp:
        for seed in (int(s) for s in _list(args.seeds)):
            for model in _list(args.models):
                for cfg in configurations(model, not args.no_graph_norm, not args.no_inmemory):
                    metrics = Path(tmp) / "metrics.jsonl"
                    cmd = command(args, spec, model, seed, cfg, metrics)
                    res = run_one(cmd, child_env, metrics, args.timeout)
                    rec = {"kind": "run", "model": model, "seed": seed, "engine": cfg["engine"],
                           "fanouts": cfg["fanouts"], "norm": cfg["norm"], "epochs": args.epochs, "lr": args.lr,
                           "batch_size": args.batch_size if cfg["engine"] == "minibatch" else None,
                           "dataset": spec, "run_command": shlex.join(cmd), **res, **env_rec}
                    runs.append(rec)
                    what = f"{model} seed {seed} {cfg['engine']} fanouts {cfg['fanouts']} norm {cfg['norm']}"
                    if res["ok"]:
                        print(f"{what}: test acc {_pct(res['test_acc_at_best_val'])} at best val "
                              f"{_pct(res['best_val_acc'])} (epoch {res['best_epoch']}), final "
                              f"{_pct(res['final_test_acc'])}; epoch {res['median_epoch_s']:.3f} s, "
                              f"wall {res['wall_s']:.1f} s", flush=True)
                    else:
                        print(f"{what}: FAILED ({res['error']}): {res.get('stderr_tail', '')[-500:]}", flush=True)

    summary = summarise(runs, args.bound)
    print_table(summary)
    print(f"\n{len(runs)} runs, {sum(r['wall_s'] for r in runs):.0f} s; dataset {spec}")
    if not args.no_save:
        append_records(args.out, runs + [{**s, **env_rec} for s in summary])
    failed = any(not r["ok"] for r in runs)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
