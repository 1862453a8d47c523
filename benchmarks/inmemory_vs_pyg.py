"""gnnscale's in-memory engine vs the same model in PyG (issue #2): same graph, same device, one thread.

    python -m benchmarks inmemory_vs_pyg                       # 200K-vertex csbm, GCN and SAGE, 3 rounds
    python -m benchmarks inmemory_vs_pyg --quick               # 20K vertices, 3 epochs, 1 round
    python -m benchmarks inmemory_vs_pyg --models gcn,sage,gat --device cuda

Cases: one per (model, implementation), the implementations of a model a group (the harness runs them back to
back in an order that rotates per round, each in its own process): gnnscale-inmemory, pyg (edge_index) and, for
GCN, pyg-sparse (``adj_t`` from ``ToSparseTensor``), all on the same seeded csbm graph (each process builds it).
Each runs ``--warmup`` untimed then ``--epochs`` timed epochs; one record per run with the median epoch time and
the peak memory (CPU: the increase of the process's peak RSS over its baseline; CUDA: ``max_memory_allocated``).
The table gives, per model and implementation, the median and range over rounds of the median epoch and of
``pyg_time / ours_time`` within each round (> 1: gnnscale is faster).

The helpers ``PygNet``, ``make_pyg``, ``SPARSE_ADJ``, ``free_memory``, ``start_peak``, ``end_peak`` and ``sync``
are shared with :mod:`benchmarks.offload` and :mod:`benchmarks._peers_workers`.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import torch_geometric
import torch_geometric.typing
from torch import Tensor, nn
from torch_geometric.nn import GATConv, GCNConv, SAGEConv
from torch_geometric.transforms import ToSparseTensor

from benchmarks._peers_workers import _vm as _vm_bytes
from benchmarks.harness import Case, latest_session, split_list
from benchmarks.harness.graphs import device_name
from benchmarks.harness.records import provenance, session_of, table
from gnnscale.engines import InMemoryEngine
from gnnscale.engines.core.devices import resolve_device
from gnnscale.graph.generators import csbm
from gnnscale.graph.graph import Graph
from gnnscale.nn import build_model
from gnnscale.train import TrainConfig

Step = Callable[[int], float]  # one training epoch -> loss
OURS = "gnnscale-inmemory"
TITLE = "In-memory engine vs PyG (issue #2)"
SPARSE_ADJ = "torch_sparse.SparseTensor" if torch_geometric.typing.WITH_TORCH_SPARSE else "torch.sparse_csr"


class PygNet(nn.Module):
    """The plain PyG model: dropout before every layer (input included), ReLU (ELU for GAT) between layers."""

    def __init__(self, cfg: TrainConfig, in_features: int, num_classes: int):
        super().__init__()
        dims = [in_features] + [cfg.hidden] * (cfg.layers - 1) + [num_classes]
        heads = [cfg.heads] * (cfg.layers - 1) + [1]  # GAT: concatenated hidden heads, one output head
        make: dict[str, Callable[[int, int, int], nn.Module]] = {
            "gcn": lambda i, d_in, d_out: GCNConv(d_in, d_out, cached=True),
            "sage": lambda i, d_in, d_out: SAGEConv(d_in, d_out, aggr="mean"),
            "gat": lambda i, d_in, d_out: GATConv(d_in, d_out // heads[i], heads=heads[i]),
        }
        if cfg.model not in make:
            raise ValueError(f"no PyG baseline for {cfg.model!r}")
        self.convs = nn.ModuleList(make[cfg.model](i, dims[i], dims[i + 1]) for i in range(cfg.layers))
        self.p = cfg.dropout
        self.act: Callable[[Tensor], Tensor] = F.elu if cfg.model == "gat" else F.relu

    def forward(self, x: Tensor, adj: Any) -> Tensor:
        for i, conv in enumerate(self.convs):
            x = conv(F.dropout(self.act(x) if i else x, self.p, self.training), adj)
        return x


def make_ours(g: Graph, cfg: TrainConfig, dev: torch.device) -> Step:
    assert g.num_classes is not None
    model = build_model(cfg.model, g.num_features, cfg.hidden, g.num_classes, layers=cfg.layers,
                        dropout=cfg.dropout, heads=cfg.heads, seed=cfg.seed)
    engine = InMemoryEngine(g, model, cfg, dev)
    return lambda epoch: engine.train_epoch(epoch)["loss"]


def make_pyg(g: Graph, cfg: TrainConfig, dev: torch.device, sparse: bool = False) -> Step:
    assert g.num_classes is not None
    data = g.to_pyg()
    if sparse:
        data = ToSparseTensor()(data)  # adj_t: SPARSE_ADJ
    data = data.to(dev)
    adj = data.adj_t if sparse else data.edge_index
    torch.manual_seed(cfg.seed)
    model = PygNet(cfg, g.num_features, g.num_classes).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)

    def step(epoch: int) -> float:
        model.train()
        opt.zero_grad(set_to_none=True)
        out = model(data.x, adj)
        loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
        loss.backward()
        opt.step()
        return float(loss.detach())  # the same host sync as the engine's train_epoch

    return step


IMPLS: dict[str, Callable[[Graph, TrainConfig, torch.device], Step]] = {
    OURS: make_ours,
    "pyg": make_pyg,
    "pyg-sparse": lambda g, cfg, dev: make_pyg(g, cfg, dev, sparse=True),
}


def free_memory(dev: torch.device) -> None:
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    elif sys.platform.startswith("linux"):  # give freed heap back to the OS: fair RSS baseline for next impl
        with contextlib.suppress(OSError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)


def start_peak(dev: torch.device) -> tuple[str, int]:
    """Reset the peak counter; return (what peak_bytes means, baseline bytes)."""
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
        return "cuda max_memory_allocated", 0
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")  # Linux >= 4.0: resets VmHWM (peak RSS) to current RSS
        return "cpu peak RSS increase over baseline (VmHWM after reset)", _vm_bytes("VmRSS") or 0
    return "none (cannot reset peak RSS here)", 0


def end_peak(dev: torch.device, kind: str, base: int) -> int | None:
    if dev.type == "cuda":
        return int(torch.cuda.max_memory_allocated(dev))
    hwm = _vm_bytes("VmHWM") if "VmHWM" in kind else None
    return None if hwm is None else max(0, hwm - base)


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def bench(name: str, g: Graph, cfg: TrainConfig, dev: torch.device, warmup: int) -> dict[str, Any]:
    """Median epoch time and peak memory of one implementation (a baseline that cannot run raises: the harness
    records the error)."""
    free_memory(dev)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)  # seeds CUDA devices too
    kind, base = start_peak(dev)
    step: Step | None = None
    times: list[float] = []
    try:
        step = IMPLS[name](g, cfg, dev)
        for e in range(1, warmup + cfg.epochs + 1):
            sync(dev)
            t0 = time.perf_counter()
            step(e)
            sync(dev)
            if e > warmup:
                times.append(time.perf_counter() - t0)
        peak = end_peak(dev, kind, base)
    finally:
        del step
        free_memory(dev)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None  # > cores: timings are contended
    return {"impl": name, "median_epoch_s": statistics.median(times), "epoch_times_s": times,
            "peak_bytes": peak, "peak_kind": kind, "loadavg_1m": load}




LABELS = {("gcn", "pyg"): "PyG `GCNConv(cached=True)`, edge_index",
          ("gcn", "pyg-sparse"): "PyG `GCNConv`, sparse CSR `adj_t`",
          ("sage", "pyg"): 'PyG `SAGEConv(aggr="mean")`, edge_index', ("gat", "pyg"): "PyG `GATConv`, edge_index"}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--models", default="gcn,sage", help="comma-separated subset of gcn,sage,gat")
    ap.add_argument("--nodes", type=int, default=None, help="csbm vertices (default 200000; --quick 20000)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed epochs (default 2; --quick 1)")
    ap.add_argument("--epochs", type=int, default=None, help="timed epochs (default 10; --quick 3)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda or cuda:N")


def cases(args: argparse.Namespace) -> list[Case]:
    """Per model: gnnscale's in-memory engine, PyG on edge_index and (GCN) PyG on ``adj_t``, one group."""
    common = {"nodes": args.nodes or (20_000 if args.quick else 200_000),
              "warmup": args.warmup if args.warmup is not None else 1 if args.quick else 2,
              "epochs": args.epochs or (3 if args.quick else 10), "seed": args.seed, "device": args.device}
    return [Case(f"{model}:{impl}", {**common, "model": model, "impl": impl}, group=model)
            for model in split_list(args.models) for impl in [OURS, "pyg"] + (["pyg-sparse"] if model == "gcn" else [])]


