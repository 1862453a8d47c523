"""The moments of the offload engine's passes (:mod:`~gnnscale.plan.offload_memory`): per layer kind, the
device bytes a chunk's computation holds at each moment where the live set can peak, given its ``V, R, E``, its
assembled source rows ``A`` and the previous chunk's leftovers ``P`` still bound; and what each pass leaves bound
for the next chunk (``*_stale``)."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from gnnscale.nn.base import BlockLayer
from gnnscale.nn.gat import GATLayer
from gnnscale.nn.gin import GINLayer
from gnnscale.nn.graphconv import GraphConvLayer
from gnnscale.nn.sage import SAGELayer
from gnnscale.plan.layer_memory import layer_memory, measured

F32 = 4
I64 = 8
SAGE_LIKE = (SAGELayer, GraphConvLayer)
"""Layers priced as SAGE: a sparse sum or mean, then two linear maps (GraphConv's sum allocates no more)."""


class Drops(NamedTuple):
    """Whether a layer's pass drops out its input rows and its output rows, and where keyed dropout runs fused."""

    input: bool
    output: bool
    fused_min: float = math.inf
    """Elements from which :func:`~gnnscale.nn.ops.keyed_dropout` runs the fused CPU kernel
    (:func:`~gnnscale.runtime.cpu_kernels.dropout_applies`), ``inf`` where it never does (an accelerator, the sim
    device, no numba)."""


def _dropout(rows: Tensor, width: int, on: bool = True, fused_min: float = math.inf) -> Tensor:
    """Keyed dropout's peak on ``[rows, width]``: the torch formulation's int32 hash products and the bool mask,
    then the mask and the output (``where`` and an in-place division), with two bytes per element of slack for the
    allocator, besides int64 row hashes and the column hashes' few int64 vectors of ``width``; where the fused CPU
    kernel runs (``rows * width >= fused_min``), its output alone (it makes no mask and no hash tensor)."""
    fused = rows * width >= fused_min
    return torch.where(fused, F32 * rows * width, rows * (7 * width + 3 * I64) + 4 * I64 * width) * on


def _edges(layer: BlockLayer, V: Tensor, E: Tensor) -> Tensor:
    """A block's edges from the planner's count, which adds a self-loop per destination (an upper bound for an
    adjacency without them)."""
    return E if layer.adjacency.self_loops else E - V


# ------------------------------------------------------------------------------------------------ the moments
def _params(layer: object) -> int:
    """Bytes of a layer's parameters: its gradients' temporaries before they are accumulated."""
    return sum(p.numel() * p.element_size() for p in layer.parameters())  # type: ignore[attr-defined]


def _project(V: Tensor, fi: int, fa: int, P: Tensor, d: Drops) -> Tensor:
    """The layer's input (the features dropped out: ``d[0]``) made while the previous chunk's ``P`` is still
    bound, then its projection (a temporary stored to host memory)."""
    x = F32 * V * fi * d[0]
    return torch.maximum(_dropout(V, fi, d[0], d.fused_min) + P, x + F32 * V * fa)


def _project_backward(V: Tensor, fi: int, fa: int, l: int, P: Tensor, d: Drops) -> Tensor:
    """The input again (made while the previous chunk's ``P`` is bound), then the projection's backward without
    its forward (:func:`~gnnscale.nn.ops.linear_vjp`: the weight's gradient, a parameter's size) and the input's
    gradient (``l > 0``) while the previous chunk's is still bound."""
    x = F32 * V * fi * d[0]
    return torch.maximum(_dropout(V, fi, d[0], d.fused_min) + P, x + F32 * V * fi * (l > 0) * 2)


def _project_backward_stale(V: Tensor, fi: int, l: int, d: Drops) -> Tensor:
    """The previous chunk's input after dropout (layer 0; else a slice) and its gradient (``l > 0``)."""
    return F32 * V * fi * (d[0] + (l > 0))


def _update(layer: object, V: Tensor, fi: int, fa: int, fo: int) -> Tensor:
    """UPDATE's peak (no autograd) beyond its input aggregation."""
    if isinstance(layer, GINLayer):
        return torch.maximum(8 * V * fi, F32 * V * fi + 8 * V * fo) * 1.0
    if isinstance(layer, SAGE_LIKE):
        return 12 * V * fo * 1.0
    return 8 * V * fo * 1.0


def _gat_edges(layer: GATLayer, V: Tensor, R: Tensor, E: Tensor) -> Tensor:
    """GAT's aggregation at its sparse products (no autograd; :class:`~gnnscale.nn.gat.GATLayer` forms no
    ``[E, H, C]`` messages): projected rows and their source scores (two layouts), destination scores, the
    ``[H, E]`` scores turned weights in place with a per-destination temporary and their signs, int64 row
    pointers, each head's output and the stacked ones."""
    H, HC = layer.heads, layer.heads * layer.out_per_head
    return F32 * R * (HC + 2 * H) + F32 * V * H + I64 * V + F32 * E * 2 * H + E * H + F32 * V * HC * 2


def _forward(layer: BlockLayer, l: int, proj: bool, V: Tensor, R: Tensor, E: Tensor, A: Tensor,
             d: Drops) -> Tensor:
    """Layer ``l`` without autograd (``d``: its input's and its output's dropout), the next layer's input."""
    fi, fo = layer.in_features, layer.out_features
    after = F32 * V * fo * 2 + _dropout(V, fo, d[1], d.fused_min)  # the output, its activation and dropout
    if proj:
        spmm = 8 * V * fo if isinstance(layer, SAGE_LIKE) else F32 * V * fo
        agg = F32 * V * fo
        xd = 0 * V
        dst = 0 * V
        if layer.update_uses_dst:
            dst = agg + _dropout(V, fi, d[0], d.fused_min)
            xd = F32 * V * fi * d[0]
        return torch.maximum(torch.maximum(A + spmm, A + dst), torch.maximum(
            A + agg + xd + _update(layer, V, fi, fo, fo), after))
    X = F32 * R * fi * d[0]
    drop = A + _dropout(R, fi, True, d.fused_min) if d[0] else 0 * R
    if isinstance(layer, GATLayer) or measured(layer):
        work = _gat_edges(layer, V, R, E) if isinstance(layer, GATLayer) else \
            layer_memory(layer).forward(V, R, _edges(layer, V, E))
        return torch.maximum(drop, torch.maximum(A + X + work, after))
    spmm = 8 * V * fi if isinstance(layer, SAGE_LIKE) else F32 * V * fi
    agg = F32 * V * fi
    return torch.maximum(torch.maximum(drop, A + X + spmm), torch.maximum(
        A + X + agg + _update(layer, V, fi, fi, fo), after))


def _loss(layer: BlockLayer, l: int, proj: bool, V: Tensor, R: Tensor, E: Tensor, A: Tensor, P: Tensor,
          d: Drops) -> Tensor:
    """The last layer with autograd, the loss and the backward into the source rows; the previous chunk's rows
    and gradient ``P`` stay bound (through its output's graph) until this chunk's output replaces it."""
    fi, fo = layer.in_features, layer.out_features
    if proj:
        fwd = F32 * V * fo * (6 if isinstance(layer, SAGE_LIKE) else 3)
        xd = F32 * V * fi * (2 if layer.update_uses_dst else 0)
        drop = _dropout(V, fi, d[0] and layer.update_uses_dst, d.fused_min)
        return A + torch.maximum(drop, xd + fwd + torch.maximum(P, F32 * R * fo))
    X = F32 * R * fi * d[0]
    drop = A + _dropout(R, fi, True, d.fused_min) if d[0] else 0 * R
    if measured(layer):  # measured: through its forward (``P`` still bound), then its backward and the loss's
        m, Em = layer_memory(layer), _edges(layer, V, E)
        return torch.maximum(drop, A + X + torch.maximum(m.saved[l > 0](V, R, Em) + P,
                                                         m.train[l > 0](V, R, Em) + F32 * V * fo * 3))
    if isinstance(layer, GATLayer):
        H, HC = layer.heads, layer.heads * layer.out_per_head
        saved = _gat_edges(layer, V, R, E)
        # backward: each head's transposed product and its stack, the weights' per-head SDDMMs (sparse results
        # with their own int64 indices) and their stack, the softmax's and leaky ReLU's [H, E] temporaries
        grads = F32 * R * (2 * HC + fi) + E * H * (I64 + F32) + F32 * E * H * 6
        return torch.maximum(drop, A + X + saved + torch.maximum(P, grads))
    # GIN/GCN/SAGE aggregating first: the aggregation's and the slice's gradients, then their sum
    grads = F32 * R * fi * (3 if isinstance(layer, (GINLayer, *SAGE_LIKE)) else 1)
    fwd = F32 * V * fi * 4 + F32 * V * fo * 6
    return torch.maximum(drop, A + X + fwd + torch.maximum(P, grads))


def _loss_stale(layer: object, l: int, proj: bool, V: Tensor, R: Tensor, A: Tensor) -> Tensor:
    """The previous chunk's source rows and their gradient, bound until the next chunk's rows replace them."""
    fi, fo = layer.in_features, layer.out_features  # type: ignore[attr-defined]
    width = fo if proj else fi
    return A + F32 * R * width * (l > 0 or proj)


def _backward_cached(layer: BlockLayer, l: int, proj: bool, through: bool, V: Tensor, R: Tensor, P: Tensor,
                     d: Drops, relu: bool) -> Tensor:
    """UPDATE recomputed from the cached aggregation with autograd, the next layer's input's gradient, their
    backward, then the propagation's transpose into the source rows; the previous chunk's leftovers ``P`` stay
    bound until this chunk's recomputation returns (not through its propagation's transpose)."""
    fi, fo = layer.in_features, layer.out_features
    fa = fo if proj else fi
    dst = layer.update_uses_dst
    xd = F32 * V * fi * (dst and d[0])
    if isinstance(layer, GINLayer):
        update = _update(layer, V, fi, fa, fo) + F32 * V * fi * 2
        # y, activation, dropout; their gradients
        after = F32 * V * fo * 2 + _dropout(V, fo, d[1], d.fused_min) + F32 * V * fo * 2
        peak = xd + torch.maximum(update, after) + F32 * V * fa
        if through:  # y, the aggregation's gradient, the sources' gradient
            peak = torch.maximum(peak, xd + F32 * V * (fo + 2 * fa) + F32 * R * fa)
        return P + torch.maximum(peak, _dropout(V, fi, dst and d[0], d.fused_min))
    # GCN, SAGE and GraphConv: UPDATE with autograd (its products, then y); the next layer's input's gradient from
    # y: ReLU and dropout backpropagated without their forward (the dropout of the incoming gradient, then ReLU's
    # mask of it), else through their forward with autograd; y's backward into the aggregation's gradient (a copy:
    # the caller holds y's) and the destination rows' (layer > 0)
    update = _update(layer, V, fi, fa, fo)
    if relu:
        grad_y = F32 * V * fo + torch.maximum(_dropout(V, fo, d[1], d.fused_min), F32 * V * fo * 2 * 1.0)
    else:
        grad_y = F32 * V * fo * 4 + _dropout(V, fo, d[1], d.fused_min)
    back = F32 * V * (2 * fo + fa * through + fi * (dst and l > 0))
    recompute = xd + torch.maximum(torch.maximum(update, grad_y), back)
    recompute = torch.maximum(recompute, _dropout(V, fi, dst and d[0], d.fused_min))
    # then, the previous chunk let go: the aggregation's gradient (scaled by the in-degrees for a mean) and the
    # sources' gradient
    push = xd + F32 * V * (fa * 2 + fi * (dst and l > 0)) + F32 * R * fa if through else 0 * V
    return torch.maximum(P + recompute, push)


def _backward_cached_stale(layer: object, l: int, proj: bool, through: bool, V: Tensor, d: Drops) -> Tensor:
    """The previous chunk's leaves bound in the loop until this chunk's recomputation returns: its aggregation's
    gradient, its dropped-out destination rows and their gradient (GIN: its output and aggregation's gradient,
    its destination rows)."""
    fi, fo = layer.in_features, layer.out_features  # type: ignore[attr-defined]
    fa = fo if proj else fi
    dst = layer.update_uses_dst  # type: ignore[attr-defined]
    if isinstance(layer, GINLayer):
        return F32 * V * (fo + fa) + (F32 * V * fi * 2 if dst else 0)
    return F32 * V * (fa * through + fi * (dst and d[0]) + fi * (dst and l > 0))


def _backward_whole(layer: BlockLayer, l: int, V: Tensor, R: Tensor, E: Tensor, A: Tensor, P: Tensor,
                    d: Drops) -> Tensor:
    """A layer recomputed whole with autograd (GAT, a user's) and backpropagated into its source rows."""
    fi, fo = layer.in_features, layer.out_features
    X = F32 * R * fi * d[0]
    drop = A + _dropout(R, fi, True, d.fused_min) if d[0] else 0 * R
    if measured(layer):  # measured, then the next layer's input's gradient (its dropout's and ReLU's); the
        # previous chunk's input ``P`` stays bound until this chunk's recomputation returns
        m, Em = layer_memory(layer), _edges(layer, V, E)
        grad_y = F32 * V * fo * 2 + _dropout(V, fo, d[1], d.fused_min)
        return P + torch.maximum(drop, torch.maximum(A, X) + m.train[l > 0](V, R, Em) + grad_y)
    assert isinstance(layer, GATLayer)
    H, HC = layer.heads, layer.heads * layer.out_per_head
    saved = _gat_edges(layer, V, R, E) + F32 * E * H * 2
    # the weights' per-head SDDMMs (sparse results with their own int64 indices) and each head's [E, C]-sized
    # products' workspace, the output's gradient rows (the rows' come after the edges' are let go)
    grads = E * H * (I64 + F32) + F32 * E * 3 * HC + F32 * V * fo * 5
    # the assembled rows are the input (l > 0), or are let go once dropped out (layer 0)
    return torch.maximum(drop, torch.maximum(A, X) + saved + torch.maximum(P, grads))


def _backward_whole_stale(layer: object, l: int, V: Tensor, R: Tensor, A: Tensor) -> Tensor:
    """The previous chunk's input (after dropout for layer 0; else its rows and their gradient, bound through
    its output's graph until the next output replaces it) and output."""
    fi, fo = layer.in_features, layer.out_features  # type: ignore[attr-defined]
    return F32 * R * fi * (2 if l > 0 else 1) + F32 * V * fo * 2
