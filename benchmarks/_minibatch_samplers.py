"""The sampler baselines of ``python -m benchmarks minibatch`` (a helper, not a benchmark): gnnscale's sampler
before issue #12 (fetch whole lists, then sort-sample), vectorised O(fanout) samplers on torch's RNG, ours and
PyG's ``NeighborSampler``. Every one takes one batch of seeds and returns ``(blocks, neighbour entries fetched)``:
the same output contract as ours (one Block per hop, relabelled, weights sliced), so the timings compare like with
like. ``benchmarks.minibatch`` re-exports them (``benchmarks.peers_workers`` imports ``sample_ours`` and
``pyg_sampler`` from there).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from gnnscale.graph.block import Block
from gnnscale.graph.csr import csr_rows, csr_slices
from gnnscale.sample import CSRTopology, sample_blocks
from gnnscale.sample.neighbor import _relabel


# (a) gnnscale's sampler before issue #12, copied from ``git show feae281:gnnscale/sample/neighbor.py``
# (``CSRTopology.neighbors``, ``_sample_rows``, ``_relabel`` and the loop of ``sample_blocks``), unchanged but for
# the names and the count of entries fetched.
def _feae281_neighbors(topo: CSRTopology, ids: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
    """feae281's ``CSRTopology.neighbors``: the whole in-neighbour lists of ``ids``, one CSR local to the request."""
    out_dev = ids.device
    indptr, pos = csr_slices(topo.indptr, ids.to(topo.device).long())
    w = None if topo.weight is None else topo.weight[pos].to(out_dev)
    return indptr.to(out_dev), topo.indices[pos].to(out_dev), w


def _feae281_sample_rows(indptr: Tensor, fanout: int, generator: torch.Generator | None
                         ) -> tuple[Tensor, Tensor | None]:
    """feae281's ``_sample_rows``: every candidate edge of a row with ``deg > fanout`` gets a random key, one sort
    keyed by (row, key) shuffles each row, the first ``fanout`` of a row are kept."""
    deg = indptr[1:] - indptr[:-1]
    num_edges = int(indptr[-1])
    if fanout < 0 or num_edges == 0 or int(deg.max()) <= fanout:
        return indptr, None
    dev = indptr.device
    big = deg > fanout
    rows = csr_rows(indptr)
    cand = torch.nonzero(big[rows]).view(-1)
    big_deg = deg[big]
    m = int(big_deg.numel())
    brow = torch.repeat_interleave(torch.arange(m, device=dev), big_deg, output_size=int(cand.numel()))
    shift = 63 - max(m.bit_length(), 1)
    key = (brow << shift) | torch.randint(0, 1 << shift, brow.shape, generator=generator, device=dev)
    order = cand[torch.sort(key).indices]
    seg_start = torch.cumsum(big_deg, 0) - big_deg
    rank = torch.arange(order.numel(), device=dev) - seg_start[brow]
    keep = ~big[rows]
    keep[order[rank < fanout]] = True
    picked = torch.nonzero(keep).view(-1)
    new_indptr = torch.cat([indptr.new_zeros(1), torch.cumsum(deg.clamp(max=fanout), 0)])
    return new_indptr, picked


def _feae281_relabel(dst_ids: Tensor, nbr_ids: Tensor) -> tuple[Tensor, Tensor]:
    """feae281's ``_relabel``."""
    n = dst_ids.numel()
    uniq, inv = torch.unique(torch.cat([dst_ids, nbr_ids]), return_inverse=True)
    is_dst = torch.zeros(uniq.numel(), dtype=torch.bool, device=uniq.device)
    is_dst[inv[:n]] = True
    new_ids = uniq[~is_dst]
    local = torch.empty(uniq.numel(), dtype=torch.int64, device=uniq.device)
    local[inv[:n]] = torch.arange(n, device=uniq.device)
    local[~is_dst] = torch.arange(n, n + new_ids.numel(), device=uniq.device)
    return local[inv[n:]], torch.cat([dst_ids, new_ids])


