"""The mini-batch path as XGNN does it: trainers per device reading through their row of the placement, reads from
the right tier only, positions sampled before fetching, a real pipeline, a constant number of host syncs."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from gnnscale import TrainConfig, load_dataset
from gnnscale.engines import MiniBatchEngine
from gnnscale.errors import ConfigError
from gnnscale.graph.block import AdjacencySpec, normalized_csr, sampling_csr
from gnnscale.graph.generators import csbm
from gnnscale.graph.graph import Graph
from gnnscale.nn import build_model
from gnnscale.sample import sample_blocks, sample_key
from gnnscale.store.global_store import GlobalMemoryStore, fit_hot_counts
from gnnscale.store.placement import HOST
from gnnscale.testing import SyncCounter, need_file, only_cuda

CPU = torch.device("cpu")
GCN = AdjacencySpec(self_loops=True, norm="gcn")
RING = [[0, 1, 0, 1], [1, 0, 1, 0], [0, 1, 0, 1], [1, 0, 1, 0]]  # opposite GPUs are not linked
PCIE = [[0.0] * 4 for _ in range(4)]


def weighted(g: Graph, seed: int = 0) -> Graph:
    """``g`` with random positive edge weights: GCN's lists then carry a weight per entry (an unweighted graph's
    GCN lists carry none: the sampler normalises each block itself)."""
    w = torch.rand(g.num_edges, generator=torch.Generator().manual_seed(seed)) + 0.5
    return Graph.from_edge_index(g.edge_index(), g.num_nodes, x=g.x, y=g.y, edge_weight=w, train_mask=g.train_mask,
                                 val_mask=g.val_mask, test_mask=g.test_mask)


def _engine(g: Graph, trainers: int = 1, **kw: Any) -> MiniBatchEngine:
    base: dict[str, Any] = dict(model="sage", layers=2, hidden=16, dropout=0.5, engine="minibatch", fanouts=(4, 3),
                                gpu_graph_ratio=0.4, gpu_feature_ratio=0.3, seed=2, devices=("cpu",) * trainers)
    cfg = TrainConfig(**{**base, **kw})
    assert g.num_classes is not None
    model = build_model(cfg.model, g.num_features, cfg.hidden, g.num_classes, layers=cfg.layers, dropout=cfg.dropout,
                        heads=cfg.heads, seed=cfg.seed)
    return MiniBatchEngine(g, model, cfg, CPU)


# ------------------------------------------------------------------------------------------------ trainers


def _first_epoch(eng: MiniBatchEngine) -> tuple[dict[str, Any], list[torch.Tensor]]:
    """The first epoch's record and the master's gradients at its (only) optimiser step."""
    grads: list[torch.Tensor] = []
    step = eng.optimizer.step

    def capture(*a: Any, **k: Any) -> Any:
        grads.extend(p.grad.clone() for p in eng.model.parameters())  # type: ignore[union-attr]
        return step(*a, **k)

    eng.optimizer.step = capture  # type: ignore[method-assign]
    return eng.train_epoch(1), grads


def _first_step(eng: MiniBatchEngine) -> tuple[float, list[torch.Tensor]]:
    """The epoch's loss and the master's gradients at its (only) optimiser step."""
    stats, grads = _first_epoch(eng)
    return stats["loss"], grads


@pytest.mark.parametrize("model", ["sage", "gcn", "gat"])
def test_a_step_on_n_trainers_equals_one_trainer_on_the_union_batch(model: str) -> None:
    """Keyed sampling gives each trainer exactly the union batch's per-vertex samples, and the seed-weighted sum
    of the trainers' gradients is the union batch's gradient: equal loss and gradients for 1, 2 and 3 trainers."""
    g = csbm(nodes=400, features=12, avg_degree=10, seed=5)
    kw = dict(model=model, batch_size=4096, heads=2)  # one global batch: the whole training set, one step
    loss1, grad1 = _first_step(_engine(g, 1, **kw))
    for n in (2, 3):
        eng = _engine(g, n, **kw)
        loss, grads = _first_step(eng)
        assert loss == pytest.approx(loss1, rel=1e-5, abs=1e-7), n
        for a, b in zip(grad1, grads, strict=True):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
        # and every trainer really sampled and extracted its own share, through its own reader
        assert all(r.stats.graph_requests == 0 for r in eng.store.readers)  # reset at the end of the epoch
        eng.store.reset_stats()
        eng.train_epoch(2)
    # a broken split (a trainer's share sampled with another epoch's key) is seen: the test can fail
    eng = _engine(g, 2, **kw)
    real = eng._prepare
    eng._prepare = lambda t, seeds, fanouts, key: real(t, seeds, fanouts, key + t.index)  # type: ignore[method-assign]
    loss, _ = _first_step(eng)
    assert loss != pytest.approx(loss1, rel=1e-5)


def test_every_trainer_samples_and_extracts_its_share_through_its_own_reader() -> None:
    g = csbm(nodes=600, features=8, avg_degree=8, seed=6)
    eng = _engine(g, 3, batch_size=24)
    calls: dict[tuple[int, str], list[int]] = {}
    for r in eng.store.readers:
        for name in ("features", "request"):
            real = getattr(r, name)

            def spy(ids: torch.Tensor, real: Any = real, key: tuple[int, str] = (r.index, name)) -> Any:
                calls.setdefault(key, []).append(ids.numel())
                return real(ids)

            setattr(r, name, spy)
    eng.train_epoch(1)
    batches = -(-int(g.train_mask.sum()) // 24)  # type: ignore[union-attr]
    for r in range(3):
        assert len(calls[(r, "features")]) == batches and len(calls[(r, "request")]) == 2 * batches
    # the shares of a batch: the first hop of each trainer requests its contiguous third of the seeds
    first_hop = [calls[(r, "request")][0] for r in range(3)]
    assert batches > 1 and sum(first_hop) == 24 and max(first_hop) - min(first_hop) <= 1


# ------------------------------------------------------------------------------------------------ tiers


def _expected_sources(store: GlobalMemoryStore, reader: int, ids: torch.Tensor, hot: int) -> dict[int, int]:
    """Rows of ``ids`` per source under the placement: a hot row of partition p from ``source[reader][p]``."""
    G = len(store.devices)
    out: dict[int, int] = {}
    for r in store.rank[ids].tolist():
        src = store.placement.source[reader][r % G] if r < hot else HOST
        out[src] = out.get(src, 0) + 1
    return out


@pytest.mark.parametrize("links", [RING, PCIE], ids=["ring", "pcie-only"])
def test_per_reader_reads_follow_the_placement_and_never_touch_another_tier(links: list[list[float]]) -> None:
    """Every copy a reader must not read is poisoned (NaN rows, -1 entries): the answers stay exact, so each row
    came from the one source the placement names; the per-source counters equal the plan."""
    g = weighted(csbm(nodes=400, features=5, avg_degree=6, seed=6))
    assert g.x is not None
    store = GlobalMemoryStore(g, [CPU] * 4, adjacency=GCN, gpu_graph_ratio=0.5, gpu_feature_ratio=0.5, links=links)
    indptr, indices, weight = (t.clone() for t in sampling_csr(g, GCN)[:3])  # type: ignore[union-attr]
    x = g.x.clone()  # the host table is the graph's own tensor on CPU (no copy): keep the truth aside
    ids = torch.arange(g.num_nodes)
    G = 4
    for reader in range(G):
        src = store.placement.source[reader]
        saved_x = [dict(d) for d in store.dev_x]
        saved_csr = [dict(d) for d in store.dev_csr]
        host_x, host_csr = store.host_x.clone(), tuple(None if t is None else t.clone() for t in store.host_csr)
        for h in range(G):
            for p in list(store.dev_x[h]):
                if src[p] != h:  # a copy this reader must not use
                    store.dev_x[h][p] = torch.full_like(store.dev_x[h][p], float("nan"))
                    ptr, ind, w = store.dev_csr[h][p]
                    store.dev_csr[h][p] = (ptr, torch.full_like(ind, -1), None if w is None else w * float("nan"))
        hot_on_device = [(r < store.hot_features) and src[r % G] != HOST for r in store.rank.tolist()]
        store.host_x[torch.tensor(hot_on_device)] = float("nan")  # host rows of device-read vertices
        for v in torch.nonzero(torch.tensor([(r < store.hot_graph) and src[r % G] != HOST
                                             for r in store.rank.tolist()])).view(-1).tolist():
            store.host_csr[1][indptr[v]: indptr[v + 1]] = -1
        try:
            store.reset_stats()
            assert torch.equal(store.features(ids, reader), x)
            got_ptr, got_idx, got_w = store.neighbors(ids, reader)
            assert torch.equal(got_ptr, indptr) and torch.equal(got_idx, indices)
            assert weight is not None and got_w is not None and torch.equal(got_w, weight)
            st = store.readers[reader].stats
            assert dict(st.rows_from) == _expected_sources(store, reader, ids, store.hot_features)
            assert dict(st.lists_from) == _expected_sources(store, reader, ids, store.hot_graph)
            remote = [h for h in set(src) if h not in (HOST, reader)]
            assert st.remote_requests == 3 * len(remote)  # features, degrees, entries: one request per holder each
        finally:
            store.dev_x[:] = saved_x
            store.dev_csr[:] = saved_csr
            store.host_x.copy_(host_x)
            for t, s in zip(store.host_csr, host_csr, strict=True):
                if t is not None and s is not None:
                    t.copy_(s)
    if links is PCIE:  # no links: everything not in the own partition comes from host memory
        assert all(set(s) <= {g_, HOST} for g_, s in enumerate(store.placement.source))


def test_bytes_are_counted_per_tier_on_cpu_devices_too() -> None:
    for width in (4, 24):
        g = csbm(nodes=300, features=width, avg_degree=6, seed=7)
        store = GlobalMemoryStore(g, [CPU] * 4, gpu_graph_ratio=0.5, gpu_feature_ratio=0.25, links=RING)
        ids = torch.arange(g.num_nodes)
        store.features(ids, 0)
        indptr, _, _ = store.neighbors(ids, 0)
        st = store.readers[0].stats
        assert st.h2d_feature_bytes == st.rows_from[HOST] * width * 4 > 0
        remote_rows = sum(c for s, c in st.rows_from.items() if s not in (HOST, 0))
        remote_lists = sum(c for s, c in st.lists_from.items() if s not in (HOST, 0))
        remote_entries = sum(c for s, c in st.entries_from.items() if s not in (HOST, 0))
        assert remote_rows > 0 and remote_entries > 0
        assert st.d2d_bytes == remote_rows * width * 4 + remote_lists * 16 + remote_entries * 8
        assert st.h2d_topology_bytes == st.lists_from[HOST] * 16 + st.entries_from[HOST] * 8 > 0
        assert st.fetched_neighbor_entries == int(indptr[-1])


# ------------------------------------------------------------------------------------------------ fetching


def _amplification(g: Graph, fanouts: tuple[int, ...], batches: int = 6, batch: int = 512) -> float:
    store = GlobalMemoryStore(g, [CPU, CPU], gpu_graph_ratio=0.3, gpu_feature_ratio=0.0)
    seeds = torch.randperm(g.num_nodes, generator=torch.Generator().manual_seed(0))[: batches * batch]
    sampled = 0
    for i in range(batches):
        blocks = sample_blocks(store.reader(1), seeds[i * batch: (i + 1) * batch], fanouts, sample_key(0, i))
        sampled += sum(b.num_edges for b in blocks)
    return store.stats.fetched_neighbor_entries / sampled


def test_read_amplification_on_a_degree_50_graph() -> None:
    """Only the sampled entries are fetched (fetching whole lists read 4.8x the sampled edges here)."""
    g = csbm(nodes=20000, features=4, avg_degree=50, seed=1)
    assert _amplification(g, (15, 10)) <= 1.1


def test_read_amplification_on_ego_twitter_symmetrised() -> None:
    g = load_dataset(f"edgelist:{need_file('snap/ego-twitter.txt.gz')}:symmetrize=1,features=8")
    assert _amplification(g, (15, 10)) <= 1.1


def test_engine_records_sampled_and_fetched_entries() -> None:
    g = csbm(nodes=3000, features=8, avg_degree=30, seed=3)
    stats = _engine(g, 2, batch_size=256, fanouts=(10, 5)).train_epoch(1)
    assert 0 < stats["fetched_neighbor_entries"] <= 1.1 * stats["sampled_edges"]
    assert stats["trainers"] == 2


# ------------------------------------------------------------------------------------------------ budget


def test_topology_first_fill_of_the_budget() -> None:
    g = csbm(nodes=1000, features=32, avg_degree=10, seed=8)
    n = g.num_nodes
    directory = 8 * n
    full_topo = GlobalMemoryStore(g, [CPU], gpu_graph_ratio=1.0).device_bytes()[0] - directory
    row = 32 * 4
    # room for the whole topology and a third of the feature rows: topology all on the device first
    store = GlobalMemoryStore(g, [CPU], gpu_graph_ratio=None, gpu_feature_ratio=None,
                              memory_budget=directory + full_topo + n // 3 * row)
    assert store.hot_graph == n and store.hot_features == n // 3
    # room for half the topology only: no features at all
    half = GlobalMemoryStore(g, [CPU], gpu_graph_ratio=None, gpu_feature_ratio=None,
                             memory_budget=directory + full_topo // 2)
    assert 0 < half.hot_graph < n and half.hot_features == 0
    # the fit is tight: what it chose fits (the store checks), one more list does not
    list_bytes = 8 + (half.readers[0].store.dev_csr[0][0][0].diff() * 8)
    assert list_bytes.numel() == half.hot_graph
    rank_bytes = 8 + (normalized_csr(g, AdjacencySpec())[0].diff()[torch.sort(half.rank).indices] * 8)
    h, _ = fit_hot_counts(rank_bytes, row, ((0,),), full_topo // 2)
    assert h == half.hot_graph and int(rank_bytes[: h + 1].sum()) + 8 > full_topo // 2
    # two devices, pure partitioning: each holds half the hot set, so twice the vertices fit
    two = GlobalMemoryStore(g, [CPU, CPU], gpu_graph_ratio=None, gpu_feature_ratio=None, links=[[0, 0], [0, 0]],
                            memory_budget=directory + full_topo // 2)
    assert two.hot_graph > 1.8 * half.hot_graph


# ------------------------------------------------------------------------------------------------ pipeline


def test_sampling_of_the_next_batch_starts_before_this_batch_trains() -> None:
    """A handshake, not a timing: training of batch 0 waits until the sampler has started batch 1. A sequential
    loop (sample, train, sample, ...) never gets there, and the wait runs out."""
    g = csbm(nodes=2000, features=8, avg_degree=8, seed=9)
    eng = _engine(g, 1, batch_size=128)
    started = threading.Event()
    calls: list[int] = []
    real_prepare, real_forward = eng._prepare, eng._forward

    def prepare(*a: Any, **k: Any) -> Any:
        calls.append(len(calls))
        if len(calls) == 2:
            started.set()
        return real_prepare(*a, **k)

    overlapped: list[bool] = []

    def forward(*a: Any, **k: Any) -> Any:
        if not overlapped:
            overlapped.append(started.wait(timeout=60))
        return real_forward(*a, **k)

    eng._prepare, eng._forward = prepare, forward  # type: ignore[method-assign]
    eng.train_epoch(1)
    assert overlapped == [True], "batch 1 was not being sampled while batch 0 trained"


# ------------------------------------------------------------------------------------------------ syncs


@pytest.mark.parametrize("fanouts", [(5, 3), (5, 3, 2)])
def test_host_syncs_per_batch_are_a_constant_per_hop(fanouts: tuple[int, ...]) -> None:
    """Counted as issued (a CPU run sees what a GPU run would sync): the same for 1 and 4 devices, 64 and 512
    seeds, and at most 5 per hop + 2 -- none per vertex, partition or holder."""
    g = csbm(nodes=3000, features=8, avg_degree=20, seed=1)
    totals = set()
    for devices, batch in [(1, 64), (4, 64), (4, 512)]:
        eng = _engine(g, devices, layers=len(fanouts), fanouts=fanouts)
        with SyncCounter() as c:
            eng._prepare(eng.trainers[-1], eng.train_ids[:batch], fanouts, key=5)
        totals.add(c.total)
        assert c.total <= 5 * len(fanouts) + 2, dict(c.counts)
    assert len(totals) == 1, totals


# ------------------------------------------------------------------------------------------------ CUDA


@only_cuda
def test_cuda_sampling_equals_cpu_sampling_with_real_fanouts() -> None:
    """Keyed sampling: the GPU draws the CPU's sample, so a CUDA epoch with fanouts (5, 3) matches the CPU's."""
    g = csbm(nodes=2000, features=16, avg_degree=8, seed=2)
    cfg = TrainConfig(model="sage", layers=2, hidden=16, dropout=0.0, engine="minibatch", batch_size=128,
                      fanouts=(5, 3), gpu_graph_ratio=0.3, gpu_feature_ratio=0.3, seed=1)

    def run(device: torch.device) -> dict[str, float]:
        assert g.num_classes is not None
        model = build_model("sage", g.num_features, 16, g.num_classes, layers=2, dropout=0.0, heads=1, seed=1)
        return MiniBatchEngine(g, model, cfg, device).train_epoch(1)

    cpu, gpu = run(CPU), run(torch.device("cuda"))
    assert gpu["sampled_edges"] == cpu["sampled_edges"]
    assert gpu["fetched_neighbor_entries"] == cpu["fetched_neighbor_entries"]
    assert gpu["h2d_row_bytes"] == cpu["h2d_row_bytes"] > 0
    assert gpu["loss"] == pytest.approx(cpu["loss"], rel=1e-3)


@only_cuda
def test_cuda_staging_buffer_is_pinned_once_and_reused() -> None:
    g = csbm(nodes=3000, features=16, avg_degree=8, seed=3)
    store = GlobalMemoryStore(g, [torch.device("cuda")], gpu_feature_ratio=0.1, gather="index_select")
    for i in range(10):
        ids = torch.randperm(g.num_nodes, device="cuda")[: 200 + 10 * i]
        assert g.x is not None
        assert torch.equal(store.features(ids).cpu(), g.x[ids.cpu()])
    assert store.stats.staging_allocs == 1


@pytest.mark.parametrize("shares", [(0.2, 0.8), (0.5, 0.125, 0.375)])
def test_unequal_shares_split_each_batch_and_train_the_same_step(shares: tuple[float, ...]) -> None:
    """A trainer on a faster device takes a larger share of every global batch; keyed sampling keeps the step the
    union batch's, whatever the split (the base of hybrid CPU + accelerator training)."""
    g = csbm(nodes=400, features=12, avg_degree=10, seed=5)
    kw: dict[str, Any] = dict(model="sage", batch_size=4096)
    loss1, grad1 = _first_step(_engine(g, 1, **kw))
    stats, grads = _first_epoch(_engine(g, len(shares), shares=shares, **kw))
    assert stats["loss"] == pytest.approx(loss1, rel=1e-5, abs=1e-7)
    for a, b in zip(grad1, grads, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
    n = int(g.train_mask.sum())  # type: ignore[union-attr]
    bounds = [round(n * c) for c in torch.cumsum(torch.tensor(shares, dtype=torch.float64), 0).tolist()]
    assert stats["trainer_seeds"] == [b - a for a, b in zip([0, *bounds[:-1]], bounds, strict=True)]
    assert sum(stats["trainer_sampled_edges"]) == stats["sampled_edges"]


@pytest.mark.parametrize(("shares", "message"), [
    ((0.0, 1.0), "must each lie in \\(0, 1\\)"),
    ((0.5, 0.6), "must sum to 1"),
    ((0.5, 0.25, 0.25), "3 fraction\\(s\\) for 2 device"),
])
def test_bad_shares_are_refused(shares: tuple[float, ...], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TrainConfig(engine="minibatch", devices=("cpu", "cpu"), shares=shares)
