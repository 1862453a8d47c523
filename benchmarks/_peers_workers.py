"""The case code of ``python -m benchmarks peers``: one run of one system on one workload, and the data set-up.

Not a benchmark itself (hence the leading underscore): :mod:`benchmarks.peers` declares the cases and the harness
runs each in its own process, calling :func:`run` here with the case's parameters (``system``, ``kind``, ``model``,
``data``, ``epochs``, ``warmup``, ``repeats``, ``chunks``, ``host_allocator``). Systems: ``gnnscale`` (its in-memory
engine; ``kind`` ``minibatch``: its mini-batch engine), ``gnnscale-offload`` (the offload engine, ``chunks``
chunks), ``pyg`` (PyG's layers on a sparse CSR ``adj_t``, GAT on ``edge_index``) and ``dgl`` / ``dgl-retain``
(DGL's ``GraphConv`` / ``SAGEConv`` / ``GATConv``; ``dgl-retain`` is DGL with glibc's tunables set by its case's
environment). The DGL cases run in DGL's own venv (torch 2.2.1, no gnnscale dependencies): this module imports
only numpy and torch at the top, and gnnscale, PyG and DGL inside the functions that use them.

Every system trains the same model (2 layers, hidden 64, GAT with 4 hidden heads, dropout 0.5 before each layer,
ReLU / ELU between layers; Adam lr 0.01, weight decay 5e-4) from the same initial weights (``weights-<model>.npz``,
gnnscale's initialisation, parameter names mapped to each peer's) on the same arrays (:func:`prepare`: plain
``.npy`` files of the in-neighbour CSR, features, labels and masks). One torch thread (the harness's); the
mini-batch workload also pins the process to one core. The record: epoch times, accuracy, peak memory.

Memory: ``peak_rss_bytes`` is the process's ``VmHWM`` at the end (data, library and training together);
``train_peak_bytes`` is the peak over the resident size after set-up (``VmHWM`` reset through ``clear_refs``);
``epoch_peak_rss_bytes`` and ``epoch_minor_faults``: ``VmHWM`` after each epoch and the minor page faults within
it (how a retained heap grows, and what glibc's default costs instead). ``host_allocator`` (gnnscale only) sets
gnnscale's ``--host-allocator``, default ``auto`` as a user gets it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

ARRAYS = ("indptr", "indices", "x", "y", "train_mask", "val_mask", "test_mask")
HIDDEN, LAYERS, HEADS, DROPOUT, LR, WEIGHT_DECAY, SEED = 64, 2, 4, 0.5, 0.01, 5e-4, 0
FANOUTS = (15, 10)  # neighbours per hop, the seeds' hop first (gnnscale's and PyG's order; DGL takes it reversed)
BATCH = 1024
MODELS = ("gcn", "sage", "gat")
CSBM = {"classes": 5, "avg_degree": 10, "features": 128, "communities": 16, "seed": SEED}

Arrays = dict[str, np.ndarray]


# ------------------------------------------------------------------------------------------------ process state
def _vm(key: str) -> int | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return None


def _minor_faults() -> int:
    """The process's minor page faults so far (pages the kernel mapped and zeroed on first touch)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def reset_peak() -> int | None:
    """Reset ``VmHWM`` to the current resident size (Linux >= 4.0); the resident size, or None if it cannot."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return None
    return _vm("VmRSS")


def load(data: Path) -> tuple[Arrays, dict[str, Any]]:
    return {k: np.load(data / f"{k}.npy") for k in ARRAYS}, json.loads((data / "meta.json").read_text())


def train_seeds(a: Arrays) -> np.ndarray:
    """The training vertices in one fixed shuffled order (the sampling workload's batches, for every system)."""
    return np.random.default_rng(SEED).permutation(np.flatnonzero(a["train_mask"]))


def edge_lists(a: Arrays) -> tuple[Tensor, Tensor]:
    """``(src, dst)`` of every in-edge of the CSR."""
    indptr = torch.from_numpy(a["indptr"])
    dst = torch.repeat_interleave(torch.arange(indptr.numel() - 1), indptr[1:] - indptr[:-1])
    return torch.from_numpy(a["indices"]).long(), dst


def weights(data: Path, model: str, rename: Callable[[str, Tensor], tuple[str, Tensor]]) -> dict[str, Tensor]:
    """gnnscale's initial weights of ``model``, each ``(name, tensor)`` mapped by ``rename``."""
    with np.load(data / f"weights-{model}.npz") as z:
        return dict(rename(k, torch.from_numpy(z[k].copy())) for k in z.files)


def load_weights(net: nn.Module, state: dict[str, Tensor]) -> None:
    """Load ``state``; every one of gnnscale's tensors must land on a parameter of the same shape."""
    missing, unexpected = net.load_state_dict(state, strict=False)
    own = dict(net.named_parameters())
    if unexpected or any(k in own for k in missing):
        raise RuntimeError(f"weights do not map: missing {missing}, unexpected {unexpected}")


def accuracy(logits: Tensor, y: Tensor, mask: Tensor) -> float:
    return float((logits[mask].argmax(-1) == y[mask]).float().mean())


# ------------------------------------------------------------------------------------------------ gnnscale and PyG
def _graph(a: Arrays, meta: dict[str, Any]) -> Any:
    from gnnscale.graph.graph import Graph

    t = {k: torch.from_numpy(v) for k, v in a.items()}
    return Graph(indptr=t["indptr"], indices=t["indices"], x=t["x"], y=t["y"], train_mask=t["train_mask"],
                 val_mask=t["val_mask"], test_mask=t["test_mask"], num_classes=meta["classes"], name="csbm")


def _config(model: str, epochs: int, **kw: Any) -> Any:
    from gnnscale.train import TrainConfig

    return TrainConfig(model=model, hidden=HIDDEN, layers=LAYERS, heads=HEADS, dropout=DROPOUT, lr=LR,
                       weight_decay=WEIGHT_DECAY, epochs=epochs, seed=SEED, **kw)


def gnnscale_run(a: Arrays, meta: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """gnnscale's engine for the workload: in-memory (full), offload with ``--chunks`` or mini-batch."""
    from gnnscale.engines import select_engine
    from gnnscale.nn import build_model

    g = _graph(a, meta)
    kw: dict[str, Any] = {"engine": "inmemory", "host_allocator": args.host_allocator}
    if args.system == "gnnscale-offload":
        kw = {**kw, "engine": "offload", "chunks": args.chunks}
    elif args.workload == "minibatch":
        kw = {**kw, "engine": "minibatch", "batch_size": BATCH, "fanouts": FANOUTS}
    cfg = _config(args.model, args.epochs, **kw)
    dev = torch.device("cpu")
    engine_cls, _ = select_engine(g, cfg, dev)
    model = build_model(cfg.model, g.num_features, cfg.hidden, g.num_classes, layers=cfg.layers,
                        dropout=cfg.dropout, heads=cfg.heads, seed=cfg.seed)
    engine = engine_cls(g, model, cfg, dev)
    if getattr(engine, "counter", None) is not None:  # the offload engine's live-bytes counter: Python on every op
        engine.counter = None

    def step(epoch: int) -> tuple[float, int]:
        s = engine.train_epoch(epoch)
        return float(s["loss"]), int(s.get("sampled_edges", 0))

    def evaluate() -> dict[str, float | None]:
        r = engine.evaluate()
        return {"val_acc": r.get("val_acc"), "test_acc": r.get("test_acc")}

    what = engine.describe()
    return {"step": step, "evaluate": evaluate, "detail": engine_cls.__name__ + (f": {what}" if what else "")}


def pyg_run(a: Arrays, meta: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """:mod:`benchmarks.inmemory_vs_pyg`'s ``PygNet`` with gnnscale's initial weights; GCN and SAGE on ``adj_t``
    (``ToSparseTensor``), GAT on ``edge_index``."""
    from torch_geometric.transforms import ToSparseTensor

    from benchmarks.inmemory_vs_pyg import SPARSE_ADJ, PygNet

    g = _graph(a, meta)
    data = g.to_pyg()
    sparse = args.model != "gat"
    if sparse:
        data = ToSparseTensor()(data)
    adj = data.adj_t if sparse else data.edge_index
    net = PygNet(_config(args.model, args.epochs), g.num_features, meta["classes"])
    load_weights(net, weights(args.data, args.model, lambda k, t: (k.replace("layers.", "convs.", 1), t)))
    opt = torch.optim.Adam(net.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    train = data.train_mask

    def step(epoch: int) -> tuple[float, int]:
        net.train()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(data.x, adj)[train], data.y[train])
        loss.backward()
        opt.step()
        return float(loss.detach()), 0

    @torch.no_grad()
    def evaluate() -> dict[str, float | None]:
        net.eval()
        out = net(data.x, adj)
        return {"val_acc": accuracy(out, data.y, data.val_mask), "test_acc": accuracy(out, data.y, data.test_mask)}

    what = f"adj_t ({SPARSE_ADJ})" if sparse else "edge_index"
    return {"step": step, "evaluate": evaluate, "detail": f"PyG on {what}"}


def gnnscale_sampler(a: Arrays, meta: dict[str, Any]) -> tuple[Callable[[Tensor, int], int], str]:
    """gnnscale's ``sample_blocks`` on the SAGE adjacency (:mod:`benchmarks.minibatch`'s ``sample_ours``)."""
    from benchmarks.minibatch import sample_ours
    from gnnscale.graph.block import normalized_csr
    from gnnscale.nn import build_model
    from gnnscale.sample import CSRTopology, sample_key

    g = _graph(a, meta)
    model = build_model("sage", g.num_features, 8, meta["classes"], layers=LAYERS, dropout=0.0, heads=1, seed=0)
    topo = CSRTopology(*normalized_csr(g, model.adjacency))

    def run(seeds: Tensor, rnd: int) -> int:
        blocks, _ = sample_ours(topo, seeds, FANOUTS, sample_key(SEED, rnd))
        return sum(b.num_edges for b in blocks)

    return run, "gnnscale sample_blocks (keyed positions, then fetch)"


def pyg_sampler(a: Arrays, meta: dict[str, Any]) -> tuple[Callable[[Tensor, int], int], str]:
    """:mod:`benchmarks.minibatch`'s ``pyg_sampler`` (PyG's NeighborSampler; needs pyg_lib or torch_sparse)."""
    from benchmarks.minibatch import pyg_sampler as make
    from gnnscale.sample import CSRTopology

    fn, note = make(CSRTopology(torch.from_numpy(a["indptr"]), torch.from_numpy(a["indices"]), None), FANOUTS)
    if fn is None:
        raise RuntimeError(note)
    return (lambda seeds, rnd: fn(seeds)), note


# ------------------------------------------------------------------------------------------------ DGL
class DglNet(nn.Module):
    """The same model with DGL's layers; on the whole graph (``forward(g, x)``) or on sampled blocks."""

    def __init__(self, model: str, in_features: int, classes: int):
        super().__init__()
        from dgl.nn import GATConv, GraphConv, SAGEConv

        dims = [in_features] + [HIDDEN] * (LAYERS - 1) + [classes]
        heads = [HEADS] * (LAYERS - 1) + [1]
        make: dict[str, Callable[[int], nn.Module]] = {
            "gcn": lambda i: GraphConv(dims[i], dims[i + 1], norm="both"),
            "sage": lambda i: SAGEConv(dims[i], dims[i + 1], "mean"),
            "gat": lambda i: GATConv(dims[i], dims[i + 1] // heads[i], num_heads=heads[i]),
        }
        self.convs = nn.ModuleList(make[model](i) for i in range(LAYERS))
        self.act: Callable[[Tensor], Tensor] = F.elu if model == "gat" else F.relu

    def forward(self, graphs: Any, x: Tensor) -> Tensor:
        for i, conv in enumerate(self.convs):
            g = graphs[i] if isinstance(graphs, list) else graphs
            x = conv(g, F.dropout(self.act(x) if i else x, DROPOUT, self.training))
            x = x.flatten(1)  # GAT: heads concatenated
        return x


def dgl_name(model: str, key: str, t: Tensor) -> tuple[str, Tensor]:
    """gnnscale's parameter names (PyG's) -> DGL's; GraphConv keeps ``W`` as ``[in, out]``."""
    layer, _, name = key.partition(".")[2].partition(".")
    if model == "gcn" and name == "lin.weight":
        return f"convs.{layer}.weight", t.t().contiguous()
    table = {"lin.weight": "fc.weight", "lin_l.weight": "fc_neigh.weight", "lin_l.bias": "fc_self.bias",
             "lin_r.weight": "fc_self.weight", "att_src": "attn_l", "att_dst": "attn_r", "bias": "bias"}
    return f"convs.{layer}.{table[name]}", t


def dgl_graph(a: Arrays, loops: bool) -> Any:
    import dgl

    src, dst = edge_lists(a)
    g = dgl.graph((src, dst), num_nodes=len(a["indptr"]) - 1)
    return dgl.add_self_loop(dgl.remove_self_loop(g)) if loops else g


def dgl_run(a: Arrays, meta: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    import dgl

    g = dgl_graph(a, loops=args.model != "sage")
    x, y = torch.from_numpy(a["x"]), torch.from_numpy(a["y"])
    masks = {k: torch.from_numpy(a[k]) for k in ("train_mask", "val_mask", "test_mask")}
    net = DglNet(args.model, x.shape[1], meta["classes"])
    load_weights(net, weights(args.data, args.model, lambda k, t: dgl_name(args.model, k, t)))
    opt = torch.optim.Adam(net.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    train = masks["train_mask"]

    def full_step(epoch: int) -> tuple[float, int]:
        net.train()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(g, x)[train], y[train])
        loss.backward()
        opt.step()
        return float(loss.detach()), 0

    loader = None
    if args.workload == "minibatch":
        sampler = dgl.dataloading.NeighborSampler(list(reversed(FANOUTS)))  # DGL: the input layer's fanout first
        loader = dgl.dataloading.DataLoader(g, torch.nonzero(train).view(-1), sampler, batch_size=BATCH,
                                            shuffle=True, drop_last=False, num_workers=0)

    def batch_step(epoch: int) -> tuple[float, int]:
        net.train()
        total, edges = 0.0, 0
        for _, out_nodes, blocks in loader:
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(net(blocks, x[blocks[0].srcdata[dgl.NID]]), y[out_nodes])
            loss.backward()
            opt.step()
            total += float(loss.detach())
            edges += sum(int(b.num_edges()) for b in blocks)
        return total / max(len(loader), 1), edges

    @torch.no_grad()
    def evaluate() -> dict[str, float | None]:
        net.eval()
        out = net(g, x)
        return {"val_acc": accuracy(out, y, masks["val_mask"]), "test_acc": accuracy(out, y, masks["test_mask"])}

    what = "NeighborSampler + DataLoader (num_workers=0)" if loader else "full graph"
    return {"step": batch_step if loader else full_step, "evaluate": evaluate, "detail": f"DGL {what}"}


def dgl_sampler(a: Arrays, meta: dict[str, Any]) -> tuple[Callable[[Tensor, int], int], str]:
    import dgl

    g = dgl_graph(a, loops=False)
    sampler = dgl.dataloading.NeighborSampler(list(reversed(FANOUTS)))

    def run(seeds: Tensor, rnd: int) -> int:
        _, _, blocks = sampler.sample(g, seeds)
        return sum(int(b.num_edges()) for b in blocks)

    return run, "DGL NeighborSampler.sample"


# ------------------------------------------------------------------------------------------------ drivers
RUNNERS = {"gnnscale": gnnscale_run, "gnnscale-offload": gnnscale_run, "pyg": pyg_run, "dgl": dgl_run}
SAMPLERS = {"gnnscale": gnnscale_sampler, "pyg": pyg_sampler, "dgl": dgl_sampler}


def train_workload(a: Arrays, meta: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """``--epochs`` epochs (the first ``--warmup`` not timed for the median), then accuracy."""
    t0 = time.perf_counter()
    run = RUNNERS[args.system](a, meta, args)
    setup_s = time.perf_counter() - t0
    base = reset_peak()
    times, losses, edges, peaks, faults = [], [], [], [], []
    for e in range(1, args.epochs + 1):
        t0, f0 = time.perf_counter(), _minor_faults()
        loss, n = run["step"](e)
        times.append(time.perf_counter() - t0)
        peaks.append(_vm("VmHWM"))
        faults.append(_minor_faults() - f0)
        losses.append(loss)
        edges.append(n)
    acc = run["evaluate"]()
    timed = times[args.warmup:]
    out = {"setup_s": setup_s, "epoch_times_s": timed, "warmup_times_s": times[: args.warmup], "losses": losses,
           "median_s": float(np.median(timed)), **acc, "detail": run["detail"], "rss_after_setup_bytes": base,
           "epoch_peak_rss_bytes": peaks, "epoch_minor_faults": faults}
    if any(edges):
        out["sampled_edges_per_epoch"] = edges[args.warmup:]
    return out


def sample_workload(a: Arrays, meta: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """One epoch's batches (the shuffled training vertices, ``BATCH`` each) sampled once untimed, then
    ``--repeats`` times timed; the median seconds and sampled edges / s."""
    t0 = time.perf_counter()
    fn, detail = SAMPLERS[args.system](a, meta)
    setup_s = time.perf_counter() - t0
    seeds = torch.from_numpy(train_seeds(a)).long()
    batches = [seeds[i: i + BATCH] for i in range(0, seeds.numel(), BATCH)]
    base = reset_peak()
    times, edges = [], []
    for rnd in range(args.repeats + 1):
        t0 = time.perf_counter()
        n = sum(fn(b, rnd) for b in batches)
        times.append(time.perf_counter() - t0)
        edges.append(n)
    med = float(np.median(times[1:]))
    return {"setup_s": setup_s, "epoch_times_s": times[1:], "warmup_times_s": times[:1], "median_s": med,
            "sampled_edges": edges[-1], "mteps": float(np.median(edges[1:])) / med / 1e6, "batches": len(batches),
            "detail": detail, "rss_after_setup_bytes": base}


def versions(system: str) -> dict[str, str | None]:
    out: dict[str, str | None] = {"torch": torch.__version__}
    if system == "dgl":
        import dgl

        out["dgl"] = dgl.__version__
    else:
        import torch_geometric

        import gnnscale

        out["pyg"], out["gnnscale_file"] = torch_geometric.__version__, gnnscale.__file__
    return out


DEFAULTS = {"model": "sage", "epochs": 5, "warmup": 1, "repeats": 3, "chunks": 8, "host_allocator": "auto"}
CARRIED = ("record", "kind", "system", "reference", "nodes", "notes")
"""The case's parameters its record carries (the harness adds the rest)."""


def run(params: dict[str, Any]) -> dict[str, Any]:
    """One case: ``params`` as :data:`DEFAULTS` names them plus ``system``, ``kind`` and ``data``; an exception is
    the case's error (the harness records it and goes on)."""
    from benchmarks.harness.graphs import device_name
    args = argparse.Namespace(**{**DEFAULTS, **params})
    args.data, args.workload = Path(args.data), args.kind
    args.system = "dgl" if args.system == "dgl-retain" else args.system  # the allocator is in the case's env
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(1)
    if args.workload == "minibatch" and hasattr(os, "sched_setaffinity"):  # "both on one core"
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    torch.manual_seed(SEED)
    np.random.seed(SEED)
    rec: dict[str, Any] = {k: params[k] for k in CARRIED if k in params}
    rec.update(workload=args.workload, model=args.model, device="cpu", device_name=device_name(),
               **versions(args.system))
    a, meta = load(args.data)
    rec.update(nodes=meta["nodes"], edges=meta["edges"])
    work = sample_workload if args.workload == "sampling" else train_workload
    rec.update(work(a, meta, args))
    rec.update(peak_rss_bytes=_vm("VmHWM"), threads=torch.get_num_threads(),
               cpus=sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None)
    base = rec.get("rss_after_setup_bytes")
    rec["train_peak_bytes"] = None if base is None or rec["peak_rss_bytes"] is None else rec["peak_rss_bytes"] - base
    return rec


def prepare(data: Path, nodes: int) -> None:
    """The csbm graph and every model's initial weights as plain arrays in ``data`` (skipped when present)."""
    if (data / "meta.json").exists():
        return
    from gnnscale.graph.generators import csbm
    from gnnscale.nn import build_model

    g = csbm(nodes=nodes, **CSBM)
    tmp = data.with_name(data.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    for k in ARRAYS:
        np.save(tmp / f"{k}.npy", getattr(g, k).numpy())
    for m in MODELS:
        model = build_model(m, g.num_features, HIDDEN, g.num_classes, layers=LAYERS, dropout=DROPOUT, heads=HEADS,
                            seed=SEED)
        np.savez(tmp / f"weights-{m}.npz", **{k: v.detach().numpy() for k, v in model.state_dict().items()})
    meta = {"nodes": g.num_nodes, "edges": g.num_edges, "features": g.num_features, "classes": g.num_classes,
            "spec": "csbm:" + ",".join(f"{k}={v}" for k, v in {"nodes": nodes, **CSBM}.items())}
    (tmp / "meta.json").write_text(json.dumps(meta))
    tmp.rename(data)
