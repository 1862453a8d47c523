"""The vectorised preprocessing (ChunkCounter, chunk_rows, reorganize) returns exactly
what the straightforward per-chunk loops below (the previous implementations, kept as references) return."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor

import gnnscale.partition.csr as csr
from gnnscale.graph.graph import Graph
from gnnscale.partition import partition_graph, permute_csr
from gnnscale.partition.dedup import (
    chunk_rows,
    default_schedule,
    reorganize,
)
from gnnscale.partition.plan import ChunkCounter, chunk_halo, chunk_neighbour_counts


# ------------------------------------------------------------------------------------------------ references
def ref_chunk_neighbour_counts(indptr: Tensor, indices: Tensor, chunk_ptr: Tensor) -> Tensor:
    """``[K, 3]`` int64 per chunk ``[lo, hi)``: distinct in-neighbours ``|N_k|``, those outside ``[lo, hi)``, and
    in-edges."""
    n = indptr.numel() - 1
    mark = torch.zeros(n, dtype=torch.bool)
    out = torch.empty(chunk_ptr.numel() - 1, 3, dtype=torch.int64)
    for k in range(chunk_ptr.numel() - 1):
        lo, hi = int(chunk_ptr[k]), int(chunk_ptr[k + 1])
        src = indices[int(indptr[lo]) : int(indptr[hi])]
        if src.numel() * 8 < n:  # small chunk: sort its few sources instead of sweeping an [N] mask
            u = torch.unique(src)
            total, outside = u.numel(), int(((u < lo) | (u >= hi)).sum())
        else:
            mark.zero_()
            mark[src] = True
            total = int(mark.sum())
            outside = total - int(mark[lo:hi].sum())
        out[k, 0], out[k, 1], out[k, 2] = total, outside, src.numel()
    return out


def ref_chunk_rows(indptr: Tensor, indices: Tensor, chunk_ptr: Tensor) -> list[Tensor]:
    """Per chunk ``[lo, hi)``: its destinations ``lo..hi-1``, then the sorted in-neighbours outside the range.

    This is the row order of a chunk's block (destinations first, as layers expect) and the set ``N_ij``.
    """
    mark = torch.zeros(indptr.numel() - 1, dtype=torch.bool)
    bounds = chunk_ptr.tolist()
    return [torch.cat([torch.arange(lo, hi), chunk_halo(indptr, indices, lo, hi, mark)])
            for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]


def ref_overlaps(rows_a: list[Tensor], rows_b: list[Tensor], n: int) -> np.ndarray:
    """``[len(a), len(b)]`` matrix of ``|A_x ∩ B_y|`` for row sets (sparse incidence product)."""
    import scipy.sparse as sp

    def incidence(sets: list[Tensor]) -> sp.csr_matrix:
        lens = [s.numel() for s in sets]
        cols = torch.cat(sets).numpy() if sets else np.zeros(0, dtype=np.int64)
        rows = np.repeat(np.arange(len(sets)), lens)
        return sp.csr_matrix((np.ones(len(cols), dtype=np.int64), (rows, cols)), shape=(len(sets), n))

    return np.asarray((incidence(rows_a) @ incidence(rows_b).T).todense())


def ref_reorganize(rows: list[Tensor], partitions: int, chunks: int, num_nodes: int) -> Tensor:
    """HongTu Algorithm 4: the ``[m, n]`` schedule of chunk ids that groups and orders chunks to share rows.

    Phase 1 assigns partition ``i``'s chunks to batches, each batch taking the remaining chunk with the most rows in
    common with its transition set so far (inter-partition sharing). Phase 2 orders the batches, each next batch
    the remaining one sharing the most rows with the previous (intra-device reuse). Ties go to the lowest id.
    """
    m, n = partitions, chunks
    sched = default_schedule(m, n).clone()
    union = [rows[j] for j in range(n)]  # phase 1: N^U_j starts as partition 0's chunk j
    for i in range(1, m):
        own = [rows[i * n + k] for k in range(n)]
        common = ref_overlaps(own, union, num_nodes)  # [k, j] = |N_ik ∩ N^U_j|
        left = list(range(n))
        for j in range(n):
            k = max(left, key=lambda a: (common[a, j], -a))
            left.remove(k)
            sched[i, j] = i * n + k
            union[j] = torch.unique(torch.cat([union[j], own[k]]))
    if n > 2:  # phase 2: batch order
        common = ref_overlaps(union, union, num_nodes)
        order, left = [0], list(range(1, n))
        while left:
            k = max(left, key=lambda a: (common[a, order[-1]], -a))
            left.remove(k)
            order.append(k)
        sched = sched[:, order]
    return sched

# ------------------------------------------------------------------------------------------------ graphs
def _csr(n: int, e: int, seed: int, dtype: torch.dtype = torch.int64, isolated: int = 0) -> tuple[Tensor, Tensor]:
    """A random in-neighbour CSR with self-loops, repeated edges, a heavy hub and ``isolated`` vertices (the last
    ones: no in- nor out-edges)."""
    g = torch.Generator().manual_seed(seed)
    live = n - isolated
    dst = torch.randint(0, live, (e,), generator=g)
    src = torch.randint(0, live, (e,), generator=g)
    src[: e // 10] = 0  # a hub read by many chunks
    src[e // 10 : e // 5] = dst[e // 10 : e // 5]  # self-loops
    dst, order = torch.sort(dst, stable=True)
    src = src[order]
    indptr = torch.zeros(n + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(dst, minlength=n), 0, out=indptr[1:])
    return indptr, src.to(dtype)


def _chunk_ptr(n: int, k: int, seed: int, empty: bool = False) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    if empty:  # repeated cuts: empty chunks
        cuts = torch.sort(torch.randint(1, n, (k - 1,), generator=g)).values
    else:
        cuts = torch.sort(torch.randperm(n - 1, generator=g)[: k - 1] + 1).values
    return torch.cat([torch.tensor([0]), cuts, torch.tensor([n])])


CASES = [(60, 400, 1), (60, 400, 7), (2000, 30000, 7), (2000, 30000, 64), (3000, 6000, 300), (700, 9000, 300)]


@pytest.mark.parametrize(("n", "e", "k"), CASES)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_chunk_counts_and_rows_match_the_per_chunk_loops(n: int, e: int, k: int, dtype: torch.dtype) -> None:
    ip, ix = _csr(n, e, seed=n + k, dtype=dtype, isolated=n // 10)
    counter = ChunkCounter(ip, ix)
    for empty in (False, True):
        cp = _chunk_ptr(n, k, seed=k, empty=empty)
        ref = ref_chunk_neighbour_counts(ip, ix, cp)
        assert torch.equal(counter.counts(cp), ref)
        assert torch.equal(chunk_neighbour_counts(ip, ix, cp), ref)
        rows, expect = chunk_rows(ip, ix, cp), ref_chunk_rows(ip, ix, cp)
        assert len(rows) == len(expect) and len(counter.rows(cp)) == len(expect)
        for a, b in zip(rows, expect, strict=True):
            assert a.dtype == b.dtype == torch.int64 and torch.equal(a, b)
    # a sub-range of the vertices (not every vertex in a chunk)
    cp = _chunk_ptr(n, k, seed=k)[1:] if k > 1 else torch.tensor([n // 3, n // 2])
    assert torch.equal(counter.counts(cp), ref_chunk_neighbour_counts(ip, ix, cp))
    for a, b in zip(counter.rows(cp), ref_chunk_rows(ip, ix, cp), strict=True):
        assert torch.equal(a, b)
    mark = torch.zeros(n, dtype=torch.bool)
    lo, hi = int(cp[0]), int(cp[1])
    assert torch.equal(chunk_halo(ip, ix, lo, hi, mark), chunk_halo(ip, ix, lo, hi, mark))


def test_counter_cache_follows_the_tensors() -> None:
    ip, ix = _csr(500, 4000, seed=3)
    cp = _chunk_ptr(500, 9, seed=1)
    assert ChunkCounter.of(ip, ix).gap is ChunkCounter.of(ip, ix).gap
    first = chunk_neighbour_counts(ip, ix, cp)
    ix[:100] = 7  # modified in place: not the cached transpose any more
    assert not torch.equal(first, chunk_neighbour_counts(ip, ix, cp))
    assert torch.equal(chunk_neighbour_counts(ip, ix, cp), ref_chunk_neighbour_counts(ip, ix, cp))
    ip2, ix2 = ip.clone(), ix.clone()
    assert ChunkCounter.of(ip2, ix2).gap is not ChunkCounter.of(ip, ix).gap


# ------------------------------------------------------------------------------------------------ dedup pieces
def _plan_rows(n: int, e: int, m: int, k: int, seed: int) -> tuple[list[Tensor], Tensor, int]:
    ip, ix = _csr(n, e, seed=seed, isolated=n // 20)
    g = Graph(indptr=ip, indices=ix)
    plan = partition_graph(g, m, k, "random", seed)
    ip2, ix2 = permute_csr(ip, ix, None, plan.perm, plan.inverse())[:2]
    return chunk_rows(ip2, ix2, plan.chunk_ptr), plan.part_ptr, n


@pytest.mark.parametrize(("m", "k"), [(1, 1), (1, 7), (3, 1), (3, 7), (4, 64), (2, 300), (1, 300)])
def test_reorganize_matches_the_loops(m: int, k: int) -> None:
    rows, part_ptr, n = _plan_rows(2400 if k < 300 else 4000, 20000, m, k, seed=m * 100 + k)
    sched = reorganize(rows, m, k, n)
    assert torch.equal(sched, ref_reorganize(rows, m, k, n))


def test_reorganize_ties_go_to_the_lowest_id() -> None:
    t = torch.tensor
    rows = [t([0, 1]), t([2, 3]), t([4, 5]), t([6, 7]), t([0, 2]), t([8]), t([9]), t([1, 3])]  # 2 x 4 chunks
    sched = reorganize(rows, 2, 4, 10)
    assert torch.equal(sched, ref_reorganize(rows, 2, 4, 10))
    same = [t([0]), t([0]), t([0]), t([0])]  # all tie: identity order
    assert reorganize(same, 1, 4, 1).tolist() == [[0, 1, 2, 3]] == ref_reorganize(same, 1, 4, 1).tolist()


def test_stats_edge_cut_and_alpha_match_the_definitions() -> None:
    ip, ix = _csr(900, 8000, seed=5, isolated=30)
    g = Graph(indptr=ip, indices=ix)
    plan = partition_graph(g, 3, 5, "random", 1)
    st = plan.stats(g)
    ip2, ix2 = permute_csr(ip, ix, None, plan.perm, plan.inverse())[:2]
    part_of = torch.repeat_interleave(torch.arange(3), plan.part_ptr[1:] - plan.part_ptr[:-1])
    dst = torch.repeat_interleave(torch.arange(900), ip2[1:] - ip2[:-1])
    assert st["edge_cut"] == int((part_of[ix2] != part_of[dst]).sum()) / 8000
    counts = ref_chunk_neighbour_counts(ip2, ix2, plan.chunk_ptr)
    assert st["alpha"] == int(counts[:, 0].sum()) / 900
    assert st["chunk_rows_max"] == int((plan.chunk_ptr[1:] - plan.chunk_ptr[:-1] + counts[:, 1]).max())


def test_owner_counts_equal_a_set_count() -> None:
    """ChunkCounter.owners: per chunk and partition, the chunk's rows (destinations and distinct in-neighbours)
    that the partition owns -- what the planner's transition-buffer bound reads."""
    from gnnscale.graph.generators import csbm

    for parts, chunks in ((1, 5), (3, 4), (4, 7)):
        g = csbm(nodes=400, avg_degree=6, seed=parts)
        plan = partition_graph(g, parts, chunks, "random")
        ip, ix = permute_csr(g.indptr, g.indices, None, plan.perm, plan.inverse())[:2]
        got = ChunkCounter(ip, ix).owners(plan.chunk_ptr, plan.part_ptr)
        part_of = torch.searchsorted(plan.part_ptr, torch.arange(g.num_nodes), right=True) - 1
        for k in range(plan.num_chunks):
            lo, hi = plan.chunk_range(k)
            rows = set(range(lo, hi)) | set(ix[int(ip[lo]) : int(ip[hi])].tolist())
            want = torch.bincount(part_of[torch.tensor(sorted(rows))], minlength=parts)
            assert torch.equal(got[k], want), (parts, chunks, k)


@pytest.mark.parametrize("block", [1, 2, 7, 997])
def test_edge_gaps_in_blocks_equal_one_pass(block: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The gaps' passes run in blocks of edges: a source's run of edges that crosses a block boundary keeps its
    previous destination (sources with many edges and repeated edges included)."""
    ip, ix = _csr(300, 5000, seed=11, isolated=30)
    whole = csr._edge_gaps(ip, ix)
    monkeypatch.setattr(csr, "GAP_BLOCK", block)
    assert torch.equal(csr._edge_gaps(ip, ix), whole)
    cp = _chunk_ptr(300, 9, seed=2)
    assert torch.equal(ChunkCounter(ip, ix).counts(cp), ref_chunk_neighbour_counts(ip, ix, cp))
