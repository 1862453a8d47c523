"""GAT (Velickovic et al.), multi-head, with PyG ``GATConv`` semantics (self-loops, LeakyReLU 0.2).

The attention is one autograd function (:class:`_AttentionSpMM`): scores, edge softmax and the weighted sum of
the projected sources as one sparse CSR product per head whose values are the attention weights. Only ``[E, H]``
per-edge tensors exist (scores, weights, their gradients); the ``[E, H, C]`` messages a gather-multiply-scatter
formulation builds, with their gradients, never do (DGL's fused gSpMM / gSDDMM, with torch's own sparse kernels).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gnnscale.graph.block import AdjacencySpec, Block
from gnnscale.nn.base import BlockLayer
from gnnscale.nn.ops import sparse_mm, transpose_order, with_values


def _per_dst(x: Tensor, counts: Tensor, num_edges: int) -> Tensor:
    """``[num_dst] -> [E]``: each destination's value on each of its in-edges (CSR order). A repeat, not a
    gather: several times faster than ``index_select`` with the edges' destinations."""
    return x.repeat_interleave(counts, output_size=num_edges)


def segment_softmax_(e: Tensor, ptr: Tensor, counts: Tensor) -> Tensor:
    """``[E]`` softmax of one head's scores ``e`` over each destination's in-edges (CSR rows ``ptr``), in place,
    as PyG's ``softmax`` with ``ptr`` (the maximum subtracted, ``1e-16`` added to the sums)."""
    E = e.shape[0]
    m = torch.segment_reduce(e, "max", offsets=ptr)  # [num_dst]; -inf: no edges
    e.sub_(_per_dst(m, counts, E)).exp_()
    return e.div_(_per_dst(torch.segment_reduce(e, "sum", offsets=ptr).add_(1e-16), counts, E))


class _AttentionSpMM(torch.autograd.Function):
    """``out[d, k] = sum_e alpha[e, k] h[src e, k]``, ``alpha`` GATConv's edge softmax of
    ``leaky_relu(a_src[src] + a_dst[dst])``, as one sparse CSR product per head ``k``.

    Per-edge tensors are ``[H, E]`` (each head's edge values contiguous: the CSR values of its product), and the
    work goes head by head: the only per-edge temporaries are one head's ``[E]`` (never a second ``[H, E]``: at
    800K vertices and 4 heads each is 141 MB, and the host allocator keeps what it frees). Forward keeps the
    weights and the scores' signs. Backward: per head the transposed product ``A_k^T @ grad_k`` for ``h`` and the
    sampled dense product (SDDMM) ``dot(grad[dst], h[src])`` for the weights, written into the head's row of the
    weights' gradient; the softmax's backward needs only ``sum_e alpha * d alpha`` per destination.
    """

    @staticmethod
    def forward(ctx: Any, h: Tensor, a_src: Tensor, a_dst: Tensor, block: Block, slope: float) -> Tensor:
        ptr, src, E, H = block.indptr.long(), block.indices, block.num_edges, h.shape[1]
        counts = ptr[1:] - ptr[:-1]
        a_src, a_dst = a_src.t().contiguous(), a_dst.t().contiguous()  # [H, num_src], [H, num_dst]
        alpha, positive = h.new_empty(H, E), torch.empty(H, E, dtype=torch.bool, device=h.device)
        adj, outs = block.adj(), []
        for k in range(H):
            e = torch.index_select(a_src[k], 0, src, out=alpha[k])
            e += _per_dst(a_dst[k], counts, E)
            torch.gt(e, 0, out=positive[k])
            segment_softmax_(F.leaky_relu_(e, slope), ptr, counts)
            outs.append(sparse_mm(with_values(adj, e), h[:, k].contiguous()))
        out = torch.stack(outs, dim=1)
        ctx.save_for_backward(h, alpha, positive)
        ctx.block, ctx.slope = block, slope
        return out  # [num_dst, H, C]

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        h, alpha, positive = ctx.saved_tensors
        block: Block = ctx.block
        H, E = h.shape[1], block.num_edges
        adj, adj_t, perm = block.adj(), block.adj_t(), transpose_order(block)
        ptr, t_ptr = block.indptr.long(), adj_t.crow_indices().long()
        counts = ptr[1:] - ptr[:-1]
        grad_h = torch.empty_like(h) if ctx.needs_input_grad[0] else None
        grad_e = alpha.new_empty(H, E)
        grad_dst, grad_src = alpha.new_empty(H, block.num_dst), alpha.new_empty(H, h.shape[0])
        for k in range(H):
            ak, ge, gk = alpha[k], grad_e[k], grad[:, k].contiguous()  # gk: [num_dst, C]
            if grad_h is not None:
                grad_h[:, k] = sparse_mm(with_values(adj_t, ak.index_select(0, perm)), gk)  # [num_src, C]
            # d loss / d alpha[k, e] = dot(grad[dst e, k], h[src e, k]): the SDDMM, written into grad_e[k]
            torch.sparse.sampled_addmm(with_values(adj, ak), gk, h[:, k].t(), beta=0.0,
                                       out=with_values(adj, ge))
            # softmax: d e = alpha * (d alpha - sum over the destination's in-edges of alpha * d alpha)
            s = torch.segment_reduce(ak * ge, "sum", offsets=ptr)  # [num_dst]
            ge.sub_(_per_dst(s, counts, E)).mul_(ak)
            ge.copy_(torch.where(positive[k], ge, ge * ctx.slope))  # leaky ReLU
            grad_dst[k] = torch.segment_reduce(ge, "sum", offsets=ptr)
            grad_src[k] = torch.segment_reduce(ge.index_select(0, perm), "sum", offsets=t_ptr)
        return grad_h, grad_src.t(), grad_dst.t(), None, None


