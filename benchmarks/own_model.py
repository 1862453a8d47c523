"""Your own model under offload (issue #45): a Stack of PyG convs, in-memory against offload with 8 chunks.

    .venv/bin/python benchmarks/own_model.py                       # csbm 100K; GraphConv and GAT; 5 rounds
    .venv/bin/python benchmarks/own_model.py --models graphconv --rounds 3 --breakdown
    .venv/bin/python benchmarks/own_model.py --quick --no-save     # a tiny graph, one round: does it run

The model is what a user writes: ``gnnscale.nn.Stack([GraphConv(F, H), GraphConv(H, C)], dropout=0.5)`` of PyG's
``GraphConv`` (converted to gnnscale's ``GraphConvLayer`` over the same parameters: the engines cache its
parameter-free aggregation), and for comparison ``Stack([GATConv(F, H / heads, heads=heads), GATConv(H, C)])``
(no native layer: the generic ``PyGConv`` path, which the offload engine recomputes in backward). Each model is
built under ``--seed`` and trained by the engine ``gnnscale.train`` picks for it (``select_engine(...,
model=...)``), constructed as ``train`` constructs it: ``inmemory``, and ``offload`` with ``partitions=1,
chunks=--chunks`` (8).

Timing: one torch thread (``--threads``); per run ``--warmup`` untimed epochs, then ``--epochs`` timed ones
(``engine.train_epoch``: forward, backward, optimiser step; no evaluation). ``--rounds`` interleaved rounds: each
round runs every model's engines, in-memory first in odd rounds and offload first in even ones. Per (model,
engine) the median over every timed epoch of every round; the ratio ``offload / inmemory`` of those medians, and
the range of the per-round ratios. On the CPU the offload engine counts its live "device" bytes with a
``TorchDispatchMode`` (Python on every tensor op); as in ``benchmarks/offload.py`` it runs in the warm-up epochs
only (``--count-timed``: in every epoch, as ``gnnscale train`` runs it). Losses: every run's epochs are compared
with the in-memory run of its round (``loss_max_abs_diff``: the engines are exact, so rounding only).

``--breakdown``: after the rounds, one more run per (model, engine) under ``torch.profiler`` (3 epochs), its ops'
self time per epoch summed into dense products, sparse products (gnnscale's fused CPU kernels included, which the
profiler sees through a ``record_function`` around them), keyed dropout, other ops, and what no op accounts for
(Python, the engine's own loop).

One JSON line per run, and per model one summary line, appended to ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

try:  # run as a script (its folder is on sys.path) or imported as benchmarks.own_model
    from offload import append_records, environment
except ImportError:  # pragma: no cover
    from benchmarks.offload import append_records, environment

from gnnscale.config import TrainConfig
from gnnscale.engines import select_engine
from gnnscale.errors import GnnscaleError
from gnnscale.graph.datasets import load_dataset
from gnnscale.graph.graph import Graph
from gnnscale.nn import Stack, as_stack
from gnnscale.runtime import cpu_kernels
from gnnscale.train import check_trainable

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "own_model.jsonl"
DEFAULT_DATASET = "csbm:nodes=100000,avg_degree=10,features=128,classes=16"
QUICK_DATASET = "csbm:nodes=600,avg_degree=8,features=16,classes=4"
ENGINES = ("inmemory", "offload")
BOUND = 1.3
"""The issue's bound on ``offload / inmemory`` for the GraphConv stack."""


def graphconv_stack(features: int, hidden: int, classes: int, heads: int, dropout: float) -> Stack:
    """Two PyG ``GraphConv`` (sum aggregation, PyG's default) in a Stack."""
    del heads
    from torch_geometric.nn import GraphConv

    return Stack([GraphConv(features, hidden), GraphConv(hidden, classes)], dropout=dropout)


