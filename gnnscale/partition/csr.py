"""CSR work of partitioning: renumbering an in-neighbour CSR, and each chunk's in-neighbour sets (halo, counts,
per-partition owners) for any split of the destinations into contiguous chunks."""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import torch
from torch import Tensor

from gnnscale.errors import ConfigError

__all__ = ["ChunkCounter", "chunk_halo", "chunk_neighbour_counts", "permute_csr"]


# ------------------------------------------------------------------------------------------------ CSR helpers
def permute_csr(indptr: Tensor, indices: Tensor, weight: Tensor | None, perm: Tensor,
                inv: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
    """Renumber an in-neighbour CSR: new row ``r`` is old row ``perm[r]``; sources map through ``inv``.

    Edge order inside each row is kept, so per-row reductions see the same sequence as before. An identity
    ``perm`` (one partition split into ranges) returns the inputs themselves (``indices`` as int64): no copy.
    """
    if perm.numel() == 0 or (int(perm[0]) == 0 and int(perm[-1]) == perm.numel() - 1
                             and torch.equal(perm, torch.arange(perm.numel()))):
        return indptr, indices.long(), weight
    deg = (indptr[1:] - indptr[:-1])[perm]  # [N] new rows' degrees
    new_ptr = torch.zeros_like(indptr)
    torch.cumsum(deg, 0, out=new_ptr[1:])
    E = int(new_ptr[-1])
    shift = torch.repeat_interleave(indptr[:-1][perm] - new_ptr[:-1], deg, output_size=E)  # old - new position
    pos = torch.arange(E, dtype=torch.int64) + shift
    new_indices = inv.index_select(0, indices.long().index_select(0, pos))
    return new_ptr, new_indices, None if weight is None else weight.index_select(0, pos)


def chunk_halo(indptr: Tensor, indices: Tensor, lo: int, hi: int, mark: Tensor) -> Tensor:
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


def chunk_neighbour_counts(indptr: Tensor, indices: Tensor, chunk_ptr: Tensor) -> Tensor:
    """``[K, 3]`` int64 per chunk ``[lo, hi)``: distinct in-neighbours ``|N_k|``, those outside ``[lo, hi)``, and
    in-edges.

    O(E) per call once the transposed CSR of ``(indptr, indices)`` is built (an O(E log E) sort, cached while
    these tensors live and are not modified: see :class:`ChunkCounter`, which callers with many chunk splits of
    one CSR can also hold themselves).
    """
    return ChunkCounter.of(indptr, indices).counts(chunk_ptr)


class ChunkCounter:
    """Per-chunk in-neighbour sets of one in-neighbour CSR, for any number of chunk splits.

    ``ChunkCounter(indptr, indices)`` runs one O(E log E) sort to find, for every in-edge ``(s -> d)``, the
    previous destination of the same source ``s`` in CSR order (``gap``, int32, -1 for a source's first edge; a
    repeated edge's copies after the first get ``d`` itself). For any ``chunk_ptr`` (non-decreasing offsets of
    contiguous destination chunks ``[lo, hi)``), an edge into chunk ``[lo, hi)`` brings a new in-neighbour to the
    chunk exactly when ``gap < lo``, so each chunk's distinct in-neighbours are read from its own contiguous edge
    range by streaming comparisons: O(E) per split, no O(N) work per chunk.

    * :meth:`counts` is :func:`chunk_neighbour_counts` (``[K, 3]``: ``|N_k|``, outside, in-edges);
    * :meth:`rows` is :func:`gnnscale.partition.dedup.chunk_rows` (per chunk: ``lo..hi-1``, then the sorted
      in-neighbours outside ``[lo, hi)``).

    Both return exactly what the per-chunk definitions do. :meth:`of` reuses the ``gap`` of the same
    ``(indptr, indices)`` tensors (one cached entry, kept while they live and are not modified in place).
    """

    _cache: tuple[Any, Any, int, int, Tensor] | None = None

    def __init__(self, indptr: Tensor, indices: Tensor, gap: Tensor | None = None) -> None:
        self.indptr, self.indices = indptr, indices
        self.num_nodes = indptr.numel() - 1
        self.gap = _edge_gaps(indptr, indices) if gap is None else gap
        """``[E]`` int32: the previous destination (CSR order) of each edge's source, -1 for its first edge."""

    @classmethod
    def of(cls, indptr: Tensor, indices: Tensor) -> ChunkCounter:
        """A counter of ``(indptr, indices)`` sharing the cached ``gap`` when these same tensors were seen last,
        unmodified since."""
        c = cls._cache
        if (c is not None and c[0]() is indptr and c[1]() is indices and c[2] == indptr._version
                and c[3] == indices._version):
            return cls(indptr, indices, c[4])
        ChunkCounter._cache = None
        counter = cls(indptr, indices)
        try:
            ChunkCounter._cache = (weakref.ref(indptr, _drop_cache), weakref.ref(indices, _drop_cache),
                                   indptr._version, indices._version, counter.gap)
        except TypeError:  # pragma: no cover - tensors without weak references
            pass
        return counter

    def _ranges(self, chunk_ptr: Tensor) -> list[tuple[int, int, int, int]]:
        bounds = chunk_ptr.tolist()
        edges = self.indptr[chunk_ptr].tolist()
        return list(zip(bounds[:-1], bounds[1:], edges[:-1], edges[1:], strict=True))

    def counts(self, chunk_ptr: Tensor) -> Tensor:
        """:func:`chunk_neighbour_counts` for ``chunk_ptr``: ``[K, 3]`` int64 ``|N_k|``, outside, in-edges."""
        out = torch.empty(chunk_ptr.numel() - 1, 3, dtype=torch.int64)
        total, outside = [], []
        for lo, hi, e0, e1 in self._ranges(chunk_ptr):
            new = self.gap[e0:e1] < lo
            src = self.indices[e0:e1]
            inside = int((new & (src >= lo) & (src < hi)).sum())
            t = int(new.sum())
            total.append(t)
            outside.append(t - inside)
        out[:, 0] = torch.tensor(total, dtype=torch.int64)
        out[:, 1] = torch.tensor(outside, dtype=torch.int64)
        out[:, 2] = self.indptr[chunk_ptr[1:]] - self.indptr[chunk_ptr[:-1]]
        return out

    def owners(self, chunk_ptr: Tensor, part_ptr: Tensor) -> Tensor:
        """``[K, m]`` int64: rows of chunk ``k`` (its destinations and distinct in-neighbours) that partition ``b``
        (new ids ``part_ptr[b] .. part_ptr[b+1]``) owns; O(E) per split, like :meth:`counts`."""
        m = part_ptr.numel() - 1
        part_of = torch.repeat_interleave(torch.arange(m), part_ptr[1:] - part_ptr[:-1], output_size=self.num_nodes)
        out = torch.zeros(chunk_ptr.numel() - 1, m, dtype=torch.int64)
        for k, (lo, hi, e0, e1) in enumerate(self._ranges(chunk_ptr)):
            src = self.indices[e0:e1]
            new = (self.gap[e0:e1] < lo) & ((src < lo) | (src >= hi))
            out[k] = torch.bincount(part_of[src[new].long()], minlength=m)
            if hi > lo:
                out[k, int(part_of[lo])] += hi - lo  # the chunk's own destinations
        return out

    def halo(self, lo: int, hi: int) -> Tensor:
        """:func:`chunk_halo` of ``[lo, hi)``: sorted int64 in-neighbours outside the range."""
        e0, e1 = int(self.indptr[lo]), int(self.indptr[hi])
        src = self.indices[e0:e1]
        sel = (self.gap[e0:e1] < lo) & ((src < lo) | (src >= hi))
        return torch.sort(src[sel].long()).values

    def rows(self, chunk_ptr: Tensor) -> list[Tensor]:
        """:func:`gnnscale.partition.dedup.chunk_rows` for ``chunk_ptr``: per chunk ``[lo, hi)`` its destinations
        ``lo..hi-1`` then its sorted outside in-neighbours (int64)."""
        return [torch.cat([torch.arange(lo, hi), self.halo(lo, hi)]) for lo, hi, _, _ in self._ranges(chunk_ptr)]


GAP_BLOCK = 1 << 22
"""Edges per step of :func:`_edge_gaps`' passes after its sort (bounds their temporaries)."""


def _edge_gaps(indptr: Tensor, indices: Tensor) -> Tensor:
    """``[E]`` int32: per in-edge, the destination of the previous edge (CSR order) with the same source, -1 for
    the first. One sort of ``source << b | edge position`` (the stable order by source), in place; the passes
    before and after it run in blocks of :data:`GAP_BLOCK` edges, so the peak is the sort key, the destination of
    every edge and the answer (16 bytes an edge) plus one block's temporaries."""
    n, E = indptr.numel() - 1, indices.numel()
    if n >= 1 << 31:
        raise ConfigError(f"ChunkCounter supports fewer than 2**31 vertices, got {n}")
    pb = max(E - 1, 1).bit_length()
    src = indices.numpy()
    dst = np.repeat(np.arange(n, dtype=np.int32), (indptr[1:] - indptr[:-1]).numpy())
    gap = np.empty(E, dtype=np.int32)
    if max(n - 1, 1).bit_length() + pb > 63:  # pragma: no cover - too many edges for one 64-bit key
        pos = torch.sort(indices, stable=True).indices.numpy()
        s = src[pos]
        same = np.concatenate([[False], s[1:] == s[:-1]]) if E else np.zeros(0, dtype=bool)
        tdst = dst[pos]
        prev = np.full(E, -1, dtype=np.int32)
        if E:
            prev[1:] = np.where(same[1:], tdst[:-1], -1)
        gap[pos] = prev
        return torch.from_numpy(gap)
    key = np.empty(E, dtype=np.int64)
    for a in range(0, E, GAP_BLOCK):
        b = min(a + GAP_BLOCK, E)
        k = key[a:b]
        k[:] = src[a:b]
        k <<= pb
        k |= np.arange(a, b, dtype=np.int64)
    key.sort()
    mask = (1 << pb) - 1
    last_src, last_dst = -1, -1  # the previous block's last edge
    for a in range(0, E, GAP_BLOCK):
        k = key[a : min(a + GAP_BLOCK, E)]
        s = k >> pb
        pos = k & mask  # edge positions grouped by source, in CSR order
        tdst = dst[pos]
        prev = np.empty(k.size, dtype=np.int32)
        prev[0] = last_dst if s[0] == last_src else -1
        np.copyto(prev[1:], tdst[:-1])
        prev[1:][s[1:] != s[:-1]] = -1
        gap[pos] = prev
        last_src, last_dst = int(s[-1]), int(tdst[-1])
    return torch.from_numpy(gap)


def _drop_cache(_ref: Any) -> None:
    ChunkCounter._cache = None