class GATLayer(BlockLayer):
    """Multi-head attention layer; parameters named as PyG's ``GATConv`` (``lin``, ``att_src``, ``att_dst``, ``bias``).

    AGGREGATE projects the sources, scores every edge, normalises the scores over each destination's full
    in-neighbourhood (segment softmax in CSR order) and sums; that per-edge work is trainable, hence
    ``edge_compute = True``. Heads are concatenated (``concat=True``) or averaged.
    """

    edge_compute: ClassVar[bool] = True
    adjacency: ClassVar[AdjacencySpec] = AdjacencySpec(self_loops=True)
    update_uses_dst: ClassVar[bool] = False
    output_bias: ClassVar[str | None] = "bias"

    def __init__(
        self,
        in_features: int,
        out_per_head: int,
        heads: int = 1,
        concat: bool = True,
        negative_slope: float = 0.2,
    ):
        super().__init__()
        self.heads, self.out_per_head, self.concat = heads, out_per_head, concat
        self.in_features = in_features
        self.out_features = heads * out_per_head if concat else out_per_head
        self.negative_slope = negative_slope
        self.lin = nn.Linear(in_features, heads * out_per_head, bias=False)
        self.att_src = nn.Parameter(torch.empty(1, heads, out_per_head))
        self.att_dst = nn.Parameter(torch.empty(1, heads, out_per_head))
        self.bias = nn.Parameter(torch.zeros(self.out_features))
        for w in (self.lin.weight, self.att_src, self.att_dst):
            nn.init.xavier_uniform_(w)

    def aggregate(self, block: Block, x_src: Tensor) -> Tensor:
        H, C = self.heads, self.out_per_head
        h = self.lin(x_src).view(-1, H, C)  # [num_src, H, C]
        a_src = (h * self.att_src).sum(-1)  # [num_src, H]
        a_dst = (h[: block.num_dst] * self.att_dst).sum(-1)  # [num_dst, H]
        out = _AttentionSpMM.apply(h, a_src, a_dst, block, self.negative_slope)  # [num_dst, H, C]
        return out.reshape(block.num_dst, H * C) if self.concat else out.mean(dim=1)

    def workspace_bytes(self, num_src: int, num_dst: int, num_edges: int) -> int:
        H, HC = self.heads, self.heads * self.out_per_head
        per_edge = 4 * 8 * H + H + 16  # scores, weights (two layouts), their gradients, signs; int64 dst and order
        return num_edges * per_edge + 4 * (5 * num_src * HC + 6 * num_dst * HC)

    def update(self, agg: Tensor, x_dst: Tensor) -> Tensor:
        return agg + self.bias

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_per_head}, heads={self.heads}, concat={self.concat}"
