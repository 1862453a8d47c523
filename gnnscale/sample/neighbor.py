"""K-hop uniform neighbour sampling into per-layer :class:`~gnnscale.graph.block.Block` s (XGNN §5, GraphSAGE).

The sampler reads the graph only through a :class:`Topology` (a graph store: the in-memory :class:`CSRTopology`
here, a global memory store spanning devices elsewhere), asks it once per hop for the in-neighbours of the whole
de-duplicated frontier (one batched request, not one per vertex), samples every row at once on the device of the
seeds, and relabels the reached vertices into the local rows gnnscale's layers consume.

Vocabulary: the *seeds* are the mini-batch's output vertices; hop ``h`` (``h = 0`` next to the seeds) expands
the *frontier* (the vertices reached so far) by at most ``fanouts[h]`` in-neighbours per frontier vertex.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from gnnscale.graph.block import AdjacencySpec, Block, normalized_csr
from gnnscale.graph.graph import Graph, csr_rows, csr_slices


@runtime_checkable
class Topology(Protocol):
    """What the sampler needs from a graph store: in-degrees and in-neighbour CSR slices of a batch of vertices."""

    def num_neighbors(self, ids: Tensor) -> Tensor:
        """``[n]`` int64 in-degree of each vertex of ``ids`` (``[n]`` integer global ids)."""
        ...

    def neighbors(self, ids: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """In-neighbours of ``ids`` as one CSR local to this request: ``(indptr, indices, weights)``.

        ``indptr`` is ``[n + 1]`` int64 (``indptr[0] == 0``), ``indices`` the ``[sum deg]`` int64 global ids of the
        in-neighbours, row ``i``'s in ``indices[indptr[i]:indptr[i + 1]]``, and ``weights`` the matching
        ``[sum deg]`` edge weights or ``None``. ``ids`` may be on CPU or CUDA; results are on the device of ``ids``.
        """
        ...


class CSRTopology:
    """The in-memory :class:`Topology`: an in-neighbour CSR ``(indptr, indices, weight)`` held in tensors.

    The tensors may live on any device; requests are answered on the device of the ids they come with.
    """

    def __init__(self, indptr: Tensor, indices: Tensor, weight: Tensor | None = None):
        if indptr.dim() != 1 or indptr.numel() < 1 or indices.dim() != 1:
            raise ValueError("CSRTopology needs a 1-D indptr of num_nodes + 1 entries and 1-D indices")
        if weight is not None and weight.shape != indices.shape:
            raise ValueError(f"weight has shape {tuple(weight.shape)}, indices {tuple(indices.shape)}")
        self.indptr = indptr.long()
        self.indices = indices.long()
        self.weight = weight

    @classmethod
    def from_graph(cls, graph: Graph, spec: AdjacencySpec | None = None) -> CSRTopology:
        """The adjacency ``spec`` (default: the plain graph) of ``graph``, self-loops and normalisation applied
        globally as in full-graph training, so sampled blocks carry the edge weights :meth:`Block.from_graph` has."""
        return cls(*normalized_csr(graph, AdjacencySpec() if spec is None else spec))

    @property
    def num_nodes(self) -> int:
        return int(self.indptr.numel()) - 1

    @property
    def device(self) -> torch.device:
        return self.indptr.device

    def num_neighbors(self, ids: Tensor) -> Tensor:
        i = ids.to(self.device).long()
        return (self.indptr[i + 1] - self.indptr[i]).to(ids.device)

    def neighbors(self, ids: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        out_dev = ids.device
        indptr, pos = csr_slices(self.indptr, ids.to(self.device).long())
        w = None if self.weight is None else self.weight[pos].to(out_dev)
        return indptr.to(out_dev), self.indices[pos].to(out_dev), w


def _sample_rows(
    indptr: Tensor, fanout: int, generator: torch.Generator | None
) -> tuple[Tensor, Tensor | None]:
    """Uniform sampling without replacement of at most ``fanout`` entries per CSR row, all rows at once.

    Returns the new ``[n + 1]`` indptr and the positions (into the request's edge arrays, ascending, so each row
    keeps its neighbours in CSR order) of the sampled edges, or ``None`` when every edge is kept.
    """
    deg = indptr[1:] - indptr[:-1]  # [n]
    num_edges = int(indptr[-1])
    if fanout < 0 or num_edges == 0 or int(deg.max()) <= fanout:
        return indptr, None
    dev = indptr.device
    # Rows with deg <= fanout keep every edge; only the edges of the other ("big") rows are drawn from.
    big = deg > fanout  # [n]
    rows = csr_rows(indptr)  # [E], ascending
    cand = torch.nonzero(big[rows]).view(-1)  # [Ec] edges of big rows, grouped by row, ascending
    big_deg = deg[big]  # [m]
    m = int(big_deg.numel())
    brow = torch.repeat_interleave(torch.arange(m, device=dev), big_deg, output_size=int(cand.numel()))  # [Ec]
    # Segmented random shuffle by one sort: key = (big-row index, random bits), so the candidates come out grouped
    # by row, each row's edges in a uniformly random order, and the first `fanout` slots of a row are a uniform
    # subset of size `fanout` without replacement. The key keeps 63 - bits(m) >= 32 random bits: two equal keys
    # in a row of degree d (order then decided by the sort) have probability below d^2 / 2^33.
    shift = 63 - max(m.bit_length(), 1)
    key = (brow << shift) | torch.randint(0, 1 << shift, brow.shape, generator=generator, device=dev)  # [Ec]
    order = cand[torch.sort(key).indices]  # [Ec]
    seg_start = torch.cumsum(big_deg, 0) - big_deg  # [m] first slot of each big row
    rank = torch.arange(order.numel(), device=dev) - seg_start[brow]  # [Ec] slot's rank within its row
    keep = ~big[rows]  # [E]
    keep[order[rank < fanout]] = True
    picked = torch.nonzero(keep).view(-1)  # [E'] edge positions, CSR order
    new_indptr = torch.cat([indptr.new_zeros(1), torch.cumsum(deg.clamp(max=fanout), 0)])  # [n + 1]
    return new_indptr, picked


def _relabel(dst_ids: Tensor, nbr_ids: Tensor) -> tuple[Tensor, Tensor]:
    """Local source rows of ``nbr_ids`` and the block's ``src_ids``: ``dst_ids`` (unique) first, in their order,
    then the vertices reached for the first time, in ascending id order."""
    n = dst_ids.numel()
    uniq, inv = torch.unique(torch.cat([dst_ids, nbr_ids]), return_inverse=True)  # sorted ids; [n + E']
    is_dst = torch.zeros(uniq.numel(), dtype=torch.bool, device=uniq.device)
    is_dst[inv[:n]] = True
    new_ids = uniq[~is_dst]  # ascending
    local = torch.empty(uniq.numel(), dtype=torch.int64, device=uniq.device)  # row of each unique id
    local[inv[:n]] = torch.arange(n, device=uniq.device)
    local[~is_dst] = torch.arange(n, n + new_ids.numel(), device=uniq.device)
    return local[inv[n:]], torch.cat([dst_ids, new_ids])


def sample_blocks(
    topo: Topology, seeds: Tensor, fanouts: Sequence[int], generator: torch.Generator | None = None
) -> list[Block]:
    """Sample ``len(fanouts)`` hops of in-neighbours around ``seeds`` into one :class:`Block` per GNN layer.

    Fanout order (PyG's ``NeighborLoader(num_neighbors=...)`` convention): ``fanouts[0]`` is the hop from the
    seeds, ``fanouts[1]`` the hop from their sampled neighbours, and so on outwards; ``--fanouts 15,10`` samples 15
    in-neighbours per seed and 10 per neighbour of those. ``-1`` takes every in-neighbour, ``0`` none.

    Block order (DGL's): ``blocks[0]`` is the input layer and was sampled with ``fanouts[-1]``; ``blocks[-1]`` has
    the seeds as destinations and was sampled with ``fanouts[0]``. So ``blocks[l]`` feeds ``model.layers[l]``,
    ``x[blocks[0].src_ids]`` are the input features, and the last block's output rows are the seeds in order.

    Sampling: uniform without replacement, per destination vertex: one with in-degree ``d <= fanout`` keeps all its
    in-neighbours (multi-edges counted as separate neighbours); one with ``d > fanout`` keeps a uniformly random
    subset of exactly ``fanout`` of its in-edges (each with probability ``fanout / d``; exact up to random-key
    collisions, probability below ``d^2 / 2^33`` per row). All rows of a hop are sampled at once: random keys per
    candidate edge, one sort keyed by (row, key), then the edges ranked ``< fanout`` in their row. Sampled edges
    keep the topology's CSR order within a row, and their weights (sliced from the topology's; ``None`` stays
    ``None``).

    Relabelling: in every block the destinations are the first source rows, ``src_ids[:num_dst]``; in the last
    block they are ``seeds`` in the given order, in block ``l < len - 1`` they are ``blocks[l + 1].src_ids`` in
    that order (``blocks[l].num_dst == blocks[l + 1].num_src``). The vertices a hop reaches for the first time
    follow, sorted by ascending global id. ``src_ids`` are global ids (int64), ``indices`` local source rows
    (int64), ``indptr`` int64.

    Requests: hop ``h`` calls ``topo.neighbors`` exactly once, with the de-duplicated frontier (the destinations
    of its block); ``topo.num_neighbors`` is never needed.

    Args:
        topo: the graph store.
        seeds: ``[B]`` distinct integer global vertex ids, on the device where sampling runs (CPU or CUDA).
        fanouts: one per layer, as above; each ``>= -1``.
        generator: RNG on the seeds' device; the same seeded generator state gives identical blocks.
            ``None`` uses torch's default generator for that device.

    Raises:
        ValueError: ``seeds`` not a 1-D integer tensor or holding duplicates (de-duplicate them first: a
            mini-batch has one output row per seed), ``fanouts`` empty or a fanout below ``-1``.
    """
    if seeds.dim() != 1 or seeds.is_floating_point() or seeds.is_complex() or seeds.dtype == torch.bool:
        raise ValueError(f"seeds must be a 1-D integer tensor, got {seeds.dtype} of shape {tuple(seeds.shape)}")
    fanouts = [int(f) for f in fanouts]
    if not fanouts:
        raise ValueError("fanouts must list at least one hop")
    if any(f < -1 for f in fanouts):
        raise ValueError(f"fanouts must be >= -1 (-1: all neighbours), got {fanouts}")
    frontier = seeds.long()
    if torch.unique(frontier).numel() != frontier.numel():
        raise ValueError("seeds contain duplicates; pass each seed once (e.g. torch.unique(seeds))")
    dev = frontier.device
    blocks: list[Block] = []
    for fanout in fanouts:
        indptr, nbrs, weight = topo.neighbors(frontier)
        indptr, nbrs = indptr.to(dev).long(), nbrs.to(dev).long()
        weight = None if weight is None else weight.to(dev)
        indptr, picked = _sample_rows(indptr, fanout, generator)
        if picked is not None:
            nbrs = nbrs[picked]
            weight = None if weight is None else weight[picked]
        local, src_ids = _relabel(frontier, nbrs)
        blocks.append(Block(indptr=indptr, indices=local, num_src=int(src_ids.numel()), edge_weight=weight,
                            src_ids=src_ids))
        frontier = src_ids
    blocks.reverse()
    return blocks
