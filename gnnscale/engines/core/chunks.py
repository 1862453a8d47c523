"""The chunk of the full-graph engines (offload, task-parallel): a range of destination vertices, the source rows
its in-edges read and its block, cut once on the host and reused every pass.

Both engines cut the graph's normalised in-neighbour CSR (in their own vertex order) into destination ranges
``[lo, hi)`` with :func:`cut_chunks`; a chunk's rows are its destinations first, then the sorted in-neighbours
outside the range (:func:`gnnscale.partition.dedup.chunk_rows`). The task-parallel engine also needs to know which
chunk owns each source row (:meth:`Chunk.with_sources`): a P device assembles a chunk's rows from the rows other
chunks' tasks produced, and sends the rows' gradients back to them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import Tensor

from gnnscale.graph.block import Block, cut_block


class SourcePart(NamedTuple):
    """The source rows of a chunk that another chunk (or itself) owns."""

    owner: int
    """The owning chunk's id."""
    positions: Tensor
    """``[r]`` int64 positions of those rows in the reading chunk's ``rows``."""
    offsets: Tensor
    """``[r]`` int64 offsets of the same rows inside the owning chunk (``row - owner.lo``)."""


@dataclass(eq=False)
class Chunk:
    """One destination chunk: ids ``[lo, hi)`` (in the engine's vertex order), its source rows and its block."""

    k: int
    """Chunk id (position in the engine's chunk list)."""
    lo: int
    hi: int
    rows: Tensor
    """``[R]`` int64 ids of the source rows: ``lo..hi-1`` first, then the sorted outside in-neighbours."""
    block: Block
    """Local CSR (int32 row pointers and source rows while the chunk has fewer than 2^31 edges), globally
    normalised weights, and its transpose when a layer's backward needs one; ``src_ids`` are the ids dropout is
    keyed by (the *original* vertex ids; int32 below 2^31 vertices). Built once (pinned for a GPU)."""
    train_local: Tensor
    """``[t]`` int64 positions in ``[0, hi - lo)`` of the chunk's training vertices."""
    y_train: Tensor
    """``[t]`` their labels."""
    sources: list[SourcePart] = field(default_factory=list)
    """Which chunks own the source rows, one part per owner in id order (filled by :meth:`with_sources`)."""
    edge_chunk: Tensor | None = None
    """``[E]`` int64 owning chunk of each edge's source row (filled by :meth:`with_sources`)."""

    in_place_: Block | None = field(default=None, repr=False)

    @property
    def num_dst(self) -> int:
        return self.hi - self.lo

    def in_place(self, num_rows: int) -> Block:
        """The chunk's in-edges from the rows of a host table of ``num_rows`` rows itself (``indices`` are
        :attr:`rows` of the block's, entry for entry in the same order, so its products sum the same terms in the
        same order as the block's over the gathered rows): what a CPU worker reads source rows in place with.
        Built on first use and kept (4 bytes an edge below 2^31 rows, else 8)."""
        if self.in_place_ is None or self.in_place_.num_src != num_rows:
            b = self.block
            small = num_rows < 2**31 and b.indptr.dtype == torch.int32
            indices = self.rows.index_select(0, b.indices.long())
            self.in_place_ = Block(indptr=b.indptr if small else b.indptr.long(),
                                   indices=indices.to(torch.int32) if small else indices, num_src=num_rows,
                                   edge_weight=b.edge_weight)
        return self.in_place_

    def with_sources(self, chunk_ptr: Tensor) -> Chunk:
        """Fill :attr:`sources` and :attr:`edge_chunk` for chunks bounded by ``chunk_ptr`` (``[M + 1]``, chunk
        ``j`` is ``[chunk_ptr[j], chunk_ptr[j + 1])``); returns ``self``."""
        owner = torch.searchsorted(chunk_ptr, self.rows, right=True) - 1  # [R] chunk of each source row
        self.edge_chunk = owner.index_select(0, self.block.indices.long())  # [E]
        order = torch.sort(owner, stable=True).indices
        counts = torch.bincount(owner, minlength=chunk_ptr.numel() - 1).tolist()
        parts, start = [], 0
        for j, count in enumerate(counts):
            if count:
                pos = order[start : start + count]
                parts.append(SourcePart(j, pos, self.rows.index_select(0, pos) - int(chunk_ptr[j])))
                start += count
        self.sources = parts
        return self


def cut_chunks(indptr: Tensor, indices: Tensor, weight: Tensor | None, bounds: list[tuple[int, int]],
               rows: list[Tensor], *, train: Tensor, y: Tensor, ids: Tensor | None = None, transpose: bool = False,
               host: Callable[[Tensor], Tensor] | None = None) -> list[Chunk]:
    """One :class:`Chunk` per destination range ``bounds[k]`` with source rows ``rows[k]``, its block cut from the
    whole-graph in-neighbour CSR ``indptr, indices, weight``.

    Args:
        train: ``[N]`` bool training mask; ``y``: ``[N]`` labels (both in the CSR's vertex order).
        ids: ``[N]`` the id each vertex's dropout is keyed by (``None``: the vertex itself).
        transpose: build each block's transpose here (a layer's backward propagates through it).
        host: applied to every tensor a chunk keeps (pinning them for a GPU); ``None``: kept as cut.
    """
    n = indptr.numel() - 1
    id_dtype = torch.int32 if n < 2**31 else torch.int64
    scratch = torch.empty(n, dtype=id_dtype)
    chunks = []
    for k, ((lo, hi), r) in enumerate(zip(bounds, rows, strict=True)):
        keys = r if ids is None else ids.index_select(0, r)
        block = cut_block(indptr, indices, weight, lo, hi, r, scratch, keys.to(id_dtype))
        if transpose:
            block.with_transpose()
        train_local = torch.nonzero(train[lo:hi]).view(-1)
        y_train = y[lo:hi].index_select(0, train_local)
        if host is None:
            chunks.append(Chunk(k, lo, hi, r, block, train_local, y_train))
        else:
            chunks.append(Chunk(k, lo, hi, host(r), block.map(host), host(train_local), host(y_train)))
    return chunks
