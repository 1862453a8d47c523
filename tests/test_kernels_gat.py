"""GAT's fused attention kernel (issue #30 point 2): one sparse product per head with the attention weights as its
values, an SDDMM in backward. It equals the gather-multiply-scatter formulation it replaced (and PyG's
``GATConv``), forward and backward, on every kind of block, and never builds an ``[E, H, C]`` tensor."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch_geometric.nn import GATConv
from torch_geometric.utils import segment, softmax

from gnnscale.graph.block import Block, cut_block
from gnnscale.graph.generators import csbm
from gnnscale.graph.graph import Graph
from gnnscale.nn.gat import GATLayer
from gnnscale.sample import CSRTopology, SampledAdjacency, sample_blocks


def _reference(layer: GATLayer, block: Block, x: Tensor) -> Tensor:
    """The materialising formulation: ``[E, H, C]`` messages ``h[src] * alpha``, summed per destination."""
    H, C = layer.heads, layer.out_per_head
    h = layer.lin(x).view(-1, H, C)
    a_src = (h * layer.att_src).sum(-1)
    a_dst = (h[: block.num_dst] * layer.att_dst).sum(-1)
    src, dst, ptr = block.indices.long(), block.dst_index(), block.indptr.long()
    e = F.leaky_relu(a_src[src] + a_dst[dst], layer.negative_slope)
    alpha = softmax(e, ptr=ptr, num_nodes=block.num_dst)
    out = segment(h[src] * alpha.unsqueeze(-1), ptr, reduce="sum")
    out = out.reshape(block.num_dst, H * C) if layer.concat else out.mean(dim=1)
    return layer.update(out, x[: block.num_dst])


def _graph() -> Graph:
    """csbm with a self-loop listed twice (vertex 3), multi-edges and a vertex with no in-edges (vertex 11)."""
    g = csbm(nodes=300, features=12, avg_degree=6, seed=5)
    ei = g.edge_index()
    ei = ei[:, ei[1] != 11]
    ei = torch.cat([ei, torch.tensor([[3, 3, 7, 20, 20], [3, 3, 7, 21, 21]])], dim=1)
    return Graph.from_edge_index(ei, g.num_nodes, x=g.x, y=g.y)


def _blocks(g: Graph) -> dict[str, Block]:
    spec = GATLayer.adjacency
    whole = Block.from_graph(g, spec)
    plain = Block.from_graph(g)  # no self-loops: vertex 11 has no in-edge at all (a zero row)
    rows = torch.cat([torch.arange(100, 180), torch.arange(0, 100), torch.arange(180, g.num_nodes)])
    chunk = cut_block(whole.indptr, whole.indices, None, 100, 180, rows, torch.empty(g.num_nodes, dtype=torch.int64))
    assert chunk.indices.dtype == torch.int32
    sampled = sample_blocks(CSRTopology.from_graph(g, spec), torch.arange(0, 300, 7), [4, 3], key=11,
                            adjacency=SampledAdjacency.from_graph(g, spec))[0]
    return {"whole": whole, "plain": plain, "chunk": chunk, "chunk_t": chunk.map(lambda t: t).with_transpose(),
            "sampled": sampled}


@pytest.mark.parametrize("concat", [True, False])
@pytest.mark.parametrize("kind", ["whole", "plain", "chunk", "chunk_t", "sampled"])
def test_attention_kernel_equals_the_materialising_reference(kind: str, concat: bool) -> None:
    g = _graph()
    block = _blocks(g)[kind]
    torch.manual_seed(0)
    layer = GATLayer(12, 5, heads=3, concat=concat).double()
    torch.nn.init.normal_(layer.bias)
    x = torch.randn(block.num_src, 12, dtype=torch.float64)
    grad_out = torch.randn(block.num_dst, layer.out_features, dtype=torch.float64)
    grads = []
    for fn in (layer.forward, lambda b, xx: _reference(layer, b, xx)):
        layer.zero_grad()
        xr = x.clone().requires_grad_()
        out = fn(block, xr)
        out.backward(grad_out)
        grads.append([out.detach(), xr.grad] + [p.grad.clone() for p in layer.parameters()])  # type: ignore[union-attr]
    names = ["out", "x"] + [n for n, _ in layer.named_parameters()]
    for name, a, b in zip(names, *grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=f"{kind}: {name}")


def test_attention_kernel_equals_pyg_gatconv_in_float32() -> None:
    g = _graph()
    block = Block.from_graph(g, GATLayer.adjacency)
    torch.manual_seed(1)
    ours, theirs = GATLayer(12, 4, heads=4), GATConv(12, 4, heads=4)
    torch.nn.init.normal_(ours.bias)
    theirs.load_state_dict(ours.state_dict(), strict=False)
    x1, x2 = g.x.clone().requires_grad_(), g.x.clone().requires_grad_()
    out1, out2 = ours(block, x1), theirs(x2, g.edge_index())
    torch.testing.assert_close(out1, out2, atol=1e-5, rtol=1e-5)
    grad = torch.randn_like(out1)
    out1.backward(grad)
    out2.backward(grad)
    torch.testing.assert_close(x1.grad, x2.grad, atol=1e-5, rtol=1e-5)
    theirs_p = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, theirs_p[name].grad, atol=1e-5, rtol=1e-5, msg=name)


class _Largest(TorchDispatchMode):
    """The largest dense tensor any op produces."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = (0, "")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, Tensor) and t.layout == torch.strided and t.numel() > self.largest[0]:
                self.largest = (t.numel(), f"{func} {tuple(t.shape)}")
        return out


