"""Blocks: the bipartite sub-graphs every layer runs on.

A :class:`Block` holds the in-edges of ``num_dst`` destination rows from ``num_src`` source rows, in CSR. By
convention (DGL's) the first ``num_dst`` source rows *are* the destination vertices, so ``x_src[:num_dst]`` is the
destinations' own representation. The in-memory engine uses one block for the whole graph; chunked engines cut
blocks out of the same normalised adjacency, so a chunk sees exactly the edge weights the full graph would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

from gnnscale.graph.csr import coo_to_csr, csr_rows
from gnnscale.graph.graph import Graph

Norm = Literal["none", "gcn"]


@dataclass(frozen=True)
class AdjacencySpec:
    """Which adjacency a layer aggregates over. On the whole graph (full-graph engines) normalisation reads the
    whole graph's degrees; on a sampled block, the degrees the sampler's ``SampledAdjacency`` says."""

    self_loops: bool = False
    """Give every vertex exactly one self-loop (PyG's ``add_remaining_self_loops``: the graph's own loops are
    replaced, a loop listed twice counts once)."""
    norm: Norm = "none"
    """``"gcn"``: symmetric ``D^-1/2 (A + I) D^-1/2`` weights from the graph's edge weights; ``"none"``: ones."""

    @property
    def weighted(self) -> bool:
        """Whether the graph's edge weights enter the adjacency (GCN's normalisation, as PyG's ``gcn_norm`` of
        ``edge_weight``); otherwise every edge weighs one."""
        return self.norm == "gcn"


def normalized_csr(graph: Graph, spec: AdjacencySpec) -> tuple[Tensor, Tensor, Tensor | None]:
    """In-neighbour CSR ``(indptr, indices, weight)`` of the whole graph after self-loops and normalisation.

    Self-loops follow PyG's ``add_remaining_self_loops``: the graph's own loops are removed and every vertex gets
    exactly one, weighted as the graph's loop was (the last listed, when a loop is listed twice) or 1. Chunked
    engines slice destination row ranges out of this, so per-chunk blocks carry globally correct weights.
    """
    n = graph.num_nodes
    indptr, indices, weight, loop_weight = sampling_csr(graph, spec)
    if spec.self_loops:
        indptr, indices, weight = _add_self_loops(indptr, indices, weight, n, loop_weight)
    if spec.norm == "gcn":
        w = torch.ones(indices.numel()) if weight is None else weight
        rows = csr_rows(indptr)
        deg = torch.zeros(n).index_add_(0, rows, w)  # weighted in-degree, self-loop included
        weight = gcn_weights(deg, indices, rows, w)
    return indptr, indices, weight


def gcn_weights(deg: Tensor, src: Tensor, dst: Tensor, weight: Tensor) -> Tensor:
    """GCN's edge weights ``w_uv / sqrt(deg_u deg_v)`` (``gcn_norm``; a vertex of degree 0 gets 0), for edges
    ``src[e] -> dst[e]`` indexing ``deg``."""
    dinv = deg.pow(-0.5)
    dinv.masked_fill_(torch.isinf(dinv), 0.0)
    return dinv[src] * weight * dinv[dst]


def sampling_csr(graph: Graph, spec: AdjacencySpec) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """What a sampler draws from for a layer with adjacency ``spec``: ``(indptr, indices, weight, loop_weight)``.

    The graph's in-neighbour CSR with its raw weights (kept only when ``spec.norm == "gcn"``, the one use of
    them). When the layer adds self-loops, the graph's own loops are taken out of the lists, so they never take a
    fanout slot: the layer's loop is added to each sampled block outside the fanout; ``loop_weight`` (``[N]``, or
    ``None`` for ones) is then the weight the graph gave each vertex's loop (PyG's ``add_remaining_self_loops``).
    """
    indptr, indices = graph.indptr, graph.indices.long()
    weight = graph.edge_weight if spec.weighted else None
    if not spec.self_loops:
        return indptr, indices, weight, None
    return remove_self_loops(indptr, indices, weight, graph.num_nodes)


