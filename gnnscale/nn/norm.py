"""The model options around the layers: normalisation (``--norm``), residual connections (``--residual``) and
jumping knowledge (``--jk``), with PyG's :class:`~torch_geometric.nn.models.BasicGNN` semantics.

* ``norm``: ``batch`` is :class:`torch.nn.BatchNorm1d` (PyG's ``norm="batch_norm"``: statistics over the rows the
  layer computed, running statistics in evaluation, both in the model's ``state_dict``); ``layer`` is
  :class:`torch.nn.LayerNorm` over each row's features (PyG's ``norm="layer_norm"`` with
  ``norm_kwargs={"mode": "node"}``; PyG's default ``mode="graph"`` normalises over the whole graph instead, which no
  chunked or sampled engine could reproduce, and DGL's examples use the per-row one).
* ``residual``: PyG's ``GATConv(residual=True)`` convention for every layer type: the layer's output plus a
  bias-free linear map of its own (post-dropout) input, ``conv(x) + W_res x`` (PyG's ``BasicGNN`` itself has no
  residual option; only ``GATConv`` has one, and this is it).
* ``jk``: ``none`` (PyG's ``jk=None``, the last layer outputs the class scores), or ``last``/``cat``/``max``: every
  layer outputs the hidden width, each output is normalised, activated and dropped out, then combined (the last;
  concatenated; element-wise maximum, PyG's ``JumpingKnowledge``) and a final :class:`torch.nn.Linear` (``lin``)
  gives the class scores.
"""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor, nn

from gnnscale.errors import ConfigError
from gnnscale.nn.base import BlockLayer
from gnnscale.nn.batchnorm import SplitBatchNorm

NORMS = ("none", "batch", "layer")
"""``--norm`` choices."""
JK_MODES = ("none", "last", "cat", "max")
"""``--jk`` choices."""


def make_norm(norm: str, width: int) -> nn.Module:
    """The normalisation module for ``norm`` on ``width`` features (``nn.Identity`` for ``none``)."""
    if norm == "batch":  # BatchNorm1d that the engines may also run over chunks, trainers or ranks
        return SplitBatchNorm(width)
    if norm == "layer":
        return nn.LayerNorm(width)
    if norm == "none":
        return nn.Identity()
    raise ConfigError(f"unknown --norm {norm!r}; choose one of {', '.join(NORMS)}")


class _Residual(BlockLayer):
    """Mixin: UPDATE adds ``res(x_dst)``, a bias-free linear map of the layer's input rows (PyG ``GATConv``'s
    ``residual=True``); UPDATE then reads ``x_dst`` whatever the layer type."""

    update_uses_dst: ClassVar[bool] = True
    has_update_vjp: ClassVar[bool] = False  # the residual term is not in the base layer's UPDATE backward
    res: nn.Linear

    def update(self, agg: Tensor, x_dst: Tensor) -> Tensor:
        return super().update(agg, x_dst) + self.res(x_dst)  # type: ignore[no-any-return]

    def update_vjp(self, agg: Tensor, x_dst: Tensor | None, grad: Tensor, agg_grad: bool,
                   dst_grad: bool) -> tuple[Tensor | None, Tensor | None] | None:
        """``None``: the layer's own UPDATE backward does not know the residual term (recomputed instead)."""
        del agg, x_dst, grad, agg_grad, dst_grad
        return None


_RESIDUAL_CLASSES: dict[type[BlockLayer], type[BlockLayer]] = {}


def with_residual(layer: BlockLayer) -> BlockLayer:
    """``layer`` with a residual connection (same parameters plus ``res.weight``, Glorot-initialised as PyG's)."""
    cls = type(layer)
    if cls not in _RESIDUAL_CLASSES:
        name = f"Residual{cls.__name__}"
        _RESIDUAL_CLASSES[cls] = type(name, (_Residual, cls), {"__module__": __name__, "__qualname__": name})
        globals()[name] = _RESIDUAL_CLASSES[cls]  # picklable by name, as a class written in this module would be
    layer.__class__ = _RESIDUAL_CLASSES[cls]
    res = nn.Linear(layer.in_features, layer.out_features, bias=False)
    nn.init.xavier_uniform_(res.weight)
    layer.res = res  # type: ignore[attr-defined]
    return layer
