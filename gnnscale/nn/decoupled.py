"""Decoupled GNNs (NeutronTask Eq. 4): ``Y = f(Â)^L · e_θ(g_θ(X), A) · g_θ(X)``.

All ``L`` vertex T tasks (``g_θ``, an MLP with keyed dropout) run first, then -- for ``dgat`` -- one edge T task
``e_θ`` that scores every edge GATv2-style from ``g_θ``'s output, then ``L`` parameter-free P tasks, each one
propagation with the normalised adjacency (``dgcn``) or the attention weights (``dgat``). Because the P tasks run
back to back on ``g_θ``'s (class-wide) output, a task-parallel engine keeps one P task's buffers at a time and
recomputes the T tasks in backward instead of storing them (NeutronTask §5.1).

The pieces are separate methods so that engines can run them where they like: :meth:`DecoupledGNN.transform` (T
tasks, a range of them at a time, on any rows), :meth:`DecoupledGNN.edge_weights` (the edge task on a block whose
sources include every in-neighbour of its destinations) and :class:`PropagationLayer` (a P task on a block).
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gnnscale.errors import ConfigError
from gnnscale.graph.block import AdjacencySpec, Block
from gnnscale.nn.base import BlockLayer
from gnnscale.nn.mlp import MLPLayer
from gnnscale.nn.model import GNN, call_arguments
from gnnscale.nn.norm import make_norm
from gnnscale.nn.ops import keyed_dropout, spmm, spmm_t, spmm_t_add

DECOUPLED_MODELS = ("dgcn", "dgat")
"""Model names built by :class:`DecoupledGNN`."""


class PropagationLayer(BlockLayer):
    """A P task: ``h_v = sum_u w_uv h_u`` over the block's weights (no parameters; AGGREGATE only)."""

    adjacency: ClassVar[AdjacencySpec] = AdjacencySpec(self_loops=True, norm="gcn")
    update_uses_dst: ClassVar[bool] = False
    sparse_backward: ClassVar[bool] = True
    reads_by_product: ClassVar[bool] = True

    def __init__(self, width: int):
        super().__init__()
        self.in_features = self.out_features = width

    def aggregate(self, block: Block, x_src: Tensor) -> Tensor:
        return spmm(block, x_src)  # [num_dst, F]

    def aggregate_vjp(self, block: Block, grad_agg: Tensor) -> Tensor:
        return spmm_t(block, grad_agg)  # [num_src, F]

    def aggregate_vjp_add(self, block: Block, grad_agg: Tensor, out: Tensor, rows: Tensor) -> None:
        spmm_t_add(block, grad_agg, out, rows)

    def update(self, agg: Tensor, x_dst: Tensor) -> Tensor:
        return agg


