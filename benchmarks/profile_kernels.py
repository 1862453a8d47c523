"""Profile gnnscale's hot kernels on the peers benchmark's workloads (issue #30 point 2).

    python benchmarks/profile_kernels.py                       # every workload on csbm 200K
    python benchmarks/profile_kernels.py --workloads gat --epochs 4 --top 15
    python benchmarks/profile_kernels.py --no-profile          # times and peaks only
    git archive HEAD~3 gnnscale | tar -x -C /tmp/base           # then, before against after, interleaved:
    python benchmarks/profile_kernels.py --baseline /tmp/base --rounds 3

Each workload runs in its own child process (``benchmarks/peers_workers.py``'s gnnscale runner, the same model,
weights and data as ``benchmarks/peers.py``; one torch thread): one warm-up epoch, ``--epochs`` timed epochs
(median and range printed), the peak resident memory over them (``VmHWM`` after a reset once set-up is done: the
training's own peak, what peers.py calls ``train_peak_bytes``), then one more epoch under ``torch.profiler``
(``record_shapes``) whose top ops by self CPU time are printed. The sampling workload samples one epoch of
batches (SAGE fanouts 15,10, batch 1024) per "epoch" and reports sampled edges per second;
``minibatch`` is a mini-batch SAGE epoch and ``offload`` the offload engine's GCN epoch at 8 chunks.

``--baseline DIR`` (a folder holding another revision's ``gnnscale`` package) runs every workload with that
revision too, alternating with this one for ``--rounds`` rounds (the machine's load drifts: interleaving keeps the
comparison fair), and prints the median over rounds of each run's median epoch time and peak.

The data set is prepared under ``--data`` (default: peers.py's cache) when it is missing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, os.environ.get("PROFILE_GNNSCALE_ROOT", str(HERE.parent)))  # --baseline: another revision

import peers_workers as pw  # noqa: E402

DEFAULT_DATA = Path.home() / ".cache" / "gnnscale" / "peers" / "data"
WORKLOADS = ("gcn", "sage", "gat", "sampling", "minibatch", "offload")
"""Full-graph GCN, SAGE and GAT, sampling only, a mini-batch SAGE epoch and offload GCN at 8 chunks (peers.py's)."""


def _table(prof: Any, top: int) -> str:
    return str(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top, max_name_column_width=40))


