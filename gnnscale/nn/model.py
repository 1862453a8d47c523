"""A stack of block layers with activation and keyed dropout between them."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gnnscale.errors import ConfigError
from gnnscale.graph.block import AdjacencySpec, Block
from gnnscale.nn.base import BlockLayer, block_and_features
from gnnscale.nn.gat import GATLayer
from gnnscale.nn.gcn import GCNLayer
from gnnscale.nn.gin import GINLayer
from gnnscale.nn.mlp import MLPLayer
from gnnscale.nn.norm import JK_MODES, make_norm, with_residual
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
    """``num_layers`` block layers; before layer ``l``: normalisation, activation (both ``l > 0``), then dropout.

    Engines drive it either whole (:meth:`forward` on one block) or layer by layer
    (:meth:`layer_input` then ``layers[l]`` on each chunk's block): both give the same numbers, because
    dropout masks are keyed by ``(seed, epoch, layer, vertex id)`` rather than drawn from a stateful RNG.

    ``norm``, ``residual`` and ``jk`` follow PyG's ``BasicGNN`` (:mod:`gnnscale.nn.norm` says how): a hidden layer
    is conv -> norm -> activation -> dropout (the norm ``norms[l - 1]`` and the rest run in
    :meth:`layer_input` of the next layer), the last conv has no norm unless ``jk`` is set, and with ``jk``
    :meth:`head` combines every layer's output and applies the final linear map ``lin``. BatchNorm's statistics
    are over the rows :meth:`layer_input` is given: the whole graph in :meth:`forward`, a batch's rows of that
    layer in a sampled engine.
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
        norm: str = "none",
        residual: bool = False,
        jk: str = "none",
        input_dropout: float | None = None,
    ):
        super().__init__()
        if kind not in MODELS:
            raise ConfigError(f"unknown model {kind!r}; choose one of {', '.join(MODELS)}")
        if num_layers < 1:
            raise ConfigError(f"--layers must be >= 1, got {num_layers}")
        if jk not in JK_MODES:
            raise ConfigError(f"unknown --jk {jk!r}; choose one of {', '.join(JK_MODES)}")
        self.kind, self.dropout = kind, dropout
        self.input_dropout = dropout if input_dropout is None else input_dropout
        """The input features' drop probability (layer 0's input): ``dropout`` unless given (PyG's ``BasicGNN``:
        0)."""
        self.norm, self.residual, self.jk = norm, residual, jk
        self.activation: Callable[[Tensor], Tensor] = F.elu if kind == "gat" else F.relu
        dims = [in_features] + [hidden] * (num_layers - 1) + [num_classes if jk == "none" else hidden]
        layers: list[BlockLayer] = []
        for i in range(num_layers):
            last = i == num_layers - 1 and jk == "none"
            if kind == "gat":
                if not last and hidden % heads:
                    raise ConfigError(f"--hidden ({hidden}) must be divisible by --heads ({heads}) for GAT")
                h = 1 if last else heads
                layers.append(GATLayer(dims[i], dims[i + 1] // h, heads=h, concat=True))
            elif kind == "gin":  # PyG's GIN model normalises inside each layer's MLP too
                layers.append(GINLayer(dims[i], dims[i + 1], norm=norm))
            else:
                layers.append(MODELS[kind](dims[i], dims[i + 1]))
            if residual:
                layers[-1] = with_residual(layers[-1])
        self.layers = nn.ModuleList(layers)
        self.norms = nn.ModuleList(make_norm(norm, hidden) for _ in range(num_layers - (jk == "none")))
        """``norms[l]`` normalises layer ``l``'s output (every layer but the last, unless ``jk`` is set)."""
        self.lin = None if jk == "none" else nn.Linear(hidden * (num_layers if jk == "cat" else 1), num_classes)
        """With ``jk``: the final linear map from the combined layer outputs to the class scores."""

    @property
    def block_layers(self) -> list[BlockLayer]:
        """``layers`` typed as :class:`BlockLayer` (engines call their ``aggregate``/``update`` halves)."""
        return [cast(BlockLayer, m) for m in self.layers]

    @property
    def adjacency(self) -> AdjacencySpec:
        """The adjacency every layer aggregates over (one per model)."""
        return cast(BlockLayer, self.layers[0]).adjacency

    def biases_before_norm(self) -> list[nn.Parameter]:
        """The biases that shift every row just before a BatchNorm (``--norm batch``): a hidden layer's output bias
        (``layers.0.bias``, ``layers.0.lin_l.bias``, ...), GIN's inner ``mlp.0.bias``, a decoupled model's hidden T
        tasks' ``lin.bias``. BatchNorm subtracts its rows' mean, so their true gradient is exactly zero; a computed
        one is rounding noise that Adam scales up to steps of about ``lr``, different in every engine (chunks,
        trainers and ranks sum in other orders). Every engine zeroes their gradients before each optimiser step
        (:class:`~gnnscale.engines.base.Engine`): they keep their initial values (unless ``weight_decay`` shrinks
        them), as the running means they shift do, so the engines agree on accuracies as on losses."""
        biases: list[nn.Parameter] = []
        for i, layer in enumerate(self.block_layers):
            normed = i < len(self.norms) and isinstance(self.norms[i], nn.BatchNorm1d)
            biases += layer.biases_before_norm(normed)
        return biases

    def dropout_key(self, seed: int, epoch: int, layer: int) -> int:
        """Key of the dropout mask applied to the input of ``layer`` in ``epoch``."""
        return mix_key(seed, epoch, layer)

    def layer_input(self, layer: int, h: Tensor, row_ids: Tensor, seed_epoch: tuple[int, int] | None,
                    out: Tensor | None = None) -> Tensor:
        """What ``layers[layer]`` consumes: normalisation and activation of the previous output (if any), then
        dropout. Per row except BatchNorm in training, whose statistics are over ``h``'s rows.

        Args:
            h: ``[rows, F]`` previous layer's output (or the features for layer 0: bfloat16 ones are upcast to
                float32 first).
            row_ids: ``[rows]`` global vertex ids of those rows.
            seed_epoch: ``(seed, epoch)`` while training; ``None`` disables dropout (evaluation).
            out: where to write the result, with no autograd (an engine's host rows; ``out`` is returned).
        """
        if layer > 0:
            h = self.activation(self.norms[layer - 1](h))
        elif h.dtype == torch.bfloat16:  # features stored in bfloat16: upcast where they are (on the device)
            h = h.float()
        key = None if seed_epoch is None else self.dropout_key(*seed_epoch, layer)
        return keyed_dropout(h, self.input_dropout if layer == 0 else self.dropout, key, row_ids, out)

    def layer_input_vjp(self, layer: int, h: Tensor, row_ids: Tensor, seed_epoch: tuple[int, int],
                        grad: Tensor) -> Tensor | None:
        """``dL/dh`` of :meth:`layer_input` (``layer > 0``, training) from ``grad``, its output's gradient, without
        its forward: the dropout's backward is the same masked scale of ``grad``, ReLU's ``threshold_backward``
        (``h <= 0`` where ``relu(h) <= 0``): bitwise what autograd gives. ``None`` where the layer's input has a
        normalisation or another activation (the caller then runs autograd)."""
        if layer == 0 or self.activation is not F.relu or not isinstance(self.norms[layer - 1], nn.Identity):
            return None
        g = keyed_dropout(grad, self.dropout, self.dropout_key(*seed_epoch, layer), row_ids)
        return torch.ops.aten.threshold_backward(g, h, 0)

    def head(self, hs: list[Tensor]) -> Tensor:
        """With ``jk``, the class scores from every layer's output as the next layer would take it: ``hs[l]`` is
        :meth:`layer_input` ``(l + 1, ...)`` of layer ``l``'s output (normalised, activated, dropped out; the last
        layer's keyed as a layer ``num_layers`` would be), all on the same rows. Combined (the last, concatenated,
        or the element-wise maximum: PyG's ``JumpingKnowledge``), then ``lin``."""
        assert self.lin is not None, "head() is for models with jk"
        if self.jk == "cat":
            h = torch.cat(hs, dim=-1)
        elif self.jk == "max":
            h = torch.stack(hs, dim=-1).amax(dim=-1)
        else:
            h = hs[-1]
        return self.lin(h)  # type: ignore[no-any-return]

    def forward(self, block: Block | Tensor, x: Tensor, seed_epoch: tuple[int, int] | Tensor | None = None, *,
                edge_weight: Tensor | None = None) -> Tensor:
        """Whole-graph forward on one block whose sources are its destinations (``num_src == num_dst``); or PyG's
        ``model(x, edge_index[, edge_weight])`` (the block built from ``edge_index`` with :attr:`adjacency` on each
        call: :func:`~gnnscale.nn.base.block_and_features`)."""
        block, x, seed_epoch = call_arguments(self, block, x, seed_epoch, edge_weight)
        row_ids = block.row_ids()
        h, hs = x, []
        for i, layer in enumerate(self.layers):
            h = self.layer_input(i, h, row_ids, seed_epoch)
            if i > 0:
                hs.append(h)  # each norm runs once (BatchNorm's running statistics move once per layer)
            h = layer(block, h)
        if self.lin is None:
            return h
        return self.head([*hs, self.layer_input(len(self.layers), h, row_ids, seed_epoch)])


def call_arguments(model: GNN, block: Block | Tensor, x: Tensor, seed_epoch: tuple[int, int] | Tensor | None,
              edge_weight: Tensor | None) -> tuple[Block, Tensor, tuple[int, int] | None]:
    """A model's ``(block, x, seed_epoch)`` from its call, gnnscale's or PyG's (``model(x, edge_index,
    edge_weight)``: a third positional tensor is PyG's ``edge_weight``, as in ``BasicGNN.forward``)."""
    if isinstance(seed_epoch, Tensor):
        edge_weight, seed_epoch = seed_epoch, None
    b, x = block_and_features(model, block, x, edge_weight)
    return b, x, seed_epoch
