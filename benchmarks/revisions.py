"""Epoch times of two git revisions of gnnscale, interleaved on one machine (issue #27, the refactoring's bound).

Issue #27: the refactoring keeps in-memory, offload and mini-batch epoch times within 5% of before.

    python -m benchmarks revisions                                   # db8e33a against HEAD, 5 rounds
    python -m benchmarks revisions --base db8e33a --head 1a2b3c4 --rounds 5 --epochs 6 \\
        --engines inmemory,offload,minibatch --dataset csbm:nodes=50000,avg_degree=10,features=100
    python -m benchmarks revisions --quick            # 1 round, in-memory and offload, 5K vertices, 2 epochs

Each (engine, side) is a case: ``--base`` (default db8e33a, the last commit before the refactoring) and ``--head``
(default HEAD) are the ``rev`` of their cases, so the harness checks each out as a clean detached worktree (the
working tree and its uncommitted changes are neither used nor touched) and removes it at the end. The two cases of
an engine are one group: base then head in even rounds, head then base in odd ones, so load from other processes
falls on both alike.

A case runs ``python -m gnnscale train ... --device cpu --quiet --metrics FILE`` with the harness's interpreter
(``--python``) and ``PYTHONPATH=<worktree>`` first, in a neutral folder so ``python -m`` cannot pick up the current
directory's package; it first checks (once per worktree) that a child with that path imports ``gnnscale`` from
inside the worktree, and fails otherwise. ``GNNSCALE_CACHE_DIR`` is a folder of each worktree's own (the revisions
never read each other's partition plans); ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` are the harness's ``--threads``
(default 1). One model for both: GCN, 2 layers, hidden 64, seed 0, on ``--dataset``; per engine:

* ``inmemory``: the whole graph, one step per epoch;
* ``offload``: ``--chunks 4`` (one partition in 4 chunks, whatever the planner would pick);
* ``minibatch``: ``--batch-size 1024``, the default fanouts.

Each run trains ``--epochs`` epochs; ``epoch_time_s`` of the metrics lines (the training epoch, evaluation not
included) is read, the first epoch dropped as warm-up. One record per run (``"record": "run"``; a run that fails
is recorded with its error and the others go on). The table, computed from the run records of one session: per
engine the median over all timed epochs of all rounds for base and head, the ratio head/base (< 1: head is
faster), the range of the per-round ratios (medians of the two runs of one round: how much the machine moved the
figure) and the verdict against ``--bound`` (default 0.05): ``yes`` when head/base <= 1 + bound (``yes (faster)``
below 1 - bound), ``**no**`` above; an engine without a timed epoch on one side is reported as failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import Case, Row, split_list
from benchmarks.harness.machine import RevisionError, host_cpu
from benchmarks.harness.records import fmt, provenance, session_of, table

TITLE = "Refactoring (issue #27): epoch times before and after"
ROUNDS = 5
DEFAULT_BASE = "db8e33a"  # the last commit before the refactoring of issue #27
DEFAULT_DATASET = "csbm:nodes=50000,avg_degree=10,features=100"  # epochs of 0.2-0.8 s on the 2-core CPU machine
QUICK_DATASET = "csbm:nodes=5000,avg_degree=10,features=32"
ENGINES = ("inmemory", "offload", "minibatch")
SIDES = ("base", "head")
MODEL_ARGS = ("--model", "gcn", "--layers", "2", "--hidden", "64", "--seed", "0")
ENGINE_ARGS: dict[str, tuple[str, ...]] = {
    "inmemory": (),
    "offload": ("--chunks", "4"),
    "minibatch": ("--batch-size", "1024"),
}
_CHECK = ("import json, gnnscale, torch; print(json.dumps({'file': gnnscale.__file__, 'torch': torch.__version__, "
          "'threads': torch.get_num_threads()}))")


# ------------------------------------------------------------------------------------------------ cases
def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--base", default=DEFAULT_BASE, metavar="REV",
                    help=f"the reference revision (default {DEFAULT_BASE})")
    ap.add_argument("--head", default="HEAD", metavar="REV", help="the revision measured against it (default HEAD)")
    ap.add_argument("--engines", default=",".join(ENGINES),
                    help=f"comma list of {','.join(ENGINES)} (default all; --quick: inmemory,offload)")
    ap.add_argument("--dataset", default=DEFAULT_DATASET, metavar="SPEC",
                    help=f"default {DEFAULT_DATASET} (--quick: {QUICK_DATASET})")
    ap.add_argument("--epochs", type=int, default=6, help="epochs per run, the first dropped (default 6; --quick 2)")
    ap.add_argument("--bound", type=float, default=0.05, help="allowed slow-down head/base - 1 (default 0.05)")
    ap.add_argument("--timeout", type=float, default=900.0, metavar="S", help="seconds per run (default 900)")
    ap.add_argument("--python", default=sys.executable, help="interpreter of the runs (default: the harness's)")


def cases(args: argparse.Namespace) -> list[Case]:
    engines = split_list("inmemory,offload" if args.quick and args.engines == ",".join(ENGINES) else args.engines)
    unknown = [e for e in engines if e not in ENGINES]
    if unknown or not engines:
        raise SystemExit(f"error: --engines: {','.join(unknown) or '(none)'}: choose from {','.join(ENGINES)}")
    if args.epochs < 2 or not args.bound > 0:
        raise SystemExit("error: --epochs must be >= 2 (the first epoch is dropped) and --bound > 0")
    quick = args.quick
    dataset = QUICK_DATASET if quick and args.dataset == DEFAULT_DATASET else args.dataset
    epochs = 2 if quick and args.epochs == 6 else args.epochs
    revs = {"base": args.base, "head": args.head}
    return [Case(f"{engine} {side}", {"engine": engine, "side": side, "rev_name": revs[side], "dataset": dataset,
                                      "epochs": epochs, "bound": args.bound, "python": args.python,
                                      "timeout": args.timeout},
                 group=engine, rev=revs[side], timeout=args.timeout + 300) for engine in engines for side in SIDES]


# ------------------------------------------------------------------------------------------------ one run
def train_command(python: str, dataset: str, engine: str, epochs: int, metrics: Path) -> list[str]:
    """The child's command line (flags that exist in db8e33a's CLI and after it)."""
    return [python, "-m", "gnnscale", "train", "--dataset", dataset, *MODEL_ARGS, "--engine", engine,
            *ENGINE_ARGS[engine], "--epochs", str(epochs), "--device", "cpu", "--quiet", "--metrics", str(metrics)]


def child_env(worktree: Path, cache: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default os.environ, whose thread counts the harness set) with the worktree first on PYTHONPATH
    and a cache folder."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join([str(worktree), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    env["GNNSCALE_CACHE_DIR"] = str(cache)
    env.pop("GNNSCALE_DEVICE", None)  # --device cpu either way; HEAD's runtime would otherwise read it
    return env


def read_epoch_times(path: Path) -> list[float]:
    """``epoch_time_s`` of every epoch line of a metrics file, in order (the summary line has none)."""
    times = []
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                if not rec.get("summary") and rec.get("epoch_time_s") is not None:
                    times.append(float(rec["epoch_time_s"]))
    return times


def _tail(text: str, lines: int = 3) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:]) or "(no output)"


def check_revision(python: str, worktree: Path, cwd: Path, env: dict[str, str]) -> dict[str, Any]:
    """What a child of this revision imports: ``{"file", "torch", "threads"}`` (cached in the worktree);
    RevisionError when gnnscale does not import, or imports from outside ``worktree``."""
    cached = worktree / ".bench-import-check.json"
    if cached.exists():
        return json.loads(cached.read_text())
    p = subprocess.run([python, "-c", _CHECK], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise RevisionError(f"gnnscale does not import: {_tail(p.stderr or p.stdout)}")
    info = json.loads(p.stdout.strip().splitlines()[-1])
    if not Path(info["file"]).resolve().is_relative_to(worktree.resolve()):
        raise RevisionError(f"a child with PYTHONPATH={worktree} imports gnnscale from {info['file']}, not from the "
                            "worktree: its timings would be of the wrong code")
    cached.write_text(json.dumps(info))
    return info


def train(cmd: list[str], cwd: Path, env: dict[str, str], metrics: Path, timeout: float) -> list[float]:
    """One training run's epoch times; RuntimeError (non-zero exit, timeout, fewer than 2 epochs) otherwise."""
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"timed out after {timeout:.0f} s") from None
    if p.returncode != 0:
        raise RuntimeError(f"exit {p.returncode}: {_tail(p.stderr or p.stdout)}")
    times = read_epoch_times(metrics)
    if len(times) < 2:
        raise RuntimeError(f"{len(times)} epoch records in the metrics")
    return times


