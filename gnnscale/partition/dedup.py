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

DEDUP_MODES = ("none", "reuse", "full")
REORGANIZE_MODES = ("auto", "on", "off")


# ------------------------------------------------------------------------------------------------ chunk rows
def chunk_rows(indptr: Tensor, indices: Tensor, chunk_ptr: Tensor) -> list[Tensor]:
    """Per chunk ``[lo, hi)``: its destinations ``lo..hi-1``, then the sorted in-neighbours outside the range.

    This is the row order of a chunk's block (destinations first, as layers expect) and the set ``N_ij``. The
    tensors are int64 views of one flat tensor, built without a per-chunk pass (:meth:`ChunkCounter.rows`, whose
    transposed CSR is cached for the same ``indptr``/``indices``).
    """
    return ChunkCounter.of(indptr, indices).rows(chunk_ptr)


_SHIFT = 32
"""Flat set keys are ``group << 32 | vertex`` (vertex ids < 2**31): sorting them sorts by group, then vertex."""
_LOW = (1 << _SHIFT) - 1


def _isin_sorted(a: Tensor, b_sorted: Tensor) -> Tensor:
    """``[len(a)]`` bool: which elements of ``a`` occur in the sorted ``b_sorted``."""
    if b_sorted.numel() == 0:
        return torch.zeros(a.numel(), dtype=torch.bool)
    pos = torch.searchsorted(b_sorted, a).clamp_(max=b_sorted.numel() - 1)
    return b_sorted[pos] == a


def _find(keys: np.ndarray, probe: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions of ``probe`` in the sorted ``keys`` and whether each is there."""
    if keys.size == 0:
        return np.zeros(probe.size, dtype=np.int64), np.zeros(probe.size, dtype=bool)
    pos = np.searchsorted(keys, probe)
    np.minimum(pos, keys.size - 1, out=pos)
    return pos, keys[pos] == probe


def _group_keys(rows: list[Tensor], chunk_ids: list[int], groups: list[int]) -> np.ndarray:
    """Unsorted int64 keys ``group << 32 | row`` of the rows of chunks ``chunk_ids`` (``groups`` alongside)."""
    sets = [rows[k] for k in chunk_ids]
    if not sets:
        return np.zeros(0, dtype=np.int64)
    key = torch.cat(sets).numpy().astype(np.int64)
    key |= np.repeat(np.asarray(groups, dtype=np.int64) << _SHIFT, [t.numel() for t in sets])
    return key


def _union_keys(rows: list[Tensor], schedule: Tensor) -> np.ndarray:
    """Sorted distinct keys ``j << 32 | v`` of every batch's transition set ``U_j`` (column ``j`` of
    ``schedule``)."""
    m, n = schedule.shape
    key = _group_keys(rows, schedule.reshape(-1).tolist(), [j for _ in range(m) for j in range(n)])
    key.sort()
    if key.size:
        key = key[np.concatenate([[True], key[1:] != key[:-1]])]
    return key


def _split_keys(key: np.ndarray, groups: int) -> list[Tensor]:
    """Sorted flat keys -> per group its sorted int64 values."""
    counts = np.bincount(key >> _SHIFT, minlength=groups) if key.size else np.zeros(groups, dtype=np.int64)
    return list(torch.split(torch.from_numpy(key & _LOW), counts.tolist()))


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
    return _split_keys(_union_keys(rows, schedule), schedule.shape[1])


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

    Each partition costs one sparse overlap product and one sort of the transition sets; the greedy choices are
    vectorised over the ``n`` candidates.
    """
    m, n = partitions, chunks
    sched = default_schedule(m, n).clone()
    # phase 1: N^U_j starts as partition 0's chunk j; kept as sorted keys j << 32 | v
    ukey = _group_keys(rows, list(range(n)), list(range(n)))
    ukey.sort()
    for i in range(1, m):
        own = rows[i * n : (i + 1) * n]
        common = _overlaps(own, _split_keys(ukey, n), num_nodes)  # [k, j] = |N_ik ∩ N^U_j|
        pick = _greedy(common, None)
        sched[i] = i * n + torch.tensor(pick, dtype=torch.int64)
        ukey = np.concatenate([ukey, _group_keys(rows, [i * n + k for k in pick], list(range(n)))])
        ukey.sort()
        ukey = ukey[np.concatenate([[True], ukey[1:] != ukey[:-1]])]
    if n > 2:  # phase 2: batch order
        union = _split_keys(ukey, n)
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
    """Eq. 4's row counts of ``schedule`` (sorts of flat ``group << 32 | row`` keys, no per-batch loop)."""
    m, n = schedule.shape
    ori = sum(r.numel() for r in rows)
    ukey = _union_keys(rows, schedule)
    p2p = int(ukey.size)
    # U_j's rows already in U_{j-1}: key j << 32 | v found as (j-1) << 32 | v (j = 0 probes negative keys)
    ru = p2p - int(_find(ukey, ukey - (1 << _SHIFT))[1].sum())
    # reuse: chunk (i, j)'s rows already in chunk (i, j-1)'s, group i * n + j
    key = _group_keys(rows, schedule.reshape(-1).tolist(), list(range(m * n)))
    key.sort()
    probe = key - (1 << _SHIFT)
    found = _find(key, probe)[1]
    found &= (key >> _SHIFT) % n != 0  # j = 0 has no previous chunk
    reuse = int(key.size) - int(found.sum())
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


