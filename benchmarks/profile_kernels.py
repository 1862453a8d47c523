"""Profile gnnscale's hot kernels on the peers benchmark's workloads (issue #30 point 2).

    python -m benchmarks profile_kernels                       # every workload on csbm 200K
    python -m benchmarks profile_kernels --workloads gat --epochs 4 --top 15
    python -m benchmarks profile_kernels --no-profile          # times and peaks only
    python -m benchmarks profile_kernels --baseline HEAD~3 --rounds 3   # before against after, interleaved
    python -m benchmarks profile_kernels --quick

Each workload is a case (the peers benchmark's gnnscale runner, ``benchmarks/_peers_workers.py``: the same model,
weights and data as ``python -m benchmarks peers``; one torch thread): one warm-up epoch, ``--epochs`` timed
epochs (median and range), the peak resident memory over them (``VmHWM`` after a reset once set-up is done: the
training's own peak, what peers calls ``train_peak_bytes``), then one more epoch under ``torch.profiler``
(``record_shapes``) whose top ops by self CPU time are recorded (``table``). The sampling workload samples one
epoch of batches (SAGE fanouts 15,10, batch 1024) per "epoch" and reports sampled edges per second; ``minibatch``
is a mini-batch SAGE epoch and ``offload`` the offload engine's GCN epoch at 8 chunks.

``--baseline REV`` (a git revision) adds a case per workload that imports ``gnnscale`` from a clean worktree of
that revision; with this tree's case it forms the workload's group, so the two alternate over the ``--rounds``
rounds (the machine's load drifts: interleaving keeps the comparison fair). The table gives, per workload and
revision, the median over rounds of each run's median epoch time, CPU time and peak.

The data set is prepared under ``--data`` (default: the peers benchmark's cache) when it is missing.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import Case, latest_session, split_list
from benchmarks.harness.graphs import device_name
from benchmarks.harness.records import fmt, provenance, table

TITLE = "Profile of gnnscale's hot kernels on the peers workloads (issue #30 point 2)"
ROUNDS = 1
DEFAULT_DATA = Path.home() / ".cache" / "gnnscale" / "peers" / "data"
WORKLOADS = ("gcn", "sage", "gat", "sampling", "minibatch", "offload")
"""Full-graph GCN, SAGE and GAT, sampling only, a mini-batch SAGE epoch and offload GCN at 8 chunks (peers')."""


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--workloads", default=",".join(WORKLOADS),
                    help=f"comma-separated, of {', '.join(WORKLOADS)} (--quick: gcn,offload)")
    ap.add_argument("--nodes", type=int, default=200_000, help="csbm vertices (default 200000; --quick 5000)")
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder holding csbm-n<nodes>-c16-s0")
    ap.add_argument("--epochs", type=int, default=3, help="timed epochs after one warm-up (--quick: 2)")
    ap.add_argument("--top", type=int, default=10, help="ops listed per profile")
    ap.add_argument("--no-profile", dest="profile", action="store_false")
    ap.add_argument("--baseline", metavar="REV", help="a git revision whose gnnscale runs every workload too")


def cases(args: argparse.Namespace) -> list[Case]:
    q = args.quick
    workloads = split_list("gcn,offload" if q and args.workloads == ",".join(WORKLOADS) else args.workloads)
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        raise SystemExit(f"error: unknown workload {unknown[0]!r}; pick from {', '.join(WORKLOADS)}")
    nodes = 5000 if q and args.nodes == 200_000 else args.nodes
    common = {"nodes": nodes, "data": str(args.data / f"csbm-n{nodes}-c16-s0"), "top": args.top,
              "epochs": 2 if q and args.epochs == 3 else args.epochs, "profile": args.profile}
    revs: list[str | None] = [None] if args.baseline is None else [args.baseline, None]
    return [Case(f"{w} {rev or 'this'}", {**common, "workload": w, "revision": rev or "this"}, group=w, rev=rev)
            for w in workloads for rev in revs]


def _pw() -> Any:
    from benchmarks import _peers_workers as pw  # the peers benchmark's case code
    return pw