def sample_fetch_all(topo: CSRTopology, seeds: Tensor, fanouts: tuple[int, ...],
                     generator: torch.Generator | None = None) -> tuple[list[Block], int]:
    """Baseline (a), feae281's ``sample_blocks``: per hop the frontier's whole lists are fetched, then sampled."""
    frontier = seeds.long()
    if torch.unique(frontier).numel() != frontier.numel():
        raise ValueError("seeds contain duplicates")
    dev = frontier.device
    blocks: list[Block] = []
    fetched = 0
    for fanout in fanouts:
        indptr, nbrs, weight = _feae281_neighbors(topo, frontier)
        fetched += int(nbrs.numel())
        indptr, nbrs = indptr.to(dev).long(), nbrs.to(dev).long()
        weight = None if weight is None else weight.to(dev)
        indptr, picked = _feae281_sample_rows(indptr, fanout, generator)
        if picked is not None:
            nbrs = nbrs[picked]
            weight = None if weight is None else weight[picked]
        local, src_ids = _feae281_relabel(frontier, nbrs)
        blocks.append(Block(indptr=indptr, indices=local, num_src=int(src_ids.numel()), edge_weight=weight,
                            src_ids=src_ids))
        frontier = src_ids
    blocks.reverse()
    return blocks, fetched


# (b) and (b2): straightforward vectorised O(fanout) samplers on torch's RNG. Both draw positions, then fetch only
# those entries through the same store request as ours (``topo.request`` / ``take``) and relabel with gnnscale's
# ``_relabel``: the only difference from ours is how the positions are drawn.
def floyd_positions(deg: Tensor, fanout: int, generator: torch.Generator | None = None) -> Tensor:
    """``[m, fanout]`` positions (ascending per row) of a uniform ``fanout``-subset of ``range(deg[i])``, every
    ``deg > fanout``: Floyd's algorithm on all rows at once with ``torch.rand`` (for ``i < fanout``:
    ``j = deg - fanout + i``, ``t`` uniform in ``[0, j]``, keep ``t`` or ``j`` if ``t`` is taken)."""
    m = deg.numel()
    out = torch.empty(m, fanout, dtype=torch.int64, device=deg.device)
    for i in range(fanout):
        j = deg - (fanout - i)
        t = (torch.rand(m, dtype=torch.float64, generator=generator, device=deg.device) * (j + 1)).long()
        if i:
            t = torch.where((out[:, :i] == t.unsqueeze(1)).any(1), j, t)
        out[:, i] = t
    return out.sort(dim=1).values


def rejection_positions(deg: Tensor, fanout: int, generator: torch.Generator | None = None) -> Tensor:
    """``[m, fanout]`` positions (ascending per row) of a uniform ``fanout``-subset of ``range(deg[i])``, every
    ``deg > fanout``: ``fanout`` positions drawn with replacement per row; while rows hold a repeat (found after a
    per-row sort), those rows redraw their repeated slots. Uniform: the process treats all positions alike."""
    dev = deg.device
    d = deg.unsqueeze(1).double()
    draw = (torch.rand(deg.numel(), fanout, dtype=torch.float64, generator=generator, device=dev) * d).long()
    draw = draw.sort(dim=1).values
    rows = torch.arange(deg.numel(), device=dev)  # rows that may still hold a repeat
    while rows.numel():
        sub = draw[rows]
        dup = torch.zeros_like(sub, dtype=torch.bool)
        dup[:, 1:] = sub[:, 1:] == sub[:, :-1]
        bad = dup.any(1)
        if not bool(bad.any()):
            break
        rows, sub, dup = rows[bad], sub[bad], dup[bad]
        redraw = (torch.rand(sub.shape, dtype=torch.float64, generator=generator, device=dev) * d[rows]).long()
        draw[rows] = torch.where(dup, redraw, sub).sort(dim=1).values
    return draw