def run(params: dict[str, Any]) -> dict[str, Any]:
    """One implementation of one model on the seeded csbm graph."""
    dev = resolve_device(params["device"])
    g = csbm(nodes=params["nodes"], classes=5, avg_degree=10, features=128, seed=params["seed"])
    cfg = TrainConfig(model=params["model"], hidden=64, layers=2, dropout=0.5, epochs=params["epochs"],
                      seed=params["seed"])
    case = {"model": cfg.model, "graph": "csbm", "nodes": g.num_nodes, "edges": g.num_edges, "avg_degree": 10,
            "features": g.num_features, "classes": g.num_classes, "hidden": cfg.hidden, "layers": cfg.layers,
            "dropout": cfg.dropout, "heads": cfg.heads, "warmup": params["warmup"], "epochs": cfg.epochs,
            "seed": cfg.seed, "threads": torch.get_num_threads(), "device": str(dev),
            "device_name": device_name(str(dev)), "pyg": torch_geometric.__version__}
    return {**case, **bench(params["impl"], g, cfg, dev, params["warmup"])}


def describe(r: dict[str, Any]) -> str:
    return f"{r['model']} {r['impl']}: median epoch {r['median_epoch_s']:.3f} s"


def ratios(recs: list[dict[str, Any]]) -> dict[int, float]:
    """Each record's ``median_epoch_s`` over gnnscale's in the same run, round and model (by record index)."""
    ours = {(session_of(r), r.get("round"), r["model"]): r["median_epoch_s"] for r in recs if r["impl"] == OURS}
    return {i: r["median_epoch_s"] / ours[k] for i, r in enumerate(recs)
            if (k := (session_of(r), r.get("round"), r["model"])) in ours}