def run(params: dict[str, Any]) -> dict[str, Any]:
    """One training run of ``params["engine"]`` at the worktree ``params["_src"]``: its epoch times."""
    src = Path(params["_src"])
    rev = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True,
                         check=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="bench-revisions-") as tmp:
        env = child_env(src, src / ".bench-cache")
        info = check_revision(params["python"], src, Path(tmp), env)
        metrics = Path(tmp) / "metrics.jsonl"
        cmd = train_command(params["python"], params["dataset"], params["engine"], params["epochs"], metrics)
        times = train(cmd, Path(tmp), env, metrics, params["timeout"])
    return {"record": "run", "engine": params["engine"], "side": params["side"], "rev": rev,
            "rev_name": params["rev_name"], "dataset": params["dataset"], "epochs": params["epochs"],
            "bound": params["bound"], "train_args": cmd[3:-2], "epoch_times_s": times, "timed_s": times[1:],
            "median_s": statistics.median(times[1:]), "torch": info["torch"], "device": "cpu",
            "device_name": f"{host_cpu()[:-1]}, {info['threads']} threads)", "gnnscale_file": info["file"]}


def describe(r: dict[str, Any]) -> str:
    return f"{r['engine']} {r['side']} ({r['rev'][:12]}): median {r['median_s']:.3f} s of {len(r['timed_s'])}"