class EdgeAttention(nn.Module):
    """dgat's edge T task ``e_θ``: GATv2 scores ``a · LeakyReLU(W_s p_u + W_d p_v)`` of every edge ``u -> v`` on
    the class probabilities ``p = softmax(g_θ(X))``, softmax-normalised over each destination's in-edges (one
    head), then mixed with the uniform mean: ``w_uv = share · softmax_v(s)_uv + (1 - share) / deg_in(v)``.

    Scoring after the vertex T tasks (GATv2's order: no per-edge state between P tasks) is what lets every P task
    of dgat run back to back. Scoring bounded probabilities rather than raw logits, and keeping a mean-aggregation
    share, stop attention from collapsing onto one neighbour early in training when ``g_θ`` is still noise; with
    ``share = 1`` this is plain GATv2 attention.
    """

    def __init__(self, width: int, negative_slope: float = 0.2, share: float = 0.5):
        super().__init__()
        if not 0.0 <= share <= 1.0:
            raise ConfigError(f"attention share must be in [0, 1], got {share}")
        self.width, self.negative_slope, self.share = width, negative_slope, share
        self.lin_src = nn.Linear(width, width, bias=False)
        self.lin_dst = nn.Linear(width, width)
        self.att = nn.Parameter(torch.empty(width))
        nn.init.xavier_uniform_(self.lin_src.weight)
        nn.init.xavier_uniform_(self.lin_dst.weight)
        nn.init.normal_(self.att, std=width**-0.5)

    def scores(self, block: Block, h_src: Tensor) -> Tensor:
        """``[E]`` raw scores of the block's edges from its source rows ``h_src`` (destinations first)."""
        src, dst = block.indices.long(), block.dst_index()
        prob = torch.softmax(h_src, dim=-1)
        p = self.lin_src(prob).index_select(0, src)  # [E, C]
        q = self.lin_dst(prob[: block.num_dst]).index_select(0, dst)  # [E, C]
        return F.leaky_relu(p + q, self.negative_slope) @ self.att  # [E]

    def forward(self, block: Block, h_src: Tensor) -> Tensor:
        """``[E]`` edge weights (block order): the scores' softmax over each destination's in-edges, mixed with
        ``1 / deg_in``. The block must hold every in-edge of its destinations."""
        from torch_geometric.utils import softmax

        ptr = block.indptr.long()
        alpha = softmax(self.scores(block, h_src), ptr=ptr, num_nodes=block.num_dst)
        if self.share == 1.0:
            return alpha
        deg = (ptr[1:] - ptr[:-1]).clamp_min(1).to(alpha.dtype)
        return self.share * alpha + (1.0 - self.share) / deg.index_select(0, block.dst_index())

    def extra_repr(self) -> str:
        return f"{self.width}, heads=1, GATv2, share={self.share}"


def attention_propagate(block: Block, h_src: Tensor, alpha: Tensor) -> Tensor:
    """``out_v = sum_u alpha_uv h_u`` with gradients to ``alpha`` too (the reference's differentiable form)."""
    from torch_geometric.utils import segment

    msg = h_src.index_select(0, block.indices.long()) * alpha.unsqueeze(-1)  # [E, F]
    return segment(msg, block.indptr.long(), reduce="sum")  # [num_dst, F]


def weighted(block: Block, weight: Tensor) -> Block:
    """The block with ``weight`` as its edge weights (no transpose: it is rebuilt for the new weights)."""
    return Block(indptr=block.indptr, indices=block.indices, num_src=block.num_src, edge_weight=weight,
                 src_ids=block.src_ids)