def render(records: list[dict[str, Any]]) -> str:
    """The latest run: per model and implementation, the median epoch over the rounds, each round's, the largest
    peak and the ratio to gnnscale within each round."""
    recs = latest_session(records, lambda r: r.get("median_epoch_s") is not None and r.get("ok", True))
    if not recs:
        return "No records.\n"
    q = ratios(recs)
    rounds = len({r.get("round") for r in recs})
    rows = []
    for model, impl in dict.fromkeys((r["model"], r["impl"]) for r in recs):
        idx = [i for i, r in enumerate(recs) if (r["model"], r["impl"]) == (model, impl)]
        t = [recs[i]["median_epoch_s"] for i in idx]
        qs = [q[i] for i in idx if i in q]
        peak = max((recs[i].get("peak_bytes") or 0) for i in idx)
        ratio = "1.00" if impl == OURS else "-" if not qs else (
            f"**{statistics.median(qs):.2f}** [{min(qs):.2f} - {max(qs):.2f}]")
        label = "gnnscale inmemory" if impl == OURS else LABELS.get((model, impl), impl)
        rows.append([model.upper(), label, f"{statistics.median(t):.3f}",
                     ", ".join(f"{x:.3f}" for x in t), f"{peak / 2**20:.0f}", ratio])
    r0 = recs[0]
    load = [r["loadavg_1m"] for r in recs if r.get("loadavg_1m") is not None]
    head = ["model", "implementation", f"median epoch (s), {rounds} rounds", "per round (s)", "peak (MiB), max",
            "pyg / ours, median [range]"]
    return (f"{provenance(recs).rstrip()}\n\nGraph: csbm, {r0['nodes']:,} nodes, {r0['edges']:,} directed edges, "
            f"{r0['features']} features, {r0['classes']} classes; model {r0['layers']} layers, hidden "
            f"{r0['hidden']}, dropout {r0['dropout']}, Adam; {r0['threads']} thread(s). Per round and implementation "
            f"{r0['warmup']} warm-up epochs, then the median of {r0['epochs']} timed full-graph epochs; peak: "
            f"{r0['peak_kind']}; 1-minute load average {min(load, default=0):.1f}-{max(load, default=0):.1f}. "
            f"Figures: the median over the rounds; pyg / ours > 1: gnnscale is faster.\n\n{table(head, rows)}\n")
