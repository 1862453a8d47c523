"""The mini-batch engine (XGNN store + keyed k-hop sampler): sampler throughput against baselines in the same run,
read amplification, epoch time for 1..k trainers and pipeline stages vs the store's ratios.

    .venv/bin/python benchmarks/minibatch.py --device cpu --threads 1 --hidden 64 --fanouts 15,10 \
        --dataset edgelist:/work/shared/datasets/snap/ego-twitter.txt.gz:symmetrize=1 \
        --gpu-feature-ratio 0.25 --trainers 1,2 --epochs 3 --warmup 1 --repeats 3
    PYTHONPATH=. python3 benchmarks/minibatch.py --device cuda \
        --dataset csbm:nodes=2450000,avg_degree=50,features=100,classes=47 --fanouts 25,10 --batch-size 1024 \
        --gpu-feature-ratio 0.25

(the second is the products-scale GPU target: GraphSAGE, 2 layers, hidden 256, fanouts 25,10, batch 1024, a
quarter of the features on the GPU; goal <= 0.3 s per epoch.) The default ``--dataset`` is ego-twitter, symmetrised
(``symmetrize=1``, explicit: the file lists each undirected edge once), when ``../shared/datasets/snap`` has it.

**Samplers** (``--samplers on``, the default): one epoch's batches (the training vertices, shuffled,
``--batch-size`` seeds each, ``--fanouts``) sampled on an in-memory CSR of the model's adjacency on ``--device``,
every sampler producing the same blocks (relabelled, one per hop) from the same seeds:

* ours, :func:`gnnscale.sample.sample_blocks`: per hop the frontier's degrees, positions drawn by Floyd's algorithm
  keyed by (key, hop, vertex), then only those neighbour entries fetched;
* (a) fetch-all-then-sample: gnnscale's sampler before issue #12, copied from commit feae281 -- the frontier's
  whole neighbour lists fetched, then random keys for every candidate and one segmented sort keep ``fanout``;
* (b) a straightforward vectorised O(fanout) sampler on torch's RNG, fetching only the drawn entries through the
  same store request as ours: Floyd's algorithm with ``torch.rand`` on all rows at once (ours but for the RNG);
  with ``--rejection`` also (b2), rejection: ``fanout`` positions with replacement per row, rows holding a repeat
  redraw the repeated slots until distinct;
* (c) PyG's ``NeighborSampler`` when ``pyg_lib`` or ``torch_sparse`` is installed (CPU only); otherwise a note says
  it was skipped.

Each sampler runs the epoch once untimed, then ``--repeats`` rounds in which the samplers take turns. Per sampler:
median seconds, MTEPS (sampled edges / s / 10^6), read amplification (neighbour entries fetched / sampled edges:
ours and (b) count ``CSRTopology.fetched_entries``, (a) the whole lists it fetched) and our MTEPS over its.

One graph (``--dataset``, any :func:`gnnscale.load_dataset` spec) and one model (``--model``, GraphSAGE by default;
``--layers`` defaults to the number of ``--fanouts``), trained by ``--engine minibatch`` once per
``--gpu-feature-ratio`` value (comma list) at one ``--gpu-graph-ratio``: the hottest (highest out-degree) fraction
of the vertices keep their feature rows / neighbour lists in device memory, the rest in host memory
(:class:`gnnscale.store.GlobalMemoryStore`). Each configuration runs ``--warmup`` untimed, then ``--epochs`` timed
training epochs (``MiniBatchEngine.train_epoch``: every training vertex once as a seed, ``--batch-size`` seeds and
one optimiser step per batch; no evaluation).

Per configuration: the median epoch time (wall clock around ``train_epoch``, device synchronised), the medians of
the engine's ``sample_s`` / ``extract_s`` / ``train_s``, the sampled edges per epoch (every block's edges, all
hops), MTEPS = sampled edges / median epoch time / 10^6 (HyScale-GNN's throughput metric), the store's feature and
graph hit rates (requests answered from device memory), ``h2d_bytes`` (the store's count of bytes read from host
memory onto the device), the batch count and the engine's read amplification (the store's
``fetched_neighbor_entries`` / sampled edges, last timed epoch).

Reading the stage times: ``sample_s`` (k-hop sampling) and ``extract_s`` (feature gathering) are summed over the
batches on the producer thread, which works ahead of training through a bounded queue, so they overlap
``train_s`` (forward, backward, optimiser step on the consumer side) and need not add up to the epoch time. If
``train_s`` is close to the epoch time, the pipeline hides sampling and extraction; if the epoch is much longer
than ``train_s``, training waits for batches.

On CPU the "devices" of the store are host memory too: a feature ratio changes only which rows count as hits and
which bytes are counted as host->device (``h2d_bytes``, counted on CPU as on a GPU), not bytes moved over a bus.
The GPU run is where the ratio matters: a miss there is a host row read over PCIe (UVA or CPU gather + copy).

``--trainers 1,2`` runs each configuration with 1 and with 2 trainers on ``--device`` (threads; each samples,
extracts and trains its share of every batch, gradients summed, one optimiser step per batch). The loss of the
two equals (keyed sampling); a shared neighbour of two trainers' seeds is sampled by both, so the sampled edges
per epoch grow with the trainer count.

CPU timings: ``--threads 1`` keeps them stable on a shared machine. The producer thread still runs sampling
concurrently with training (both release the GIL in torch ops), so a CPU run can keep up to two cores busy.

One JSON line per sampler (``"kind": "sampler"``) and per configuration (``"kind": "engine"``) is appended to
``--out`` (default benchmarks/results/minibatch.jsonl), with the environment (date, device, torch/PyG versions,
git revision, command, ``OMP_*``/``MALLOC_*`` variables).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

try:  # run as a script (its folder is on sys.path) or imported as benchmarks.minibatch
    from offload import PRODUCTS_LIKE, _fmt, _list, append_records, environment, prepare
    from offload import bench as time_epochs
except ImportError:  # pragma: no cover
    from benchmarks.offload import PRODUCTS_LIKE, _fmt, _list, append_records, environment, prepare
    from benchmarks.offload import bench as time_epochs

from gnnscale.engines import MiniBatchEngine, select_engine
from gnnscale.engines.devices import resolve_device
from gnnscale.errors import GnnscaleError
from gnnscale.graph.block import Block, normalized_csr
from gnnscale.graph.csr import csr_rows, csr_slices
from gnnscale.graph.graph import Graph
from gnnscale.nn import build_model
from gnnscale.sample import CSRTopology, sample_blocks, sample_key
from gnnscale.sample.neighbor import _relabel
from gnnscale.train import TrainConfig
from gnnscale.units import parse_budget

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "minibatch.jsonl"
EGO_TWITTER = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "snap" / "ego-twitter.txt.gz"
DEFAULT_DATASET = (f"edgelist:{EGO_TWITTER}:symmetrize=1" if EGO_TWITTER.exists()
                   else "csbm:nodes=100000,avg_degree=10,features=100")
STAGES = ("sample_s", "extract_s", "train_s")


def make_engine(g: Graph, cfg: TrainConfig, dev: torch.device) -> MiniBatchEngine:
    """A mini-batch engine for ``cfg`` (after the selector's checks: a refusal raises EngineError)."""
    engine_cls, _ = select_engine(g, cfg, dev)
    assert engine_cls is MiniBatchEngine and g.num_classes is not None
    model = build_model(cfg.model, g.num_features, cfg.hidden, g.num_classes, layers=cfg.layers,
                        dropout=cfg.dropout, heads=cfg.heads, seed=cfg.seed)
    return MiniBatchEngine(g, model, cfg, dev)


def bench(g: Graph, cfg: TrainConfig, dev: torch.device, warmup: int, epochs: int) -> dict[str, Any]:
    """Time ``warmup + epochs`` training epochs of one configuration (the offload script's timing loop), adding the
    mini-batch columns; ``status`` is ok, oom or refused."""

    def make() -> tuple[Any, dict[str, Any]]:
        t0 = time.perf_counter()
        engine = make_engine(g, cfg, dev)
        info = {"engine_detail": engine.describe(), "setup_s": time.perf_counter() - t0,
                "store_device_bytes": engine.store.device_bytes(), "hot_graph": engine.store.hot_graph,
                "hot_features": engine.store.hot_features, "gather_method": engine.store.gather,
                "fanouts": list(engine.fanouts), "train_vertices": int(engine.train_ids.numel())}
        return engine.train_epoch, info

    r = time_epochs("minibatch", make, dev, warmup, epochs, keep_stats=True)
    if r["status"] != "ok":
        return r
    timed_stats = r.pop("epoch_stats")[warmup:]
    last, median = timed_stats[-1], r["median_epoch_s"]
    edges = statistics.median(int(s["sampled_edges"]) for s in timed_stats)
    return {**r,
            **{f"median_{k}": statistics.median(float(s[k]) for s in timed_stats) for k in STAGES},
            **{f"{k}_per_epoch": [float(s[k]) for s in timed_stats] for k in STAGES},
            "sampled_edges": edges, "sampled_edges_per_epoch": [int(s["sampled_edges"]) for s in timed_stats],
            "mteps": edges / median / 1e6, "batches": int(last["batches"]),
            "feature_hit_rate": float(last["feature_hit_rate"]), "graph_hit_rate": float(last["graph_hit_rate"]),
            "h2d_bytes": int(last["h2d_bytes"]), "kind": "engine", "trainers": int(last["trainers"]),
            **{k: int(last[k]) for k in ("fetched_neighbor_entries", "h2d_row_bytes", "h2d_topology_bytes",
                                          "d2d_bytes")},
            "read_amplification": int(last["fetched_neighbor_entries"]) / max(int(last["sampled_edges"]), 1)}


# ------------------------------------------------------------------------------------------------ sampler baselines
# Every sampler below takes one batch of seeds and returns ``(blocks, neighbour entries fetched)``: the same output
# contract as ours (one Block per hop, relabelled, weights sliced), so the timings compare like with like.


# (a) gnnscale's sampler before issue #12, copied from ``git show feae281:gnnscale/sample/neighbor.py``
# (``CSRTopology.neighbors``, ``_sample_rows``, ``_relabel`` and the loop of ``sample_blocks``), unchanged but for
# the names and the count of entries fetched.
def _feae281_neighbors(topo: CSRTopology, ids: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
    """feae281's ``CSRTopology.neighbors``: the whole in-neighbour lists of ``ids``, one CSR local to the request."""
    out_dev = ids.device
    indptr, pos = csr_slices(topo.indptr, ids.to(topo.device).long())
    w = None if topo.weight is None else topo.weight[pos].to(out_dev)
    return indptr.to(out_dev), topo.indices[pos].to(out_dev), w


def _feae281_sample_rows(indptr: Tensor, fanout: int, generator: torch.Generator | None
                         ) -> tuple[Tensor, Tensor | None]:
    """feae281's ``_sample_rows``: every candidate edge of a row with ``deg > fanout`` gets a random key, one sort
    keyed by (row, key) shuffles each row, the first ``fanout`` of a row are kept."""
    deg = indptr[1:] - indptr[:-1]
    num_edges = int(indptr[-1])
    if fanout < 0 or num_edges == 0 or int(deg.max()) <= fanout:
        return indptr, None
    dev = indptr.device
    big = deg > fanout
    rows = csr_rows(indptr)
    cand = torch.nonzero(big[rows]).view(-1)
    big_deg = deg[big]
    m = int(big_deg.numel())
    brow = torch.repeat_interleave(torch.arange(m, device=dev), big_deg, output_size=int(cand.numel()))
    shift = 63 - max(m.bit_length(), 1)
    key = (brow << shift) | torch.randint(0, 1 << shift, brow.shape, generator=generator, device=dev)
    order = cand[torch.sort(key).indices]
    seg_start = torch.cumsum(big_deg, 0) - big_deg
    rank = torch.arange(order.numel(), device=dev) - seg_start[brow]
    keep = ~big[rows]
    keep[order[rank < fanout]] = True
    picked = torch.nonzero(keep).view(-1)
    new_indptr = torch.cat([indptr.new_zeros(1), torch.cumsum(deg.clamp(max=fanout), 0)])
    return new_indptr, picked


def _feae281_relabel(dst_ids: Tensor, nbr_ids: Tensor) -> tuple[Tensor, Tensor]:
    """feae281's ``_relabel``."""
    n = dst_ids.numel()
    uniq, inv = torch.unique(torch.cat([dst_ids, nbr_ids]), return_inverse=True)
    is_dst = torch.zeros(uniq.numel(), dtype=torch.bool, device=uniq.device)
    is_dst[inv[:n]] = True
    new_ids = uniq[~is_dst]
    local = torch.empty(uniq.numel(), dtype=torch.int64, device=uniq.device)
    local[inv[:n]] = torch.arange(n, device=uniq.device)
    local[~is_dst] = torch.arange(n, n + new_ids.numel(), device=uniq.device)
    return local[inv[n:]], torch.cat([dst_ids, new_ids])


def sample_fetch_all(topo: CSRTopology, seeds: Tensor, fanouts: tuple[int, ...],
                     generator: torch.Generator | None = None) -> tuple[list[Block], int]:
    """Baseline (a), feae281's ``sample_blocks``: per hop the frontier's whole lists are fetched, then sampled."""
    frontier = seeds.long()
    if torch.unique(frontier).numel() != frontier.numel():
        raise ValueError("seeds contain duplicates")
    dev = frontier.device
    blocks: list[Block] = []
    fetched = 0
    for fanout in fanouts:
        indptr, nbrs, weight = _feae281_neighbors(topo, frontier)
        fetched += int(nbrs.numel())
        indptr, nbrs = indptr.to(dev).long(), nbrs.to(dev).long()
        weight = None if weight is None else weight.to(dev)
        indptr, picked = _feae281_sample_rows(indptr, fanout, generator)
        if picked is not None:
            nbrs = nbrs[picked]
            weight = None if weight is None else weight[picked]
        local, src_ids = _feae281_relabel(frontier, nbrs)
        blocks.append(Block(indptr=indptr, indices=local, num_src=int(src_ids.numel()), edge_weight=weight,
                            src_ids=src_ids))
        frontier = src_ids
    blocks.reverse()
    return blocks, fetched


# (b) and (b2): straightforward vectorised O(fanout) samplers on torch's RNG. Both draw positions, then fetch only
# those entries through the same store request as ours (``topo.request`` / ``take``) and relabel with gnnscale's
# ``_relabel``: the only difference from ours is how the positions are drawn.
def floyd_positions(deg: Tensor, fanout: int, generator: torch.Generator | None = None) -> Tensor:
    """``[m, fanout]`` positions (ascending per row) of a uniform ``fanout``-subset of ``range(deg[i])``, every
    ``deg > fanout``: Floyd's algorithm on all rows at once with ``torch.rand`` (for ``i < fanout``:
    ``j = deg - fanout + i``, ``t`` uniform in ``[0, j]``, keep ``t`` or ``j`` if ``t`` is taken)."""
    m = deg.numel()
    out = torch.empty(m, fanout, dtype=torch.int64, device=deg.device)
    for i in range(fanout):
        j = deg - (fanout - i)
        t = (torch.rand(m, dtype=torch.float64, generator=generator, device=deg.device) * (j + 1)).long()
        if i:
            t = torch.where((out[:, :i] == t.unsqueeze(1)).any(1), j, t)
        out[:, i] = t
    return out.sort(dim=1).values


def rejection_positions(deg: Tensor, fanout: int, generator: torch.Generator | None = None) -> Tensor:
    """``[m, fanout]`` positions (ascending per row) of a uniform ``fanout``-subset of ``range(deg[i])``, every
    ``deg > fanout``: ``fanout`` positions drawn with replacement per row; while rows hold a repeat (found after a
    per-row sort), those rows redraw their repeated slots. Uniform: the process treats all positions alike."""
    dev = deg.device
    d = deg.unsqueeze(1).double()
    draw = (torch.rand(deg.numel(), fanout, dtype=torch.float64, generator=generator, device=dev) * d).long()
    draw = draw.sort(dim=1).values
    rows = torch.arange(deg.numel(), device=dev)  # rows that may still hold a repeat
    while rows.numel():
        sub = draw[rows]
        dup = torch.zeros_like(sub, dtype=torch.bool)
        dup[:, 1:] = sub[:, 1:] == sub[:, :-1]
        bad = dup.any(1)
        if not bool(bad.any()):
            break
        rows, sub, dup = rows[bad], sub[bad], dup[bad]
        redraw = (torch.rand(sub.shape, dtype=torch.float64, generator=generator, device=dev) * d[rows]).long()
        draw[rows] = torch.where(dup, redraw, sub).sort(dim=1).values
    return draw


PositionFn = Callable[[Tensor, int, "torch.Generator | None"], Tensor]


def sample_torch_rng(topo: CSRTopology, seeds: Tensor, fanouts: tuple[int, ...], draw: PositionFn,
                     generator: torch.Generator | None = None) -> tuple[list[Block], int]:
    """Baselines (b) and (b2): ours with the positions of every row with ``deg > fanout`` drawn by ``draw``
    (torch's RNG)."""
    frontier = seeds.long()
    if torch.unique(frontier).numel() != frontier.numel():
        raise ValueError("seeds contain duplicates")
    dev = frontier.device
    before = topo.fetched_entries
    blocks: list[Block] = []
    for fanout in fanouts:
        req = topo.request(frontier)
        deg = req.degrees.to(dev)
        take = deg if fanout < 0 else deg.clamp(max=fanout)
        indptr = torch.zeros(deg.numel() + 1, dtype=torch.int64, device=dev)
        torch.cumsum(take, 0, out=indptr[1:])
        total = int(indptr[-1])
        pos = torch.arange(total, device=dev) - indptr[csr_rows(indptr, total)]
        if fanout > 0 and total:
            big = torch.nonzero(deg > fanout).view(-1)
            if big.numel():
                slots = indptr[big].unsqueeze(1) + torch.arange(fanout, device=dev)
                pos[slots.view(-1)] = draw(deg[big], fanout, generator).view(-1)
        nbrs, weight = req.take(indptr, pos)
        local, src_ids = _relabel(frontier, nbrs.to(dev).long())
        blocks.append(Block(indptr=indptr, indices=local, num_src=int(src_ids.numel()),
                            edge_weight=None if weight is None else weight.to(dev), src_ids=src_ids))
        frontier = src_ids
    blocks.reverse()
    return blocks, topo.fetched_entries - before


def sample_ours(topo: CSRTopology, seeds: Tensor, fanouts: tuple[int, ...], key: int) -> tuple[list[Block], int]:
    """Ours, :func:`gnnscale.sample.sample_blocks` (keyed positions, then only those entries)."""
    before = topo.fetched_entries
    blocks = sample_blocks(topo, seeds, fanouts, key)
    return blocks, topo.fetched_entries - before


def pyg_sampler(topo: CSRTopology, fanouts: tuple[int, ...]) -> tuple[Callable[[Tensor], int] | None, str]:
    """(c) PyG's ``NeighborSampler`` (pyg_lib's or torch_sparse's C++ kernel) on the same graph, as a function of a
    batch giving its sampled edges, or ``None`` and why not. It samples each hop from the vertices the previous hop
    reached for the first time only (ours re-expands the whole frontier), and returns edge lists, not blocks."""
    try:
        import torch_geometric.typing as pyg_typing
        from torch_geometric.data import Data
        from torch_geometric.sampler import NeighborSampler, NodeSamplerInput
    except ImportError as exc:  # pragma: no cover
        return None, f"torch_geometric not importable ({exc})"
    if not (pyg_typing.WITH_PYG_LIB or pyg_typing.WITH_TORCH_SPARSE):
        return None, "PyG's neighbour sampler needs pyg_lib or torch_sparse; neither is installed"
    if topo.device.type != "cpu":
        return None, "PyG's NeighborSampler samples on CPU only; skipped on a device run"
    rows = csr_rows(topo.indptr, topo.indices.numel())  # destination of each in-edge
    data = Data(edge_index=torch.stack([topo.indices, rows]), num_nodes=topo.num_nodes)
    sampler = NeighborSampler(data, num_neighbors=list(fanouts))  # CSC built here, outside the timing

    def run(batch: Tensor) -> int:
        out = sampler.sample_from_nodes(NodeSamplerInput(input_id=None, node=batch.cpu()))
        return int(out.row.numel())

    lib = "pyg_lib" if pyg_typing.WITH_PYG_LIB else "torch_sparse"
    return run, f"PyG NeighborSampler ({lib})"


OURS = "gnnscale (keyed positions, then fetch)"


def bench_samplers(g: Graph, cfg: TrainConfig, dev: torch.device, repeats: int,
                   rejection: bool = False) -> list[dict[str, Any]]:
    """One epoch's batches (the training vertices, shuffled, ``cfg.batch_size`` each) sampled by ours and the
    baselines (the rejection one if ``rejection``) on the same in-memory CSR (the model's adjacency) on ``dev``, with
    ``cfg.fanouts``.

    Each sampler runs the epoch once untimed, then ``repeats`` timed rounds; the samplers take turns within a round
    (the order rotating), so a disturbance of the shared machine hits them alike. Per sampler: the median seconds,
    the sampled edges and neighbour entries fetched of the last round, MTEPS = sampled edges / median / 10^6, read
    amplification = entries fetched / sampled edges, ``ours_mteps_ratio`` = our MTEPS / its MTEPS (> 1: ours is
    faster) and ``ours_speedup`` = its seconds / ours (the samplers' edge counts differ a little: other draws)."""
    assert cfg.fanouts is not None and g.train_mask is not None
    model = build_model(cfg.model, g.num_features, 8, g.num_classes or 2, layers=cfg.layers, heads=1, dropout=0.0,
                        seed=0)
    topo = CSRTopology(*(t if t is None else t.to(dev) for t in normalized_csr(g, model.adjacency)))  # type: ignore[misc]
    train = torch.nonzero(g.train_mask).view(-1)
    seeds = train[torch.randperm(train.numel(), generator=torch.Generator().manual_seed(cfg.seed))].to(dev)
    batches = [seeds[i : i + cfg.batch_size] for i in range(0, seeds.numel(), cfg.batch_size)]
    fanouts = tuple(cfg.fanouts)
    gen = torch.Generator(device=dev).manual_seed(cfg.seed)

    def edges_of(run: Callable[[Tensor], tuple[list[Block], int]]) -> Callable[[Tensor], tuple[int, int | None]]:
        def f(b: Tensor) -> tuple[int, int | None]:
            blocks, fetched = run(b)
            return sum(blk.num_edges for blk in blocks), fetched
        return f

    key = [sample_key(cfg.seed, 0)]  # ours: one key per epoch, as the engine
    samplers: dict[str, Callable[[Tensor], tuple[int, int | None]]] = {
        OURS: edges_of(lambda b: sample_ours(topo, b, fanouts, key[0])),
        "fetch-all-then-sample (gnnscale feae281)": edges_of(lambda b: sample_fetch_all(topo, b, fanouts, gen)),
        "Floyd, torch RNG (O(fanout))": edges_of(lambda b: sample_torch_rng(topo, b, fanouts, floyd_positions,
                                                                             gen))}
    if rejection:
        samplers["rejection, torch RNG (O(fanout))"] = edges_of(
            lambda b: sample_torch_rng(topo, b, fanouts, rejection_positions, gen))
    pyg, note = pyg_sampler(topo, fanouts)
    if pyg is None:
        print(f"  note: PyG's sampler skipped: {note}", file=sys.stderr)
    else:
        samplers[note] = lambda b: (pyg(b), None)
    names = list(samplers)
    times: dict[str, list[float]] = {n: [] for n in names}
    counts: dict[str, tuple[int, int | None]] = {}

    def epoch(name: str) -> tuple[float, int, int | None]:
        fn, edges, fetched = samplers[name], 0, 0
        sync(dev)
        t0 = time.perf_counter()
        for b in batches:
            e, f = fn(b)
            edges += e
            fetched = None if f is None or fetched is None else fetched + f
        sync(dev)
        return time.perf_counter() - t0, edges, fetched

    load = [os.getloadavg()[0]]
    for name in names:  # untimed: first-call costs (allocator, lazy init) out of the way
        epoch(name)
    for r in range(repeats):
        key[0] = sample_key(cfg.seed, r + 1)
        for name in names[r % len(names):] + names[: r % len(names)]:
            t, edges, fetched = epoch(name)
            times[name].append(t)
            counts[name] = (edges, fetched)
    load.append(os.getloadavg()[0])
    out = []
    for name in names:
        med = statistics.median(times[name])
        edges, fetched = counts[name]
        out.append({"kind": "sampler", "sampler": name, "median_sample_s": med, "sample_s_per_repeat": times[name],
                    "sampled_edges": edges, "fetched_neighbor_entries": fetched, "mteps": edges / med / 1e6,
                    "read_amplification": None if fetched is None else fetched / max(edges, 1),
                    "batches": len(batches), "repeats": repeats, "fanouts": list(fanouts),
                    "loadavg_1m_before_after": load, **({"pyg_note": note} if name == OURS and pyg is None else {})})
    for r in out:
        r["ours_mteps_ratio"] = out[0]["mteps"] / r["mteps"]
        r["ours_speedup"] = r["median_sample_s"] / out[0]["median_sample_s"]  # its seconds / ours (gpu_check)
    return out

def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def print_samplers(rows: list[dict[str, Any]]) -> None:
    print(f"  {'sampler':<42}{'epoch (s)':>10}{'edges':>11}{'MTEPS':>8}{'fetched/sampled':>16}{'ours/this MTEPS':>16}")
    for r in rows:
        print(f"  {r['sampler']:<42}{r['median_sample_s']:>10.3f}{r['sampled_edges']:>11,d}{r['mteps']:>8.2f}"
              f"{_fmt(r['read_amplification'], '.2f'):>16}{r['ours_mteps_ratio']:>15.2f}x")
    print(f"  one epoch's batches, median of {rows[0]['repeats']} rounds; MTEPS = sampled edges / s / 1e6; "
          "fetched/sampled: neighbour entries read per sampled edge")
    if "pyg_note" in rows[0]:
        print(f"  PyG's sampler not timed: {rows[0]['pyg_note']}")


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"  {'trainers':>8}{'feat r':>7}{'graph r':>8}{'median (s)':>11}{'sample':>8}{'extract':>8}{'train':>8}"
          f"{'edges/ep':>12}{'MTEPS':>8}{'feat hit':>9}{'graph hit':>10}{'H2D MB':>8}{'batches':>8}{'loss':>8}")
    for r in rows:
        head = f"  {r['trainers_requested']:>8d}{r['gpu_feature_ratio']:>7g}{r['gpu_graph_ratio']:>8g}"
        if r["status"] != "ok":
            print(f"{head}  {r['status']}: {r['reason'][:110]}")
            continue
        print(f"{head}{r['median_epoch_s']:>11.3f}{r['median_sample_s']:>8.3f}{r['median_extract_s']:>8.3f}"
              f"{r['median_train_s']:>8.3f}{r['sampled_edges']:>12,.0f}{r['mteps']:>8.2f}"
              f"{r['feature_hit_rate']:>9.3f}{r['graph_hit_rate']:>10.3f}{_fmt(r['h2d_bytes'] / 1e6, '.1f'):>8}"
              f"{r['batches']:>8d}{r['final_loss']:>8.4f}  read x{r['read_amplification']:.2f}")
    print("  sample/extract: producer-thread sums, overlapping train; MTEPS = sampled edges / median epoch / 1e6; "
          "hit: store requests answered from device memory")
    for r in rows:
        if r.get("engine_detail"):
            print(f"    {r['trainers_requested']} trainer(s), feature ratio {r['gpu_feature_ratio']:g}: "
                  f"{r['engine_detail']}")


def _ratios(text: str, flag: str) -> list[float]:
    values = [float(v) for v in _list(text)]
    if not values or any(not 0.0 <= v <= 1.0 for v in values):
        raise ValueError(f"{flag}: one or more values in [0, 1], got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda or cuda:N")
    ap.add_argument("--dataset", default=DEFAULT_DATASET, metavar="SPEC",
                    help=f"dataset spec (default {DEFAULT_DATASET}; ogbn-products-sized: {PRODUCTS_LIKE})")
    ap.add_argument("--root", default=None, help="folder of dataset files (planetoid, ogb, npz)")
    ap.add_argument("--model", default="sage", help="gcn, sage, gat, gin or mlp (default sage)")
    ap.add_argument("--layers", type=int, default=None, help="default: the number of --fanouts")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4, help="GAT hidden heads")
    ap.add_argument("--dropout", type=float, default=0.5)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--batch-size", type=int, default=1024, help="seed vertices per batch")
    ap.add_argument("--fanouts", default="25,10", help="neighbours sampled per hop, the seeds' hop first (-1: all)")
    ap.add_argument("--gpu-feature-ratio", default="0,0.25,1", metavar="RATIOS",
                    help="fractions of the vertices (hottest first) whose features live on the device, to sweep")
    ap.add_argument("--gpu-graph-ratio", type=float, default=1.0,
                    help="fraction of the vertices (hottest first) whose neighbour lists live on the device")
    ap.add_argument("--gpu-memory", default=None, metavar="BUDGET",
                    help="device budget for the store: GiB (6) or a size (64MB); default: free device memory")
    ap.add_argument("--gather", default="auto", help="auto, index_select or uva (host feature rows on CUDA)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed epochs before the timed ones")
    ap.add_argument("--epochs", type=int, default=3, help="timed epochs (the median is reported)")
    ap.add_argument("--trainers", default="1", metavar="LIST",
                    help="trainer counts to run (comma list): k trainers on --device, one thread each (default 1); "
                         "0: no engine run")
    ap.add_argument("--samplers", choices=["on", "off"], default="on",
                    help="also time our sampler against the baselines on one epoch's batches (default on)")
    ap.add_argument("--rejection", action="store_true",
                    help="sampler comparison: also time the rejection baseline (b2)")
    ap.add_argument("--repeats", type=int, default=3, help="sampler comparison: repeats (the median is reported)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON Lines file to append to")
    ap.add_argument("--no-save", action="store_true", help="print the table only")
    args = ap.parse_args(argv)

    try:
        dev = resolve_device(args.device)
        fanouts = tuple(int(f) for f in _list(args.fanouts))
        feature_ratios = _ratios(args.gpu_feature_ratio, "--gpu-feature-ratio")
        (graph_ratio,) = _ratios(str(args.gpu_graph_ratio), "--gpu-graph-ratio")
        budget = None if args.gpu_memory is None else parse_budget(args.gpu_memory)
        trainer_counts = [int(k) for k in _list(args.trainers) if int(k) != 0]  # 0: samplers only
        if (trainer_counts and min(trainer_counts) < 1) or args.repeats < 1:
            raise ValueError("--trainers takes counts >= 1 (or 0: no engine run) and --repeats must be >= 1")
        if args.warmup < 0 or args.epochs < 1:
            raise ValueError("--warmup must be >= 0 and --epochs >= 1")
        base = TrainConfig(model=args.model, layers=args.layers or len(fanouts), hidden=args.hidden,
                           heads=args.heads, dropout=args.dropout, lr=args.lr, epochs=args.epochs, seed=args.seed,
                           engine="minibatch", batch_size=args.batch_size, fanouts=fanouts,
                           gpu_graph_ratio=graph_ratio, memory_budget=budget, gather=args.gather)
        g, load_s = prepare(args)
    except (GnnscaleError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    common = environment(dev)
    case = {"dataset": g.meta.get("spec", args.dataset), "graph": g.name, "nodes": g.num_nodes,
            "edges": g.num_edges, "avg_in_degree": g.num_edges / max(g.num_nodes, 1), "features": g.num_features,
            "classes": g.num_classes, "engine": "minibatch", "model": base.model, "layers": base.layers,
            "hidden": base.hidden, "heads": base.heads, "dropout": base.dropout, "lr": base.lr,
            "batch_size": base.batch_size, "fanouts_requested": list(fanouts), "memory_budget": budget,
            "gather_requested": base.gather, "warmup": args.warmup, "epochs": args.epochs, "seed": args.seed,
            "load_s": load_s}
    print(f"{case['dataset']}: {g.num_nodes:,} nodes, {g.num_edges:,} edges, {g.num_features} features, "
          f"{g.num_classes} classes (built in {load_s:.1f} s)")
    print(f"device {common['device_name']}; torch {common['torch']}, PyG {common['pyg']}, gnnscale "
          f"{common['gnnscale_rev']}; {base.model}, {base.layers} layers, hidden {base.hidden}, batch "
          f"{base.batch_size}, fanouts {','.join(map(str, fanouts))}; warmup {args.warmup}, median of "
          f"{args.epochs} timed epochs")
    samplers: list[dict[str, Any]] = []
    if args.samplers == "on":
        print("  timing the samplers ...", file=sys.stderr, flush=True)
        samplers = bench_samplers(g, base, dev, args.repeats, args.rejection)
        print()
        print_samplers(samplers)
    rows = []
    for k in trainer_counts:
        for ratio in feature_ratios:
            cfg = TrainConfig(**{**asdict(base), "gpu_feature_ratio": ratio, "devices": (str(dev),) * k})
            print(f"  running {k} trainer(s), feature ratio {ratio:g}, graph ratio {graph_ratio:g} ...",
                  file=sys.stderr, flush=True)
            rows.append({"gpu_feature_ratio": ratio, "gpu_graph_ratio": graph_ratio, "trainers_requested": k,
                         **bench(g, cfg, dev, args.warmup, args.epochs)})
    if rows:
        print()
        print_table(rows)
    records = [{**common, **case, **r} for r in [*samplers, *rows]]
    if not args.no_save:
        append_records(args.out, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
