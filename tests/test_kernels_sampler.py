"""The sampler's leaner relabelling (issue #30 point 2): marking ids in a ``[num_nodes]`` array gives exactly the
blocks the sorting path gives (destinations first, then new ids ascending), for every fanout, adjacency and
batch, so the keyed samples are unchanged."""

from __future__ import annotations

import pytest
import torch

from gnnscale.graph.generators import csbm
from gnnscale.nn import build_model
from gnnscale.sample import CSRTopology, SampledAdjacency, neighbor, sample_blocks


def test_dense_relabel_equals_the_sorting_relabel() -> None:
    torch.manual_seed(0)
    dst = torch.randperm(5000)[:300]
    for nbr in (torch.randint(0, 5000, (4000,)), dst[torch.randint(0, 300, (50,))], torch.empty(0, dtype=torch.int64)):
        a = neighbor._relabel(dst, nbr)
        b = neighbor._relabel(dst, nbr, num_nodes=5000)
        assert all(torch.equal(x, y) and x.dtype == y.dtype for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("kind", ["sage", "gcn", "gat"])
@pytest.mark.parametrize("fanouts", [[15, 10], [-1, 4], [40, 2], [0, 3]])
def test_blocks_equal_with_either_relabelling(kind: str, fanouts: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    g = csbm(nodes=3000, avg_degree=12, seed=3)
    model = build_model(kind, g.num_features, 8, 3, layers=2, dropout=0.0, heads=1, seed=0)
    adjacency = SampledAdjacency.from_graph(g, model.adjacency)
    seeds = torch.randperm(3000, generator=torch.Generator().manual_seed(1))[:500]
    runs = []
    for ratio in (neighbor.DENSE_RELABEL_RATIO, 0):  # dense marks, then the sorting unique everywhere
        monkeypatch.setattr(neighbor, "DENSE_RELABEL_RATIO", ratio)
        topo = CSRTopology.from_graph(g, model.adjacency)
        runs.append((sample_blocks(topo, seeds, fanouts, key=7, adjacency=adjacency), topo.fetched_entries))
    (dense, fetched_a), (sort, fetched_b) = runs
    assert fetched_a == fetched_b
    for a, b in zip(dense, sort, strict=True):
        assert a.num_src == b.num_src
        for name in ("indptr", "indices", "edge_weight", "src_ids"):
            x, y = getattr(a, name), getattr(b, name)
            assert (x is None and y is None) or (x.dtype == y.dtype and torch.equal(x, y)), name
