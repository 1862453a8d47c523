"""The one model type every engine runs: :class:`Stack`, a stack of block layers (gnnscale's, a user's, or PyG
``MessagePassing`` convs wrapped by :mod:`gnnscale.nn.pyg`) with normalisation, activation and keyed dropout between
them, as PyG's ``BasicGNN`` arranges them.

Engines drive a stack whole (:meth:`Stack.forward` on one block) or layer by layer (:meth:`Stack.layer_input`, then
``layers[l]`` on each chunk's or sampled block): both give the same numbers, because dropout masks are keyed by
``(seed, epoch, layer, vertex id)`` rather than drawn from a stateful RNG.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gnnscale.errors import ConfigError
from gnnscale.graph.block import AdjacencySpec, Block
from gnnscale.nn.base import BlockLayer, block_and_features
from gnnscale.nn.batchnorm import SplitBatchNorm
from gnnscale.nn.norm import JK_MODES, NORMS, make_norm, with_residual
from gnnscale.nn.ops import keyed_dropout, mix_key
from gnnscale.nn.pyg import as_block_layer, as_norm, is_pyg

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu, "elu": F.elu, "gelu": F.gelu, "leaky_relu": F.leaky_relu, "tanh": torch.tanh,
    "sigmoid": torch.sigmoid, "silu": F.silu,
}
"""``act`` names a :class:`Stack` takes (any element-wise callable or module is taken too)."""


def activation(act: str | Callable[[Tensor], Tensor] | None) -> Callable[[Tensor], Tensor]:
    """The element-wise function ``act`` names: a name of :data:`ACTIVATIONS`, a callable (``torch.nn.ReLU()``
    and ``torch.nn.ELU()`` with default arguments become ``F.relu`` and ``F.elu``: engines backpropagate ReLU
    without its forward), or ``None`` for the identity."""
    if act is None:
        return _identity
    if isinstance(act, str):
        if act.lower() not in ACTIVATIONS:
            raise ConfigError(f"unknown activation {act!r}; choose one of {', '.join(ACTIVATIONS)}, or pass a "
                              "callable")
        return ACTIVATIONS[act.lower()]
    if type(act) is nn.ReLU:
        return F.relu
    if type(act) is nn.ELU and cast(nn.ELU, act).alpha == 1.0:
        return F.elu
    if not callable(act):
        raise ConfigError(f"act must be a name or a callable, got {type(act).__name__}")
    return act


def _identity(x: Tensor) -> Tensor:
    return x


class Stack(nn.Module):
    """``convs`` in order; before layer ``l``: normalisation, activation (both ``l > 0``), then dropout.

    Args:
        convs: the layers: gnnscale :class:`~gnnscale.nn.base.BlockLayer` s (user subclasses included) or PyG
            ``MessagePassing`` convs (wrapped by :func:`~gnnscale.nn.pyg.as_block_layer`: ``GCNConv`` and
            ``SAGEConv`` become gnnscale's own layers over the same parameters, the others run as they are on
            each block). Every layer must aggregate over the same adjacency (``GCNConv``'s normalised one, or the
            graph's own edges).
        act: the activation between layers: a name (``relu``, ``elu``, ...), an element-wise callable, or
            ``None``.
        dropout: the drop probability of every hidden layer's output (keyed: the same mask on every engine).
        norms: ``None``/``"none"``, ``"batch"``, ``"layer"`` (one per hidden layer, as ``--norm``), or the modules
            themselves (``BatchNorm1d``, ``LayerNorm``, PyG's ``BatchNorm`` or node-mode ``LayerNorm``).
        residual: add a bias-free linear map of each layer's input to its output (:func:`gnnscale.nn.norm
            .with_residual`).
        jk: ``None``/``"none"``, ``"last"``, ``"cat"`` or ``"max"``: combine every layer's output (PyG's
            ``JumpingKnowledge``), then the linear map ``lin`` (``out_channels`` wide, or the module given).
        out_channels: with ``jk``, the class count (the width of ``lin``'s output).
        lin: with ``jk``, the final module itself (a converted ``BasicGNN``'s ``lin``).
        input_dropout: the drop probability of the input features (PyG's ``BasicGNN``: none).
    """

    decoupled: ClassVar[bool] = False
    """True for the decoupled models (:class:`~gnnscale.nn.decoupled.DecoupledGNN`): T tasks, then P tasks."""
    kind: str = "stack"
    """The built-in model's name (``gcn``, ...); ``stack`` for a stack of a user's convs."""

    def __init__(self, convs: Sequence[nn.Module], act: str | Callable[[Tensor], Tensor] | None = "relu",
                 dropout: float = 0.5, norms: str | Sequence[nn.Module] | None = None, residual: bool = False,
                 jk: str | None = None, *, out_channels: int | None = None, lin: nn.Module | None = None,
                 input_dropout: float = 0.0):
        super().__init__()
        if len(convs) < 1:
            raise ConfigError("a Stack needs at least one conv")
        jk = "none" if jk is None else jk
        if jk not in JK_MODES:
            raise ConfigError(f"unknown jk {jk!r}; choose one of {', '.join(JK_MODES)}")
        for name, p in (("dropout", dropout), ("input_dropout", input_dropout)):
            if not 0.0 <= p < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {p}")
        self.dropout, self.input_dropout, self.jk, self.residual = dropout, input_dropout, jk, residual
        self.activation = activation(act)
        layers = [as_block_layer(c) for c in convs]
        if residual:
            layers = [with_residual(layer) for layer in layers]
        self.layers = nn.ModuleList(layers)
        for i in range(1, len(layers)):
            if layers[i].in_features != layers[i - 1].out_features:
                raise ConfigError(f"conv {i} takes {layers[i].in_features} features but conv {i - 1} gives "
                                  f"{layers[i - 1].out_features}")
        specs = {layer.adjacency for layer in layers}
        if len(specs) > 1:
            raise ConfigError("the convs aggregate over different adjacencies (GCNConv's normalised one with "
                              "self-loops, and the graph's own edges): a Stack takes one; use the same kind of "
                              "adjacency in every layer")
        count = len(layers) - (jk == "none")
        self.norm, self.norms = _norms(norms, [layer.out_features for layer in layers[:count]])
        """``norms[l]`` normalises layer ``l``'s output (every layer but the last, unless ``jk`` is set); ``norm``
        names their kind (``none``, ``batch``, ``layer``)."""
        if jk == "none":
            if lin is not None or out_channels is not None:
                raise ConfigError("lin and out_channels go with jk (the last conv gives the class scores without)")
            self.lin: nn.Linear | None = None
        else:
            widths = {layer.out_features for layer in layers}
            if jk == "max" and len(widths) > 1:
                raise ConfigError("jk='max' needs every conv to give the same width")
            if lin is None:
                if out_channels is None:
                    raise ConfigError(f"jk={jk!r} needs out_channels (the class count) or lin")
                width = sum(layer.out_features for layer in layers) if jk == "cat" else layers[-1].out_features
                lin = nn.Linear(width, out_channels)
            self.lin = cast(nn.Linear, lin)  # PyG's Linear too: weight, bias, out_channels
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
        (:class:`~gnnscale.engines.core.base.Engine`): they keep their initial values (unless ``weight_decay`` shrinks
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


def class_count(model: Stack) -> int:
    """Width of ``model``'s class scores: its ``lin``'s output with ``jk``, else its last layer's."""
    if model.lin is not None:
        return int(getattr(model.lin, "out_features", getattr(model.lin, "out_channels", 0)))
    return int(model.block_layers[-1].out_features)


def _norms(norms: str | Sequence[nn.Module] | None, widths: list[int]) -> tuple[str, nn.ModuleList]:
    """``(kind, modules)`` of a :class:`Stack`'s ``norms`` argument, one module per width."""
    if norms is None or isinstance(norms, str):
        kind = "none" if norms is None else norms
        if kind not in NORMS:
            raise ConfigError(f"unknown norm {kind!r}; choose one of {', '.join(NORMS)}, or pass the modules")
        return kind, nn.ModuleList(make_norm(kind, w) for w in widths)
    modules = [as_norm(m) for m in norms]
    modules = modules[: len(widths)] if len(modules) == len(widths) + 1 and isinstance(modules[-1], nn.Identity) \
        else modules  # BasicGNN keeps an Identity after its last conv
    if len(modules) != len(widths):
        raise ConfigError(f"norms: {len(widths)} modules needed (one per hidden layer), got {len(modules)}")
    kinds = {"batch" if isinstance(m, SplitBatchNorm) else "layer" if isinstance(m, nn.LayerNorm) else "none"
             for m in modules}
    if len(kinds) > 1:
        raise ConfigError("norms: one kind for every layer (BatchNorm, LayerNorm or none), not a mix")
    return kinds.pop(), nn.ModuleList(modules)


def call_arguments(model: nn.Module, block: Block | Tensor, x: Tensor, seed_epoch: tuple[int, int] | Tensor | None,
                   edge_weight: Tensor | None) -> tuple[Block, Tensor, tuple[int, int] | None]:
    """A model's ``(block, x, seed_epoch)`` from its call, gnnscale's or PyG's (``model(x, edge_index,
    edge_weight)``: a third positional tensor is PyG's ``edge_weight``, as in ``BasicGNN.forward``)."""
    if isinstance(seed_epoch, Tensor):
        edge_weight, seed_epoch = seed_epoch, None
    b, x = block_and_features(model, block, x, edge_weight)
    return b, x, seed_epoch


def as_stack(model: nn.Module) -> Stack:
    """The :class:`Stack` a model given to :func:`gnnscale.train` runs as: a Stack (a built-in model too) as it
    is; a PyG ``BasicGNN`` (``GCN``, ``GraphSAGE``, ``GAT``, ``GIN``, ``EdgeCNN``, ``PNA``, a subclass) converted
    over the same parameters (its convs, norms, activation, dropout, jumping knowledge and ``lin``). Anything else
    is a :class:`~gnnscale.errors.ConfigError` saying what to pass."""
    if isinstance(model, Stack):
        return model
    if is_pyg(model, "BasicGNN"):
        m = cast(Any, model)
        name = type(model).__name__
        jk = m.jk_mode
        if jk not in (None, "last", "cat", "max"):
            raise ConfigError(f"{name}(jk={jk!r}): jumping knowledge by {jk} is not supported; use last, cat or max")
        if m.act_first and any(not isinstance(n, nn.Identity) for n in m.norms):
            raise ConfigError(f"{name}(act_first=True) with a norm: a Stack normalises before the activation")
        return Stack(list(m.convs), act=m.act, dropout=float(m.dropout.p), norms=list(m.norms), jk=jk,
                     lin=getattr(m, "lin", None))
    raise ConfigError(f"model must be a gnnscale.nn.Stack or a PyG BasicGNN (GCN, GraphSAGE, GAT, ...), not "
                      f"{type(model).__name__}; wrap a list of convs with gnnscale.nn.Stack(convs)")