def plan_exchange(rows: list[Tensor], part_ptr: Tensor, schedule: Tensor, mode: str, device_of: list[int],
                  volume: CommVolume | None = None) -> ExchangePlan:
    """Slots, loads, flushes and assembly maps of every batch for ``mode`` ``reuse`` or ``full``.

    Every transition set ``T[b][j]`` is one run of a flat sorted key array (``(b * n + j) << 32 | row``), so
    membership in the previous or next batch's set and every chunk's slot lookup are single vectorised searches;
    only the slot assignment walks the ``m * n`` sets in order (each step O(its set + the buffer's capacity)).
    """
    m, n = schedule.shape
    devices = max(device_of) + 1
    volume = volume or comm_volume(rows, schedule)
    # the transition sets T[b][j] of buffer b (one per partition), sorted, as flat keys (b * n + j) << 32 | row
    pp = part_ptr.numpy()
    if mode == "full":
        ukey = _union_keys(rows, schedule)
        v = ukey & _LOW
        owner = np.searchsorted(pp, v, side="right") - 1
        key = (owner * n + (ukey >> _SHIFT)) << _SHIFT | v
        del ukey, v, owner
    else:
        key = _group_keys(rows, schedule.reshape(-1).tolist(), list(range(m * n)))
    key.sort()
    grp = key >> _SHIFT
    sizes = np.bincount(grp, minlength=m * n) if key.size else np.zeros(m * n, dtype=np.int64)
    start = np.zeros(m * n + 1, dtype=np.int64)
    np.cumsum(sizes, out=start[1:])
    vals = torch.from_numpy(key & _LOW)
    cap = [int(sizes[b * n : (b + 1) * n].max()) for b in range(m)]
    offset, capacity = [0] * m, [0] * devices
    for b in range(m):
        offset[b] = capacity[device_of[b]]
        capacity[device_of[b]] += cap[b]
    # rows kept from the previous set of the same buffer, and where they were; rows leaving before the next set
    j_of = grp % n
    prev_pos, kept_np = _find(key, key - (1 << _SHIFT))
    kept_np &= j_of != 0
    leave_np = ~_find(key, key + (1 << _SHIFT))[1]
    leave_np |= j_of == n - 1
    del grp, j_of
    kept, prev_pos, leave = torch.from_numpy(kept_np), torch.from_numpy(prev_pos), torch.from_numpy(leave_np)
    # slots: kept rows keep theirs, newcomers take freed ones in increasing order
    slot = torch.empty(key.size, dtype=torch.int64)
    free_of: list[Tensor] = []
    for g in range(m * n):
        a, e = int(start[g]), int(start[g + 1])
        kg = kept[a:e]
        s = slot[a:e]
        ks = slot[prev_pos[a:e][kg]]
        s[kg] = ks
        used = torch.zeros(cap[g // n], dtype=torch.bool)
        used[ks] = True
        free = torch.nonzero(~used).view(-1)[: e - a - ks.numel()]
        s[~kg] = free
        free_of.append(free)
    gslot = slot + torch.repeat_interleave(torch.tensor(offset, dtype=torch.int64),
                                           torch.from_numpy(sizes.reshape(m, n).sum(1)), output_size=key.size)
    moves: list[list[BatchMoves]] = [[] for _ in range(devices)]
    cat = (lambda xs: torch.cat(xs) if xs else torch.empty(0, dtype=torch.int64))  # noqa: E731
    for d in range(devices):
        mine = [b for b in range(m) if device_of[b] == d]
        for j in range(n):
            nr, ns, lr, ls, kept_rows = [], [], [], [], 0
            for b in mine:
                g = b * n + j
                a, e = int(start[g]), int(start[g + 1])
                new = ~kept[a:e]
                nr.append(vals[a:e][new])
                ns.append(free_of[g] + offset[b])
                kept_rows += (e - a) - nr[-1].numel()
                lv = leave[a:e]
                lr.append(vals[a:e][lv])
                ls.append(gslot[a:e][lv])
            moves[d].append(BatchMoves(cat(nr), cat(ns), kept_rows, cat(lr), cat(ls)))
    # assembly of each chunk's rows from the buffers: one search of every chunk's rows in the flat keys
    order = schedule.reshape(-1).tolist()
    lens = [rows[k].numel() for k in order]
    flat = torch.cat([rows[k] for k in order]).numpy().astype(np.int64) if order else np.zeros(0, np.int64)
    i_of = np.repeat(np.arange(m * n, dtype=np.int64) // n, lens)
    j_of = np.repeat(np.arange(m * n, dtype=np.int64) % n, lens)
    own = np.searchsorted(pp, flat, side="right") - 1 if mode == "full" else i_of
    where = _find(key, (own * n + j_of) << _SHIFT | flat)[0]
    del j_of
    slots_all = gslot[torch.from_numpy(where)]
    owner_t = torch.from_numpy(own)
    remote_t = torch.from_numpy(own != i_of)
    dev_t = torch.tensor(device_of, dtype=torch.int64)[owner_t] if devices > 1 else None
    del where, own, i_of, flat
    assembly: dict[int, Assembly] = {}
    d2d = 0
    pos0 = 0
    for g, k in enumerate(order):
        i = g // n
        a, e = pos0, pos0 + lens[g]
        pos0 = e
        slot_k = slots_all[a:e]
        if mode == "reuse":
            assembly[k] = Assembly([(device_of[i], None, slot_k)], 0)
            continue
        parts: list[tuple[int, Tensor | None, Tensor]] = []
        if dev_t is None:
            if e > a:
                parts.append((0, None, slot_k))
        else:
            dev = dev_t[a:e]
            for dd in torch.unique(dev).tolist():
                sel = dev == dd
                if bool(sel.all()):
                    parts.append((dd, None, slot_k))
                else:
                    pos = torch.nonzero(sel).view(-1)
                    parts.append((dd, pos, slot_k[pos]))
        remote = int(remote_t[a:e].sum())
        d2d += remote
        assembly[k] = Assembly(parts, remote)
    h2d = sum(mv.new_rows.numel() for dev_moves in moves for mv in dev_moves)
    counts = {"rows_ori": volume.ori, "rows_p2p": volume.p2p, "rows_h2d": h2d,
              "rows_reused": sum(mv.kept for dev_moves in moves for mv in dev_moves), "rows_d2d": d2d}
    return ExchangePlan(mode, schedule, list(device_of), capacity, moves, assembly, volume, counts)
