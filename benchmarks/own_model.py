"""Your own model under offload (issue #45): a Stack of PyG convs, in-memory against offload with 8 chunks.

    python -m benchmarks own_model                          # csbm 100K; GraphConv and GAT; 5 rounds
    python -m benchmarks own_model --models graphconv --rounds 3 --breakdown
    python -m benchmarks own_model --quick --no-save        # a tiny graph, one round: does it run

The model is what a user writes: ``gnnscale.nn.Stack([GraphConv(F, H), GraphConv(H, C)], dropout=0.5)`` of PyG's
``GraphConv`` (converted to gnnscale's ``GraphConvLayer`` over the same parameters: the engines cache its
parameter-free aggregation), and for comparison ``Stack([GATConv(F, H / heads, heads=heads), GATConv(H, C)])``
(no native layer: the generic ``PyGConv`` path, which the offload engine recomputes in backward). Each model is
built under ``--seed`` and trained by the engine ``gnnscale.train`` picks for it (``select_engine(...,
model=...)``), constructed as ``train`` constructs it: ``inmemory``, and ``offload`` with ``partitions=1,
chunks=--chunks`` (8).

Cases: one per (model, engine), the two engines of a model one group (the harness runs them in its own processes
with one thread, in-memory first in odd rounds and offload first in even ones). Per run ``--warmup`` untimed
epochs, then ``--epochs`` timed ones (``engine.train_epoch``: forward, backward, optimiser step; no evaluation);
one ``"kind": "run"`` record each. :func:`summarize` (in :func:`render`) takes per (model, engine) the median over
every timed epoch of every round, the ratio ``offload / inmemory`` of those medians, the range of the per-round
ratios, and compares every run's losses with the in-memory run of its round (``loss_max_abs_diff``: the engines
are exact, so rounding only). On the CPU the offload engine counts its live "device" bytes with a
``TorchDispatchMode`` (Python on every tensor op); as in ``benchmarks/offload.py`` it runs in the warm-up epochs
only (``--count-timed``: in every epoch, as ``gnnscale train`` runs it).

``--breakdown``: one more case per (model, engine) under ``torch.profiler`` (3 epochs; ``"kind": "breakdown"``),
its ops' self time per epoch summed into dense products, sparse products (gnnscale's fused CPU kernels included,
which the profiler sees through a ``record_function`` around them), keyed dropout, other ops, and what no op
accounts for (Python, the engine's own loop).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import torch

from benchmarks.harness import Case, Row, fmt, split_list
from benchmarks.harness.graphs import device_name, load_graph
from benchmarks.harness.records import provenance, session_of, table
from gnnscale.config import TrainConfig
from gnnscale.engines import select_engine
from gnnscale.errors import GnnscaleError
from gnnscale.graph.graph import Graph
from gnnscale.nn import Stack, as_stack
from gnnscale.runtime import cpu_kernels

TITLE = "Your own model: PyG GraphConv under offload (issue #45), CPU"
ROUNDS = 5
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


def make_engine(g: Graph, name: str, engine: str, args: Any) -> Any:
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


def run_engine(g: Graph, name: str, engine: str, args: Any) -> dict[str, Any]:
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


def breakdown(g: Graph, name: str, engine: str, args: Any, epochs: int = 3) -> dict[str, float]:
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



# ------------------------------------------------------------------------------------------------ cases
def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--dataset", default=None, metavar="SPEC",
                    help=f"dataset spec (default {DEFAULT_DATASET}; --quick {QUICK_DATASET})")
    ap.add_argument("--root", default=None, help="folder of dataset files")
    ap.add_argument("--models", default="graphconv,gat", help=f"comma list of {', '.join(MODELS)}")
    ap.add_argument("--hidden", type=int, default=None, help="default 64 (--quick 8)")
    ap.add_argument("--heads", type=int, default=4, help="GAT's hidden heads")
    ap.add_argument("--dropout", type=float, default=0.5, help="between the layers (keyed)")
    ap.add_argument("--chunks", type=int, default=8, help="offload: chunks of the one partition")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=None, help="timed epochs per run (default 5, --quick 2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--count-timed", action="store_true",
                    help="keep the offload engine's CPU live-bytes counter on in the timed epochs")
    ap.add_argument("--breakdown", action="store_true", help="profile one more run per case (see above)")


def cases(args: argparse.Namespace) -> list[Case]:
    """Per model, its two engines (one group), and with ``--breakdown`` a profiled case per engine."""
    models = split_list(args.models)
    if not models or any(m not in MODELS for m in models):
        raise SystemExit(f"error: --models: choose from {', '.join(MODELS)}, got {args.models!r}")
    params = {"dataset": args.dataset or (QUICK_DATASET if args.quick else DEFAULT_DATASET), "root": args.root,
              "hidden": args.hidden or (8 if args.quick else 64), "heads": args.heads, "dropout": args.dropout,
              "chunks": args.chunks, "warmup": args.warmup, "epochs": args.epochs or (2 if args.quick else 5),
              "seed": args.seed, "count_timed": args.count_timed}
    if params["epochs"] < 1 or args.warmup < 0 or args.chunks < 1:
        raise SystemExit("error: --epochs and --chunks must be >= 1, --warmup >= 0")
    out = [Case(f"{m} {e}", {**params, "model": m, "engine": e}, group=m) for m in models for e in ENGINES]
    if args.breakdown:
        out += [Case(f"{m} {e} breakdown", {**params, "model": m, "engine": e, "breakdown": True})
                for m in models for e in ENGINES]
    return out


def run(params: dict[str, Any]) -> dict[str, Any]:
    """One (model, engine): a ``run`` record, or with ``breakdown`` a ``breakdown`` record."""
    os.environ.setdefault("GNNSCALE_CACHE_DIR", tempfile.mkdtemp(prefix="gnnscale-bench-"))  # partition plans
    g, _ = load_graph(params["dataset"], params["root"], params["seed"])
    args = SimpleNamespace(**params)
    case = {"dataset": params["dataset"], "nodes": g.num_nodes, "edges": g.num_edges, "features": g.num_features,
            "classes": g.num_classes, "hidden": args.hidden, "heads": args.heads, "dropout": args.dropout,
            "chunks_requested": args.chunks, "partitions": 1, "warmup": args.warmup, "epochs": args.epochs,
            "seed": args.seed, "count_timed": args.count_timed, "device": "cpu", "device_name": device_name(),
            "model": args.model, "engine": args.engine}
    if params.get("breakdown"):
        return {**case, "kind": "breakdown", "breakdown_ms_per_epoch": breakdown(g, args.model, args.engine, args)}
    return {**case, "kind": "run", **run_engine(g, args.model, args.engine, args)}


def describe(r: dict[str, Any]) -> str:
    if r["kind"] == "breakdown":
        return ", ".join(f"{k} {v:.1f}" for k, v in r["breakdown_ms_per_epoch"].items()) + " ms per epoch"
    return f"median {r['median_epoch_s']:.3f} s" if r.get("status") == "ok" else str(r.get("reason"))


# ------------------------------------------------------------------------------------------------ summary
def summarize(name: str, runs: list[dict[str, Any]], case: dict[str, Any]) -> dict[str, Any]:
    """The model's summary: per engine the median over all timed epochs of all rounds; the ratio; the per-round
    ratios; the largest loss difference of a run from the in-memory run of its round."""
    ok = [r for r in runs if r["status"] == "ok"]
    med = {e: statistics.median([t for r in ok if r["engine"] == e for t in r["epoch_times_s"]]) for e in ENGINES
           if any(r["engine"] == e for r in ok)}
    per_round, diffs = [], []
    for rnd in sorted({r["round"] for r in ok}):
        pair = {r["engine"]: r for r in ok if r["round"] == rnd}
        if len(pair) == 2:
            per_round.append(pair["offload"]["median_epoch_s"] / pair["inmemory"]["median_epoch_s"])
            diffs += [max(abs(a - b) for a, b in zip(r["losses"], pair["inmemory"]["losses"], strict=True))
                      for r in pair.values()]
    ratio = med["offload"] / med["inmemory"] if len(med) == 2 else None
    return {**case, "kind": "summary", "model": name, "median_epoch_s": med, "ratio": ratio,
            "per_round_ratios": per_round, "loss_max_abs_diff": max(diffs) if diffs else None,
            "bound": BOUND if name == "graphconv" else None,
            "within_bound": None if ratio is None or name != "graphconv" else ratio <= BOUND,
            "runs_ok": len(ok), "runs": len(runs)}


def summaries(records: list[dict[str, Any]]) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Per run of the benchmark (session) and model, in order: its summary and its run records."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        if r.get("kind") == "run":
            groups.setdefault((session_of(r), r["model"]), []).append(r)
    return [(summarize(model, rs, {k: rs[0].get(k) for k in ("dataset", "rounds", "count_timed", "gnnscale_rev")}),
             rs) for (_, model), rs in groups.items()]


def _rev(r: dict[str, Any]) -> str:
    return str(r.get("gnnscale_rev") or "").removesuffix("-dirty")


def render(records: list[dict[str, Any]]) -> str:
    """The latest commit's runs, the latest per (dataset, model, rounds, --count-timed); the latest breakdown."""
    runs = [r for r in records if r.get("kind") == "run"]
    last = _rev(runs[-1]) if runs else None
    latest: dict[tuple[Any, ...], tuple[dict[str, Any], list[dict[str, Any]]]] = {}
    for s, rs in summaries([r for r in runs if _rev(r) == last]):
        latest[(s["dataset"], s["model"], s["rounds"], s["count_timed"])] = (s, rs)
    rows, shown = [], []
    for (spec, model, rounds, counted), (s, rs) in latest.items():
        med, per = s["median_epoch_s"], s["per_round_ratios"]
        rows.append([f"`{spec}`", model + (" (`--count-timed`)" if counted else ""), rounds,
                     fmt(med.get("inmemory")), fmt(med.get("offload")), fmt(s["ratio"], ".2f"),
                     f"{min(per):.2f}-{max(per):.2f}" if per else "-", fmt(s["loss_max_abs_diff"], ".1e")])
        shown += rs
    head = ["graph", "model", "rounds", "inmemory (s)", "offload, 8 chunks (s)", "offload / inmemory", "per round",
            "losses, max abs diff"]
    text = (f"{provenance(shown)}\n\nA PyG GraphConv stack (and GAT, the generic `PyGConv` path) under offload "
            f"with 8 chunks against in-memory (bound {BOUND}x for GraphConv), median over every timed epoch of "
            "every round; the latest commit's runs, the latest per graph, model, rounds and `--count-timed`.\n\n"
            f"{table(head, rows)}\n")
    return text + _render_breakdown(records)