def remove_self_loops(indptr: Tensor, indices: Tensor, weight: Tensor | None,
                      n: int) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """The CSR without its self-loops, and ``[n]`` loop weights (each vertex's last listed loop, else 1; ``None``
    when there are no weights)."""
    dst = csr_rows(indptr, indices.numel())
    on_loop = indices == dst
    if not bool(on_loop.any()):
        return indptr, indices, weight, None
    keep = ~on_loop
    loop_weight = None
    if weight is not None:
        pos = torch.nonzero(on_loop).view(-1)  # the last listed loop of a vertex wins, deterministically
        last = torch.full((n,), -1, dtype=torch.int64).scatter_reduce_(0, dst[pos], pos, "amax")
        has = last >= 0
        loop_weight = torch.ones(n, dtype=weight.dtype)
        loop_weight[has] = weight[last[has]]
        weight = weight[keep]
    new_ptr = torch.zeros(n + 1, dtype=indptr.dtype)
    torch.cumsum(torch.bincount(dst[keep], minlength=n), 0, out=new_ptr[1:])
    return new_ptr, indices[keep], weight, loop_weight


def _add_self_loops(indptr: Tensor, indices: Tensor, weight: Tensor | None, n: int,
                    loop_weight: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
    """The CSR with a self-loop (weight ``loop_weight[v]``, default 1) added to every row that has none, at its place
    in (destination, source) order -- what sorting the edges with the loops added gives. Rows already sorted by
    source (as :class:`Graph` builds them) take an O(E) insertion; otherwise the edges are sorted."""
    dst = csr_rows(indptr, indices.numel())
    on_loop = indices == dst
    has_loop = torch.zeros(n, dtype=torch.bool)
    has_loop[dst[on_loop]] = True
    add = (~has_loop).to(torch.int64)  # [n] rows that get a loop
    missing = torch.nonzero(add).view(-1)
    if weight is not None:
        loops = torch.ones(missing.numel(), dtype=weight.dtype) if loop_weight is None else loop_weight[missing]
    in_row = torch.ones(indices.numel(), dtype=torch.bool)
    if indices.numel():
        in_row[indptr[1:-1][indptr[1:-1] < indices.numel()]] = False  # first edge of a row: no predecessor
    sorted_rows = bool(((indices[1:] >= indices[:-1]) | ~in_row[1:]).all()) if indices.numel() > 1 else True
    if not sorted_rows:
        src = torch.cat([indices, missing])
        both = torch.cat([dst, missing])
        if weight is not None:
            weight = torch.cat([weight, loops])
        return coo_to_csr(src, both, n, weight, coalesce=False)
    shift = torch.zeros(n + 1, dtype=torch.int64)
    torch.cumsum(add, 0, out=shift[1:])  # loops added in the rows before each row
    new_ptr = indptr + shift
    after = (indices > dst) & add.bool()[dst]  # edges placed after their row's new loop
    pos = torch.arange(indices.numel()) + shift[dst] + after
    below = torch.zeros(n, dtype=torch.int64).index_add_(0, dst, (indices < dst).to(torch.int64))
    loop_pos = new_ptr[missing] + below[missing]
    total = indices.numel() + missing.numel()
    out = torch.empty(total, dtype=indices.dtype)
    out[pos] = indices
    out[loop_pos] = missing.to(indices.dtype)
    if weight is not None:
        w = torch.empty(total, dtype=weight.dtype)
        w[pos] = weight
        w[loop_pos] = loops
        weight = w
    return new_ptr, out, weight


@dataclass(eq=False)
class Block:
    """In-edges of ``num_dst`` destination rows from ``num_src`` source rows (destinations are the first rows).

    A block may carry its transpose (``t_*``, built once by :meth:`with_transpose`): chunked engines build it on
    the host when the chunk is cut and move it with the block, so backward never re-sorts the edges on the device.
    """

    indptr: Tensor
    """``[num_dst + 1]`` row pointers (int32 when ``indices`` is int32: the sparse tensor shares them)."""
    indices: Tensor
    """``[num_edges]`` local source row (``0 <= i < num_src``) of each edge."""
    num_src: int
    edge_weight: Tensor | None = None
    """``[num_edges]`` weight per edge; ``None`` means ones."""
    src_ids: Tensor | None = None
    """``[num_src]`` global vertex id of each source row; ``None`` means ``arange(num_src)``."""
    t_indptr: Tensor | None = None
    """``[num_src + 1]`` row pointers of the transpose (sources' out-edges), when built."""
    t_indices: Tensor | None = None
    """``[num_edges]`` destination row of each out-edge of the transpose."""
    t_weight: Tensor | None = None
    """``[num_edges]`` the transpose's weights (``None`` when ``edge_weight`` is)."""
    _cache: dict[str, Tensor] = field(default_factory=dict, repr=False)

    @classmethod
    def from_graph(cls, graph: Graph, spec: AdjacencySpec = AdjacencySpec()) -> Block:
        """One block covering the whole graph (``num_src == num_dst == num_nodes``)."""
        indptr, indices, weight = normalized_csr(graph, spec)
        return cls(indptr=indptr, indices=indices, num_src=graph.num_nodes, edge_weight=weight)

    @property
    def num_dst(self) -> int:
        return int(self.indptr.numel()) - 1

    @property
    def num_edges(self) -> int:
        return int(self.indices.numel())

    @property
    def device(self) -> torch.device:
        return self.indptr.device

    @property
    def has_transpose(self) -> bool:
        return self.t_indptr is not None

    def row_ids(self, rows: int | None = None) -> Tensor:
        """Global ids of the first ``rows`` source rows (all when ``None``): the keys of keyed dropout."""
        rows = self.num_src if rows is None else rows
        if self.src_ids is None:
            return torch.arange(rows, device=self.device)
        return self.src_ids[:rows]

    def in_degree(self) -> Tensor:
        """``[num_dst]`` in-edges per destination."""
        return self.indptr[1:] - self.indptr[:-1]

    def dst_index(self) -> Tensor:
        """``[num_edges]`` destination row of each edge (cached; no device sync: the size is known)."""
        if "dst" not in self._cache:
            self._cache["dst"] = csr_rows(self.indptr, self.num_edges)
        return self._cache["dst"]

    def edge_index(self) -> Tensor:
        """``[2, num_edges]`` int64 PyG edges ``(local source row, destination row)`` of the block, in its CSR order
        (cached): what a PyG conv takes with ``(x_src, x_dst)``."""
        if "edge_index" not in self._cache:
            self._cache["edge_index"] = torch.stack([self.indices.long(), self.dst_index().long()])
        return self._cache["edge_index"]

    def _values(self) -> Tensor:
        if self.edge_weight is not None:
            return self.edge_weight
        return torch.ones(self.num_edges, device=self.device)

    def adj(self) -> Tensor:
        """Sparse CSR ``[num_dst, num_src]`` adjacency with the edge weights (cached)."""
        if "adj" not in self._cache:
            # int32 source rows (chunk blocks) keep int32 pointers too: no int64 copy of the indices
            indptr = self.indptr.to(self.indices.dtype) if self.indices.dtype == torch.int32 else self.indptr
            self._cache["adj"] = torch.sparse_csr_tensor(
                indptr, self.indices.to(indptr.dtype), self._values(), (self.num_dst, self.num_src)
            )
        return self._cache["adj"]

    def adj_t(self) -> Tensor:
        """Sparse CSR ``[num_src, num_dst]`` transpose, for backward (cached): sources sum their gradients. Uses the
        transpose carried by the block when there is one, else sorts the edges here."""
        if "adj_t" not in self._cache:
            if self.t_indptr is not None:
                assert self.t_indices is not None
                values = self.t_weight if self.t_weight is not None else torch.ones(self.num_edges, device=self.device)
                self._cache["adj_t"] = torch.sparse_csr_tensor(self.t_indptr, self.t_indices, values,
                                                               (self.num_src, self.num_dst))
            else:
                csc = self.adj().to_sparse_csc()
                self._cache["adj_t"] = torch.sparse_csr_tensor(
                    csc.ccol_indices(), csc.row_indices(), csc.values(), (self.num_src, self.num_dst)
                )
        return self._cache["adj_t"]

    def with_transpose(self) -> Block:
        """This block with its transpose built (in place; returns ``self``), in the dtype of ``indices``."""
        if self.t_indptr is None:
            # a stable sort of the source rows (radix sort for integers): each source's out-edges in destination
            # order, what a CSC conversion gives, several times faster
            order = torch.sort(self.indices, stable=True).indices
            dtype = self.indices.dtype
            counts = torch.bincount(self.indices, minlength=self.num_src)
            t_indptr = torch.zeros(self.num_src + 1, dtype=dtype)
            torch.cumsum(counts, 0, out=t_indptr[1:])
            self.t_indptr = t_indptr
            self.t_indices = self.dst_index().index_select(0, order).to(dtype)
            self.t_weight = None if self.edge_weight is None else self.edge_weight.index_select(0, order)
            self._cache.pop("dst", None)  # built on the host for this: the device computes its own
        return self

    def _fields(self, transpose: bool = True) -> list[Tensor | None]:
        fields = [self.indptr, self.indices, self.edge_weight, self.src_ids]
        return fields + ([self.t_indptr, self.t_indices, self.t_weight] if transpose else [])

    def map(self, fn: Callable[[Tensor], Tensor], transpose: bool = True) -> Block:
        """A new block whose tensors are ``fn`` of these (the transpose left out unless ``transpose``)."""
        t = [None if x is None else fn(x) for x in self._fields(transpose)] + [None] * (0 if transpose else 3)
        return Block(indptr=t[0], indices=t[1], num_src=self.num_src, edge_weight=t[2],  # type: ignore[arg-type]
                     src_ids=t[3], t_indptr=t[4], t_indices=t[5], t_weight=t[6])

    def to(self, device: torch.device | str, non_blocking: bool = False, transpose: bool = True) -> Block:
        """Copy to ``device``, with the transpose when the block carries one and ``transpose`` (sparse views are
        rebuilt there on first use, without copying)."""
        return self.map(lambda t: t.to(device, non_blocking=non_blocking), transpose)

    def tensors(self) -> list[Tensor]:
        """The block's tensors (its transpose's included), for marking their use on a stream
        (``runtime.record_stream``)."""
        return [t for t in self._fields() if t is not None]

    def record_stream(self, stream: Any) -> None:
        """Mark the block's tensors as used on ``stream`` (made on another stream and read on this one: the
        caching allocator then keeps their memory until ``stream``'s work on them is done)."""
        for t in self._fields():
            if t is not None:
                t.record_stream(stream)

    def pin_memory(self) -> Block:
        return self.map(lambda t: t.pin_memory())

    def nbytes(self, transpose: bool = True) -> int:
        """Bytes of the block's tensors (with the transpose it carries, unless ``transpose`` is false)."""
        return sum(t.numel() * t.element_size() for t in self._fields(transpose) if t is not None)


def cut_block(indptr: Tensor, indices: Tensor, weight: Tensor | None, lo: int, hi: int, rows: Tensor,
              scratch: Tensor, src_ids: Tensor | None = None) -> Block:
    """The block of destinations ``lo .. hi - 1`` of a whole-graph in-neighbour CSR whose sources are ``rows``
    (global ids, the destinations first): local source ids, int32 row pointers and indices while the block has
    fewer than 2^31 edges (the engines' chunk topology). ``scratch`` is an ``[N]`` integer buffer it writes
    ``rows``' positions into; ``src_ids`` (default ``rows``) are the ids the block reports for its rows."""
    scratch[rows] = torch.arange(rows.numel(), dtype=scratch.dtype)
    e0, e1 = int(indptr[lo]), int(indptr[hi])
    idx = torch.int32 if e1 - e0 < 2**31 and rows.numel() < 2**31 else torch.int64
    return Block(indptr=(indptr[lo : hi + 1] - e0).to(idx), indices=scratch.index_select(0, indices[e0:e1]).to(idx),
                 num_src=rows.numel(), edge_weight=None if weight is None else weight[e0:e1].contiguous(),
                 src_ids=rows if src_ids is None else src_ids)