# ------------------------------------------------------------------------------------------------ summary
def verdict(ratio: float, bound: float) -> str:
    if ratio > 1 + bound:
        return "**no**"
    return "yes (faster)" if ratio < 1 - bound else "yes"


def summarise(runs: Sequence[dict[str, Any]], engines: Sequence[str], bound: float) -> list[dict[str, Any]]:
    """Per engine, from run records (``engine``, ``side``, ``round``, ``ok``, ``timed_s``, ``error``): the median of
    all timed epochs per side, head/base, the per-round ratios and the verdict (``None`` and ``failed`` when a side
    has no timed epoch)."""
    out = []
    for engine in engines:
        mine = [r for r in runs if r["engine"] == engine]
        s: dict[str, Any] = {"engine": engine, "bound": bound}
        for side in SIDES:
            ok = [r for r in mine if r["side"] == side and r["ok"]]
            pooled = [t for r in ok for t in r["timed_s"]]
            s[f"{side}_median_s"] = statistics.median(pooled) if pooled else None
            s[f"{side}_epochs"] = len(pooled)
            s[f"{side}_runs_ok"] = len(ok)
            s[f"{side}_runs"] = sum(r["side"] == side for r in mine)
            s[f"{side}_errors"] = sorted({r["error"] for r in mine if r["side"] == side and not r["ok"]})
        per_round = []
        for rnd in sorted({r["round"] for r in mine}):
            med = {r["side"]: statistics.median(r["timed_s"]) for r in mine if r["round"] == rnd and r["ok"]}
            if len(med) == 2:
                per_round.append(med["head"] / med["base"])
        s["round_ratios"] = per_round
        if s["base_median_s"] and s["head_median_s"]:
            s["ratio"] = s["head_median_s"] / s["base_median_s"]
            s["within_bound"] = s["ratio"] <= 1 + bound
            s["verdict"] = verdict(s["ratio"], bound)
        else:
            s["ratio"], s["within_bound"] = None, None
            failed = [side for side in SIDES if not s[f"{side}_median_s"]]
            s["verdict"] = f"failed ({' and '.join(failed)})"
        out.append(s)
    return out