def _breakdowns(records: list[dict[str, Any]]) -> tuple[dict[tuple[str, str], dict[str, float]], list[dict]]:
    """The latest profiler breakdown per (model, engine): records of ``"kind": "breakdown"``, or before the
    harness a summary's ``breakdown_ms_per_epoch``."""
    out: dict[tuple[str, str], dict[str, float]] = {}
    src: dict[tuple[str, str], dict[str, Any]] = {}
    for r in records:
        if r.get("kind") == "breakdown":
            out[(r["model"], r["engine"])], src[(r["model"], r["engine"])] = r["breakdown_ms_per_epoch"], r
        elif r.get("kind") == "summary" and r.get("breakdown_ms_per_epoch"):
            for e, parts in r["breakdown_ms_per_epoch"].items():
                out[(r["model"], e)], src[(r["model"], e)] = parts, r
    return out, list({id(r): r for r in src.values()}.values())


def _render_breakdown(records: list[dict[str, Any]]) -> str:
    parts, src = _breakdowns(records)
    if not parts:
        return ""
    rows = []
    for model in dict.fromkeys(m for m, _ in parts):
        mem, off = parts.get((model, "inmemory"), {}), parts.get((model, "offload"), {})
        cats = [k for k in dict.fromkeys([*mem, *off]) if k != "wall"] + ["wall"]
        rows += [[model, c, fmt(mem.get(c), ".1f"), fmt(off.get(c), ".1f"),
                  fmt(off[c] - mem[c] if c in mem and c in off else None, "+.0f")] for c in cats]
    return (f"\nWhere the time goes (`--breakdown`, the latest: ops' self time per epoch under torch.profiler, "
            f"3 epochs).\n\n{provenance(src)}\n\n"
            f"{table(['model', 'ms per epoch', 'inmemory', 'offload', 'difference'], rows)}\n")


def headline(records: list[dict[str, Any]]) -> list[Row]:
    """The GraphConv stack's ratio from its latest run (on the default graph, without ``--count-timed``, if any)."""
    conv = [(s, rs) for s, rs in summaries(records) if s["model"] == "graphconv" and s["ratio"] is not None]
    best = [x for x in conv if x[0]["dataset"] == DEFAULT_DATASET and not x[0]["count_timed"]] or conv
    if not best:
        return []
    s, rs = best[-1]
    return [Row("your own model (PyG GraphConv) under offload: equal to in-memory, epoch time ratio",
                f"{s['ratio']:.2f}x in-memory's epoch, losses within {fmt(s['loss_max_abs_diff'], '.1e')} "
                f"(`{s['dataset']}`, {s['rounds']} rounds)", tuple(rs))]
