"""Deduplicated host-device communication (HongTu §5-6): batches, transition sets, slots and Algorithm 4.

Chunk ``(i, j)`` of partition ``i`` reads the rows ``N_ij``: its destinations and their in-neighbours. A *batch*
``j`` is the chunks at position ``j`` of every partition (one per device in HongTu). Sent naively, a layer pass
moves ``V_ori = sum_ij |N_ij|`` rows host->device. Deduplication moves fewer:

* **full** (Algorithms 2-3): the transition set ``U_j = union_i N_ij`` is loaded once per batch, each vertex into
  the transition buffer of the partition that owns it (``T_ij = U_j ∩ V_i``); chunks assemble their rows from the
  buffers of every partition (peer-to-peer between devices, a device-local copy when partitions share one);
  rows of ``T_ij`` that were already in ``T_i,j-1`` stay in place (``V_+ru`` rows cross the bus, Eq. 4).
* **reuse**: no sharing between partitions; each partition's buffer holds its chunk's ``N_ij`` and keeps the rows
  it shares with ``N_i,j-1`` (intra-device reuse only: HongTu's answer for slow inter-GPU links).
* **none**: every chunk gathers its rows from host memory.

A buffer has one slot per row of its largest set; write positions are fixed in preprocessing so that a row kept
from the previous batch keeps its slot and newcomers take the slots of rows that left (§6, in-place transition
data management). In backward the same slots accumulate gradients: a kept row's gradient stays on the device,
a leaving row's is flushed to host memory once (Algorithm 3).

:func:`reorganize` is Algorithm 4 (which chunks share a batch, then the order of batches) and :func:`comm_cost`
is Eq. 4 with measured throughputs (:mod:`gnnscale.plan.throughput`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from gnnscale.partition.plan import ChunkCounter

DEDUP_MODES = ("auto", "none", "reuse", "full")
"""``--dedup`` choices; ``auto`` is :func:`resolve_dedup`'s."""


def resolve_dedup(mode: str, accelerator: bool) -> str:
    """The deduplication a run uses: ``mode``, or for ``auto`` ``full`` (HongTu's) when the workers are
    accelerators and ``none`` when they are the CPU, whose "device" is host memory: no transfer to save, and the
    transition buffers' assembly, gradient pushes and flushes would only add copies (about 1.3x an offload
    epoch's time at 200K vertices, 8 chunks)."""
    if mode == "auto":
        return "full" if accelerator else "none"
    return mode
REORGANIZE_MODES = ("auto", "on", "off")


# ------------------------------------------------------------------------------------------------ chunk rows
def chunk_rows(indptr: Tensor, indices: Tensor, chunk_ptr: Tensor) -> list[Tensor]:
    """Per chunk ``[lo, hi)``: its destinations ``lo..hi-1``, then the sorted in-neighbours outside the range.

    This is the row order of a chunk's block (destinations first, as layers expect) and the set ``N_ij``. Built by
    :meth:`ChunkCounter.rows` from the edges' per-source gaps (one O(E log E) sort, cached for the same
    ``indptr``/``indices``; then O(E) per split, no O(N) work per chunk).
    """
    return ChunkCounter.of(indptr, indices).rows(chunk_ptr)


def _isin_sorted(a: Tensor, b_sorted: Tensor) -> Tensor:
    """``[len(a)]`` bool: which elements of ``a`` occur in the sorted ``b_sorted``."""
    if b_sorted.numel() == 0:
        return torch.zeros(a.numel(), dtype=torch.bool)
    pos = torch.searchsorted(b_sorted, a).clamp_(max=b_sorted.numel() - 1)
    return b_sorted[pos] == a


def _overlaps(rows_a: list[Tensor], rows_b: list[Tensor], n: int) -> np.ndarray:
    """``[len(a), len(b)]`` matrix of ``|A_x ∩ B_y|`` for row sets without repeats (sparse incidence product)."""
    import scipy.sparse as sp

    def incidence(sets: list[Tensor]) -> sp.csr_matrix:
        lens = np.array([s.numel() for s in sets], dtype=np.int64)
        ptr = np.zeros(len(sets) + 1, dtype=np.int64)
        np.cumsum(lens, out=ptr[1:])
        cols = torch.cat(sets).numpy() if sets else np.zeros(0, dtype=np.int64)
        return sp.csr_matrix((np.ones(cols.size, dtype=np.int64), cols, ptr), shape=(len(sets), n))

    return np.asarray((incidence(rows_a) @ incidence(rows_b).T).todense())


