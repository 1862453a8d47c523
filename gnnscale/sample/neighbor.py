"""K-hop uniform neighbour sampling into per-layer :class:`~gnnscale.graph.block.Block` s (XGNN §5, GraphSAGE).

The sampler reads the graph only through a :class:`Topology` (a graph store: the in-memory :class:`CSRTopology`
here, a global memory store spanning devices elsewhere). Per hop it asks the store once for the degrees of the whole
de-duplicated frontier, draws the positions to keep on the seeds' device (keyed by the run's seed, the epoch, the
hop and the vertex: :func:`sample_positions`), fetches only those neighbour entries in one request, and relabels
the reached vertices into the local rows gnnscale's layers consume.

Vocabulary: the *seeds* are the mini-batch's output vertices; hop ``h`` (``h = 0`` next to the seeds) expands
the *frontier* (the vertices reached so far) by at most ``fanouts[h]`` in-neighbours per frontier vertex.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor

from gnnscale.graph.block import AdjacencySpec, Block, sampling_csr
from gnnscale.graph.csr import csr_rows
from gnnscale.graph.graph import Graph
from gnnscale.sample.adjacency import SampledAdjacency

FLOYD_MAX_FANOUT = 32
"""Largest fanout drawn by Floyd's algorithm; larger ones key every position of a row and keep the smallest."""
_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # 2^64 / golden ratio: the splitmix64 increment
_MUL1, _MUL2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB  # splitmix64 finaliser multipliers


def _signed(c: int) -> int:
    """A 64-bit pattern as the int64 torch stores it."""
    c &= _MASK64
    return c - (1 << 64) if c >> 63 else c


def _shr(x: Tensor, s: int) -> Tensor:
    """Logical right shift of int64 bit patterns (torch's ``>>`` is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def mix64(x: Tensor) -> Tensor:
    """splitmix64's finaliser on int64 tensors (a bijection of 64-bit patterns; int64 products wrap mod 2^64)."""
    x = x ^ _shr(x, 30)
    x = x * _signed(_MUL1)
    x = x ^ _shr(x, 27)
    x = x * _signed(_MUL2)
    return x ^ _shr(x, 31)


def mix64_int(x: int) -> int:
    """:func:`mix64` on one Python int (an unsigned 64-bit result)."""
    x &= _MASK64
    x = ((x ^ (x >> 30)) * _MUL1) & _MASK64
    x = ((x ^ (x >> 27)) * _MUL2) & _MASK64
    return x ^ (x >> 31)


def sample_key(seed: int, epoch: int) -> int:
    """The sampling key of a run's epoch: a hash of ``(seed, epoch)`` (keys of other epochs look unrelated)."""
    return mix64_int(mix64_int(seed + _GOLDEN) + epoch * _GOLDEN)


def hop_key(key: int, hop: int) -> int:
    """Key of hop ``hop`` (0 next to the seeds) under a batch's sampling ``key``."""
    return mix64_int(key ^ mix64_int((hop + 1) * _GOLDEN))