def _step(pw: Any, workload: str, data: Path, epochs: int) -> tuple[Any, dict[str, Any]]:
    """One "epoch" of the workload: a function of the epoch number returning sampled edges (0 when training)."""
    import argparse as ap_mod

    import torch

    a, meta = pw.load(data)
    if workload == "sampling":
        fn, _ = pw.gnnscale_sampler(a, meta)
        seeds = torch.from_numpy(pw.train_seeds(a)).long()
        batches = [seeds[i: i + pw.BATCH] for i in range(0, seeds.numel(), pw.BATCH)]
        return (lambda epoch: sum(fn(b, epoch) for b in batches)), meta
    system, kind, model = {"minibatch": ("gnnscale", "minibatch", "sage"),
                           "offload": ("gnnscale-offload", "full", "gcn")}.get(workload, ("gnnscale", "full", workload))
    run = pw.gnnscale_run(a, meta, ap_mod.Namespace(system=system, workload=kind, model=model, epochs=epochs,
                                                    chunks=8, host_allocator="auto"))

    def step(epoch: int) -> int:
        run["step"](epoch)
        return 0

    return step, meta


def run(params: dict[str, Any]) -> dict[str, Any]:
    """One workload's timed epochs, peak and profile, with this tree's gnnscale or ``params["_src"]``'s."""
    if params.get("_src"):
        sys.path.insert(0, params["_src"])  # before gnnscale is first imported: the baseline revision's
    import numpy as np
    import torch

    pw = _pw()
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(1)
    torch.manual_seed(pw.SEED)
    data = Path(params["data"])
    pw.prepare(data, params["nodes"])
    step, meta = _step(pw, params["workload"], data, params["epochs"])
    step(0)  # warm-up: caches, allocator
    base = pw.reset_peak()
    times, cpu, edges = [], [], []
    for e in range(1, params["epochs"] + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        edges.append(step(e))
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    peak = pw._vm("VmHWM")
    import gnnscale

    rec: dict[str, Any] = {"workload": params["workload"], "revision": params["revision"], "nodes": meta["nodes"],
                           "device": "cpu", "device_name": device_name(),
                           "times_s": times, "gnnscale": str(Path(gnnscale.__file__).parent),
                           "median_s": float(np.median(times)), "median_cpu_s": float(np.median(cpu)),
                           "train_peak_bytes": None if base is None or peak is None else peak - base}
    if params["workload"] == "sampling":
        rec["mteps"] = float(np.median(edges)) / rec["median_s"] / 1e6
    if params["profile"]:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            step(params["epochs"] + 1)
        rec["table"] = str(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=params["top"],
                                                     max_name_column_width=40))
    return rec


def describe(r: dict[str, Any]) -> str:
    extra = f", {r['mteps']:.2f} M sampled edges/s" if "mteps" in r else ""
    return (f"{r['workload']} [{r['revision']}: {r['gnnscale']}]: median {r['median_s']:.3f} s "
            f"(cpu {r['median_cpu_s']:.3f} s){extra}")


def _median(recs: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in recs if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def render(records: list[dict[str, Any]]) -> str:
    recs = latest_session(records, lambda r: r.get("median_s") is not None)
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in recs:
        groups.setdefault((r["workload"], r["revision"]), []).append(r)
    rows = []
    for (w, rev), rs in groups.items():
        peak = _median(rs, "train_peak_bytes")
        rows.append([w, rev, rs[0]["nodes"], len(rs), fmt(_median(rs, "median_s")), fmt(_median(rs, "median_cpu_s")),
                     fmt(None if peak is None else peak / 2**30), fmt(_median(rs, "mteps"), ".2f")])
    profiles = []
    for r in {(r["workload"], r["revision"]): r for r in recs}.values():  # the last round's of each
        if r.get("table"):
            ops = "\n".join(ln.rstrip() for ln in r["table"].strip().splitlines())
            profiles.append(f"`{r['workload']}` [{r['revision']}], the last round's profile (top ops by self CPU "
                            f"time):\n\n```\n{ops}\n```")
    head = ["workload", "revision", "nodes", "rounds", "median epoch (s)", "median CPU (s)", "train peak (GiB)",
            "M sampled edges/s"]
    return "\n\n".join([provenance(recs), "The latest run: per workload and revision, the median over rounds of "
                        "each run's median epoch time, CPU time and training peak.", table(head, rows),
                        *profiles]) + "\n"