def _unions(rows: list[Tensor], schedule: Tensor) -> list[Tensor]:
    """Sorted transition set ``U_j`` of every batch (column ``j`` of ``schedule``)."""
    return [torch.unique(torch.cat([rows[k] for k in schedule[:, j].tolist()])) for j in range(schedule.shape[1])]


# ------------------------------------------------------------------------------------------------ Algorithm 4
def default_schedule(partitions: int, chunks: int) -> Tensor:
    """``[m, n]`` chunk ids: partition ``i``'s chunks in order (batch ``j`` runs chunk ``i * n + j`` of each)."""
    return torch.arange(partitions * chunks).view(partitions, chunks)


def _greedy(common: np.ndarray, pick: list[int] | None) -> list[int]:
    """Greedy choices over ``common`` (``[a, b]`` overlap counts): with ``pick`` None, for each column ``j`` in
    order, the unused row with the largest ``common[row, j]``; else a chain from ``pick[0]``, each next the unused
    row with the largest ``common[row, previous]``. Ties go to the lowest row."""
    cnt = common.astype(np.int64, copy=True)
    if pick is None:
        out = []
        for j in range(cnt.shape[1]):
            k = int(np.argmax(cnt[:, j]))  # first maximum: the lowest id
            out.append(k)
            cnt[k, :] = -1
        return out
    order = list(pick)
    cnt[order[0], :] = -1
    for _ in range(cnt.shape[0] - 1):
        k = int(np.argmax(cnt[:, order[-1]]))
        order.append(k)
        cnt[k, :] = -1
    return order


def reorganize(rows: list[Tensor], partitions: int, chunks: int, num_nodes: int) -> Tensor:
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
        common = _overlaps(own, union, num_nodes)  # [k, j] = |N_ik ∩ N^U_j|
        for j, k in enumerate(_greedy(common, None)):
            sched[i, j] = i * n + k
            union[j] = torch.unique(torch.cat([union[j], own[k]]))
    if n > 2:  # phase 2: batch order
        common = _overlaps(union, union, num_nodes)
        sched = sched[:, _greedy(common, [0])]
    return sched


# ------------------------------------------------------------------------------------------------ volumes, Eq. 4
@dataclass(frozen=True)
class CommVolume:
    """Rows moved per layer pass under each level of deduplication (HongTu §5.3)."""

    ori: int
    """``V_ori = sum_ij |N_ij|``: every chunk's rows."""
    p2p: int
    """``V_+p2p = sum_j |U_j|``: each batch's transition set once."""
    ru: int
    """``V_+ru``: transition rows not already on the device from the previous batch (full mode's host->device)."""
    reuse: int
    """Host->device rows of ``reuse`` mode: ``sum_ij |N_ij \\ N_i,j-1|``."""

    def h2d(self, mode: str) -> int:
        return {"none": self.ori, "reuse": self.reuse, "full": self.ru}[mode]


def comm_volume(rows: list[Tensor], schedule: Tensor) -> CommVolume:
    m, n = schedule.shape
    ori = sum(r.numel() for r in rows)
    unions = _unions(rows, schedule)
    p2p = sum(u.numel() for u in unions)
    ru = unions[0].numel() + sum(int((~_isin_sorted(unions[j], unions[j - 1])).sum()) for j in range(1, n))
    reuse = 0
    for i in range(m):
        prev = torch.empty(0, dtype=torch.int64)
        for k in schedule[i].tolist():
            cur = torch.sort(rows[k]).values
            reuse += int((~_isin_sorted(cur, prev)).sum())
            prev = cur
    return CommVolume(ori, p2p, ru, reuse)


@dataclass(frozen=True)
class Throughput:
    """Rows-per-second rates of Eq. 4, as bytes per second: host->device, device->device, in-device reuse."""

    hd: float
    dd: float
    ru: float