def keyed_draws(kv: Tensor, deg: Tensor, fanout: int) -> Tensor:
    """Positions ``[m, fanout]`` (ascending per row) of a uniform ``fanout``-subset of ``range(deg[i])`` per row.

    Robert Floyd's algorithm, run for all rows at once: for ``i = 0 .. fanout - 1`` let ``j = deg - fanout + i``
    and draw ``t`` uniform in ``[0, j]``; keep ``t``, or ``j`` if ``t`` was kept before. Every ``fanout``-subset is
    equally likely, and only ``fanout`` random numbers per row are drawn: row ``i``'s ``t`` is
    ``(mix64(kv[i] + (i + 1) * golden) >> 1) mod (j + 1)`` (bias below ``j / 2^63``), so the positions depend only
    on the row's key ``kv`` and its degree. Costs ``O(fanout^2)`` compares per row, no sort over its neighbours.

    Above :data:`FLOYD_MAX_FANOUT` positions per row, Floyd's ``fanout^2`` compares cost more than keying every
    position: then position ``p`` of the row gets the key ``mix64(kv + (p + 1) * golden)`` and the ``fanout``
    smallest keys win (ties to the lower position), also a uniform subset and also a function of ``(kv, deg)``.

    Args:
        kv: ``[m]`` int64 per-row keys.
        deg: ``[m]`` int64 degrees, each ``> fanout``.
        fanout: positions per row, ``>= 1``.
    """
    m = kv.numel()
    if fanout > FLOYD_MAX_FANOUT:
        return _keyed_smallest(kv, deg, fanout)
    step = torch.arange(fanout, device=kv.device)
    j = deg.unsqueeze(1) - (fanout - step)  # [m, fanout] the largest position step i may take
    # every step's draw in one pass (they depend only on the key); only the collision test is sequential
    t = torch.remainder(_shr(mix64(kv.unsqueeze(1) + (step + 1) * _signed(_GOLDEN)), 1), j + 1)  # [m, fanout]
    out = torch.empty(m, fanout, dtype=torch.int64, device=kv.device)
    out[:, 0] = t[:, 0]
    for i in range(1, fanout):
        out[:, i] = torch.where((out[:, :i] == t[:, i : i + 1]).any(1), j[:, i], t[:, i])
    return out.sort(dim=1).values


def _keyed_smallest(kv: Tensor, deg: Tensor, fanout: int) -> Tensor:
    """The ``fanout`` positions of each row with the smallest position keys (see :func:`keyed_draws`)."""
    dev = kv.device
    m = kv.numel()
    ptr = torch.zeros(m + 1, dtype=torch.int64, device=dev)
    torch.cumsum(deg, 0, out=ptr[1:])
    total = int(ptr[-1])
    row = torch.repeat_interleave(torch.arange(m, device=dev), deg, output_size=total)  # [D]
    pos = torch.arange(total, device=dev) - ptr[row]  # [D]
    key = _shr(mix64(kv[row] + (pos + 1) * _signed(_GOLDEN)), 1)  # [D] non-negative
    perm = torch.sort(key, stable=True).indices  # by key, ties by position (stable: the same on every device)
    perm = perm[torch.sort(row[perm], stable=True).indices]  # grouped by row, each row's keys ascending
    first = ptr[:-1].unsqueeze(1) + torch.arange(fanout, device=dev)  # [m, fanout] the smallest of each row
    return pos[perm[first]].sort(dim=1).values


@runtime_checkable
class NeighborRequest(Protocol):
    """One hop's request to a graph store: the degrees of a frontier, then the neighbour entries the sampler picks.

    A store routes the frontier once (which tier holds each list) when the request is made; :meth:`take` reads
    only the picked entries, one de-duplicated read per tier.
    """

    degrees: Tensor
    """``[n]`` int64 in-degree of each requested vertex, on the request's device."""

    def take(self, indptr: Tensor, pos: Tensor) -> tuple[Tensor, Tensor | None]:
        """The entries at positions ``pos[indptr[i]:indptr[i + 1]]`` (0-based, into vertex ``i``'s in-neighbour
        list) of every requested vertex ``i``: ``(indices [E'] int64 global ids, weights [E'] or None)``."""
        ...


@runtime_checkable
class Topology(Protocol):
    """What the sampler needs from a graph store: a :class:`NeighborRequest` per hop."""

    def request(self, ids: Tensor) -> NeighborRequest:
        """Open a request for the in-neighbour lists of ``ids`` (``[n]`` distinct integer global ids, on the
        device where sampling runs; results come back on that device)."""
        ...


