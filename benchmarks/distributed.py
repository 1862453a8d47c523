"""The distributed engine (HopGNN): model-centric (DistDGL) against micrograph training, remote feature bytes,
local hit rate, epoch time and accuracy, per dataset and rank count, with the single-process mini-batch engine as
the reference.

    .venv/bin/python benchmarks/distributed.py
    .venv/bin/python benchmarks/distributed.py --dry-run
    .venv/bin/python benchmarks/distributed.py --ranks 2 --epochs 5 \\
        --datasets 'edgelist:../shared/datasets/snap/web-cnr-2000.txt.gz:symmetrize=1'
    .venv/bin/python benchmarks/distributed.py --ranks 2,3,4 --batch-size 512 --datasets csbm:nodes=100000
    .venv/bin/python benchmarks/distributed.py --merge off

Per dataset (``--datasets``, ';'-separated specs; default Amazon Computers, the gnn-benchmark npz with its
standard 20-per-class split, and web-cnr-2000 symmetrised, whose features and labels the edge-list reader
synthesises: accuracy there is chance, about 1/16) and per rank count (``--ranks``, default ``2,4``), one run of
each, by subprocess, the same ``--epochs`` (default 3), ``--seed`` (0), ``--model`` (sage) and ``--batch-size``
(per rank; gnnscale's default unless given)::

    python -m gnnscale train --engine distributed --ranks R --strategy model-centric --metrics FILE --quiet ...
    python -m gnnscale train --engine distributed --ranks R --strategy micrograph --metrics FILE --quiet ...
    python -m gnnscale train --engine minibatch --batch-size R*B --metrics FILE --quiet ...

The micrograph run keeps the engine's defaults unless ``--pregather``/``--merge`` say otherwise (``--pregather on
--merge auto``: epoch 1 is warm-up, epoch 2 the baseline, then one time step more is merged each epoch while
epochs get at least 5% faster; at ``R`` = 2 one merge leaves one time step, in which every model trains all its
roots where it is: model-centric's traffic).
The mini-batch run trains the same global batches on one process
(``R x B`` seeds per step; the distributed engine's iteration equals its step, so its losses are the reference).
Every child gets ``OMP_NUM_THREADS=--omp-threads`` (default 1: R ranks share the machine's cores) and
``--device cpu`` unless ``--device`` says otherwise; partition plans go to a temporary ``GNNSCALE_CACHE_DIR`` (the
first strategy partitions with METIS, the second reuses the plan; neither is in the epoch time).

Reported per (dataset, R), from rank 0's ``--metrics`` records (counters summed over ranks):

* the headline: total network bytes per epoch (``network_bytes``: every byte the ranks received in training, as
  the comm layer counted it -- feature rows and their id requests, model migrations, gradient all-reduces) of
  each strategy and their ratio micrograph / model-centric;
* beside it, remote feature bytes per epoch (``remote_bytes``, the mean over epochs) of each strategy and their ratio
  micrograph / model-centric (the issue's bound: <= 0.4); the miss rate ``1 - local_hit_rate`` (input rows
  fetched from other ranks, pooled over the epochs; model-centric should be about ``1 - 1/R``, micrograph much
  lower on METIS parts); the ratio per epoch too (merging raises it from epoch 3 on); micrograph's migration
  bytes per epoch and time steps per iteration (per epoch: merging lowers them);
* the median epoch time (``epoch_time_s``: training only, no evaluation) of each, their ratio, and each against
  the mini-batch engine's; the final test accuracy of each and micrograph - model-centric in points (the issue's
  bound: within 0.5), and the largest per-epoch loss difference between the three (they compute the same steps);
* per rank the feature bytes it holds (``rank_feature_bytes``) against the whole matrix (``N x F x 4`` bytes,
  from the dataset loaded here): the largest share times R (1.00: exactly 1/R), the largest fetched-row cache
  (``rank_cache_peak_bytes``) and the resident memory at the last epoch's end (``rank_rss_bytes``; every rank
  parses the whole input file and keeps the whole topology, so RSS is far above the feature share).

A run that fails is recorded with its command, exit status and the end of its stderr, and the others go on (the
exit status is then 1). One JSON line per (dataset, R) is appended to ``--out`` (default
benchmarks/results/distributed.jsonl) with the environment.
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
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch

try:
    from offload import append_records, environment
except ImportError:  # run as a module
    from benchmarks.offload import append_records, environment

from gnnscale.config import TrainConfig
from gnnscale.errors import GnnscaleError
from gnnscale.graph.datasets import load_dataset

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "datasets"
AMAZON = SHARED / "gnn-benchmark" / "amazon_electronics_computers.npz"
WEB_CNR = SHARED / "snap" / "web-cnr-2000.txt.gz"
DEFAULT_DATASETS = f"npz:{AMAZON};edgelist:{WEB_CNR}:symmetrize=1"
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "distributed.jsonl"
STRATEGIES = ("model-centric", "micrograph")
REMOTE_BOUND = 0.4
"""micrograph / model-centric bytes must be at most this (the issue's bound; checked on the total network bytes)."""
DEFAULT_BATCH = next(int(f.default) for f in fields(TrainConfig) if f.name == "batch_size")  # type: ignore[call-overload]
"""gnnscale's default --batch-size (the distributed runs' per-rank batch when --batch-size is not given)."""
ACC_POINTS = 0.5
"""micrograph's final test accuracy must be within this many points of model-centric's (the issue's bound)."""


def _ints(text: str) -> list[int]:
    return [int(s) for s in text.split(",") if s.strip()]


def _file_of(spec: str) -> Path | None:
    """The input file of a file-backed spec (``npz:``/``edgelist:``), to fail before anything runs."""
    kind, _, rest = spec.partition(":")
    if kind in ("npz", "edgelist") and rest:
        return Path(rest.split(":")[0])
    return None


def dataset_facts(spec: str, seed: int) -> dict[str, Any]:
    """The graph's size and its whole feature matrix's bytes (``N x F x 4``), loaded as the children load it."""
    g = load_dataset(spec, None, seed=seed)
    assert g.x is not None
    n, f = g.num_nodes, int(g.x.shape[1])
    facts = {"graph": g.name, "nodes": n, "edges": g.num_edges, "features": f, "classes": g.num_classes,
             "train_vertices": int(g.train_mask.sum()) if g.train_mask is not None else None,
             "feature_dtype": str(g.x.dtype).removeprefix("torch."), "whole_feature_bytes": n * f * 4}
    del g
    return facts


def command(args: argparse.Namespace, spec: str, ranks: int, strategy: str | None, metrics: Path) -> list[str]:
    """The ``gnnscale train`` command of one run: ``strategy`` None is the mini-batch reference."""
    cmd = [sys.executable, "-m", "gnnscale", "train", "--dataset", spec, "--model", args.model,
           "--epochs", str(args.epochs), "--seed", str(args.seed), "--device", args.device,
           "--metrics", str(metrics), "--quiet"]
    if strategy is None:
        batch = ranks * (args.batch_size if args.batch_size is not None else DEFAULT_BATCH)
        return cmd + ["--engine", "minibatch", "--batch-size", str(batch)]
    cmd += ["--engine", "distributed", "--ranks", str(ranks), "--strategy", strategy]
    if strategy == "micrograph":
        cmd += ["--pregather", args.pregather, "--merge", args.merge]
    if args.batch_size is not None:
        cmd += ["--batch-size", str(args.batch_size)]
    return cmd


def run(cmd: list[str], env: dict[str, str], metrics: Path, timeout: float) -> dict[str, Any]:
    """Run one training; its epoch records and summary, or why it failed."""
    metrics.unlink(missing_ok=True)
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        return {"ok": False, "command": shlex.join(cmd), "returncode": None, "wall_s": time.perf_counter() - t0,
                "error": f"timed out after {timeout:.0f} s", "stderr_tail": err[-4000:]}
    wall = time.perf_counter() - t0
    out: dict[str, Any] = {"command": shlex.join(cmd), "returncode": p.returncode, "wall_s": wall,
                           "stdout": p.stdout[-2000:]}
    if p.returncode != 0 or not metrics.exists():
        return {**out, "ok": False, "error": f"exit status {p.returncode}", "stderr_tail": p.stderr[-4000:]}
    recs = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    epochs = [r for r in recs if not r.get("summary")]
    summary: dict[str, Any] = next((r for r in recs if r.get("summary")), {})
    return {**out, "ok": True, "epochs": epochs, "summary": summary, "stderr_tail": p.stderr[-1000:]}


def digest(res: dict[str, Any]) -> dict[str, Any]:
    """One run's figures over its epochs."""
    ep = res["epochs"]
    d: dict[str, Any] = {
        "epoch_times": [r["epoch_time_s"] for r in ep],
        "median_epoch_s": statistics.median(r["epoch_time_s"] for r in ep),
        "losses": [r["loss"] for r in ep],
        "test_accs": [r.get("test_acc") for r in ep],
        "final_test_acc": res["summary"].get("final_test_acc", ep[-1].get("test_acc")),
        "batches": ep[-1].get("batches"),
        "load_s": res["summary"].get("timings", {}).get("load_s"),
        "ready_s": res["summary"].get("timings", {}).get("ready_s"),
        "wall_s": res["wall_s"],
    }
    if "remote_bytes" not in ep[0]:  # the mini-batch reference
        return d
    needed = sum(r["needed_rows"] for r in ep)
    d.update({
        "network_bytes_per_epoch": statistics.mean(r["network_bytes"] for r in ep),
        "network_bytes": [r["network_bytes"] for r in ep],
        "remote_bytes_per_epoch": statistics.mean(r["remote_bytes"] for r in ep),
        "remote_rows_per_epoch": statistics.mean(r["remote_rows"] for r in ep),
        "remote_bytes": [r["remote_bytes"] for r in ep],
        "local_hit_rates": [r["local_hit_rate"] for r in ep],
        "miss_rate": 1 - sum(r["local_rows"] for r in ep) / needed if needed else None,
        "migration_bytes_per_epoch": statistics.mean(r["migration_bytes"] for r in ep),
        "time_steps": [r["time_steps"] for r in ep],
        "merges": [r["merges"] for r in ep],
        "stage_s": {k: statistics.mean(r[k] for r in ep) for k in
                    ("sample_s", "fetch_s", "train_s", "migrate_s", "sync_s")},
        "rank_feature_bytes": ep[-1]["rank_feature_bytes"],
        "rank_cache_peak_bytes": [max(r["rank_cache_peak_bytes"][i] for r in ep)
                                  for i in range(len(ep[-1]["rank_cache_peak_bytes"]))],
        "rank_rss_bytes": ep[-1]["rank_rss_bytes"],
    })
    return d


def _max_diff(a: list[float], b: list[float]) -> float | None:
    return max(abs(x - y) for x, y in zip(a, b, strict=True)) if a and len(a) == len(b) else None


def compare(facts: dict[str, Any], ranks: int, runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The (dataset, R) row: both strategies' figures, their ratios and the checks."""
    row: dict[str, Any] = {"ranks": ranks, **facts,
                           "runs": {k: v for k, v in runs.items()}}
    ok = {k: v["ok"] for k, v in runs.items()}
    mc = runs["model-centric"].get("digest") if ok["model-centric"] else None
    mg = runs["micrograph"].get("digest") if ok["micrograph"] else None
    mb = runs["minibatch"].get("digest") if ok["minibatch"] else None
    notes: list[str] = []
    if mc and mg:
        ratio = mg["remote_bytes_per_epoch"] / mc["remote_bytes_per_epoch"] if mc["remote_bytes_per_epoch"] else None
        acc = (None if mc["final_test_acc"] is None or mg["final_test_acc"] is None
               else 100 * (mg["final_test_acc"] - mc["final_test_acc"]))
        by_epoch = [g / m if m else None for g, m in zip(mg["remote_bytes"], mc["remote_bytes"], strict=False)]
        net = (mg["network_bytes_per_epoch"] / mc["network_bytes_per_epoch"]
               if mc["network_bytes_per_epoch"] else None)
        row.update({"network_ratio": net, "network_ok": net is not None and net <= REMOTE_BOUND,
                    "remote_ratio": ratio, "remote_ok": ratio is not None and ratio <= REMOTE_BOUND,
                    "remote_ratio_by_epoch": by_epoch,
                    "epoch_ratio": mg["median_epoch_s"] / mc["median_epoch_s"],
                    "acc_diff_points": acc, "acc_ok": acc is not None and abs(acc) <= ACC_POINTS,
                    "loss_diff_max": _max_diff(mc["losses"], mg["losses"])})
    for name, d in (("model-centric", mc), ("micrograph", mg)):
        if d is None:
            continue
        whole = facts["whole_feature_bytes"]
        held = d["rank_feature_bytes"]
        d["max_feature_share_x_r"] = max(held) * ranks / whole
        if sum(held) != whole:
            notes.append(f"{name}: rank_feature_bytes sum to {sum(held):,}, not N x F x 4 = {whole:,}")
        if len(held) != ranks:
            notes.append(f"{name}: {len(held)} rank_feature_bytes entries for {ranks} ranks")
        if mb is not None:
            d["over_minibatch"] = d["median_epoch_s"] / mb["median_epoch_s"]
            d["loss_diff_vs_minibatch"] = _max_diff(d["losses"], mb["losses"])
    if mc is not None and mc["miss_rate"] is not None and abs((1 - mc["miss_rate"]) - 1 / ranks) > 0.1:
        notes.append(f"model-centric local hit rate {1 - mc['miss_rate']:.3f}, far from 1/R = {1 / ranks:.3f}")
    if mc and mg and mg["miss_rate"] is not None and mc["miss_rate"] is not None \
            and mg["miss_rate"] >= mc["miss_rate"]:
        notes.append(f"micrograph misses {mg['miss_rate']:.3f} of its rows, not fewer than model-centric's "
                     f"{mc['miss_rate']:.3f}")
    if mc and mc["migration_bytes_per_epoch"]:
        notes.append("model-centric reports migration bytes")
    if mg and mg["batches"] and ranks > 1 and any(t <= 1 for t in mg["time_steps"]):
        merged = [e + 1 for e, t in enumerate(mg["time_steps"]) if t <= 1]
        notes.append(f"micrograph ran one time step per iteration in epoch(s) {merged} (merges "
                     f"{mg['merges']}): every model trained all its roots on one rank, model-centric's traffic")
    if mg and mg["batches"] and any(t > ranks for t in mg["time_steps"]):
        notes.append(f"micrograph time steps {mg['time_steps']} exceed R")
    for name, r in runs.items():
        if not r["ok"]:
            notes.append(f"{name} failed ({r['error']}): {r['command']}")
    row["notes"] = notes
    return row


def _f(v: float | None, spec: str, scale: float = 1.0) -> str:
    return "-" if v is None else format(v / scale, spec)


def print_tables(rows: list[dict[str, Any]]) -> None:
    def get(r: dict[str, Any], run: str) -> dict[str, Any]:
        x = r["runs"][run]
        return x.get("digest", {}) if x["ok"] else {}

    mib = 2**20
    print("\nCommunication (per epoch, summed over ranks, mean over epochs; MC = model-centric, MG = micrograph; miss "
          "rate = 1 - local_hit_rate, pooled over epochs):\n")
    print("| dataset | R | iterations/epoch | network MiB MC | network MiB MG | network MG/MC (<= 0.4) "
          "| remote feature MiB MC | remote feature MiB MG | feature MG/MC | feature MG/MC per epoch "
          "| miss rate MC | miss rate MG | migration MiB MG | time steps/iteration MG (per epoch) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|")
    for r in rows:
        mc, mg = get(r, "model-centric"), get(r, "micrograph")
        steps = ", ".join(f"{t:.2f}" for t in mg.get("time_steps", [])) or "-"
        ok = "" if r.get("network_ratio") is None else (" ok" if r["network_ok"] else " **FAIL**")
        print(f"| {r['graph']} | {r['ranks']} | {mc.get('batches', mg.get('batches', '-'))} "
              f"| {_f(mc.get('network_bytes_per_epoch'), '.2f', mib)} "
              f"| {_f(mg.get('network_bytes_per_epoch'), '.2f', mib)} "
              f"| {_f(r.get('network_ratio'), '.4f')}{ok} "
              f"| {_f(mc.get('remote_bytes_per_epoch'), '.2f', mib)} "
              f"| {_f(mg.get('remote_bytes_per_epoch'), '.3f', mib)} "
              f"| {_f(r.get('remote_ratio'), '.4f')} "
              f"| {', '.join(_f(x, '.3f') for x in r.get('remote_ratio_by_epoch', [])) or '-'} "
              f"| {_f(mc.get('miss_rate'), '.3f')} "
              f"| {_f(mg.get('miss_rate'), '.4f')} | {_f(mg.get('migration_bytes_per_epoch'), '.2f', mib)} | {steps} |")
    print("\nTime and accuracy (median epoch s, training only; mb = mini-batch engine, one process, batch R x B; "
          "test accuracy after the last epoch):\n")
    print("| dataset | R | epoch s MC | epoch s MG | epoch s mb | MG/MC | MC/mb | MG/mb | test acc MC | test acc MG "
          "| test acc mb | MG - MC (points, within 0.5) | max loss diff MC, MG vs mb |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        mc, mg, mb = get(r, "model-centric"), get(r, "micrograph"), get(r, "minibatch")
        ok = "" if r.get("acc_diff_points") is None else (" ok" if r["acc_ok"] else " **FAIL**")
        loss = f"{_f(mc.get('loss_diff_vs_minibatch'), '.1e')}, {_f(mg.get('loss_diff_vs_minibatch'), '.1e')}"
        print(f"| {r['graph']} | {r['ranks']} | {_f(mc.get('median_epoch_s'), '.3f')} "
              f"| {_f(mg.get('median_epoch_s'), '.3f')} | {_f(mb.get('median_epoch_s'), '.3f')} "
              f"| {_f(r.get('epoch_ratio'), '.2f')} | {_f(mc.get('over_minibatch'), '.2f')} "
              f"| {_f(mg.get('over_minibatch'), '.2f')} | {_f(mc.get('final_test_acc'), '.4f')} "
              f"| {_f(mg.get('final_test_acc'), '.4f')} | {_f(mb.get('final_test_acc'), '.4f')} "
              f"| {_f(r.get('acc_diff_points'), '+.2f')}{ok} | {loss} |")
    print("\nMemory per rank (features: N x F x 4 bytes in all; share x R = 1.00 is exactly 1/R; RSS at the last "
          "epoch's end):\n")
    print("| dataset | R | whole features MiB | per-rank features MiB | max share x R | cache peak MiB MC "
          "| cache peak MiB MG | RSS MiB MC | RSS MiB MG |")
    print("|---|---:|---:|---|---:|---|---|---|---|")
    for r in rows:
        mc, mg = get(r, "model-centric"), get(r, "micrograph")
        d = mc or mg

        def lst(v: list[int] | None) -> str:
            return "-" if not v else ", ".join(f"{b / mib:.1f}" for b in v)

        print(f"| {r['graph']} | {r['ranks']} | {r['whole_feature_bytes'] / mib:.2f} "
              f"| {lst(d.get('rank_feature_bytes'))} | {_f(d.get('max_feature_share_x_r'), '.4f')} "
              f"| {lst(mc.get('rank_cache_peak_bytes'))} | {lst(mg.get('rank_cache_peak_bytes'))} "
              f"| {lst(mc.get('rank_rss_bytes'))} | {lst(mg.get('rank_rss_bytes'))} |")
    notes = [(r["graph"], r["ranks"], n) for r in rows for n in r["notes"]]
    if notes:
        print("\nNotes:")
        for g, k, n in notes:
            print(f"- {g}, R={k}: {n}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", default=DEFAULT_DATASETS, help="';'-separated dataset specs")
    ap.add_argument("--ranks", default="2,4", help="rank counts (comma list)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default="sage")
    ap.add_argument("--batch-size", type=int, default=None,
                    help=f"seeds per rank (the mini-batch reference: R times this; default {DEFAULT_BATCH})")
    ap.add_argument("--pregather", choices=["on", "off"], default="on", help="the micrograph run's --pregather")
    ap.add_argument("--merge", default="auto", help="the micrograph run's --merge: off, auto (default) or K")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--omp-threads", type=int, default=1, help="OMP_NUM_THREADS of every child process")
    ap.add_argument("--timeout", type=float, default=1200, help="seconds one training run may take")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args(argv)
    specs = [s.strip() for s in args.datasets.split(";") if s.strip()]
    rank_counts = _ints(args.ranks)
    if args.epochs < 1 or not rank_counts or min(rank_counts) < 1 or not specs:
        print("error: need --epochs >= 1, at least one dataset and rank counts >= 1", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="gnnscale-bench-dist-"))
    os.environ.setdefault("GNNSCALE_CACHE_DIR", str(work / "cache"))
    os.environ["OMP_NUM_THREADS"] = str(args.omp_threads)
    env = dict(os.environ)
    plan = [(spec, r, s) for spec in specs for r in rank_counts for s in (*STRATEGIES, None)]
    if args.dry_run:
        print(f"# OMP_NUM_THREADS={args.omp_threads} GNNSCALE_CACHE_DIR={os.environ['GNNSCALE_CACHE_DIR']}")
        for spec, r, s in plan:
            print(shlex.join(command(args, spec, r, s, work / "metrics.jsonl")))
        return 0
    missing = [str(f) for f in map(_file_of, specs) if f is not None and not f.exists()]
    if missing:
        print(f"error: dataset file(s) missing: {', '.join(missing)} (pass --datasets)", file=sys.stderr)
        return 2
    torch.set_num_threads(args.omp_threads)
    common = environment(torch.device(args.device))
    print(f"device {common['device_name']}; torch {torch.__version__}, gnnscale {common['gnnscale_rev']}; "
          f"{args.model}, {args.epochs} epochs, seed {args.seed}, batch {args.batch_size or 'default'} per rank; "
          f"micrograph: pregather {args.pregather}, merge {args.merge}; "
          f"OMP_NUM_THREADS={args.omp_threads}; load average {os.getloadavg()[0]:.2f}")
    rows: list[dict[str, Any]] = []
    t_all = time.perf_counter()
    for spec in specs:
        try:
            facts = {"dataset": spec, **dataset_facts(spec, args.seed)}
        except GnnscaleError as exc:
            print(f"error: {spec}: {exc}", file=sys.stderr)
            return 2
        print(f"\n{facts['graph']}: {facts['nodes']:,} vertices, {facts['edges']:,} edges, {facts['features']} "
              f"features, {facts['train_vertices']:,} training vertices", flush=True)
        for r in rank_counts:
            runs: dict[str, dict[str, Any]] = {}
            for s in (*STRATEGIES, None):
                name = s or "minibatch"
                metrics = work / f"{facts['graph']}-{r}-{name}.jsonl"
                res = run(command(args, spec, r, s, metrics), env, metrics, args.timeout)
                if res["ok"]:
                    try:
                        res["digest"] = digest(res)
                    except (KeyError, ValueError, statistics.StatisticsError) as exc:
                        res.update(ok=False, error=f"unexpected metrics: {exc!r}")
                runs[name] = res
                if res["ok"]:
                    d = res["digest"]
                    extra = ("" if "remote_bytes_per_epoch" not in d else
                             f", network {d['network_bytes_per_epoch'] / 2**20:.2f} MiB/epoch, remote features "
                             f"{d['remote_bytes_per_epoch'] / 2**20:.2f} MiB/epoch, miss rate "
                             f"{d['miss_rate']:.3f}, steps {d['time_steps']}")
                    print(f"  R={r} {name}: {res['wall_s']:.1f} s wall (ready {d['ready_s']:.1f} s), epochs "
                          f"{', '.join(f'{t:.3f}' for t in d['epoch_times'])} s, test acc "
                          f"{d['final_test_acc']:.4f}{extra}", flush=True)
                else:
                    print(f"  R={r} {name}: FAILED ({res['error']}) after {res['wall_s']:.1f} s\n"
                          f"    {res['command']}\n    stderr: {res['stderr_tail'][-1500:]}", flush=True)
            rows.append(compare(facts, r, runs))
    print(f"\n{len(plan)} runs in {time.perf_counter() - t_all:.0f} s; load average {os.getloadavg()[0]:.2f}")
    print_tables(rows)
    if not args.no_save:
        for row in rows:  # the children's output only for failures; their epoch records are kept
            for res in row["runs"].values():
                if res["ok"]:
                    res.pop("stdout", None)
                    res.pop("stderr_tail", None)
                    res["summary"] = {k: res["summary"].get(k) for k in ("engine_detail", "timings", "total_time_s")}
        append_records(args.out, [{**common, "kind": "distributed", **r} for r in rows])
    return 0 if all(res["ok"] for row in rows for res in row["runs"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
