"""gnnscale's in-memory engine vs the same model in PyG: same graph, same device, one run.

    .venv/bin/python benchmarks/inmemory_vs_pyg.py --device cpu --threads 1 --rounds 3
    .venv/bin/python benchmarks/inmemory_vs_pyg.py --nodes 20000 --epochs 3 --no-save
    .venv/bin/python benchmarks/inmemory_vs_pyg.py --models gcn,sage,gat --device cuda --out /tmp/b.jsonl

Cases (one per model, on a seeded CSBM graph) x implementations: gnnscale-inmemory, pyg (edge_index) and, for
GCN, pyg-sparse (``adj_t`` from ``ToSparseTensor``). Each runs ``--warmup`` untimed then ``--epochs`` timed
epochs; the table gives median epoch time and ``pyg_time / ours_time`` (> 1: gnnscale is faster). ``--threads``
sets torch's intra-op threads (default: torch's choice); ``--rounds R`` repeats every case R times, interleaved
(round 1 of every model and implementation, then round 2, ...), and ends with the median and range over the rounds
of each implementation's median epoch and ratio. One JSON line per (round, case, implementation) is appended to
benchmarks/results/inmemory_vs_pyg.jsonl, with ``threads``, ``round`` and ``rounds``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import gc
import json
import os
import platform
import random
import statistics
import subprocess
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

from gnnscale.engines import InMemoryEngine
from gnnscale.engines.devices import resolve_device
from gnnscale.graph.generators import csbm
from gnnscale.graph.graph import Graph
from gnnscale.nn import build_model
from gnnscale.train import TrainConfig

Step = Callable[[int], float]  # one training epoch -> loss
OURS = "gnnscale-inmemory"
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "inmemory_vs_pyg.jsonl"
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


def _vm_bytes(key: str) -> int | None:
    """``VmRSS`` / ``VmHWM`` of this process from /proc/self/status (Linux), else None."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return None


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
    """Median epoch time and peak memory of one implementation, or ``skipped`` when a baseline cannot run."""
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
    except Exception as exc:
        if name == OURS:
            raise
        print(f"note: skipping {name} for {cfg.model}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return {"impl": name, "skipped": f"{type(exc).__name__}: {exc}"}
    finally:
        del step
        free_memory(dev)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None  # > cores: timings are contended
    return {"impl": name, "median_epoch_s": statistics.median(times), "epoch_times_s": times,
            "peak_bytes": peak, "peak_kind": kind, "loadavg_1m": load}


def environment(dev: torch.device) -> dict[str, Any]:
    """What the numbers depend on: date, device, torch/PyG versions and the gnnscale git revision."""
    name = (torch.cuda.get_device_name(dev) if dev.type == "cuda" else
            f"{platform.processor() or 'cpu'} ({os.cpu_count()} cores, {torch.get_num_threads()} threads)")
    rev = None
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        cmd = ["git", "-C", str(Path(__file__).resolve().parent), "describe", "--always", "--dirty"]
        rev = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()
    return {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "device": str(dev),
            "device_name": name, "torch": torch.__version__, "pyg": torch_geometric.__version__,
            "gnnscale_rev": rev}


def summarize(records: list[dict[str, Any]]) -> None:
    """Per (model, implementation): the median and range over the rounds of its median epoch and of its ratio."""
    rounds, threads = max((r["round"] for r in records), default=0), records[0]["threads"] if records else "-"
    print(f"\nover {rounds} round(s), {threads} thread(s): median [min - max] of the rounds")
    for key in dict.fromkeys((r["model"], r["impl"]) for r in records):
        rs = [r for r in records if (r["model"], r["impl"]) == key]
        t, q = [r["median_epoch_s"] for r in rs], [r["ratio_vs_ours"] for r in rs]
        peak = max((r["peak_bytes"] or 0) for r in rs) / 2**20
        print(f"  {key[0]:<5}{key[1]:<20} epoch {statistics.median(t):.3f} s [{min(t):.3f} - {max(t):.3f}]  "
              f"pyg/ours {statistics.median(q):.2f} [{min(q):.2f} - {max(q):.2f}]  peak <= {peak:.0f} MiB")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="gcn,sage", help="comma-separated subset of gcn,sage,gat")
    ap.add_argument("--nodes", type=int, default=200_000)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda or cuda:N")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON Lines file to append to")
    ap.add_argument("--no-save", action="store_true", help="print the table only")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    ap.add_argument("--rounds", type=int, default=1, help="interleaved repetitions of every case")
    args = ap.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    dev = resolve_device(args.device)
    g = csbm(nodes=args.nodes, classes=5, avg_degree=10, features=128, seed=args.seed)  # one graph for all
    common = environment(dev)
    print(f"{g!r} on {common['device_name']}; torch {torch.__version__}, PyG {torch_geometric.__version__}, "
          f"gnnscale {common['gnnscale_rev']}")
    print(f"warmup {args.warmup}, timed {args.epochs}; ratio = impl_time / {OURS}_time (> 1: ours faster); "
          f"pyg-sparse adj_t: {SPARSE_ADJ}")
    records: list[dict[str, Any]] = []
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for rnd, model in [(r, m) for r in range(1, args.rounds + 1) for m in models]:
        cfg = TrainConfig(model=model, hidden=64, layers=2, dropout=0.5, epochs=args.epochs, seed=args.seed)
        case = {"model": model, "graph": "csbm", "nodes": g.num_nodes, "edges": g.num_edges, "avg_degree": 10,
                "features": g.num_features, "classes": g.num_classes, "hidden": cfg.hidden,
                "layers": cfg.layers, "dropout": cfg.dropout, "heads": cfg.heads, "warmup": args.warmup,
                "epochs": args.epochs, "seed": args.seed, "threads": torch.get_num_threads(), "round": rnd,
                "rounds": args.rounds}
        impls = [OURS, "pyg"] + (["pyg-sparse"] if model == "gcn" else [])
        rows = [bench(name, g, cfg, dev, args.warmup) for name in impls]
        print(f"\nround {rnd}/{args.rounds}, {model}: nodes={g.num_nodes} edges={g.num_edges} "
              f"features={g.num_features} hidden={cfg.hidden} layers={cfg.layers}  [peak = {rows[0]['peak_kind']}]")
        print(f"  {'impl':<20}{'median epoch (s)':>18}{'peak (MiB)':>12}{'pyg/ours':>10}{'load 1m':>9}")
        for r in rows:
            if "skipped" in r:
                print(f"  {r['impl']:<20}skipped: {r['skipped']}")
                continue
            r["ratio_vs_ours"] = r["median_epoch_s"] / rows[0]["median_epoch_s"]
            peak = "n/a" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**20:.1f}"
            print(f"  {r['impl']:<20}{r['median_epoch_s']:>18.4f}{peak:>12}{r['ratio_vs_ours']:>10.2f}"
                  f"{r['loadavg_1m'] or float('nan'):>9.1f}")
            records.append({**common, **case, **r})
    summarize(records)
    if not args.no_save and records:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("a") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
        print(f"\nappended {len(records)} records to {args.out}")


if __name__ == "__main__":
    main()
