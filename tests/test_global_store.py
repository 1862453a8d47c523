"""XGNN's global memory store: every placement answers like the graph itself; hits are counted."""

from __future__ import annotations

import pytest
import torch
from test_minibatch_xgnn import weighted

from gnnscale.errors import ConfigError
from gnnscale.graph.block import AdjacencySpec, sampling_csr
from gnnscale.graph.csr import csr_slices
from gnnscale.graph.generators import csbm
from gnnscale.store.global_store import GlobalMemoryStore

CPU = torch.device("cpu")
GCN = AdjacencySpec(self_loops=True, norm="gcn")
PLACEMENTS = [(0.0, 0.0), (1.0, 1.0), (0.3, 0.6), (0.7, 0.1)]  # all host, all device, two splits


@pytest.mark.parametrize(("graph_ratio", "feature_ratio"), PLACEMENTS)
@pytest.mark.parametrize("devices", [1, 3])
def test_store_answers_like_the_graph(graph_ratio: float, feature_ratio: float, devices: int) -> None:
    g = weighted(csbm(nodes=500, features=7, avg_degree=6, seed=2))
    store = GlobalMemoryStore(g, [CPU] * devices, adjacency=GCN, gpu_graph_ratio=graph_ratio,
                              gpu_feature_ratio=feature_ratio)
    ids = torch.randint(0, g.num_nodes, (300,), generator=torch.Generator().manual_seed(0))  # repeats included
    assert g.x is not None
    assert torch.equal(store.features(ids), g.x[ids])
    indptr, indices, weight = sampling_csr(g, GCN)[:3]
    ptr, pos = csr_slices(indptr, ids)
    got_ptr, got_idx, got_w = store.neighbors(ids)
    assert torch.equal(got_ptr, ptr) and torch.equal(got_idx, indices[pos])
    assert weight is not None and got_w is not None and torch.equal(got_w, weight[pos])
    assert torch.equal(store.num_neighbors(ids), ptr[1:] - ptr[:-1])


def test_hottest_vertices_are_on_the_devices_and_hits_are_counted() -> None:
    g = csbm(nodes=400, features=4, avg_degree=8, seed=3)
    store = GlobalMemoryStore(g, [CPU, CPU], gpu_graph_ratio=0.25, gpu_feature_ratio=0.5)
    deg = g.out_degree()
    hot = torch.nonzero(store.rank < 100).view(-1)  # a quarter of the vertices
    cold = torch.nonzero(store.rank >= 100).view(-1)
    assert int(deg[hot].min()) >= int(deg[cold].max())  # ranked by out-degree
    ids = torch.arange(g.num_nodes)
    store.features(ids)
    store.neighbors(ids)
    stats = store.reset_stats()
    assert (stats.feature_requests, stats.feature_hits) == (400, 200)
    assert (stats.graph_requests, stats.graph_hits) == (400, 100)
    assert stats.hit_rates() == {"graph_hit_rate": 0.25, "feature_hit_rate": 0.5}
    assert store.stats.feature_requests == 0  # reset
    # partitions split by rank modulo the device count: equal shares
    sizes = [x[g].shape[0] for g, x in enumerate(store.dev_x)]
    assert sizes == [100, 100]


def test_pre_sampled_hotness_overrides_degree() -> None:
    g = csbm(nodes=100, features=3, seed=4)
    counts = torch.zeros(g.num_nodes)
    counts[[5, 17, 42]] = torch.tensor([3.0, 2.0, 1.0])
    store = GlobalMemoryStore(g, [CPU], gpu_feature_ratio=0.03, hotness=counts)
    assert store.rank[[5, 17, 42]].tolist() == [0, 1, 2]
    store.features(torch.tensor([5, 17, 42, 0]))
    assert store.stats.feature_hits == 3


def test_store_rejects_bad_ratios_and_budgets() -> None:
    g = csbm(nodes=200, features=16, seed=5)
    with pytest.raises(ConfigError, match="gpu-feature-ratio"):
        GlobalMemoryStore(g, [CPU], gpu_feature_ratio=1.5)
    with pytest.raises(ConfigError, match="more than the budget"):
        GlobalMemoryStore(g, [CPU], gpu_feature_ratio=1.0, memory_budget=1024)
    # half the feature rows, an empty CSR (one row pointer) and the rank directory (8 bytes per vertex)
    assert sum(GlobalMemoryStore(g, [CPU], gpu_feature_ratio=0.5).device_bytes()) == 100 * 16 * 4 + 8 + 200 * 8


RING = [[0, 1, 0, 1], [1, 0, 1, 0], [0, 1, 0, 1], [1, 0, 1, 0]]  # 4 GPUs in a ring: opposite GPUs are not linked
PCIE = [[0.0] * 4 for _ in range(4)]


@pytest.mark.parametrize("links", [RING, PCIE], ids=["ring", "pcie-only"])
def test_every_reader_gets_the_graph_under_the_placement(links: list[list[float]]) -> None:
    g = csbm(nodes=400, features=5, avg_degree=6, seed=6)
    store = GlobalMemoryStore(g, [CPU] * 4, adjacency=GCN, gpu_graph_ratio=0.5, gpu_feature_ratio=0.5, links=links)
    indptr, indices, weight = sampling_csr(g, GCN)[:3]
    ids = torch.arange(g.num_nodes)
    assert g.x is not None
    for reader in range(4):
        assert torch.equal(store.features(ids, reader), g.x)
        got_ptr, got_idx, _ = store.neighbors(ids, reader)
        assert torch.equal(got_ptr, indptr) and torch.equal(got_idx, indices)
    stats = store.reset_stats()
    if links is RING:  # each GPU stores its opposite's partition too: every hot row comes from a device
        assert [len(s) for s in store.placement.stored] == [2, 2, 2, 2]
        assert stats.feature_hits == 4 * 200 and stats.graph_hits == 4 * 200
    else:  # no links: own partition on the device, the other three from host memory
        assert [len(s) for s in store.placement.stored] == [1, 1, 1, 1]
        assert stats.feature_hits == 4 * 50 and stats.graph_hits == 4 * 50
