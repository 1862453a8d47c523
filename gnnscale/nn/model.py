"""A stack of block layers with activation and keyed dropout between them."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gnnscale.errors import ConfigError
from gnnscale.graph.block import AdjacencySpec, Block
from gnnscale.nn.base import BlockLayer
from gnnscale.nn.gat import GATLayer
from gnnscale.nn.gcn import GCNLayer
from gnnscale.nn.gin import GINLayer
from gnnscale.nn.mlp import MLPLayer
from gnnscale.nn.ops import keyed_dropout, mix_key
from gnnscale.nn.sage import SAGELayer

MODELS: dict[str, type[BlockLayer]] = {
    "gcn": GCNLayer,
    "sage": SAGELayer,
    "gat": GATLayer,
    "gin": GINLayer,
    "mlp": MLPLayer,
}


class GNN(nn.Module):
    """``num_layers`` block layers; before layer ``l``: activation (``l > 0``) then dropout.

    Engines drive it either whole (:meth:`forward` on one block) or layer by layer
    (:meth:`layer_input` then ``layers[l]`` on each chunk's block): both give the same numbers, because
    dropout masks are keyed by ``(seed, epoch, layer, vertex id)`` rather than drawn from a stateful RNG.
    """

    decoupled: ClassVar[bool] = False
    """True for the decoupled models (:class:`~gnnscale.nn.decoupled.DecoupledGNN`): T tasks, then P tasks."""

    def __init__(
        self,
        kind: str,
        in_features: int,
        hidden: int,
        num_classes: int,
        num_layers: int = 2,
        dropout: float = 0.5,
        heads: int = 4,
    ):
        super().__init__()
        if kind not in MODELS:
            raise ConfigError(f"unknown model {kind!r}; choose one of {', '.join(MODELS)}")
        if num_layers < 1:
            raise ConfigError(f"--layers must be >= 1, got {num_layers}")
        self.kind, self.dropout = kind, dropout
        self.activation: Callable[[Tensor], Tensor] = F.elu if kind == "gat" else F.relu
        dims = [in_features] + [hidden] * (num_layers - 1) + [num_classes]
        layers: list[BlockLayer] = []
        for i in range(num_layers):
            last = i == num_layers - 1
            if kind == "gat":
                if not last and hidden % heads:
                    raise ConfigError(f"--hidden ({hidden}) must be divisible by --heads ({heads}) for GAT")
                h = 1 if last else heads
                layers.append(GATLayer(dims[i], dims[i + 1] // h, heads=h, concat=True))
            else:
                layers.append(MODELS[kind](dims[i], dims[i + 1]))
        self.layers = nn.ModuleList(layers)

    @property
    def block_layers(self) -> list[BlockLayer]:
        """``layers`` typed as :class:`BlockLayer` (engines call their ``aggregate``/``update`` halves)."""
        return [cast(BlockLayer, m) for m in self.layers]

    @property
    def adjacency(self) -> AdjacencySpec:
        """The adjacency every layer aggregates over (one per model)."""
        return cast(BlockLayer, self.layers[0]).adjacency

    def dropout_key(self, seed: int, epoch: int, layer: int) -> int:
        """Key of the dropout mask applied to the input of ``layer`` in ``epoch``."""
        return mix_key(seed, epoch, layer)

    def layer_input(self, layer: int, h: Tensor, row_ids: Tensor, seed_epoch: tuple[int, int] | None) -> Tensor:
        """What ``layers[layer]`` consumes: activation of the previous output (if any), then dropout.

        Args:
            h: ``[rows, F]`` previous layer's output (or the features for layer 0: bfloat16 ones are upcast to
                float32 first).
            row_ids: ``[rows]`` global vertex ids of those rows.
            seed_epoch: ``(seed, epoch)`` while training; ``None`` disables dropout (evaluation).
        """
        if layer > 0:
            h = self.activation(h)
        elif h.dtype == torch.bfloat16:  # features stored in bfloat16: upcast where they are (on the device)
            h = h.float()
        key = None if seed_epoch is None else self.dropout_key(*seed_epoch, layer)
        return keyed_dropout(h, self.dropout, key, row_ids)

    def forward(self, block: Block, x: Tensor, seed_epoch: tuple[int, int] | None = None) -> Tensor:
        """Whole-graph forward on one block whose sources are its destinations (``num_src == num_dst``)."""
        row_ids = block.row_ids()
        h = x
        for i, layer in enumerate(self.layers):
            h = layer(block, self.layer_input(i, h, row_ids, seed_epoch))
        return h
