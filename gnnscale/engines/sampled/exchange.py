"""The exchange between the ranks of a distributed sampled job (HopGNN; DistDGL's model-centric strategy): the
parts of the sampled loop that cross ranks.

* :class:`RankReducer`, the loop's reducer: every rank's gradients summed in one all-reduce of one flat buffer,
  and every rank's counters gathered for an iteration checkpoint.
* :func:`layerwise_across_ranks`: exact layer-wise inference of this rank's vertices, each layer's remote input
  rows (its halo) fetched from their owners in one exchange: layer 0's through the rank's feature source
  (:meth:`~gnnscale.store.partitioned.PartitionedFeatures.fetch`), a later layer's activations alike
  (:class:`~gnnscale.store.partitioned.FetchedRows` over them).

A sample's input rows are read through the rank's feature source (its
:class:`~gnnscale.store.partitioned.PartitionedFeatures`, or the rows pre-gathered for an iteration), in the
engine (:mod:`gnnscale.engines.sampled.distributed`).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from gnnscale import runtime as rt
from gnnscale.distributed.comm import Comm
from gnnscale.engines.sampled.loop import EVAL_BATCH
from gnnscale.graph.block import Block
from gnnscale.nn.stack import Stack
from gnnscale.sample import SampledAdjacency, Topology, sample_blocks
from gnnscale.store.features import FeatureSource
from gnnscale.store.partitioned import FetchedRows, PartitionedFeatures
from gnnscale.store.transfer import place


class RankReducer:
    """The distributed loop's reducer: the gradients of ``model`` (whichever models a rank trained, their
    gradients added up) summed over the ranks in one all-reduce of one flat buffer. Every rank then takes the same
    optimiser step, so there is nothing to hand back."""

    def __init__(self, comm: Comm, model: torch.nn.Module):
        self.comm, self.model = comm, model

    def grads(self) -> list[Tensor]:
        """The model's gradients, one per parameter (zeros where a parameter has none yet)."""
        return [p.grad.detach() if p.grad is not None else torch.zeros_like(p) for p in self.model.parameters()]

    def reduce(self) -> None:
        flat = torch.cat([g.reshape(-1) for g in self.grads()])
        self.comm.all_reduce(flat, "sum", "gradient all-reduce")
        off = 0
        for p in self.model.parameters():
            p.grad = flat[off : off + p.numel()].view_as(p)
            off += p.numel()

    def sync(self) -> None:
        pass

    def gather(self, counters: dict[str, float]) -> list[dict[str, float]]:
        """Every rank's ``counters`` (an iteration checkpoint keeps the job's): one all-reduce of a rank x counter
        table."""
        keys = list(counters)
        rows = torch.zeros(self.comm.world, len(keys), dtype=torch.float64)
        rows[self.comm.rank] = torch.tensor([counters[k] for k in keys], dtype=torch.float64)
        self.comm.all_reduce(rows, "sum", "checkpoint")
        return [dict(zip(keys, r, strict=True)) for r in rows.tolist()]


def layerwise_across_ranks(model: Stack, comm: Comm, topology: Topology, features: PartitionedFeatures,
                           owner: Tensor, adjacency: SampledAdjacency, device: rt.Device) -> Tensor:
    """``[n_own, C]``: this rank's vertices' exact outputs, layer by layer over full neighbourhoods; each layer's
    remote input rows come in one exchange with their owners (every rank calls it together)."""
    rank, own = comm.rank, features.own
    blocks = [sample_blocks(topology, own[lo : lo + EVAL_BATCH], (-1,), adjacency=adjacency.exact())[0]
              for lo in range(0, own.numel(), EVAL_BATCH)]
    need = torch.unique(torch.cat([b.src_ids for b in blocks if b.src_ids is not None]
                                  or [torch.empty(0, dtype=torch.int64)]))
    remote = need[owner[need] != rank]
    h = features.rows
    for i, layer in enumerate(model.block_layers):
        rows: FeatureSource
        if i == 0:  # the features: through the rank's source (its rows, the halo fetched from the owners)
            rows = features.fetch(need, "inference")
        else:  # a layer's activations: the engine's own, exchanged the same way
            table = h

            def serve(req: Tensor, table: Tensor = table) -> Tensor:
                return table[features.local_index[req.cpu()].to(table.device)]

            halo = comm.exchange(remote, owner, serve, table.shape[1], table.dtype, "inference")
            rows = FetchedRows(features, remote, halo, own=table)
        outs = []
        for b in blocks:
            src = b.src_ids
            assert src is not None
            x = rows.gather(src)
            bd = blocks_on([b], device)[0]
            outs.append(layer(bd, model.layer_input(i, x, bd.row_ids(), None)))
        h = torch.cat(outs)  # every rank holds a part (partitions are never empty)
    return h


def blocks_on(blocks: list[Block], device: rt.Device) -> list[Block]:
    """``blocks`` (sampled in host memory) on ``device``: as they are for the CPU, else copied through the runtime
    on its current stream (ready for it)."""
    if rt.is_accelerator(device):
        return [b.map(functools.partial(place, device=device)) for b in blocks]
    return blocks
