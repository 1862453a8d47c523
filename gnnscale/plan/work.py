"""An epoch's work, counted once for every engine: per layer the aggregation's edges and width, the dense update's
FLOPs, the elementwise bytes (activation, dropout, loss), and the optimiser step; priced by a machine's
:class:`~gnnscale.plan.rates.Rates` into named seconds (:func:`compute_terms`).

The counts follow what the library computes: an aggregation is one sparse product over ``E + V`` edges (the
self-loops included) at the width it aggregates (the projected width of a layer that projects first), forward and
backward (none backward where the aggregated rows are the input features, which need no gradient); each weight
matrix costs ``2 * rows * in * out`` FLOPs forward, again for the input gradient (not at layer 0) and again for the
weight gradient, but never less than the bytes it streams at the memory rate (a narrow matmul is memory-bound).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from torch import nn

from gnnscale.graph.graph import Graph
from gnnscale.nn.base import BlockLayer
from gnnscale.nn.mlp import MLPLayer
from gnnscale.nn.stack import Stack
from gnnscale.nn.zoo import build_model
from gnnscale.plan.locality import graph_aggregate_rate
from gnnscale.plan.rates import Rates

if TYPE_CHECKING:
    from gnnscale.config import TrainConfig

ELEMENTWISE_PASSES = 5
"""Streaming passes over a hidden layer's output per epoch, each into a fresh tensor: the activation (about 1.8
passes: its output's pages are touched for the first time), the keyed dropout (1.9), their backward (0.85) and the
gradient's accumulation (0.3), as torch's profiler counts them on GCN (csbm 20K and 200K vertices, 64 wide: 2.1
and 20 ms for ReLU over 5 and 51 MB)."""
INPUT_PASSES = 4
"""Passes over the input features: layer 0's dropout forward (mask, product) and the dropped copy read back."""
LOSS_PASSES = 6
"""Passes over the class scores: log-softmax, the loss, and their gradient."""
ADAM_PASSES = 16
"""Streaming passes of Adam's step per parameter (read weights, gradient, two moments; write three; temporaries)."""
ATTENTION_PASSES = 12
"""Passes per edge and head of an attention layer: scores, LeakyReLU, softmax, the weighted sum, their backward."""


@dataclass(frozen=True)
class LayerWork:
    """One layer's work over ``rows`` destination vertices."""

    rows: int
    in_width: int
    out_width: int
    edges: int
    """Edges the layer aggregates over (``0``: no aggregation, an MLP layer)."""
    agg_width: int
    """Width of the rows it aggregates (``out_width`` when it projects first)."""
    weights: int
    """Elements of its weight matrices (each a ``[in, out]`` product per row)."""
    heads: int = 0
    """Attention heads computed per edge (``0``: none)."""
    cacheable: bool = True
    """Whether its aggregation is parameter-free (an engine may cache it instead of recomputing it)."""
    source_grad: bool = True
    """Whether its input needs a gradient (not at layer 0: the input features)."""
    projects: bool = False
    """Whether it projects before aggregating (the aggregation then needs its backward at layer 0 too)."""
    src_rows: int = 0
    """Rows of the table it aggregates from (``0``: ``rows``, the whole graph's; a sampled block's input side is
    wider than its destinations)."""
    own_rate: float = 0.0
    """Edges/s of its aggregation measured on the graph's own rows on the CPU (:mod:`gnnscale.plan.locality`;
    ``0``: the calibrated rate of random neighbours)."""

    @property
    def backward_aggregates(self) -> bool:
        """Whether the backward runs the transposed aggregation."""
        return self.edges > 0 and (self.source_grad or self.projects)

    def aggregate_s(self, rates: Rates) -> float:
        """Seconds of one sparse aggregation (forward, or the transposed product backward)."""
        if not self.edges:
            return 0.0
        if self.own_rate > 0 and rates.on_cpu:
            return self.edges / self.own_rate
        return self.edges / rates.aggregate_rate(self.agg_width, 4 * (self.src_rows or self.rows) * self.agg_width)

    def dense_s(self, rates: Rates) -> float:
        """Seconds of the forward dense update (each weight matrix once over the rows)."""
        flops = 2 * self.rows * self.weights
        streamed = 4 * self.rows * (self.in_width + self.out_width)
        return max(flops / rates.flops, streamed / rates.memory_rate(streamed)) if self.weights else 0.0

    def attention_s(self, rates: Rates) -> float:
        """Seconds of the per-edge attention work, forward and backward."""
        return ATTENTION_PASSES * 4 * self.edges * self.heads / rates.memory_rate(4 * self.edges * self.heads)


def stack_of(graph: Graph, config: TrainConfig, model: Stack | None) -> Stack:
    """``model``, or ``config``'s built-in model for ``graph`` (what ``train`` would build)."""
    if model is not None:
        return model
    assert graph.num_classes is not None
    return build_model(config.model, max(graph.num_features, 1), config.hidden, graph.num_classes,
                       **config.model_kwargs())


def _weights(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.dim() == 2)


