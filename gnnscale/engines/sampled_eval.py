"""Evaluation of the sampled engines, without dropout: layer-wise full-neighbour inference (every vertex's exact
output, layer by layer over destination batches, with the whole graph's weights: the in-memory engine's evaluation
and PyG's full-batch ``model(x, edge_index)``), or sampled inference over keyed samples (``--eval-fanouts``: the
training blocks' semantics, keyed by :data:`~gnnscale.engines.sampled.EVAL_EPOCH`, the same sample every time).

An engine says where inference reads with a :class:`SampledInference`: a topology and a feature source (the
mini-batch engine's store, the hybrid engine's host memory); the distributed engine infers across ranks (its own
``_layerwise``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import Tensor

from gnnscale.engines.sampled import EVAL_BATCH, SampledBatch, forward, inline_feed
from gnnscale.nn.model import GNN
from gnnscale.sample import SampledAdjacency, Topology, sample_blocks


def layerwise(model: GNN, topology: Topology, features: Callable[[Tensor], Tensor], num_nodes: int,
              adjacency: SampledAdjacency, *, batch_size: int, device: torch.device) -> Tensor:
    """``[N, C]`` outputs (on the CPU): layer by layer, every vertex, full neighbourhoods from ``topology``, in
    steps of at least :data:`EVAL_BATCH` destinations; the first layer's input rows from ``features`` (on
    ``device``), every later layer's from the layer before (kept in host memory)."""
    size = max(batch_size, EVAL_BATCH)
    h: Tensor | None = None
    for i, layer in enumerate(model.block_layers):
        out = None
        for lo in range(0, num_nodes, size):
            dst = torch.arange(lo, min(lo + size, num_nodes), device=device)
            block = sample_blocks(topology, dst, (-1,), adjacency=adjacency.exact())[0]
            src = block.src_ids
            assert src is not None
            x = features(src) if h is None else h[src.cpu()].to(device)
            y = layer(block, model.layer_input(i, x, block.row_ids(), None)).cpu()  # [dst, F_out]
            if out is None:
                out = torch.empty(num_nodes, y.shape[1])
            out[lo : lo + y.shape[0]] = y
        h = out
    assert h is not None
    return h


def eval_ids(masks: dict[str, Tensor]) -> Tensor:
    """The vertices of any mask (training, validation, test): what sampled evaluation predicts."""
    return torch.nonzero(torch.stack(list(masks.values())).any(0)).view(-1)


def sampled_predictions(num_nodes: int, batches: Iterable[SampledBatch],
                        logits: Callable[[SampledBatch], Tensor]) -> Tensor:
    """``[N]`` int64: the predicted class of every seed of ``batches`` from its ``logits``, -1 elsewhere."""
    pred = torch.full((num_nodes,), -1, dtype=torch.int64)
    for batch in batches:
        pred[batch.seeds.cpu()] = logits(batch).argmax(-1).cpu()
    return pred


@dataclass(eq=False)
class SampledInference:
    """Where a sampled engine's evaluation reads, and how: ``model`` over ``topology``'s full neighbourhoods and
    ``features``' rows (layer-wise), or over keyed samples of them (sampled)."""

    model: GNN
    topology: Topology
    features: Callable[[Tensor], Tensor]
    """Input rows of the given vertices, on ``device``."""
    adjacency: SampledAdjacency
    num_nodes: int
    batch_size: int
    device: torch.device
    batches: Callable[[list[Tensor], tuple[int, ...], int], Iterable[SampledBatch]] | None = None
    """Sampled evaluation's feed, ``batches(seed batches, fanouts, key)``; ``None``: each batch sampled and fetched
    inline from ``topology`` and ``features``."""
    done: Callable[[], object] | None = None
    """Called after every pass (the mini-batch store's counters are reset: inference is not an epoch's)."""

    def layerwise(self) -> Tensor:
        """``[N, C]`` exact outputs (:func:`layerwise`)."""
        h = layerwise(self.model, self.topology, self.features, self.num_nodes, self.adjacency,
                      batch_size=self.batch_size, device=self.device)
        if self.done is not None:
            self.done()
        return h

    def sampled(self, ids: Tensor, fanouts: tuple[int, ...], key: int) -> Tensor:
        """``[N]`` predictions of ``ids`` from their keyed samples with ``fanouts`` (``key``), -1 elsewhere."""
        parts = list(torch.split(ids, self.batch_size))
        if self.batches is not None:
            batches = self.batches(parts, fanouts, key)
        else:
            batches = inline_feed(self.topology, self.features, fanouts, key, self.adjacency)(parts, 0)
        pred = sampled_predictions(self.num_nodes, batches, lambda b: forward(self.model, b.blocks, b.x, None))
        if self.done is not None:
            self.done()
        return pred