def comm_cost(volume: CommVolume, mode: str, tp: Throughput, row_bytes: int = 4) -> float:
    """Eq. 4: modelled seconds of one layer pass's row traffic under ``mode``.

    A row reused in place is never dearer than loading it again (a load is a gather *and* a write into the
    buffer), so ``T_ru`` is taken as at least ``T_hd``; on a CPU, where both measure a gather in host memory,
    they would otherwise differ by noise alone.
    """
    ru_rate = max(tp.ru, tp.hd)
    if mode == "none":
        return volume.ori * row_bytes / tp.hd
    if mode == "reuse":
        return (volume.reuse / tp.hd + (volume.ori - volume.reuse) / ru_rate) * row_bytes
    return (volume.ru / tp.hd + (volume.ori - volume.p2p) / tp.dd + (volume.p2p - volume.ru) / ru_rate) * row_bytes


# ------------------------------------------------------------------------------------------------ the exchange plan
@dataclass(eq=False)
class BatchMoves:
    """One device's transition-buffer work for one batch (indices into the device's buffer tensor)."""

    new_rows: Tensor
    """``[r]`` host rows loaded into the buffer before the batch."""
    new_slots: Tensor
    """``[r]`` their buffer positions."""
    kept: int
    """Rows reused in place from the previous batch."""
    leave_rows: Tensor
    """``[s]`` rows whose slots are replaced after the batch (all rows after the last): their gradients are
    flushed to host memory then."""
    leave_slots: Tensor


@dataclass(eq=False)
class Assembly:
    """Where chunk ``k``'s rows come from: per device ``d``, positions in the chunk's rows and buffer slots."""

    parts: list[tuple[int, Tensor | None, Tensor]]
    """``(device, positions or None for all rows in order, slots in that device's buffer)``."""
    remote_rows: int
    """Rows read from another partition's buffer (inter-device, or device-local between partitions)."""


@dataclass(eq=False)
class ExchangePlan:
    """Precomputed transition buffers of a dedup mode for a schedule (HongTu §6)."""

    mode: str
    schedule: Tensor
    """``[m, n]`` chunk ids: partition ``i`` runs ``schedule[i, j]`` in batch ``j``."""
    device_of: list[int]
    """Worker (device) index of each partition."""
    capacity: list[int]
    """Rows of each device's buffer (sum over its partitions' largest sets)."""
    moves: list[list[BatchMoves]]
    """``[device][batch]``."""
    assembly: dict[int, Assembly]
    """Per chunk id."""
    volume: CommVolume
    counts: dict[str, int] = field(default_factory=dict)
    """Rows per layer pass: ``rows_ori``, ``rows_p2p``, ``rows_h2d``, ``rows_reused``, ``rows_d2d``."""

    def pin_memory(self) -> None:
        """Pin the index tensors in place, so that their per-batch copies to a GPU are asynchronous."""
        for moves in self.moves:
            for mv in moves:
                mv.new_rows, mv.new_slots = mv.new_rows.pin_memory(), mv.new_slots.pin_memory()
                mv.leave_rows, mv.leave_slots = mv.leave_rows.pin_memory(), mv.leave_slots.pin_memory()
        for asm in self.assembly.values():
            asm.parts = [(d, None if pos is None else pos.pin_memory(), slots.pin_memory())
                         for d, pos, slots in asm.parts]


def plan_exchange(rows: list[Tensor], part_ptr: Tensor, schedule: Tensor, mode: str, device_of: list[int],
                  volume: CommVolume | None = None) -> ExchangePlan:
    """Slots, loads, flushes and assembly maps of every batch for ``mode`` ``reuse`` or ``full``."""
    m, n = schedule.shape
    devices = max(device_of) + 1
    volume = volume or comm_volume(rows, schedule)
    # the transition sets T[b][j] of buffer b (one per partition), sorted
    if mode == "full":
        unions = _unions(rows, schedule)
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
            kept = _isin_sorted(cur, prev)
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
                leaving = ~_isin_sorted(sets[b][j], sets[b][j + 1]) if j + 1 < n else \
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
