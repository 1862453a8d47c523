"""GAT (Velickovic et al.), multi-head, with PyG ``GATConv`` semantics (self-loops, LeakyReLU 0.2)."""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gnnscale.graph.block import AdjacencySpec, Block
from gnnscale.nn.base import BlockLayer


class GATLayer(BlockLayer):
    """Multi-head attention layer; parameters named as PyG's ``GATConv`` (``lin``, ``att_src``, ``att_dst``, ``bias``).

    AGGREGATE projects the sources, scores every edge, normalises the scores over each destination's full
    in-neighbourhood (segment softmax in CSR order) and sums; that per-edge work is trainable, hence
    ``edge_compute = True``. Heads are concatenated (``concat=True``) or averaged.
    """

    edge_compute: ClassVar[bool] = True
    adjacency: ClassVar[AdjacencySpec] = AdjacencySpec(self_loops=True)
    update_uses_dst: ClassVar[bool] = False

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
        from torch_geometric.utils import segment, softmax

        H, C = self.heads, self.out_per_head
        h = self.lin(x_src).view(-1, H, C)  # [num_src, H, C]
        a_src = (h * self.att_src).sum(-1)  # [num_src, H]
        a_dst = (h[: block.num_dst] * self.att_dst).sum(-1)  # [num_dst, H]
        src, dst = block.indices.long(), block.dst_index()
        # index_select, not fancy indexing: its backward (index_add_) is deterministic on multi-threaded CPU,
        # where the backward of tensor[idx] is not.
        e = F.leaky_relu(a_src.index_select(0, src) + a_dst.index_select(0, dst), self.negative_slope)  # [E, H]
        ptr = block.indptr.long()  # chunk blocks keep int32 pointers; segment kernels may want int64 (V+1 only)
        alpha = softmax(e, ptr=ptr, num_nodes=block.num_dst)  # [E, H], over each dst's in-edges
        msg = h.index_select(0, src) * alpha.unsqueeze(-1)  # [E, H, C]
        out = segment(msg, ptr, reduce="sum")  # [num_dst, H, C]
        return out.reshape(block.num_dst, H * C) if self.concat else out.mean(dim=1)

    def workspace_bytes(self, num_src: int, num_dst: int, num_edges: int) -> int:
        H, HC = self.heads, self.heads * self.out_per_head
        per_edge = 4 * (12 * H + 4 * HC) + 16  # scores, softmax and messages with their gradients; int64 src/dst
        return num_edges * per_edge + 4 * (4 * num_src * HC + 6 * num_dst * HC)

    def update(self, agg: Tensor, x_dst: Tensor) -> Tensor:
        return agg + self.bias

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_per_head}, heads={self.heads}, concat={self.concat}"