def _layer(layer: BlockLayer, rows: int, edges: int, first: bool) -> LayerWork:
    projects = layer.projects_first
    aggregates = not isinstance(layer, MLPLayer)
    heads = int(getattr(layer, "heads", 0) or getattr(getattr(layer, "conv", None), "heads", 0) or 1) \
        if layer.edge_compute else 0
    return LayerWork(rows, layer.in_features, layer.out_features, edges if aggregates else 0,
                     layer.out_features if projects else layer.in_features, _weights(layer), heads,
                     not layer.edge_compute, not first, projects)


def layer_work(graph: Graph, config: TrainConfig, model: Stack | None = None) -> list[LayerWork]:
    """Every layer's work over the whole graph, in the order the forward runs them (a decoupled model: its T
    tasks, then its P tasks), its aggregations at the rate measured on the graph's own rows
    (:func:`graph_aggregate_rate`)."""
    stack = stack_of(graph, config, model)
    V, E = graph.num_nodes, graph.num_edges + graph.num_nodes
    out = [_layer(layer, V, E, i == 0) for i, layer in enumerate(stack.block_layers)]
    for prop in getattr(stack, "props", []):  # a decoupled model's P tasks
        out.append(_layer(prop, V, E, False))
    out = [replace(w, own_rate=graph_aggregate_rate(graph, w.agg_width)) if w.edges else w for w in out]
    edge = getattr(stack, "edge", None)
    if edge is not None:  # dgat's edge task: a GATv2 score per edge on the class-wide rows
        w = int(edge.width)
        out.append(LayerWork(V, w, w, 0, w, _weights(edge), heads=1, cacheable=False))
    return out


def parameters_of(graph: Graph, config: TrainConfig, model: Stack | None = None) -> int:
    return sum(p.numel() for p in stack_of(graph, config, model).parameters())


def input_dropout_s(elements: int, rates: Rates) -> float:
    """Seconds of layer 0's keyed dropout over ``elements`` input features (no gradient): at the calibrated
    :attr:`~gnnscale.plan.rates.Rates.dropout` rate, else :data:`INPUT_PASSES` memory passes."""
    if rates.dropout > 0:
        return elements / rates.dropout
    return INPUT_PASSES * 4 * elements / rates.memory_rate(4 * elements)


def _passes(count: int, elements: int, rates: Rates, fresh: bool = False) -> float:
    """Seconds of ``count`` 4-byte streaming passes over ``elements`` at the memory rate of their size; ``fresh``:
    each writes a new tensor, whose pages the allocator takes from the system again (first touch), at the streamed
    rate whatever its size (the calibration's streamed copy writes a fresh tensor too)."""
    return count * 4 * elements / (rates.memory if fresh else rates.memory_rate(4 * elements))


def optimizer_s(params: int, rates: Rates) -> float:
    """Seconds of one Adam step over ``params`` float32 values (:data:`ADAM_PASSES` passes)."""
    return _passes(ADAM_PASSES, params, rates)


def compute_terms(work: list[LayerWork], rates: Rates, *, num_classes: int, params: int,
                  input_rows: int | None = None) -> dict[str, float]:
    """The named seconds of one epoch's computation on one device, forward and backward:
    ``aggregate`` (forward), ``aggregate_backward``, ``update`` (forward), ``update_backward`` (weight and input
    gradients), ``attention``, ``elementwise`` (activation, dropout, loss) and ``optimizer``; each pass priced at
    the memory rate of its array's size (:meth:`~gnnscale.plan.rates.Rates.memory_rate`: from cache when small).
    ``input_rows``: rows of input features dropped out (default: the first layer's rows; a sampled batch's
    input side is wider); the loss is over the last layer's rows."""
    rows = (work[0].rows if work else 0) if input_rows is None else input_rows
    elementwise = input_dropout_s(rows * (work[0].in_width if work else 0), rates)
    elementwise += sum(_passes(ELEMENTWISE_PASSES, w.rows * w.out_width, rates, True) for w in work[:-1])
    elementwise += _passes(LOSS_PASSES, (work[-1].rows if work else 0) * num_classes, rates, True)
    return {
        "aggregate": sum(w.aggregate_s(rates) for w in work),
        "aggregate_backward": sum(w.aggregate_s(rates) for w in work if w.backward_aggregates),
        "update": sum(w.dense_s(rates) for w in work),
        "update_backward": sum(w.dense_s(rates) * (2 if w.source_grad else 1) for w in work),
        "attention": sum(w.attention_s(rates) for w in work),
        "elementwise": elementwise,
        "optimizer": optimizer_s(params, rates),
    }


def device_bytes(work: list[LayerWork]) -> int:
    """Bytes the computation reads on its device per epoch: each aggregation's source rows per edge (forward and
    backward) and each layer's input and output rows (forward and backward)."""
    agg = sum(2 * 4 * w.edges * w.agg_width for w in work)
    dense = sum(2 * 4 * w.rows * (w.in_width + w.out_width) for w in work)
    return agg + dense