class DecoupledGNN(GNN):
    """``num_layers`` vertex T tasks (linear layers; ReLU and keyed dropout before each, as :class:`GNN` does),
    dgat's edge T task, then ``num_layers`` P tasks on ``g_θ``'s output width (the class count).

    ``layers`` holds the T tasks (so optimisers and replicas see every parameter with :attr:`edge`); the P tasks
    are :attr:`props`. ``norm`` (``--norm``, :mod:`gnnscale.nn.norm`) normalises every hidden T task's output as
    PyG's ``MLP`` does: linear -> norm -> activation -> dropout, nothing after the last linear layer
    (``norms[l]`` on layer ``l``'s output, run at the start of T task ``l + 1``). BatchNorm's statistics are over
    the rows :meth:`transform` is given: every vertex in :meth:`forward`; a task-parallel engine that runs the T
    tasks subgraph by subgraph spans them with statistics and gradient-sums passes
    (:mod:`gnnscale.engines.taskparallel.norm`).
    """

    decoupled: ClassVar[bool] = True

    def __init__(self, kind: str, in_features: int, hidden: int, num_classes: int, num_layers: int = 2,
                 dropout: float = 0.5, norm: str = "none"):
        nn.Module.__init__(self)
        if kind not in DECOUPLED_MODELS:
            raise ConfigError(f"unknown decoupled model {kind!r}; choose one of {', '.join(DECOUPLED_MODELS)}")
        if num_layers < 1:
            raise ConfigError(f"--layers must be >= 1, got {num_layers}")
        self.kind, self.dropout, self.num_classes = kind, dropout, num_classes
        self.activation = F.relu
        dims = [in_features] + [hidden] * (num_layers - 1) + [num_classes]
        self.layers = nn.ModuleList(MLPLayer(dims[i], dims[i + 1]) for i in range(num_layers))
        self.edge = EdgeAttention(num_classes) if kind == "dgat" else None
        self.props = nn.ModuleList(PropagationLayer(num_classes) for _ in range(num_layers))
        self.norm = norm
        self.norms = nn.ModuleList(make_norm(norm, hidden) for _ in range(num_layers - 1))
        """``norms[l]`` normalises T task ``l``'s output (every T task but the last; ``nn.Identity`` for ``none``;
        made after every other module, so the other weights are those of a model without norms)."""

    @property
    def adjacency(self) -> AdjacencySpec:
        """dgcn propagates with ``D^-1/2 (A + I) D^-1/2``; dgat with attention over ``A + I``."""
        return AdjacencySpec(self_loops=True, norm="gcn" if self.kind == "dgcn" else "none")

    @property
    def num_t_tasks(self) -> int:
        """Vertex T tasks (``L``)."""
        return len(self.layers)

    @property
    def num_p_tasks(self) -> int:
        return len(self.props)

    @property
    def width(self) -> int:
        """Width of the rows the P tasks propagate (``g_θ``'s output: the class count)."""
        return self.num_classes

    def t_layer(self, l: int, h: Tensor, row_ids: Tensor, seed_epoch: tuple[int, int] | None) -> Tensor:
        """Vertex T task ``l`` on rows ``h`` (global ids ``row_ids``): normalisation and activation of the previous
        T task's output (``l > 0``), keyed dropout, linear."""
        if l > 0:
            h = self.activation(self.norms[l - 1](h))
        key = None if seed_epoch is None else self.dropout_key(*seed_epoch, l)
        h = keyed_dropout(h, self.dropout, key, row_ids)
        layer = self.layers[l]
        assert isinstance(layer, MLPLayer)
        return layer.lin(h)  # type: ignore[no-any-return]

    def transform(self, x: Tensor, row_ids: Tensor, seed_epoch: tuple[int, int] | None, start: int = 0,
                  stop: int | None = None) -> Tensor:
        """Vertex T tasks ``start .. stop - 1`` (all by default) on rows ``x`` -- vertex-wise: any subset of rows
        gives those rows' values."""
        stop = self.num_t_tasks if stop is None else stop
        for l in range(start, stop):
            x = self.t_layer(l, x, row_ids, seed_epoch)
        return x

    def edge_weights(self, block: Block, h_src: Tensor) -> Tensor | None:
        """The edge task's ``[E]`` attention weights on ``block`` (``None`` for dgcn: the block's own weights)."""
        return None if self.edge is None else self.edge(block, h_src)

    def forward(self, block: Block | Tensor, x: Tensor, seed_epoch: tuple[int, int] | Tensor | None = None, *,
                edge_weight: Tensor | None = None) -> Tensor:
        """Whole-graph forward (``num_src == num_dst``): T tasks, the edge task, then the P tasks; or PyG's
        ``model(x, edge_index[, edge_weight])``, as :meth:`GNN.forward`."""
        block, x, seed_epoch = call_arguments(self, block, x, seed_epoch, edge_weight)
        h = self.transform(x, block.row_ids(), seed_epoch)
        alpha = self.edge_weights(block, h)
        for prop in self.props:
            h = prop(block, h) if alpha is None else attention_propagate(block, h, alpha)
        return h

    def layer_input(self, layer: int, h: Tensor, row_ids: Tensor, seed_epoch: tuple[int, int] | None,
                    out: Tensor | None = None) -> Tensor:
        raise NotImplementedError("decoupled models run T tasks with transform(), not layer by layer")
