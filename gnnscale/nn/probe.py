"""The probe that decides whether a layer can be trained in parts: run it on a small graph whole and in chunks,
and compare the outputs and their gradients.

An engine other than the in-memory one never runs a layer on the whole graph: it runs it on chunks' blocks
(offload), on sampled blocks (minibatch, hybrid, distributed). That is exact only for a layer whose output at a
vertex depends on its in-edges and itself alone, computed on bipartite input (the block's source rows, the
destinations first). A layer of a user's (a PyG conv, a :class:`~gnnscale.nn.base.BlockLayer` subclass) is
checked here once, at set-up; the built-in layers are exact by construction and tested, and are not probed.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from gnnscale.graph.block import Block, cut_block, normalized_csr
from gnnscale.graph.graph import Graph
from gnnscale.nn.base import BlockLayer
from gnnscale.nn.decoupled import PropagationLayer
from gnnscale.nn.gat import GATLayer
from gnnscale.nn.gcn import GCNLayer
from gnnscale.nn.gin import GINLayer
from gnnscale.nn.graphconv import GraphConvLayer
from gnnscale.nn.mlp import MLPLayer
from gnnscale.nn.norm import _Residual
from gnnscale.nn.sage import SAGELayer

BUILT_IN = (GCNLayer, SAGELayer, GATLayer, GINLayer, MLPLayer, GraphConvLayer, PropagationLayer)
"""The zoo's layers: exact in chunks by construction (their tests compare every engine with the in-memory one)."""

PROBE_NODES = 24
PROBE_CHUNKS = ((0, 7), (7, 15), (15, 24))
RTOL, ATOL = 1e-4, 1e-5


def probed(layer: nn.Module) -> bool:
    """Whether ``layer`` is one of a user's (probed), not one of the zoo's (with a residual or not)."""
    cls = type(layer)
    if issubclass(cls, _Residual):
        cls = next(c for c in cls.__mro__[1:] if not issubclass(c, _Residual) and issubclass(c, BlockLayer))
    return cls not in BUILT_IN


def probe_graph() -> Graph:
    """The probe's graph: :data:`PROBE_NODES` vertices, every vertex with in-edges from inside and outside its
    chunk, a self-loop and a repeated edge among them (seeded: the same graph every time)."""
    g = torch.Generator().manual_seed(0)
    n = PROBE_NODES
    src = torch.randint(0, n, (4 * n,), generator=g)
    dst = torch.arange(n).repeat(4)
    extra = torch.tensor([[3, 3, 9], [3, 5, 5]])  # a self-loop, a repeated edge
    edges = torch.cat([torch.stack([src, dst]), extra], dim=1)
    return Graph.from_edge_index(edges, num_nodes=n)


def _chunk_rows(graph: Graph, indptr: Tensor, indices: Tensor, lo: int, hi: int) -> Tensor:
    """A chunk's source rows: its destinations first, then its outside in-neighbours in *descending* id order (a
    layer that reads rows by position, not through the block's edges, sees other rows than on the whole graph)."""
    own = torch.arange(lo, hi)
    neigh = torch.unique(indices[int(indptr[lo]) : int(indptr[hi])])
    outside = neigh[(neigh < lo) | (neigh >= hi)]
    return torch.cat([own, outside.flip(0)])


def _run(layer: nn.Module, block: Block, x: Tensor, weights: Tensor) -> tuple[Tensor, Tensor, list[Tensor]]:
    """``(output, dL/dx, dL/dparameters)`` of one forward and backward of ``layer`` on ``block`` with ``L =
    sum(output * weights)``."""
    x = x.detach().clone().requires_grad_(True)
    layer.zero_grad(set_to_none=True)
    y = layer(block, x)
    (y * weights).sum().backward()
    grads = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in layer.parameters()]
    assert x.grad is not None
    return y.detach(), x.grad, grads


