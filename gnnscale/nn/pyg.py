"""PyG convs as block layers: a ``MessagePassing`` conv of a user's model runs on every engine's blocks.

:func:`as_block_layer` turns a conv into a :class:`~gnnscale.nn.base.BlockLayer`:

* ``GCNConv`` (normalising, with self-loops) becomes :class:`~gnnscale.nn.gcn.GCNLayer` over the *same*
  parameters: PyG's ``GCNConv`` normalises with the degrees of the edges it is given, so on a chunk's or a sampled
  block it would see the wrong degrees; the adapter takes the whole graph's normalised weights from the block
  (``AdjacencySpec(self_loops=True, norm="gcn")``), as the in-memory graph has them.
* ``SAGEConv`` with mean aggregation (PyG's default) becomes :class:`~gnnscale.nn.sage.SAGELayer` over the same
  parameters, and ``GraphConv`` with sum or mean aggregation :class:`~gnnscale.nn.graphconv.GraphConvLayer`: the
  engines then cache their parameter-free aggregation (HongTu's recomputation-caching hybrid) instead of
  recomputing the whole conv in backward.
* any other conv is wrapped as it is (:class:`PyGConv`): it runs on a block's bipartite input ``(x_src, x_dst)``
  with the block's local ``edge_index`` and ``size``, or, when its ``forward`` takes no pair, on ``x_src`` alone
  with the outputs of the destinations (the block's first rows) kept.

No module of PyG is imported here: convs are recognised by their class's name and module, so importing gnnscale
does not pay for importing PyG.
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar, cast

import torch
from torch import Tensor, nn

from gnnscale.errors import ConfigError
from gnnscale.graph.block import Block
from gnnscale.nn.base import BlockLayer
from gnnscale.nn.batchnorm import SplitBatchNorm
from gnnscale.nn.gcn import GCNLayer
from gnnscale.nn.graphconv import GraphConvLayer
from gnnscale.nn.sage import SAGELayer

OUTPUT_BIASES = {"SAGEConv": "conv.lin_l.bias", "GraphConv": "conv.lin_rel.bias", "GATConv": "conv.bias",
                 "GATv2Conv": "conv.bias", "GCNConv": "conv.bias", "TransformerConv": "conv.lin_skip.bias"}
"""The bias a PyG conv adds last to every output row, by class name (zeroed before a BatchNorm that follows it:
:meth:`~gnnscale.nn.base.BlockLayer.biases_before_norm`)."""


def is_pyg(module: object, name: str) -> bool:
    """Whether ``module``'s class is (or derives from) PyG's class ``name``."""
    return any(c.__name__ == name and c.__module__.startswith("torch_geometric.") for c in type(module).__mro__)


def pyg_name(module: object) -> str | None:
    """The name of the PyG class ``module`` is an instance of (its own class's when it is one), else ``None``."""
    cls = type(module)
    return cls.__name__ if cls.__module__.startswith("torch_geometric.") else None


def as_block_layer(conv: nn.Module) -> BlockLayer:
    """``conv`` as a block layer: a :class:`BlockLayer` as it is; a PyG conv converted (the module docstring says
    how); anything else is a :class:`~gnnscale.errors.ConfigError` saying what a Stack takes."""
    if isinstance(conv, BlockLayer):
        return conv
    if not is_pyg(conv, "MessagePassing"):
        raise ConfigError(f"a Stack takes PyG MessagePassing convs or gnnscale BlockLayers, not "
                          f"{type(conv).__name__}")
    with torch.random.fork_rng(devices=[]):  # the native layers' own initial weights are replaced: draw nothing
        native = _native(conv)
    return native if native is not None else PyGConv(conv)


def _native(conv: nn.Module) -> BlockLayer | None:
    """gnnscale's own layer computing ``conv``'s function over ``conv``'s own parameters, where there is one."""
    c = cast(Any, conv)
    name = pyg_name(conv)
    aggr = getattr(c, "aggr", None)
    if name == "GCNConv" and c.in_channels > 0 and c.normalize and c.add_self_loops and not c.improved \
            and aggr == "add" and c.flow == "source_to_target":
        layer: BlockLayer = GCNLayer(c.in_channels, c.out_channels, bias=c.bias is not None)
        layer.lin.weight = c.lin.weight  # type: ignore[union-attr]
        layer.bias = c.bias  # type: ignore[assignment]
        return layer
    width = getattr(c, "in_channels", None)
    width = width if isinstance(width, int) and width > 0 else None  # lazy (-1) or a pair: the wrapper says
    if name == "SAGEConv" and width and aggr == "mean" and c.root_weight and not c.project and not c.normalize \
            and c.lin_l.bias is not None and c.flow == "source_to_target":
        layer = SAGELayer(width, c.out_channels)
        layer.lin_l, layer.lin_r = c.lin_l, c.lin_r  # type: ignore[assignment]
        return layer
    if name == "GraphConv" and width and aggr in ("add", "mean") and c.flow == "source_to_target":
        layer = GraphConvLayer(width, c.out_channels, aggr=aggr, bias=c.lin_rel.bias is not None)
        layer.lin_rel, layer.lin_root = c.lin_rel, c.lin_root  # type: ignore[assignment]
        return layer
    return None


class PyGConv(BlockLayer):
    """A PyG ``MessagePassing`` conv run on blocks as it is: AGGREGATE is the whole conv on the block's bipartite
    input, UPDATE passes it through. Its aggregation has parameters (the conv's), so a chunked engine recomputes
    it in backward rather than caching it (:attr:`~gnnscale.nn.base.BlockLayer.edge_compute`).

    Args:
        conv: the conv (its parameters are this layer's, under ``conv.``).
        in_features: its input width, when the conv does not say (``in_channels``, or its ``nn``'s first
            linear map for ``GINConv`` and ``EdgeConv``).
    """

    edge_compute: ClassVar[bool] = True
    update_uses_dst: ClassVar[bool] = False

    def __init__(self, conv: nn.Module, in_features: int | None = None):
        super().__init__()
        self.conv = conv
        self.name = type(conv).__name__
        self.in_features = in_features if in_features is not None else input_width(conv)
        params = inspect.signature(conv.forward).parameters
        x_type = str(params["x"].annotation) if "x" in params else ""
        self.bipartite = "Tuple" in x_type or "PairTensor" in x_type or "tuple" in x_type
        """Whether the conv takes ``(x_src, x_dst)`` (PyG's bipartite form); else it runs on ``x_src`` alone."""
        self.takes_size = "size" in params
        self.out_features = self._output_width()

    def _output_width(self) -> int:
        """The conv's output width: one forward on a 2-vertex graph (no gradient, no randomness drawn)."""
        p = next(self.conv.parameters(), None)
        x = torch.zeros(2, self.in_features, device=None if p is None else p.device)
        block = Block(indptr=torch.tensor([0, 1, 2]), indices=torch.tensor([1, 0]), num_src=2).to(x.device)
        training = self.conv.training
        try:
            with torch.no_grad(), torch.random.fork_rng(devices=[]):
                self.conv.eval()
                y = self.aggregate(block, x)
        except Exception as exc:  # noqa: BLE001 -- any conv's error, said in one line
            raise ConfigError(f"{self.name} does not run on a block of {self.in_features}-wide rows "
                              f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); give its "
                              "input width: PyGConv(conv, in_features=F)") from None
        finally:
            self.conv.train(training)
        if not isinstance(y, Tensor) or y.dim() != 2 or y.shape[0] != 2:
            raise ConfigError(f"{self.name} gives {type(y).__name__} {getattr(y, 'shape', '')}, not one row per "
                              "vertex: a Stack's convs map [N, F_in] rows to [N, F_out] rows")
        return int(y.shape[1])

    def aggregate(self, block: Block, x_src: Tensor) -> Tensor:
        edge_index = block.edge_index()
        if not self.bipartite:
            return self.conv(x_src, edge_index)[: block.num_dst]  # type: ignore[no-any-return]
        x = (x_src, x_src[: block.num_dst])  # the block's destinations are its first source rows
        if self.takes_size:
            return self.conv(x, edge_index, size=(block.num_src, block.num_dst))  # type: ignore[no-any-return]
        return self.conv(x, edge_index)  # type: ignore[no-any-return]

    def update(self, agg: Tensor, x_dst: Tensor) -> Tensor:
        del x_dst
        return agg

    def biases_before_norm(self, followed_by_batch_norm: bool) -> list[nn.Parameter]:
        """The conv's output bias (:data:`OUTPUT_BIASES`; a GIN-like conv's: the bias of its ``nn``'s last
        linear map, when that map is the ``nn``'s last module) when a BatchNorm follows."""
        if not followed_by_batch_norm:
            return []
        name = OUTPUT_BIASES.get(self.name)
        inner = getattr(self.conv, "nn", None)
        if name is None and isinstance(inner, nn.Sequential) and len(inner) and isinstance(inner[-1], nn.Linear):
            name = f"conv.nn.{len(inner) - 1}.bias"
        bias = dict(self.named_parameters()).get(name) if name else None
        return [] if bias is None else [bias]

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, bipartite={self.bipartite}"