def child(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(1)
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(1)
    torch.manual_seed(pw.SEED)
    a, meta = pw.load(args.data)
    if args.workload == "sampling":
        fn, _ = pw.gnnscale_sampler(a, meta)
        seeds = torch.from_numpy(pw.train_seeds(a)).long()
        batches = [seeds[i: i + pw.BATCH] for i in range(0, seeds.numel(), pw.BATCH)]

        def step(epoch: int) -> int:
            return sum(fn(b, epoch) for b in batches)
    else:
        system, workload, model = {"minibatch": ("gnnscale", "minibatch", "sage"),
                                   "offload": ("gnnscale-offload", "full", "gcn")}.get(
            args.workload, ("gnnscale", "full", args.workload))
        ns = argparse.Namespace(system=system, workload=workload, model=model, epochs=args.epochs, chunks=8)
        run = pw.gnnscale_run(a, meta, ns)

        def step(epoch: int) -> int:
            run["step"](epoch)
            return 0

    step(0)  # warm-up: caches, allocator
    base = pw.reset_peak()
    times, cpu, edges = [], [], []
    for e in range(1, args.epochs + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        edges.append(step(e))
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    peak = pw._vm("VmHWM")
    import gnnscale

    rec: dict[str, Any] = {"workload": args.workload, "nodes": meta["nodes"], "times_s": times,
                           "gnnscale": str(Path(gnnscale.__file__).parent),
                           "median_s": float(np.median(times)),
                           "median_cpu_s": float(np.median(cpu)),
                           "train_peak_bytes": None if base is None or peak is None else peak - base}
    if args.workload == "sampling":
        rec["mteps"] = float(np.median(edges)) / rec["median_s"] / 1e6
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            step(args.epochs + 1)
        rec["table"] = _table(prof, args.top)
    return rec


def _run_child(w: str, args: argparse.Namespace, root: str | None) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", w, "--nodes", str(args.nodes), "--data", str(args.data),
           "--epochs", str(args.epochs), "--top", str(args.top)] + ([] if args.profile else ["--no-profile"])
    env = dict(os.environ, **({"PROFILE_GNNSCALE_ROOT": root} if root else {}))
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    rec: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    rec["revision"] = "baseline" if root else "this"
    return rec


def _line(w: str, rec: dict[str, Any]) -> str:
    ts = ", ".join(f"{t:.3f}" for t in rec["times_s"])
    peak = rec["train_peak_bytes"]
    extra = f", {rec['mteps']:.2f} M sampled edges/s" if "mteps" in rec else ""
    peak_s = "n/a" if peak is None else f"{peak / 2**30:.3f} GiB"
    return (f"== {w} [{rec['revision']}: {rec['gnnscale']}] (csbm {rec['nodes']}, 1 thread): "
            f"median {rec['median_s']:.3f} s [{ts}] (cpu {rec['median_cpu_s']:.3f} s)"
            f"{extra}, train peak {peak_s}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, of {', '.join(WORKLOADS)}")
    ap.add_argument("--nodes", type=int, default=200_000)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder holding csbm-n<nodes>-c16-s0")
    ap.add_argument("--epochs", type=int, default=3, help="timed epochs (after one warm-up)")
    ap.add_argument("--top", type=int, default=10, help="ops listed per profile")
    ap.add_argument("--no-profile", dest="profile", action="store_false")
    ap.add_argument("--json", type=Path, help="also write the records here")
    ap.add_argument("--baseline", type=Path, help="folder holding another revision's gnnscale package")
    ap.add_argument("--rounds", type=int, default=1, help="rounds (alternating with --baseline)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    data = args.data / f"csbm-n{args.nodes}-c16-s0"
    if args.child:
        args.workload, args.data = args.child, data
        print(json.dumps(child(args)))
        return 0
    pw.prepare(data, args.nodes)
    recs: list[dict[str, Any]] = []
    roots: list[str | None] = [None] if args.baseline is None else [str(args.baseline.resolve()), None]
    for w in args.workloads.split(","):
        if w not in WORKLOADS:
            raise SystemExit(f"unknown workload {w!r}; pick from {', '.join(WORKLOADS)}")
        mine: dict[str | None, list[dict[str, Any]]] = {r: [] for r in roots}
        for rnd in range(args.rounds):
            for root in roots:
                rec = _run_child(w, args, root)
                rec["round"] = rnd
                recs.append(rec)
                mine[root].append(rec)
                print(_line(w, rec))
                if "table" in rec and rnd == args.rounds - 1:
                    print(rec["table"])
                sys.stdout.flush()
        if len(roots) > 1 or args.rounds > 1:
            med = {r: (float(np.median([x["median_s"] for x in v])), float(np.median([x["median_cpu_s"] for x in v])),
                       float(np.median([x["train_peak_bytes"] or 0 for x in v]))) for r, v in mine.items()}
            base, this = med.get(roots[0], med[None]), med[None]
            print(f"== {w}: median over {args.rounds} rounds: this {this[0]:.3f} s (cpu {this[1]:.3f} s), "
                  f"peak {this[2] / 2**30:.3f} GiB" + ("" if len(roots) == 1 else
                  f"; baseline {base[0]:.3f} s (cpu {base[1]:.3f} s), peak {base[2] / 2**30:.3f} GiB; time "
                  f"x{this[0] / base[0]:.3f} (cpu x{this[1] / base[1]:.3f}), peak x{this[2] / max(base[2], 1):.3f}"))
    if args.json:
        args.json.write_text(json.dumps(recs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