def format_table(summaries: Sequence[dict[str, Any]], bound: float) -> str:
    rows = []
    for s in summaries:
        rr = s["round_ratios"]
        rows.append([s["engine"], fmt(s["base_median_s"]), fmt(s["head_median_s"]), fmt(s["ratio"]),
                     f"{min(rr):.3f}-{max(rr):.3f}" if rr else "-", s["verdict"],
                     f"{s['base_runs_ok']}/{s['base_runs']}, {s['head_runs_ok']}/{s['head_runs']}"])
    return table(["engine", "base median (s)", "head median (s)", "head/base", "per-round head/base",
                  f"within {bound:.0%}", "runs ok (base, head)"], rows)


def sessions(records: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The run records (``"record": "run"``, or a failed case's) grouped by session, in order."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        if r.get("record", "run") == "run" and r.get("engine") in ENGINES and r.get("side") in SIDES:
            out.setdefault(session_of(r), []).append(r)
    return list(out.values())


def _revisions(runs: Sequence[dict[str, Any]]) -> dict[str, str]:
    """``{side: "name (hash)"}`` from the records (the old ones carry ``revisions``, the new ``rev_name``)."""
    out = {}
    for side in SIDES:
        mine = [r for r in runs if r["side"] == side]
        r = next((r for r in mine if r.get("rev") or r.get("revisions")), mine[0] if mine else None)
        if r is None:
            continue
        old = (r.get("revisions") or {}).get(side, {})
        name, sha = r.get("rev_name") or old.get("rev"), r.get("rev") or old.get("hash")
        out[side] = f"{name} ({str(sha)[:12]})" if sha else str(name)
    return out


def summary(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    engines = [e for e in ENGINES if any(r["engine"] == e for r in runs)]
    return summarise([{**r, "ok": r.get("ok", True), "timed_s": r.get("timed_s") or []} for r in runs], engines,
                     float(runs[0].get("bound") or 0.05))


def render(records: list[dict[str, Any]]) -> str:
    parts = [provenance([r for s in sessions(records) for r in s]),
             "One table per session, oldest first: medians over all timed epochs (first epoch of each run dropped) "
             "of all rounds, head/base, the range of the per-round ratios and the verdict against the bound."]
    for runs in sessions(records):
        revs, r0 = _revisions(runs), runs[0]
        rounds = len({r["round"] for r in runs})
        parts.append(f"Base {revs.get('base', '-')} against head {revs.get('head', '-')}: `{r0.get('dataset')}`, "
                     f"{rounds} round(s) x {int(r0.get('epochs') or 0) - 1} timed epochs, {r0.get('device_name')}, "
                     f"{str(r0.get('date'))[:10]}:\n\n"
                     f"{format_table(summary(runs), float(r0.get('bound') or 0.05))}")
    return "\n\n".join(parts) + "\n"


def headline(records: list[dict[str, Any]]) -> list[Row]:
    """Head/base per engine and verdict of the latest session."""
    runs = (sessions(records) or [[]])[-1]
    if not runs:
        return []
    figure = "; ".join(f"{s['engine']} {fmt(s['ratio'])} ({s['verdict']})" for s in summary(runs))
    revs = _revisions(runs)
    # records written before the harness name no gnnscale_rev: the commits they measured stand in
    recs = tuple(r if r.get("gnnscale_rev") or not r.get("rev") else {**r, "gnnscale_rev": r["rev"][:12]}
                 for r in runs)
    return [Row("refactoring: in-memory/offload/minibatch epoch time head/base",
                f"{figure}: head {revs.get('head', '-')} against base {revs.get('base', '-')}", recs)]