def test_attention_never_builds_edge_messages() -> None:
    """Forward and backward: no tensor holds ``E * H * C`` numbers (the messages or their gradient); the
    reference does, so the check can fail."""
    g = csbm(nodes=500, features=16, avg_degree=12, seed=1)
    layer = GATLayer(16, 8, heads=2)
    block = Block.from_graph(g, layer.adjacency)
    block.adj(), block.adj_t(), block.dst_index()
    E, HC = block.num_edges, 16
    for fn, builds in ((layer.forward, False), (lambda b, xx: _reference(layer, b, xx), True)):
        x = g.x.clone().requires_grad_()
        with _Largest() as log:
            fn(block, x).sum().backward()
        assert (log.largest[0] >= E * HC) == builds, log.largest


class _PerEdge(TorchDispatchMode):
    """Every op output holding at least ``limit`` numbers: (op, shape, dtype)."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit, self.made = limit, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, Tensor) and t.layout == torch.strided and t.numel() >= self.limit:
                self.made.append((str(func), tuple(t.shape), t.dtype))
        return out


def test_attention_makes_per_edge_tensors_one_head_at_a_time() -> None:
    """The attention works head by head: the only tensors of several heads' edges are the three it keeps (the
    weights and the scores' signs, saved by forward, and the weights' gradient in backward), each made once;
    every temporary holds one head's ``[E]``. The formulation over all heads at once made ``[H, E]``
    temporaries (the scores' sums, the softmax's maximum and sum per edge, the leaky ReLU's gradient), which the
    host allocator then fragments on; so does the reference here, so the check can fail."""
    g = csbm(nodes=500, features=16, avg_degree=12, seed=1)
    H = 4
    layer = GATLayer(16, 2, heads=H)
    block = Block.from_graph(g, layer.adjacency)
    block.adj(), block.adj_t(), block.dst_index()
    E = block.num_edges
    assert 500 * H * 2 < 2 * E  # no vertex table reaches the limit
    x = g.x.clone().requires_grad_()
    with _PerEdge(2 * E) as log:
        layer(block, x).sum().backward()
    assert sorted((shape, str(dtype)) for _, shape, dtype in log.made) == [
        ((H, E), "torch.bool"), ((H, E), "torch.float32"), ((H, E), "torch.float32")], log.made
    x = g.x.clone().requires_grad_()
    with _PerEdge(2 * E) as log:
        _reference(layer, block, x).sum().backward()
    assert len(log.made) > 3