def chunk_reason(layer: BlockLayer, randomness: bool = True) -> str | None:
    """Why ``layer`` cannot be trained in parts, or ``None``: run on the probe graph (:func:`probe_graph`) whole,
    then chunk by chunk (:data:`PROBE_CHUNKS`, each a block of its destinations' in-edges), in training mode, on a
    copy (the layer and the global random state are left as they were); the outputs, the input rows' gradients
    and the parameters' gradients must agree (within float32 rounding). With ``randomness``, a layer whose two runs
    on the same input differ (it draws its own random numbers) is refused too; without, both runs draw the same
    numbers: it runs in evaluation mode (its own dropout off), and its locality is what is checked."""
    name = getattr(layer, "name", type(layer).__name__)
    if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in layer.modules()):
        return (f"{name} normalises over its rows with a BatchNorm inside it: a chunk's or a batch's statistics "
                "are not the whole graph's; put the norm between the layers (Stack(norms='batch'))")
    probe = copy.deepcopy(layer).train(randomness)
    graph = probe_graph()
    indptr, indices, weight = normalized_csr(graph, probe.adjacency)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(graph.num_nodes, probe.in_features, generator=g)
    with torch.random.fork_rng(devices=[]):
        try:
            torch.manual_seed(0)
            whole = Block(indptr=indptr, indices=indices, num_src=graph.num_nodes, edge_weight=weight)
            y, x_grad, p_grads = _run(probe, whole, x, torch.ones(1))
            weights = torch.randn(y.shape, generator=g)
            y, x_grad, p_grads = _run(probe, whole, x, weights)
            torch.manual_seed(1)
            again = _run(probe, whole, x, weights)[0]
            parts, part_x = [], torch.zeros_like(x)
            part_p = [torch.zeros_like(p) for p in p_grads]
            scratch = torch.zeros(graph.num_nodes, dtype=torch.int64)
            for lo, hi in PROBE_CHUNKS:
                rows = _chunk_rows(graph, indptr, indices, lo, hi)
                block = cut_block(indptr, indices, weight, lo, hi, rows, scratch)
                out, xg, pg = _run(probe, block, x[rows], weights[lo:hi])
                parts.append(out)
                part_x.index_add_(0, rows, xg)
                part_p = [a + b for a, b in zip(part_p, pg, strict=True)]
        except Exception as exc:  # noqa: BLE001 -- a user's layer: its error said in one line
            first = str(exc).splitlines()[0] if str(exc) else ""
            return (f"{name} does not run on a chunk's bipartite block ((x_src, x_dst), the block's local "
                    f"edge_index and size): {type(exc).__name__}: {first}")
    if not torch.allclose(y, again, rtol=RTOL, atol=ATOL):
        return (f"{name} draws its own randomness (attention or message dropout inside the conv): each chunk would "
                "draw other masks than the whole graph; set that dropout to 0 (gnnscale's dropout between layers "
                "is keyed and exact)")
    chunked = torch.cat(parts)
    checks = [("outputs", y, chunked), ("input gradients", x_grad, part_x)]
    checks += [(f"gradient of {n}", a, b) for (n, _), a, b in zip(probe.named_parameters(), p_grads, part_p,
                                                                      strict=True)]
    for what, whole_value, parts_value in checks:
        if whole_value.shape != parts_value.shape or not torch.allclose(whole_value, parts_value, rtol=RTOL,
                                                                        atol=ATOL):
            return (f"{name} is not local: its {what} on the whole graph and in chunks differ, so its output at a "
                    "vertex depends on more than its in-edges and itself (a global statistic, degrees it computes "
                    "from the edges it is given, rows read by position); only the in-memory engine trains it"
                    + (" (for GCNConv's normalisation, keep normalize=True and add_self_loops=True: gnnscale "
                       "then takes the whole graph's degrees)" if "GCN" in name else ""))
    return None


def model_chunk_reasons(model: nn.Module, *, randomness: bool) -> list[str]:
    """:func:`chunk_reason` of each of ``model``'s layers that is a user's (:func:`probed`), numbered; each layer
    object is probed once (the answer is kept on it). Without ``randomness`` a layer that draws its own random
    numbers passes (a sampled engine's batches are not the whole graph's function anyway); its locality is still
    checked (in evaluation mode)."""
    out = []
    for i, layer in enumerate(getattr(model, "block_layers", [])):
        if not probed(layer):
            continue
        if not hasattr(layer, "_chunk_reasons"):
            layer._chunk_reasons = {r: chunk_reason(layer, randomness=r) for r in (True, False)}  # type: ignore
        why = layer._chunk_reasons[randomness]
        if why:
            out.append(f"layer {i}: {why}")
    return out
