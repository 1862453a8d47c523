"""Two-level partitioning: renumbering, contiguity, balance, replication factor, saved plans."""

from __future__ import annotations

import pytest
import torch

from gnnscale.errors import ConfigError
from gnnscale.graph.generators import csbm
from gnnscale.partition import (
    PartitionPlan,
    chunk_halo,
    load_or_partition,
    partition_graph,
    permute_csr,
)
from gnnscale.testing import tiny_graph


def _edges(indptr: torch.Tensor, indices: torch.Tensor) -> set[tuple[int, int]]:
    dst = torch.repeat_interleave(torch.arange(indptr.numel() - 1), indptr[1:] - indptr[:-1])
    return set(zip(indices.tolist(), dst.tolist(), strict=True))


@pytest.mark.parametrize("method", ["metis", "random", "range"])
def test_plan_is_a_contiguous_renumbering(method: str) -> None:
    g = csbm(nodes=600, features=4, seed=1)
    plan = partition_graph(g, partitions=3, chunks=4, method=method, seed=0)
    n = g.num_nodes
    assert sorted(plan.perm.tolist()) == list(range(n))  # a permutation
    assert torch.equal(plan.inverse()[plan.perm], torch.arange(n))
    ptr = plan.chunk_ptr.tolist()
    assert len(ptr) == 3 * 4 + 1 and ptr[0] == 0 and ptr[-1] == n
    assert all(b > a for a, b in zip(ptr, ptr[1:], strict=False))  # non-empty chunks
    assert set(plan.part_ptr.tolist()) <= set(ptr)  # chunks nest in partitions
    # chunks are balanced by in-edge count (+1 per vertex) inside each partition
    cost = (g.in_degree() + 1)[plan.perm]
    for i in range(3):
        sums = [int(cost[ptr[k] : ptr[k + 1]].sum()) for k in range(4 * i, 4 * i + 4)]
        assert max(sums) - min(sums) <= 2 * int(cost.max())


def test_permute_csr_keeps_every_edge() -> None:
    g = tiny_graph()
    perm = torch.tensor([3, 5, 0, 1, 4, 2])
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(6)
    w = torch.arange(g.num_edges, dtype=torch.float32)
    ip, ix, w2 = permute_csr(g.indptr, g.indices, w, perm, inv)
    old = _edges(g.indptr, g.indices)
    assert _edges(ip, ix) == {(int(inv[u]), int(inv[v])) for u, v in old}
    assert w2 is not None
    # each edge keeps its weight: new row r's edges are old row perm[r]'s edges in the same order
    for r in range(6):
        a, b = int(g.indptr[perm[r]]), int(g.indptr[perm[r] + 1])
        assert w2[int(ip[r]) : int(ip[r + 1])].tolist() == w[a:b].tolist()


def test_alpha_equals_set_based_count() -> None:
    g = csbm(nodes=300, features=4, seed=2)
    plan = partition_graph(g, partitions=2, chunks=3, method="metis")
    ip, ix, _ = permute_csr(g.indptr, g.indices, None, plan.perm, plan.inverse())
    total = 0
    mark = torch.zeros(g.num_nodes, dtype=torch.bool)
    for k in range(plan.num_chunks):
        lo, hi = plan.chunk_range(k)
        nbrs = {int(u) for u in ix[int(ip[lo]) : int(ip[hi])]}
        total += len(nbrs)
        assert chunk_halo(ip, ix, lo, hi, mark).tolist() == sorted(u for u in nbrs if not lo <= u < hi)
    st = plan.stats(g)
    assert st["alpha"] == pytest.approx(total / g.num_nodes)
    assert st["partitions"] == 2 and st["chunks"] == 3


def test_metis_cuts_fewer_edges_than_random() -> None:
    g = csbm(nodes=2000, features=4, homophily=0.9, seed=0)
    metis = partition_graph(g, partitions=4, method="metis").stats(g)
    rand = partition_graph(g, partitions=4, method="random").stats(g)
    assert metis["edge_cut"] < rand["edge_cut"]
    assert metis["alpha"] < rand["alpha"]


def test_plan_saved_and_reused(tmp_path) -> None:
    g = csbm(nodes=400, features=4, seed=3)
    plan, path, reused = load_or_partition(g, 2, 4, "metis", 0, tmp_path)
    assert path is not None and path.is_file() and not reused
    again, path2, reused2 = load_or_partition(g, 2, 8, "metis", 0, tmp_path)
    assert reused2 and path2 == path
    assert torch.equal(again.perm, plan.perm) and again.chunks == 8
    loaded = PartitionPlan.load(path)
    assert torch.equal(loaded.chunk_ptr, plan.chunk_ptr) and loaded.graph_key == plan.graph_key
    # a different graph never picks up this plan
    other = csbm(nodes=400, features=4, seed=4)
    _, path3, reused3 = load_or_partition(other, 2, 4, "metis", 0, tmp_path)
    assert not reused3 and path3 != path
    # a damaged file is replaced, not trusted
    path.write_bytes(b"not a plan")
    with pytest.raises(ConfigError, match="cannot read partition plan"):
        PartitionPlan.load(path)
    _, _, reused4 = load_or_partition(g, 2, 4, "metis", 0, tmp_path)
    assert not reused4 and PartitionPlan.load(path).graph_key == plan.graph_key


def test_bad_partition_requests() -> None:
    g = tiny_graph()
    with pytest.raises(ConfigError, match="unknown partition method"):
        partition_graph(g, 2, 1, method="spectral")
    with pytest.raises(ConfigError, match="more than the graph's 6 vertices"):
        partition_graph(g, 7, 1, method="random")
    with pytest.raises(ConfigError, match="more than the 3 vertices of the smallest partition"):
        partition_graph(g, 2, 4, method="random")
