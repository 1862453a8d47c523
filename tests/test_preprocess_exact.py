"""The vectorised preprocessing (ChunkCounter, chunk_rows, comm_volume, reorganize, plan_exchange) returns exactly
what the straightforward per-chunk loops below (the previous implementations, kept as references) return."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor

from gnnscale.graph.graph import Graph
from gnnscale.partition import partition_graph, permute_csr
from gnnscale.partition.dedup import (
    Assembly,
    BatchMoves,
    CommVolume,
    ExchangePlan,
    _unions,
    chunk_rows,
    comm_volume,
    default_schedule,
    plan_exchange,
    reorganize,
)
from gnnscale.partition.plan import ChunkCounter, chunk_halo, chunk_neighbour_counts


# ------------------------------------------------------------------------------------------------ references
def ref_chunk_halo(indptr: Tensor, indices: Tensor, lo: int, hi: int, mark: Tensor) -> Tensor:
    """Sorted ids of the in-neighbours of destinations ``[lo, hi)`` that lie outside ``[lo, hi)``.

    Args:
        mark: ``[N]`` bool scratch buffer (reused across calls; left zeroed).
    """
    src = indices[int(indptr[lo]) : int(indptr[hi])]
    if src.numel() * 8 < mark.numel():  # small chunk: sort its few sources instead of sweeping the [N] mask
        u = torch.unique(src.long())
        return u[(u < lo) | (u >= hi)]
    mark[src] = True
    mark[lo:hi] = False
    halo = torch.nonzero(mark).view(-1)
    mark[halo] = False
    return halo


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
    return [torch.cat([torch.arange(lo, hi), ref_chunk_halo(indptr, indices, lo, hi, mark)])
            for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]


def ref_isin_sorted(a: Tensor, b_sorted: Tensor) -> Tensor:
    """``[len(a)]`` bool: which elements of ``a`` occur in the sorted ``b_sorted``."""
    if b_sorted.numel() == 0:
        return torch.zeros(a.numel(), dtype=torch.bool)
    pos = torch.searchsorted(b_sorted, a).clamp_(max=b_sorted.numel() - 1)
    return b_sorted[pos] == a


def ref_overlaps(rows_a: list[Tensor], rows_b: list[Tensor], n: int) -> np.ndarray:
    """``[len(a), len(b)]`` matrix of ``|A_x ∩ B_y|`` for row sets (sparse incidence product)."""
    import scipy.sparse as sp

    def incidence(sets: list[Tensor]) -> sp.csr_matrix:
        lens = [s.numel() for s in sets]
        cols = torch.cat(sets).numpy() if sets else np.zeros(0, dtype=np.int64)
        rows = np.repeat(np.arange(len(sets)), lens)
        return sp.csr_matrix((np.ones(len(cols), dtype=np.int64), (rows, cols)), shape=(len(sets), n))

    return np.asarray((incidence(rows_a) @ incidence(rows_b).T).todense())


def ref_unions(rows: list[Tensor], schedule: Tensor) -> list[Tensor]:
    """Sorted transition set ``U_j`` of every batch (column ``j`` of ``schedule``)."""
    return [torch.unique(torch.cat([rows[k] for k in schedule[:, j].tolist()])) for j in range(schedule.shape[1])]


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


def ref_comm_volume(rows: list[Tensor], schedule: Tensor) -> CommVolume:
    m, n = schedule.shape
    ori = sum(r.numel() for r in rows)
    unions = ref_unions(rows, schedule)
    p2p = sum(u.numel() for u in unions)
    ru = unions[0].numel() + sum(int((~ref_isin_sorted(unions[j], unions[j - 1])).sum()) for j in range(1, n))
    reuse = 0
    for i in range(m):
        prev = torch.empty(0, dtype=torch.int64)
        for k in schedule[i].tolist():
            cur = torch.sort(rows[k]).values
            reuse += int((~ref_isin_sorted(cur, prev)).sum())
            prev = cur
    return CommVolume(ori, p2p, ru, reuse)


def ref_plan_exchange(rows: list[Tensor], part_ptr: Tensor, schedule: Tensor, mode: str, device_of: list[int],
                  volume: CommVolume | None = None) -> ExchangePlan:
    """Slots, loads, flushes and assembly maps of every batch for ``mode`` ``reuse`` or ``full``."""
    m, n = schedule.shape
    devices = max(device_of) + 1
    volume = volume or ref_comm_volume(rows, schedule)
    # the transition sets T[b][j] of buffer b (one per partition), sorted
    if mode == "full":
        unions = ref_unions(rows, schedule)
        sets = [[u[int(torch.searchsorted(u, part_ptr[b])): int(torch.searchsorted(u, part_ptr[b + 1]))]
                 for u in unions] for b in range(m)]
    else:
        sets = [[torch.sort(rows[k]).values for k in schedule[b].tolist()] for b in range(m)]
    cap = [max(s.numel() for s in sets[b]) for b in range(m)]
    offset, capacity = [0] * m, [0] * devices
    for b in range(m):
        offset[b] = capacity[device_of[b]]
        capacity[device_of[b]] += cap[b]
    # slots: kept rows keep theirs, newcomers take freed ones in increasing order
    slots: list[list[Tensor]] = [[] for _ in range(m)]
    new: list[list[tuple[Tensor, Tensor]]] = [[] for _ in range(m)]
    for b in range(m):
        prev, prev_slots = torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64)
        for j in range(n):
            cur = sets[b][j]
            kept = ref_isin_sorted(cur, prev)
            s = torch.empty(cur.numel(), dtype=torch.int64)
            if prev.numel():
                s[kept] = prev_slots[torch.searchsorted(prev, cur[kept])]
            used = torch.zeros(cap[b], dtype=torch.bool)
            used[s[kept]] = True
            free = torch.nonzero(~used).view(-1)[: int((~kept).sum())]
            s[~kept] = free
            slots[b].append(s)
            new[b].append((cur[~kept], free))
            prev, prev_slots = cur, s
    moves: list[list[BatchMoves]] = [[] for _ in range(devices)]
    for d in range(devices):
        mine = [b for b in range(m) if device_of[b] == d]
        for j in range(n):
            nr, ns, lr, ls, kept_rows = [], [], [], [], 0
            for b in mine:
                nr.append(new[b][j][0])
                ns.append(new[b][j][1] + offset[b])
                kept_rows += sets[b][j].numel() - new[b][j][0].numel()
                leaving = ~ref_isin_sorted(sets[b][j], sets[b][j + 1]) if j + 1 < n else \
                    torch.ones(sets[b][j].numel(), dtype=torch.bool)
                lr.append(sets[b][j][leaving])
                ls.append(slots[b][j][leaving] + offset[b])
            cat = (lambda xs: torch.cat(xs) if xs else torch.empty(0, dtype=torch.int64))  # noqa: E731
            moves[d].append(BatchMoves(cat(nr), cat(ns), kept_rows, cat(lr), cat(ls)))
    # assembly of each chunk's rows from the buffers
    assembly: dict[int, Assembly] = {}
    d2d = 0
    for i in range(m):
        for j, k in enumerate(schedule[i].tolist()):
            r = rows[k]
            if mode == "reuse":
                pos = torch.searchsorted(sets[i][j], r)
                assembly[k] = Assembly([(device_of[i], None, slots[i][j][pos] + offset[i])], 0)
                continue
            owner = torch.searchsorted(part_ptr, r, right=True) - 1
            slot = torch.empty_like(r)
            for b in torch.unique(owner).tolist():
                sel = owner == b
                slot[sel] = slots[b][j][torch.searchsorted(sets[b][j], r[sel])] + offset[b]
            dev = torch.tensor(device_of)[owner]
            parts: list[tuple[int, Tensor | None, Tensor]] = []
            for d in torch.unique(dev).tolist():
                sel = dev == d
                if bool(sel.all()):
                    parts.append((d, None, slot))
                else:
                    pos = torch.nonzero(sel).view(-1)
                    parts.append((d, pos, slot[pos]))
            remote = int((owner != i).sum())
            d2d += remote
            assembly[k] = Assembly(parts, remote)
    h2d = sum(mv.new_rows.numel() for dev_moves in moves for mv in dev_moves)
    counts = {"rows_ori": volume.ori, "rows_p2p": volume.p2p, "rows_h2d": h2d,
              "rows_reused": sum(mv.kept for dev_moves in moves for mv in dev_moves), "rows_d2d": d2d}
    return ExchangePlan(mode, schedule, list(device_of), capacity, moves, assembly, volume, counts)


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
    assert torch.equal(chunk_halo(ip, ix, lo, hi, mark), ref_chunk_halo(ip, ix, lo, hi, mark))


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
def _same_exchange(a: ExchangePlan, b: ExchangePlan) -> None:
    assert a.mode == b.mode and torch.equal(a.schedule, b.schedule) and a.device_of == b.device_of
    assert a.capacity == b.capacity and a.volume == b.volume and a.counts == b.counts
    assert len(a.moves) == len(b.moves)
    for da, db in zip(a.moves, b.moves, strict=True):
        assert len(da) == len(db)
        for x, y in zip(da, db, strict=True):
            assert isinstance(x, BatchMoves) and x.kept == y.kept
            for f in ("new_rows", "new_slots", "leave_rows", "leave_slots"):
                u, v = getattr(x, f), getattr(y, f)
                assert u.dtype == v.dtype and torch.equal(u, v), f
    assert list(a.assembly) == list(b.assembly)
    for k in a.assembly:
        x, y = a.assembly[k], b.assembly[k]
        assert isinstance(x, Assembly) and x.remote_rows == y.remote_rows and len(x.parts) == len(y.parts)
        for (d1, p1, s1), (d2, p2, s2) in zip(x.parts, y.parts, strict=True):
            assert d1 == d2 and (p1 is None) == (p2 is None) and torch.equal(s1, s2)
            assert p1 is None or p2 is None or torch.equal(p1, p2)


def _plan_rows(n: int, e: int, m: int, k: int, seed: int) -> tuple[list[Tensor], Tensor, int]:
    ip, ix = _csr(n, e, seed=seed, isolated=n // 20)
    g = Graph(indptr=ip, indices=ix)
    plan = partition_graph(g, m, k, "random", seed)
    ip2, ix2 = permute_csr(ip, ix, None, plan.perm, plan.inverse())[:2]
    return chunk_rows(ip2, ix2, plan.chunk_ptr), plan.part_ptr, n


@pytest.mark.parametrize(("m", "k"), [(1, 1), (1, 7), (3, 1), (3, 7), (4, 64), (2, 300), (1, 300)])
def test_volume_exchange_and_reorganize_match_the_loops(m: int, k: int) -> None:
    rows, part_ptr, n = _plan_rows(2400 if k < 300 else 4000, 20000, m, k, seed=m * 100 + k)
    sched = reorganize(rows, m, k, n)
    assert torch.equal(sched, ref_reorganize(rows, m, k, n))
    for s in (default_schedule(m, k), sched, sched.flip(1)):
        assert comm_volume(rows, s) == ref_comm_volume(rows, s)
        for u, v in zip(_unions(rows, s), ref_unions(rows, s), strict=True):
            assert torch.equal(u, v)
        for mode in ("reuse", "full"):
            for device_of in ([0] * m, [i % 2 for i in range(m)], list(range(m))):
                _same_exchange(plan_exchange(rows, part_ptr, s, mode, device_of),
                               ref_plan_exchange(rows, part_ptr, s, mode, device_of))


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