class _CSRRequest:
    def __init__(self, topo: CSRTopology, ids: Tensor):
        self.topo, self.out_dev = topo, ids.device
        i = ids.to(topo.device).long()
        # index_select, not tensor[i]: several times faster for 1-D gathers on the CPU
        self.start = topo.indptr.index_select(0, i)  # [n]
        self.degrees = (topo.indptr.index_select(0, i + 1) - self.start).to(self.out_dev)

    def take(self, indptr: Tensor, pos: Tensor) -> tuple[Tensor, Tensor | None]:
        t = self.topo
        indptr = indptr.to(t.device)
        counts = indptr[1:] - indptr[:-1]
        e = torch.repeat_interleave(self.start, counts, output_size=pos.numel()) + pos.to(t.device)  # [E']
        t.fetched_entries += int(e.numel())
        w = None if t.weight is None else t.weight.index_select(0, e).to(self.out_dev)
        return t.indices.index_select(0, e).to(self.out_dev), w


class CSRTopology:
    """The in-memory :class:`Topology`: an in-neighbour CSR ``(indptr, indices, weight)`` held in tensors.

    The tensors may live on any device; requests are answered on the device of the ids they come with.
    ``fetched_entries`` counts the neighbour entries read.
    """

    def __init__(self, indptr: Tensor, indices: Tensor, weight: Tensor | None = None):
        if indptr.dim() != 1 or indptr.numel() < 1 or indices.dim() != 1:
            raise ValueError("CSRTopology needs a 1-D indptr of num_nodes + 1 entries and 1-D indices")
        if weight is not None and weight.shape != indices.shape:
            raise ValueError(f"weight has shape {tuple(weight.shape)}, indices {tuple(indices.shape)}")
        self.indptr = indptr.long()
        self.indices = indices.long()
        self.weight = weight
        self.fetched_entries = 0

    @classmethod
    def from_graph(cls, graph: Graph, spec: AdjacencySpec | None = None) -> CSRTopology:
        """What a sampler for layers of adjacency ``spec`` (default: the plain graph) draws from
        (:func:`~gnnscale.graph.block.sampling_csr`): the graph's lists and raw weights, without self-loops when the
        layers add their own. :class:`~gnnscale.sample.adjacency.SampledAdjacency` adds those and normalises."""
        return cls(*sampling_csr(graph, AdjacencySpec() if spec is None else spec)[:3])

    @property
    def num_nodes(self) -> int:
        return int(self.indptr.numel()) - 1

    @property
    def device(self) -> torch.device:
        return self.indptr.device

    def request(self, ids: Tensor) -> NeighborRequest:
        return _CSRRequest(self, ids)

    def num_neighbors(self, ids: Tensor) -> Tensor:
        """``[n]`` in-degree of each id, on ``ids``' device."""
        return self.request(ids).degrees

    def neighbors(self, ids: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """Whole in-neighbour lists of ``ids``, concatenated: ``(indptr [n + 1], indices, weights or None)``."""
        return full_lists(self.request(ids))


def full_lists(req: NeighborRequest) -> tuple[Tensor, Tensor, Tensor | None]:
    """Every entry of a request's lists: ``(indptr [n + 1], indices, weights or None)``."""
    deg = req.degrees
    indptr = torch.zeros(deg.numel() + 1, dtype=torch.int64, device=deg.device)
    torch.cumsum(deg, 0, out=indptr[1:])
    total = int(indptr[-1])
    pos = torch.arange(total, device=deg.device) - indptr[csr_rows(indptr, total)]
    return indptr, *req.take(indptr, pos)


def sample_positions(frontier: Tensor, deg: Tensor, fanout: int, key: int) -> tuple[Tensor, Tensor]:
    """Which entries of each frontier vertex's in-neighbour list one hop samples: ``(indptr [n + 1], pos [E'])``.

    A vertex of in-degree ``d`` takes all ``d`` positions when ``d <= fanout`` or ``fanout == -1``, else the
    ``fanout`` positions :func:`keyed_draws` picks with the vertex key ``mix64(v ^ key)``: they depend on
    ``(key, v, d)`` only. Positions are ascending within a row.
    """
    dev = frontier.device
    take = deg if fanout < 0 else deg.clamp(max=fanout)
    indptr = torch.zeros(deg.numel() + 1, dtype=torch.int64, device=dev)
    torch.cumsum(take, 0, out=indptr[1:])
    total = int(indptr[-1])
    pos = torch.arange(total, device=dev) - torch.repeat_interleave(indptr[:-1], take, output_size=total)  # [E']
    if fanout > 0 and total:
        big = torch.nonzero(deg > fanout).view(-1)  # [m] rows that sample
        if big.numel():
            chosen = keyed_draws(mix64(frontier.index_select(0, big) ^ _signed(key)), deg.index_select(0, big),
                                 fanout)  # [m, fanout]
            slots = indptr.index_select(0, big).unsqueeze(1) + torch.arange(fanout, device=dev)  # [m, fanout]
            pos.index_copy_(0, slots.view(-1), chosen.view(-1))
    return indptr, pos


DENSE_RELABEL_RATIO = 64
""":func:`_relabel` marks ids in ``[num_nodes]`` arrays (O(num_nodes), no sort) while ``num_nodes`` is at most
this many times the ids it relabels; beyond, it sorts them."""


def _flatnonzero(mask: Tensor) -> Tensor:
    """``[k]`` int64 positions of the true entries of a 1-D bool tensor, ascending (numpy's on the CPU: several
    times faster than ``torch.nonzero`` there)."""
    if mask.device.type == "cpu":
        return torch.from_numpy(np.flatnonzero(mask.numpy())).long()
    return torch.nonzero(mask).view(-1)


def _relabel(dst_ids: Tensor, nbr_ids: Tensor, num_nodes: int | None = None) -> tuple[Tensor, Tensor]:
    """Local source rows of ``nbr_ids`` and the block's ``src_ids``: ``dst_ids`` (unique) first, in their order,
    then the vertices reached for the first time, in ascending id order. One sync (the number of new ids).

    With ``num_nodes`` (every id below it) and few vertices per id relabelled, the new ids are marked in a
    ``[num_nodes]`` bool array and read back in order (``nonzero``): linear, no sort; else a sorting unique."""
    n = dst_ids.numel()
    dev = dst_ids.device
    if num_nodes is not None and num_nodes <= DENSE_RELABEL_RATIO * (n + nbr_ids.numel()):
        seen = torch.zeros(num_nodes, dtype=torch.bool, device=dev)
        seen.index_fill_(0, nbr_ids, True)
        seen.index_fill_(0, dst_ids, False)
        new = _flatnonzero(seen)  # [m] ascending
        row = torch.empty(num_nodes, dtype=torch.int64, device=dev)  # only the entries written below are read
        row.index_copy_(0, dst_ids, torch.arange(n, device=dev))
        row.index_copy_(0, new, torch.arange(n, n + new.numel(), device=dev))
        return row.index_select(0, nbr_ids), torch.cat([dst_ids, new])
    uniq, inv = torch.unique(torch.cat([dst_ids, nbr_ids]), return_inverse=True)  # sorted ids; [n + E']
    m = uniq.numel() - n  # vertices reached for the first time
    is_dst = torch.zeros(uniq.numel(), dtype=torch.int8, device=dev).index_fill_(0, inv[:n], 1)
    new = torch.sort(is_dst, stable=True).indices[:m]  # [m] positions of the new ids in uniq, ascending
    local = torch.empty(uniq.numel(), dtype=torch.int64, device=dev)  # row of each unique id
    local.index_copy_(0, inv[:n], torch.arange(n, device=dev))
    local.index_copy_(0, new, torch.arange(n, n + m, device=dev))
    return local.index_select(0, inv[n:]), torch.cat([dst_ids, uniq.index_select(0, new)])


def sample_blocks(topo: Topology, seeds: Tensor, fanouts: Sequence[int], key: int = 0,
                  adjacency: SampledAdjacency | None = None) -> list[Block]:
    """Sample ``len(fanouts)`` hops of in-neighbours around ``seeds`` into one :class:`Block` per GNN layer.

    Fanout order (PyG's ``NeighborLoader(num_neighbors=...)`` convention): ``fanouts[0]`` is the hop from the
    seeds, ``fanouts[1]`` the hop from their sampled neighbours, and so on outwards; ``--fanouts 15,10`` samples 15
    in-neighbours per seed and 10 per neighbour of those. ``-1`` takes every in-neighbour, ``0`` none.

    Block order (DGL's): ``blocks[0]`` is the input layer and was sampled with ``fanouts[-1]``; ``blocks[-1]`` has
    the seeds as destinations and was sampled with ``fanouts[0]``. So ``blocks[l]`` feeds ``model.layers[l]``,
    ``x[blocks[0].src_ids]`` are the input features, and the last block's output rows are the seeds in order.

    Sampling: uniform without replacement, per destination vertex: one with in-degree ``d <= fanout`` keeps all its
    in-neighbours (multi-edges counted as separate neighbours); one with ``d > fanout`` keeps a uniformly random
    subset of exactly ``fanout`` of its in-edges (each with probability ``fanout / d``). The subset is *keyed*: it
    is a function of ``(key, hop, v)`` and the graph only (:func:`sample_positions`), never of the other vertices
    in the batch, their order or the device. So sampling the parts of a batch separately gives every vertex the
    neighbours it gets in the whole batch (what lets several trainers share one batch exactly), and the same key
    reproduces a sample. Sampled edges keep the topology's CSR order within a row, and their weights (``None``
    stays ``None``).

    Requests (XGNN's sample-positions-then-fetch): per hop, one :meth:`Topology.request` for the de-duplicated
    frontier (the destinations of its block) gives the degrees; the positions to keep are drawn on the seeds'
    device; one :meth:`NeighborRequest.take` reads only those entries. No whole neighbour list is fetched.

    Self-loops and weights: the blocks hold the edges as sampled from ``topo`` (its weights, or ``None``) unless
    ``adjacency`` is given; then each block is the layer's adjacency (:meth:`SampledAdjacency.apply`: a self-loop
    per destination outside the fanout, GCN weights on the block or from the graph).

    Relabelling: in every block the destinations are the first source rows, ``src_ids[:num_dst]``; in the last
    block they are ``seeds`` in the given order, in block ``l < len - 1`` they are ``blocks[l + 1].src_ids`` in
    that order (``blocks[l].num_dst == blocks[l + 1].num_src``). The vertices a hop reaches for the first time
    follow, sorted by ascending global id. ``src_ids`` are global ids (int64), ``indices`` local source rows
    (int64), ``indptr`` int64.

    Args:
        topo: the graph store.
        seeds: ``[B]`` distinct integer global vertex ids, on the device where sampling runs (CPU or CUDA).
        fanouts: one per layer, as above; each ``>= -1``.
        key: the sampling key (:func:`sample_key` of the run's seed and epoch); hop ``h`` uses
            :func:`hop_key` ``(key, h)``.
        adjacency: turns each sampled block into the layers' adjacency (``None``: the blocks as sampled).

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
    num_nodes = getattr(topo, "num_nodes", None)
    num_nodes = num_nodes if isinstance(num_nodes, int) else None
    blocks: list[Block] = []
    for hop, fanout in enumerate(fanouts):
        req = topo.request(frontier)
        indptr, pos = sample_positions(frontier, req.degrees.to(dev), fanout, hop_key(key, hop))
        nbrs, weight = req.take(indptr, pos)
        local, src_ids = _relabel(frontier, nbrs.to(dev).long(), num_nodes)
        block = Block(indptr=indptr, indices=local, num_src=int(src_ids.numel()),
                      edge_weight=None if weight is None else weight.to(dev), src_ids=src_ids)
        blocks.append(block if adjacency is None else adjacency.apply(block, fanout))
        frontier = src_ids
    blocks.reverse()
    return blocks