def gat_stack(features: int, hidden: int, classes: int, heads: int, dropout: float) -> Stack:
    """Two PyG ``GATConv``, ``heads`` heads of ``hidden / heads`` concatenated, then one head; no attention
    dropout (the offload engine refuses a conv that draws its own random numbers)."""
    from torch_geometric.nn import GATConv

    return Stack([GATConv(features, hidden // heads, heads=heads), GATConv(hidden, classes)], dropout=dropout)


MODELS: dict[str, Callable[[int, int, int, int, float], Stack]] = {"graphconv": graphconv_stack, "gat": gat_stack}


def make_engine(g: Graph, name: str, engine: str, args: argparse.Namespace) -> Any:
    """The engine ``gnnscale.train(g, cfg, model=m)`` would run, built as it builds it, with the model made under
    ``args.seed``."""
    assert g.num_classes is not None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(args.seed)
        model = as_stack(MODELS[name](g.num_features, args.hidden, g.num_classes, args.heads, args.dropout))
    chunks = {"partitions": 1, "chunks": args.chunks} if engine == "offload" else {}
    cfg = TrainConfig(engine=engine, seed=args.seed, epochs=args.warmup + args.epochs, **chunks)
    cls, _ = select_engine(g, cfg, torch.device("cpu"), model=model)
    return cls(g, model, cfg, torch.device("cpu"))


def run(g: Graph, name: str, engine: str, args: argparse.Namespace) -> dict[str, Any]:
    """Set-up, ``args.warmup`` untimed and ``args.epochs`` timed epochs of one (model, engine)."""
    t0 = time.perf_counter()
    try:
        eng = make_engine(g, name, engine, args)
    except GnnscaleError as exc:
        return {"status": "refused", "reason": f"{type(exc).__name__}: {exc}"}
    setup_s = time.perf_counter() - t0
    counter = getattr(eng, "counter", None)
    times, losses = [], []
    for epoch in range(1, args.warmup + args.epochs + 1):
        if counter is not None:
            eng.counter = counter if args.count_timed or epoch <= args.warmup else None
        t = time.perf_counter()
        stats = eng.train_epoch(epoch)
        times.append(time.perf_counter() - t)
        losses.append(float(stats["loss"]))
    detail = eng.describe() if hasattr(eng, "describe") else engine
    chunks = getattr(eng, "num_chunks", None)
    return {"status": "ok", "setup_s": setup_s, "epoch_times_s": times[args.warmup:],
            "warmup_times_s": times[: args.warmup], "median_epoch_s": statistics.median(times[args.warmup:]),
            "losses": losses, "engine_detail": detail, "chunks": chunks,
            "counter_in_timed_epochs": counter is not None and args.count_timed}


# ------------------------------------------------------------------------------------------------ breakdown
_KERNELS = ("csr_mm", "csr_mm_add", "hashed_scale", "add_rows")
_CATEGORY = {"aten::mm": "dense", "aten::addmm": "dense", "aten::linear": "dense", "aten::bmm": "dense",
             "_SpMM": "sparse", "_SpMMBackward": "sparse", "kernel::csr_mm": "sparse",
             "kernel::csr_mm_add": "sparse", "kernel::hashed_scale": "dropout", "_HashedDropout": "dropout",
             "_HashedDropoutBackward": "dropout", "kernel::add_rows": "row adds"}
_DROPOUT_OPS = {"aten::ge", "aten::bitwise_xor", "aten::__rshift__", "aten::bitwise_and", "aten::__and__",
                "aten::__xor__", "aten::__irshift__"}
"""The torch formulation of keyed dropout (``nn.ops.keep_mask``: below the fused kernel's size, a chunk's rows)."""


@contextlib.contextmanager
def _kernels_seen() -> Iterator[None]:
    """gnnscale's fused CPU kernels (numba, not torch ops) inside ``record_function`` scopes, so that the profiler
    times them; restored after."""
    saved = {k: getattr(cpu_kernels, k) for k in _KERNELS}

    def seen(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*a: Any, **kw: Any) -> Any:
            with torch.profiler.record_function(f"kernel::{name}"):
                return fn(*a, **kw)
        return call

    try:
        for k, fn in saved.items():
            setattr(cpu_kernels, k, seen(k, fn))
        yield
    finally:
        for k, fn in saved.items():
            setattr(cpu_kernels, k, fn)


def breakdown(g: Graph, name: str, engine: str, args: argparse.Namespace, epochs: int = 3) -> dict[str, float]:
    """Milliseconds per epoch by category (see the module docstring), of ``epochs`` profiled epochs after
    ``args.warmup`` untimed ones; ``wall`` is the profiled epochs' own time (the profiler adds a little)."""
    eng = make_engine(g, name, engine, args)
    if getattr(eng, "counter", None) is not None:
        eng.counter = None
    for epoch in range(1, args.warmup + 1):
        eng.train_epoch(epoch)
    with _kernels_seen(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()
        for epoch in range(args.warmup + 1, args.warmup + epochs + 1):
            eng.train_epoch(epoch)
        wall = (time.perf_counter() - t) / epochs
    out: dict[str, float] = defaultdict(float)
    for ev in prof.key_averages():
        cat = _CATEGORY.get(ev.key) or ("dropout" if ev.key in _DROPOUT_OPS else "other ops")
        out[cat] += ev.self_cpu_time_total / 1e3 / epochs
    out["outside ops"] = wall * 1e3 - sum(out.values())
    out["wall"] = wall * 1e3
    return {k: round(v, 2) for k, v in out.items()}


# ------------------------------------------------------------------------------------------------ summary
def summarize(name: str, runs: list[dict[str, Any]], case: dict[str, Any]) -> dict[str, Any]:
    """The model's summary record: per engine the median over all timed epochs of all rounds; the ratio."""
    ok = [r for r in runs if r["status"] == "ok"]
    med = {e: statistics.median([t for r in ok if r["engine"] == e for t in r["epoch_times_s"]]) for e in ENGINES
           if any(r["engine"] == e for r in ok)}
    per_round = []
    for rnd in sorted({r["round"] for r in ok}):
        pair = {r["engine"]: r["median_epoch_s"] for r in ok if r["round"] == rnd}
        if len(pair) == 2:
            per_round.append(pair["offload"] / pair["inmemory"])
    ratio = med["offload"] / med["inmemory"] if len(med) == 2 else None
    diffs = [r["loss_max_abs_diff"] for r in ok if r.get("loss_max_abs_diff") is not None]
    return {**case, "kind": "summary", "model": name, "median_epoch_s": med, "ratio": ratio,
            "per_round_ratios": per_round, "loss_max_abs_diff": max(diffs) if diffs else None,
            "bound": BOUND if name == "graphconv" else None,
            "within_bound": None if ratio is None or name != "graphconv" else ratio <= BOUND,
            "runs_ok": len(ok), "runs": len(runs)}


def print_summary(s: dict[str, Any]) -> None:
    med = s["median_epoch_s"]
    rounds = s["per_round_ratios"]
    spread = f" (rounds {min(rounds):.2f}-{max(rounds):.2f})" if rounds else ""
    ratio = "-" if s["ratio"] is None else f"{s['ratio']:.2f}"
    verdict = "" if s["within_bound"] is None else f"; within {BOUND}x: {'yes' if s['within_bound'] else 'NO'}"
    print(f"  {s['model']:<10} inmemory {med.get('inmemory', float('nan')):.3f} s, offload "
          f"{med.get('offload', float('nan')):.3f} s: offload/inmemory {ratio}{spread}{verdict}; losses differ by "
          f"at most {s['loss_max_abs_diff']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default=None, metavar="SPEC", help=f"dataset spec (default {DEFAULT_DATASET})")
    ap.add_argument("--root", default=None, help="folder of dataset files")
    ap.add_argument("--models", default="graphconv,gat", help=f"comma list of {', '.join(MODELS)}")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4, help="GAT's hidden heads")
    ap.add_argument("--dropout", type=float, default=0.5, help="between the layers (keyed)")
    ap.add_argument("--chunks", type=int, default=8, help="offload: chunks of the one partition")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=5, help="timed epochs per run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    ap.add_argument("--count-timed", action="store_true",
                    help="keep the offload engine's CPU live-bytes counter on in the timed epochs")
    ap.add_argument("--breakdown", action="store_true", help="profile one more run per case (see above)")
    ap.add_argument("--quick", action="store_true",
                    help=f"a smoke run: {QUICK_DATASET}, hidden 8, 1 round, 1 warm-up and 2 timed epochs")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON Lines file to append to")
    ap.add_argument("--no-save", action="store_true", help="print only")
    args = ap.parse_args(argv)
    if args.quick:
        args.dataset = args.dataset or QUICK_DATASET
        args.hidden, args.rounds, args.warmup, args.epochs = 8, 1, 1, 2
    args.dataset = args.dataset or DEFAULT_DATASET
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not models or any(m not in MODELS for m in models):
        print(f"error: --models: choose from {', '.join(MODELS)}, got {args.models!r}", file=sys.stderr)
        return 2
    if args.rounds < 1 or args.epochs < 1 or args.warmup < 0 or args.threads < 1 or args.chunks < 1:
        print("error: --rounds, --epochs, --threads and --chunks must be >= 1, --warmup >= 0", file=sys.stderr)
        return 2
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return _bench(args, models)
    finally:
        torch.set_num_threads(threads)  # as it was (a test calls main in its own process)


def _bench(args: argparse.Namespace, models: list[str]) -> int:
    os.environ.setdefault("GNNSCALE_CACHE_DIR", tempfile.mkdtemp(prefix="gnnscale-bench-"))  # partition plans
    try:
        g = load_dataset(args.dataset, args.root, seed=args.seed)
        check_trainable(g)
    except GnnscaleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    env = environment(torch.device("cpu"))
    case = {**env, "dataset": args.dataset, "nodes": g.num_nodes, "edges": g.num_edges,
            "features": g.num_features, "classes": g.num_classes, "hidden": args.hidden, "heads": args.heads,
            "dropout": args.dropout, "chunks_requested": args.chunks, "partitions": 1, "warmup": args.warmup,
            "epochs": args.epochs, "rounds": args.rounds, "threads": torch.get_num_threads(), "seed": args.seed,
            "count_timed": args.count_timed}
    print(f"{args.dataset}: {g.num_nodes:,} nodes, {g.num_edges:,} edges; {env['device_name']}; torch "
          f"{env['torch']}, PyG {env['pyg']}, gnnscale {env['gnnscale_rev']}; {args.rounds} round(s) of "
          f"{args.warmup} + {args.epochs} epochs")
    records: list[dict[str, Any]] = []
    for rnd in range(1, args.rounds + 1):
        for name in models:
            order = ENGINES if rnd % 2 else ENGINES[::-1]
            done = {}
            for engine in order:
                r = run(g, name, engine, args)
                done[engine] = r
                print(f"  round {rnd} {name:<10} {engine:<9} " + (f"median {r['median_epoch_s']:.3f} s"
                      if r["status"] == "ok" else r["reason"]), flush=True)
            ref = done["inmemory"]
            for engine, r in done.items():
                if r["status"] == "ok" and ref["status"] == "ok":
                    r["loss_max_abs_diff"] = max(abs(a - b) for a, b in zip(r["losses"], ref["losses"], strict=True))
                records.append({**case, "kind": "run", "model": name, "engine": engine, "round": rnd, **r})
    print(f"\nmedian over all timed epochs of {args.rounds} round(s):")
    for name in models:
        s = summarize(name, [r for r in records if r["kind"] == "run" and r["model"] == name], case)
        if args.breakdown:
            s["breakdown_ms_per_epoch"] = {e: breakdown(g, name, e, args) for e in ENGINES}
        records.append(s)
        print_summary(s)
        for engine, parts in s.get("breakdown_ms_per_epoch", {}).items():
            print(f"    {engine:<9} ms/epoch: " + ", ".join(f"{k} {v:.1f}" for k, v in parts.items()))
    if not args.no_save:
        append_records(args.out, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
