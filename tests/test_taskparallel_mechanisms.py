"""The task-parallel engine's (NeutronTask's) mechanisms, each pinned by a test that a realistic mutant fails:

* skip mode overlaps the backward too: a subgraph's T backward starts while the P device still backpropagates
  earlier-processed subgraphs (a sequential backward never completes the handshake);
* Eqs. 5-6 give the hand-computed seconds on a four-vertex graph, and the edge term (Eq. 5) and the bandwidth term
  (Eq. 6) each decide the Eq. 7-8 device split of a case built for it;
* hand-off bytes: zero wherever a tensor stays on its device, and exactly the rows that cross devices
  (``rows * width * 4``) where one moves; a receiving device's counter holds the rows it caches;
* chunks are balanced by edges, not vertices, on a graph whose in-degrees are skewed onto a few hubs.

Expected values are computed here from the graph and the equations, never read back from the engine.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

from gnnscale.config import TrainConfig
from gnnscale.engines import TaskParallelEngine
from gnnscale.engines.taskparallel.tasks import TaskOps
from gnnscale.graph.generators import csbm
from gnnscale.graph.graph import Graph
from gnnscale.nn import build_model
from gnnscale.nn.decoupled import DecoupledGNN
from gnnscale.plan.taskparallel import GAMMA, model_times, plan_taskparallel

CPU = torch.device("cpu")
F32 = 4  # bytes of a float32 element


@pytest.fixture(scope="module")
def graph() -> Graph:
    return csbm(nodes=240, avg_degree=6, features=12, classes=4, seed=3)


def _config(kind: str, layers: int, devices: int, **kw: Any) -> TrainConfig:
    base: dict[str, Any] = dict(model=kind, layers=layers, hidden=16, dropout=0.5, engine="taskparallel",
                                devices=("cpu",) * devices, subgraphs=3, memory_budget=1 << 30)
    base.update(kw)
    return TrainConfig(**base)


def _engine(g: Graph, cfg: TrainConfig) -> TaskParallelEngine:
    assert g.num_classes is not None
    m = build_model(cfg.model, g.num_features, cfg.hidden, g.num_classes, layers=cfg.layers, dropout=cfg.dropout,
                    heads=1, seed=cfg.seed)
    assert isinstance(m, DecoupledGNN)
    return TaskParallelEngine(g, m, cfg, CPU)


def _before(ops: TaskOps, name: str, hook: Callable[..., None]) -> None:
    """Call ``hook`` with the arguments of every call of the engine's operation ``name`` (a method of its
    ``tasks``), just before it runs (on the device thread that runs it). The engine looks the operations up when it
    submits an operation, so an instance attribute takes their place."""
    original = getattr(ops, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        hook(*args, **kwargs)
        return original(*args, **kwargs)

    setattr(ops, name, wrapped)


# ------------------------------------------------------------------------------------------------ 1. backward overlap
def test_skip_mode_overlaps_the_t_backward_with_the_p_backward(graph: Graph) -> None:
    """Skip mode backpropagates subgraph by subgraph from the last in the epoch's order; a subgraph's T backward
    needs only its own rows' gradients. So the T device starts the backward of the first subgraph the P device
    finishes while the P device still has the other subgraphs to do: the P backward of the last subgraph it
    processes (subgraph 0, last P task) waits for that T backward to start -- a handshake a pipelined backward
    completes and a sequential one (T backward after every P backward) cannot."""
    S = 4
    cfg = _config("dgcn", 2, 2, dependency="skip", subgraphs=S)
    eng = _engine(graph, cfg)
    assert [s.devices for s in (*eng.plan.t_stages, *eng.plan.p_stages)] == [[0], [1]]
    t_started = threading.Event()
    met: list[bool] = []
    p_order: list[tuple[int, int]] = []  # (P task, subgraph) in the order the P device runs its backward

    def on_t_backward(k: int, s: int, grad: Any, se: Any) -> None:
        if s == S - 1:  # processed first by the backward
            t_started.set()

    def on_p_backward(l: int, c: Any, source: Any, se: Any) -> None:
        s = eng.tasks.sub_of[c.k]
        p_order.append((l, s))
        if l == cfg.layers - 1 and s == 0:  # the last subgraph the P device reaches
            met.append(t_started.wait(timeout=30))

    _before(eng.tasks, "t_backward", on_t_backward)
    _before(eng.tasks, "p_backward", on_p_backward)
    eng.train_epoch(1)
    k = eng.plan.chunks_per_subgraph
    assert met == [True] * k
    # the P backward itself runs subgraph by subgraph, every P task of a subgraph before the next subgraph
    assert p_order == [(l, s) for s in range(S - 1, -1, -1) for l in (1, 0) for _ in range(k)]


# ------------------------------------------------------------------------------------------------ 2-3. Eqs. 5-8
def _tiny(kind: str = "dgcn") -> tuple[Graph, TrainConfig]:
    """Four vertices on a directed cycle (4 edges, no self-loops), 3 features, 2 classes; 2 layers of width 2."""
    g = Graph.from_edge_index(torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]]), num_nodes=4,
                              x=torch.ones(4, 3), y=torch.tensor([0, 1, 0, 1]),
                              train_mask=torch.ones(4, dtype=torch.bool))
    return g, _config(kind, 2, 3, hidden=2, subgraphs=None)


# Eq. 5 and 6 by hand for _tiny(): |V| = 4, |E| = 4 edges + 4 self-loops = 8, dims 3 -> 2 -> 2, d_e = 2,
# average degree 8 / 4 = 2. The model counts Eq. 6's memory traffic in bytes (4 per float32 element).
T_FLOP_DGCN = 2 * 4 * 3 * 2 + 2 * 4 * 2 * 2  # = 80: sum over layers of 2 |V| d_l d_{l+1}
T_FLOP_EDGE = 2 * 8 * 2 * 2  # = 64: dgat's edge task, 2 |E| d_e d_e
P_FLOP = 2 * 4 * 2 * 2  # = 32 per P task: 2 |V| d d_e
P_BYTES = 4 * (4 * 2 * (1 + 2 * 2) + 4)  # = 176 per P task: 4 bytes x (|V| d (1 + 2 d_e) + |V|)
FLOPS, BANDWIDTH = 1e9, 2e9


@pytest.mark.parametrize("kind", ["dgcn", "dgat"])
def test_eqs_5_6_give_the_hand_computed_times(kind: str) -> None:
    g, cfg = _tiny(kind)
    times = model_times(g, cfg, flops=FLOPS, bandwidth=BANDWIDTH)
    t_flop = T_FLOP_DGCN + (T_FLOP_EDGE if kind == "dgat" else 0)
    assert times["t_s"] == pytest.approx(t_flop / FLOPS, rel=1e-12)  # 80 ns (dgcn), 144 ns (dgat)
    p_s = 2 * (GAMMA * P_FLOP / FLOPS + (1 - GAMMA) * P_BYTES / BANDWIDTH)  # two P tasks
    assert GAMMA == 0.5 and p_s == pytest.approx(120e-9, rel=1e-12)  # 2 x (16 ns + 44 ns)
    assert times["p_s"] == pytest.approx(p_s, rel=1e-12)


@pytest.mark.parametrize("kind, n_t, n_p, decided_by", [
    # dgcn: N_p = round(3 * 120 / (120 + 80)) = round(1.8) = 2; without Eq. 6's bandwidth term P would take
    # 32 ns: round(3 * 32 / 112) = round(0.86) = 1
    ("dgcn", 1, 2, "bandwidth"),
    # dgat: N_p = round(3 * 120 / (120 + 144)) = round(1.36) = 1; without Eq. 5's edge term T would take 80 ns:
    # round(3 * 120 / 200) = round(1.8) = 2
    ("dgat", 2, 1, "edge"),
])
def test_the_device_split_follows_eqs_5_to_8(monkeypatch: pytest.MonkeyPatch, kind: str, n_t: int, n_p: int,
                                             decided_by: str) -> None:
    """Three devices, four task placements: the planner splits them by Eqs. 7-8 on the times Eqs. 5-6 model from
    the measured rates (fixed here). Each case is built so that the term named by ``decided_by`` flips it."""
    from gnnscale.plan import throughput

    monkeypatch.setattr(throughput, "compute_rates", lambda device: (FLOPS, BANDWIDTH))
    g, cfg = _tiny(kind)
    plan = plan_taskparallel(g, cfg, CPU)
    assert (plan.n_t, plan.n_p) == (n_t, n_p)
    assert [s.devices for s in plan.t_stages] == [[d] for d in range(n_t)]
    assert [s.devices for s in plan.p_stages] == [[d] for d in range(n_t, 3)]
    t_flop = T_FLOP_DGCN + (T_FLOP_EDGE if kind == "dgat" else 0)
    assert plan.predicted["t_s"] == pytest.approx(t_flop / FLOPS, rel=1e-12)
    assert plan.predicted["p_s"] == pytest.approx(120e-9, rel=1e-12)
    # the same formula without the deciding term gives the other split (Eq. 7 with Eq. 8's clamp)
    t_s, p_s = t_flop / FLOPS, 120e-9
    if decided_by == "edge":
        t_s = T_FLOP_DGCN / FLOPS
    else:
        p_s = 2 * GAMMA * P_FLOP / FLOPS
    assert min(max(round(3 * p_s / (p_s + t_s)), 1), 2) != n_p


# ------------------------------------------------------------------------------------------------ 4-5. hand-off bytes
def _outside_rows(g: Graph, ptr: torch.Tensor) -> int:
    """Sum over chunks of their block's source rows: the chunk's own vertices and its distinct in-neighbours
    outside it."""
    src, dst = g.edge_index()
    total = 0
    for lo, hi in zip(ptr[:-1].tolist(), ptr[1:].tolist(), strict=True):
        s = src[(dst >= lo) & (dst < hi)].unique()
        total += (hi - lo) + int(((s < lo) | (s >= hi)).sum())
    return total


def _cache_snapshots(eng: TaskParallelEngine) -> dict[int, tuple[int, dict[int, int], dict[int, int]]]:
    """Arrange that each P device, at its first P backward (its P forward is over, nothing cleared yet), records
    ``(cached layers, bytes of the storages its cache holds, the bytes its own counter tracks for them)``."""
    snaps: dict[int, tuple[int, dict[int, int], dict[int, int]]] = {}

    def on_p_backward(l: int, c: Any, source: Any, se: Any) -> None:
        r = eng.tasks.p_runner(l, c.k)
        if r.index in snaps:
            return
        held = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in r.cache.values()}
        assert r.counter is not None
        tracked = {key: n for key, (ref, n) in r.counter.live.items() if key in held and not ref.expired()}
        snaps[r.index] = (len({layer for layer, _ in r.cache}), held, tracked)

    _before(eng.tasks, "p_backward", on_p_backward)
    return snaps


def test_one_device_moves_no_bytes_between_tasks(graph: Graph) -> None:
    """Every T -> P, P -> P and P -> T hand-off stays on the one device: nothing is copied, zero bytes counted.
    The features still come from host memory, once for the forward and once for the recomputation."""
    eng = _engine(graph, _config("dgcn", 2, 1))
    for epoch in (1, 2):
        stats = eng.train_epoch(epoch)
        for kind in ("t2p", "p2p", "p2t", "t2t"):
            assert stats.get(f"{kind}_bytes", 0) == 0, kind
        assert stats["h2d_topology_bytes"] == 0
        assert stats["h2d_row_bytes"] == 2 * graph.num_nodes * graph.num_features * F32
        assert stats["h2d_bytes"] == stats["h2d_row_bytes"]


def test_bytes_count_exactly_the_rows_that_cross_devices(graph: Graph) -> None:
    """dgcn, 3 layers on ``T | p1 | p2+p3``: ``H^0`` crosses T -> P once per row, ``H^1`` p1 -> p2 once per row;
    ``H^2`` (p2 -> p3) and the loss gradients stay on their device (0 bytes). Backward, each chunk sends one
    gradient row per source row of its block: p2 -> p1 and p1 -> T. The receiving devices' counters hold every
    row they cache: one layer of ``H`` on p1's device, two on p2+p3's."""
    cfg = _config("dgcn", 3, 3, t_devices=1)
    eng = _engine(graph, cfg)
    assert [s.devices for s in (*eng.plan.t_stages, *eng.plan.p_stages)] == [[0], [1], [2]]
    N, C, F = graph.num_nodes, graph.num_classes, graph.num_features
    assert C is not None
    row = C * F32  # bytes of one row of H (width: the class count)
    sources = _outside_rows(graph, eng.ptr)
    assert sources > N  # chunks read rows of other chunks
    snaps = _cache_snapshots(eng)
    stats = eng.train_epoch(1)
    assert stats["t2p_bytes"] == N * row
    assert stats["p2p_bytes"] == N * row + sources * row  # H^1 forward, dL/dH^1 backward
    assert stats["p2t_bytes"] == sources * row
    assert stats.get("t2t_bytes", 0) == 0
    assert stats["h2d_row_bytes"] == 2 * N * F * F32
    # each P device moves every chunk's block (with its transpose) once, and keeps it
    assert stats["h2d_topology_bytes"] == 2 * sum(c.block.nbytes() for c in eng.chunks)
    assert stats["h2d_bytes"] == stats["h2d_row_bytes"] + stats["h2d_topology_bytes"]
    assert sorted(snaps) == [1, 2]
    for device, layers in ((1, 1), (2, 2)):
        cached_layers, held, tracked = snaps[device]
        assert cached_layers == layers
        assert sum(held.values()) == layers * N * row  # every row of each cached layer, once
        assert tracked == held  # ... each counted by the device that holds it


# ------------------------------------------------------------------------------------------------ 6. chunk balance
def _skewed(n: int = 400, hubs: int = 8, hub_degree: int = 60) -> Graph:
    """``hubs`` vertices (ids ``0 .. hubs - 1``) with ``hub_degree`` in-edges each from seeded random non-hub
    sources; every other vertex ``v`` has one in-edge, from ``v - 1``."""
    gen = torch.Generator().manual_seed(7)
    hub_src = torch.randint(hubs, n, (hubs * hub_degree,), generator=gen)
    hub_dst = torch.arange(hubs).repeat_interleave(hub_degree)
    rest = torch.arange(hubs, n)
    ei = torch.stack([torch.cat([hub_src, rest - 1]), torch.cat([hub_dst, rest])])
    y = torch.arange(n) % 3
    return Graph.from_edge_index(ei, num_nodes=n, x=torch.ones(n, 4), y=y, train_mask=torch.ones(n, dtype=torch.bool))


def _chunk_costs(cost: torch.Tensor, ptr: torch.Tensor) -> list[int]:
    return [int(cost[lo:hi].sum()) for lo, hi in zip(ptr[:-1].tolist(), ptr[1:].tolist(), strict=True)]


@pytest.mark.parametrize("chunks", [4, 8])
def test_chunks_balance_edges_not_vertices_on_a_skewed_graph(chunks: int) -> None:
    """A chunk's work is its in-edges plus one self-loop per vertex. Each cut falls on the first vertex whose
    running edge count passes the exact share, so every chunk is within one vertex's edges (plus one, the share's
    rounding) of ``total / M``. Equal vertex counts would put all the hubs' edges in the first chunk."""
    g = _skewed()
    src, dst = g.edge_index()
    cost = torch.bincount(dst, minlength=g.num_nodes) + 1  # in-edges from the literal edge list, plus a self-loop
    total, widest = int(cost.sum()), int(cost.max())
    assert total == 8 * 61 + 392 * 2 and widest == 61
    share = total / chunks
    plan = plan_taskparallel(g, _config("dgcn", 2, 2, subgraphs=chunks), CPU, times={"t_s": 1.0, "p_s": 1.0})
    ptr = plan.chunk_ptr
    assert plan.num_chunks == chunks and int(ptr[0]) == 0 and int(ptr[-1]) == g.num_nodes
    assert bool((ptr[1:] > ptr[:-1]).all())
    edges = _chunk_costs(cost, ptr)
    assert all(abs(e - share) < widest + 1 for e in edges), (edges, share)
    by_vertices = torch.arange(chunks + 1) * g.num_nodes // chunks
    assert max(abs(e - share) for e in _chunk_costs(cost, by_vertices)) > 2 * widest  # the graph tells them apart
    # the engine cuts its blocks at these boundaries: each holds its destinations' in-edges and self-loops
    eng = _engine(g, _config("dgcn", 2, 2, subgraphs=chunks, t_devices=1))
    assert torch.equal(eng.ptr, ptr)
    assert [c.block.num_edges for c in eng.chunks] == edges