PositionFn = Callable[[Tensor, int, "torch.Generator | None"], Tensor]


def sample_torch_rng(topo: CSRTopology, seeds: Tensor, fanouts: tuple[int, ...], draw: PositionFn,
                     generator: torch.Generator | None = None) -> tuple[list[Block], int]:
    """Baselines (b) and (b2): ours with the positions of every row with ``deg > fanout`` drawn by ``draw``
    (torch's RNG)."""
    frontier = seeds.long()
    if torch.unique(frontier).numel() != frontier.numel():
        raise ValueError("seeds contain duplicates")
    dev = frontier.device
    before = topo.fetched_entries
    blocks: list[Block] = []
    for fanout in fanouts:
        req = topo.request(frontier)
        deg = req.degrees.to(dev)
        take = deg if fanout < 0 else deg.clamp(max=fanout)
        indptr = torch.zeros(deg.numel() + 1, dtype=torch.int64, device=dev)
        torch.cumsum(take, 0, out=indptr[1:])
        total = int(indptr[-1])
        pos = torch.arange(total, device=dev) - indptr[csr_rows(indptr, total)]
        if fanout > 0 and total:
            big = torch.nonzero(deg > fanout).view(-1)
            if big.numel():
                slots = indptr[big].unsqueeze(1) + torch.arange(fanout, device=dev)
                pos[slots.view(-1)] = draw(deg[big], fanout, generator).view(-1)
        nbrs, weight = req.take(indptr, pos)
        local, src_ids = _relabel(frontier, nbrs.to(dev).long())
        blocks.append(Block(indptr=indptr, indices=local, num_src=int(src_ids.numel()),
                            edge_weight=None if weight is None else weight.to(dev), src_ids=src_ids))
        frontier = src_ids
    blocks.reverse()
    return blocks, topo.fetched_entries - before


def sample_ours(topo: CSRTopology, seeds: Tensor, fanouts: tuple[int, ...], key: int) -> tuple[list[Block], int]:
    """Ours, :func:`gnnscale.sample.sample_blocks` (keyed positions, then only those entries)."""
    before = topo.fetched_entries
    blocks = sample_blocks(topo, seeds, fanouts, key)
    return blocks, topo.fetched_entries - before


def pyg_sampler(topo: CSRTopology, fanouts: tuple[int, ...]) -> tuple[Callable[[Tensor], int] | None, str]:
    """(c) PyG's ``NeighborSampler`` (pyg_lib's or torch_sparse's C++ kernel) on the same graph, as a function of a
    batch giving its sampled edges, or ``None`` and why not. It samples each hop from the vertices the previous hop
    reached for the first time only (ours re-expands the whole frontier), and returns edge lists, not blocks."""
    try:
        import torch_geometric.typing as pyg_typing
        from torch_geometric.data import Data
        from torch_geometric.sampler import NeighborSampler, NodeSamplerInput
    except ImportError as exc:  # pragma: no cover
        return None, f"torch_geometric not importable ({exc})"
    if not (pyg_typing.WITH_PYG_LIB or pyg_typing.WITH_TORCH_SPARSE):
        return None, "PyG's neighbour sampler needs pyg_lib or torch_sparse; neither is installed"
    if topo.device.type != "cpu":
        return None, "PyG's NeighborSampler samples on CPU only; skipped on a device run"
    rows = csr_rows(topo.indptr, topo.indices.numel())  # destination of each in-edge
    data = Data(edge_index=torch.stack([topo.indices, rows]), num_nodes=topo.num_nodes)
    sampler = NeighborSampler(data, num_neighbors=list(fanouts))  # CSC built here, outside the timing

    def run(batch: Tensor) -> int:
        out = sampler.sample_from_nodes(NodeSamplerInput(input_id=None, node=batch.cpu()))
        return int(out.row.numel())

    lib = "pyg_lib" if pyg_typing.WITH_PYG_LIB else "torch_sparse"
    return run, f"PyG NeighborSampler ({lib})"