def input_width(conv: nn.Module) -> int:
    """The input width a PyG conv declares: ``in_channels`` (both sides of a pair must agree), else the first
    linear map of its ``nn`` (``GINConv``; ``EdgeConv``'s takes twice the width)."""
    name = type(conv).__name__
    width = getattr(conv, "in_channels", None)
    if isinstance(width, tuple | list):
        if len(set(width)) != 1:
            raise ConfigError(f"{name} takes sources and destinations of different widths {tuple(width)}; in a "
                              "Stack both are the previous layer's rows")
        width = width[0]
    inner = getattr(conv, "nn", None)
    if width is None and isinstance(inner, nn.Module):
        first = next((m for m in inner.modules() if isinstance(getattr(m, "in_features", None), int)
                      or isinstance(getattr(m, "in_channels", None), int)), None)
        if first is not None:
            width = getattr(first, "in_features", None) or getattr(first, "in_channels", None)
            if is_pyg(conv, "EdgeConv") and isinstance(width, int):
                width //= 2
    if not isinstance(width, int) or width <= 0:
        raise ConfigError(f"{name}: its input width is not known ({width!r}; a lazy -1 is not); give it: "
                          "gnnscale.nn.PyGConv(conv, in_features=F)")
    return width


def as_norm(module: nn.Module) -> nn.Module:
    """A normalisation a Stack runs between layers: BatchNorm as :class:`~gnnscale.nn.batchnorm.SplitBatchNorm`
    (which engines reduce over chunks, trainers and ranks), over the same parameters and running statistics;
    ``LayerNorm`` per row (PyG's ``LayerNorm`` in ``node`` mode too); ``Identity``. A norm over the whole graph
    (PyG's ``LayerNorm(mode="graph")``, ``GraphNorm``, ...) is refused: no chunk or batch sees the whole graph."""
    if isinstance(module, SplitBatchNorm | nn.LayerNorm | nn.Identity):
        return module
    name = pyg_name(module)
    inner = getattr(module, "module", None)
    if name == "BatchNorm" and isinstance(inner, nn.BatchNorm1d):
        module = inner
    if type(module) is nn.BatchNorm1d:
        bn = cast(nn.BatchNorm1d, module)
        if not (bn.affine and bn.track_running_stats):
            raise ConfigError("norms: BatchNorm1d without affine parameters or running statistics is not supported")
        split = SplitBatchNorm(bn.num_features, eps=bn.eps, momentum=bn.momentum)
        split.weight, split.bias = bn.weight, bn.bias  # the same parameters
        split.load_state_dict(bn.state_dict())  # and the same running statistics
        return split
    if name == "LayerNorm" and getattr(module, "mode", None) == "node":
        m = cast(Any, module)
        ln = nn.LayerNorm(m.in_channels, eps=m.eps, elementwise_affine=m.affine)
        if m.affine:
            ln.weight, ln.bias = m.weight, m.bias
        return ln
    why = (" (mode='graph' normalises over the whole graph: use mode='node')" if name == "LayerNorm" else "")
    raise ConfigError(f"norms: {type(module).__name__}{why} is not one the engines can split over chunks and "
                      "batches; use BatchNorm1d, LayerNorm over each row, or none")
