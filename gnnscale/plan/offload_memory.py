"""Per-pass memory model of the offload engine: the device bytes alive at each pass's peak, chunk by chunk.

An epoch of the offload engine is a sequence of passes over the chunk schedule
(:class:`~gnnscale.engines.offload.layers.LayerPasses`): each projecting layer's projection, each layer's
forward, the last layer's fused loss and backward, each layer's backward and the projections' backward. A pass
holds, besides the model:

* its transition buffers (``--dedup full/reuse``), at the width of the rows that pass moves (a projecting layer
  moves its projected rows, not its input) and only where it moves them (rows, gradients or both);
* the loads of two chunks (the one computing and the next, prefetched): block topology, the batch's newcomer
  rows or the gathered source rows, destination slices; at the moment a load is issued, three;
* what the computing chunk allocates: its assembled source rows, keyed-dropout temporaries (none where the
  probability is 0), the layer's outputs and, with autograd, saved tensors and gradients -- listed per layer kind
  (GCN, SAGE and GraphConv, GAT, GIN) at each moment where the live set can peak, or, for a user's layer run whole
  in every pass (a PyG conv other than those), as measured on probe blocks (:mod:`~gnnscale.plan.layer_memory`);
* the previous chunk's results still bound to the loop's variables until the next chunk rebinds them.

Each chunk is priced with its own ``V, R, E`` and its neighbours in the schedule, so maxima of different chunks
are not combined (each layer kind's moments: :mod:`~gnnscale.plan.offload_moments`). A model with a
normalisation, residual connections or jumping knowledge, or a layer the model neither lists nor measures (a user's
layer whose aggregation is cached), is priced by the coarse :func:`~gnnscale.plan.offload.chunk_peak_bytes` bound
instead (a user's layer's workspace measured there too).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from gnnscale import runtime as rt
from gnnscale.nn.base import BlockLayer
from gnnscale.nn.gat import GATLayer
from gnnscale.nn.gcn import GCNLayer
from gnnscale.nn.gin import GINLayer
from gnnscale.nn.graphconv import GraphConvLayer
from gnnscale.nn.sage import SAGELayer
from gnnscale.nn.stack import Stack
from gnnscale.plan.layer_memory import layer_memory, measured, whole
from gnnscale.plan.offload_moments import (
    F32,
    I64,
    SAGE_LIKE,
    Drops,
    _backward_cached,
    _backward_cached_stale,
    _backward_whole,
    _backward_whole_stale,
    _dropout,
    _edges,
    _forward,
    _loss,
    _loss_stale,
    _params,
    _project,
    _project_backward,
    _project_backward_stale,
)
from gnnscale.runtime import cpu_kernels

SMALL = 4096
"""Bytes of a pass's temporaries that grow with no row, edge or feature count: the loss and other scalars, the
dropout's column hashes, index vectors of a few elements."""


def modelled(model: Stack) -> bool:
    """True when :func:`pass_peaks` lists every tensor of ``model``'s passes (else the coarse bound applies)."""
    if getattr(model, "norm", "none") != "none" or getattr(model, "residual", False):
        return False
    if getattr(model, "jk", "none") != "none":
        return False
    kinds = (GCNLayer, SAGELayer, GATLayer, GINLayer, GraphConvLayer)
    return all(type(layer) in kinds or (measured(layer) and whole(layer)) for layer in model.block_layers)


@dataclass
class Chunks:
    """Per chunk, in one worker's schedule order (float64 ``[K]`` tensors)."""

    V: Tensor
    R: Tensor
    E: Tensor
    """In-edges (with a self-loop per destination: an upper bound for models without them)."""
    staged: Tensor
    """Newcomer rows loaded with the chunk (the first chunk of a batch; 0 without an exchange)."""
    held: Tensor
    """Newcomer rows of the chunk's batch still held while it computes (loaded with an earlier chunk)."""
    first: Tensor
    """1.0 where the chunk is the first of its batch."""


def _shift(t: Tensor, step: int) -> Tensor:
    """``t`` of the neighbour ``step`` positions later (``-1``: earlier) in the sequence, zero past the ends."""
    out = torch.zeros_like(t)
    if t.numel() <= abs(step):
        return out
    if step > 0:
        out[:-step] = t[step:]
    else:
        out[-step:] = t[:step]
    return out


def fused_dropout_min(devices: Sequence[rt.Device]) -> float:
    """Elements from which keyed dropout runs the fused CPU kernel on every one of ``devices`` (the CPU, where numba
    imports: :func:`~gnnscale.runtime.cpu_kernels.dropout_applies`), ``inf`` where it does not (an accelerator,
    the sim device, which checks every access through torch)."""
    on_cpu = all(not isinstance(d, rt.SimDevice) and d.type == "cpu" for d in devices)
    return float(cpu_kernels.MIN_ELEMENTS) if on_cpu and cpu_kernels.available() else math.inf


@dataclass
class _Epoch:
    """What every pass of :func:`pass_peaks` shares: the model, the chunks, the options and the peaks so far."""

    model: Stack
    c: Chunks
    exchange: bool
    capacity: int
    multi_part: bool
    resident: bool
    idx: int
    fused_min: float
    views: bool
    weights: bool
    """The adjacency carries edge weights (``gcn`` normalisation)."""
    p_in: float
    p: float
    relu: bool
    """The next layer's input backpropagated without its forward."""
    ids_view: Tensor
    """The previous chunk's destination ids (its output's dropout keys) bound beside its output: a view of its
    block's source ids, which keeps all ``R`` of them (resident blocks: priced with the blocks)."""
    out: dict[str, int]


def _drops(e: _Epoch, l: int) -> Drops:
    """Whether layer ``l``'s pass drops out its input rows (layer 0's features) and its output rows."""
    return Drops(l == 0 and e.p_in > 0, e.p > 0, e.fused_min)


def _topology(e: _Epoch, transpose: bool, blocks: bool) -> Tensor:
    V, R, E = e.c.V, e.c.R, e.c.E
    if not blocks or e.resident:
        return torch.zeros_like(V)
    idx, weights = e.idx, e.weights
    t = idx * (V + 1) + idx * E + idx * R + (F32 * E if weights else 0)
    if transpose:
        t = t + idx * (R + 1) + idx * E + (F32 * E if weights else 0)
    return t + block_cache_bytes(e.model, V, R, E, transpose)


def _loads(e: _Epoch, *, src: int, grad: int, slices: Sequence[int], blocks: bool,
           transpose: bool) -> tuple[int, Tensor, Tensor, Tensor]:
    """A pass's transition buffers' bytes, and per chunk its load, its assembled source rows and the newcomer rows
    of its batch it still holds (see :func:`_run`)."""
    c, V, R = e.c, e.c.V, e.c.R
    moves = e.exchange and (src > 0 or grad > 0)
    persistent = F32 * e.capacity * (src + grad) if moves else 0
    load = _topology(e, transpose, blocks) + F32 * V * sum(slices) * (not e.views)
    if blocks and src and not moves:
        load = load + F32 * R * src  # gathered rows
    A = torch.zeros_like(V)
    if moves:
        load = load + I64 * R * (2 if e.multi_part else 1)  # assembly slots (and positions)
        if src:
            load = load + (F32 * src + I64) * c.staged  # newcomer rows and their slots
            A = F32 * R * src
        if grad:
            load = load + I64 * c.staged * c.first  # leaving slots (at most the batch's newcomers)
    held = F32 * src * c.held if moves and src else torch.zeros_like(V)
    if moves and src and e.multi_part:
        A = 2 * A  # the parts gathered, then the assembled rows
    return persistent, load, A, held


def _run(e: _Epoch, name: str, *, src: int, grad: int, slices: Sequence[int], blocks: bool, transpose: bool,
         compute: Callable[[Tensor, Tensor], Tensor], stale: Callable[[Tensor], Tensor],
         rebind: Callable[[Tensor], Tensor] | None = None, slack: int = 0) -> None:
    """One pass: ``src``/``grad`` the widths of the rows/gradients it moves (0: none), ``slices`` the widths
    of the destination rows it reads; ``compute(A, P)`` the chunk's own peak given its assembled rows' bytes
    ``A`` and the previous chunk's leftovers ``P`` (``stale(A)`` of that chunk: what it leaves bound until
    the next chunk rebinds it; ``compute`` adds them where they are still bound), ``rebind(A)`` what the
    next chunk allocates before its variables let go of the previous chunk's (its source rows, assembled
    while the old ones are bound)."""
    persistent, load, A, held = _loads(e, src=src, grad=grad, slices=slices, blocks=blocks, transpose=transpose)
    nxt, prev = _shift(load, 1), _shift(load, -1)
    st = stale(A)
    prev_stale = _shift(st, -1)
    at_compute = load + nxt + held + compute(A, prev_stale)
    peak = torch.maximum(at_compute, prev + load + nxt + held + prev_stale)
    if rebind is not None:
        peak = torch.maximum(peak, load + nxt + held + rebind(A) + prev_stale)
    # slack: parameter-gradient temporaries; SMALL: what no row count scales (scalars, per-column vectors)
    e.out[name] = persistent + slack + SMALL + int(peak.max())


def _project_pass(e: _Epoch, l: int, layer: BlockLayer) -> None:
    V, fi, fa = e.c.V, layer.in_features, layer.out_features
    _run(e, f"project{l}", src=0, grad=0, slices=[fi], blocks=False, transpose=False,
         compute=lambda A, P: _project(V, fi, fa, P, _drops(e, l)), stale=lambda A: F32 * V * fi * _drops(e, l)[0])


def _project_backward_pass(e: _Epoch, l: int, layer: BlockLayer) -> None:
    V, fi, fa = e.c.V, layer.in_features, layer.out_features
    _run(e, f"project_backward{l}", src=0, grad=0, slices=[fi, fa], blocks=False, transpose=False,
         compute=lambda A, P: _project_backward(V, fi, fa, l, P, _drops(e, l)), slack=2 * _params(layer),
         stale=lambda A: _project_backward_stale(V, fi, l, _drops(e, l)))


def _forward_pass(e: _Epoch, l: int, layer: BlockLayer) -> None:
    V, R, E = e.c.V, e.c.R, e.c.E
    fi, fo, proj = layer.in_features, layer.out_features, layer.projects_first
    if proj:
        _project_pass(e, l, layer)
    _run(e, f"forward{l}", src=fo if proj else fi, grad=0, slices=[fi] if proj and layer.update_uses_dst else [],
         blocks=True, transpose=False, compute=lambda A, P: _forward(layer, l, proj, V, R, E, A, _drops(e, l)) + P,
         stale=lambda A: F32 * V * fo + e.ids_view)


def _loss_pass(e: _Epoch, l: int, layer: BlockLayer) -> None:
    V, R, E = e.c.V, e.c.R, e.c.E
    fi, fo, proj = layer.in_features, layer.out_features, layer.projects_first
    fa = fo if proj else fi
    if proj:
        _project_pass(e, l, layer)
    _run(e, "loss", src=fa, grad=fa if proj or l > 0 else 0, slices=[fi] if proj and layer.update_uses_dst else [],
         blocks=True, transpose=layer.sparse_backward and (proj or l > 0),
         compute=lambda A, P: _loss(layer, l, proj, V, R, E, A, P, _drops(e, l)), slack=2 * _params(layer),
         stale=lambda A: _loss_stale(layer, l, proj, V, R, A), rebind=lambda A: A)
    if proj:
        _project_backward_pass(e, l, layer)


def _backward_pass(e: _Epoch, l: int, layer: BlockLayer) -> None:
    V, R, E = e.c.V, e.c.R, e.c.E
    fi, fo, proj = layer.in_features, layer.out_features, layer.projects_first
    fa = fo if proj else fi
    through = (layer.cacheable or proj) and (l > 0 or proj)
    grad = fa if proj or l > 0 else 0
    if layer.cacheable or proj:
        slices = [fa, fo] + ([fi] if layer.update_uses_dst else [])
        _run(e, f"backward{l}", src=0, grad=grad if through else 0, slices=slices, blocks=through,
             transpose=layer.sparse_backward and through, slack=2 * _params(layer),
             compute=lambda A, P: _backward_cached(layer, l, proj, through, V, R, P, _drops(e, l), e.relu),
             stale=lambda A: _backward_cached_stale(layer, l, proj, through, V, _drops(e, l)))
    else:
        _run(e, f"backward{l}", src=fi, grad=grad, slices=[fo], blocks=True, transpose=layer.sparse_backward and l > 0,
             compute=lambda A, P: _backward_whole(layer, l, V, R, E, A, P, _drops(e, l)), slack=2 * _params(layer),
             stale=lambda A: _backward_whole_stale(layer, l, V, R, A) if not measured(layer) else
             F32 * R * fi * (2 if l > 0 else 1),  # a measured layer's input (and its gradient)
             rebind=lambda A: A + _dropout(R, fi, _drops(e, l)[0], e.fused_min))
    if proj:
        _project_backward_pass(e, l, layer)


def pass_peaks(model: Stack, c: Chunks, *, exchange: bool, capacity: int, multi_part: bool, resident: bool,
               idx: int = 4, fused_min: float = math.inf, views: bool = False) -> dict[str, int]:
    """Modelled peak device bytes of each pass of a training epoch (beyond the parameters), the largest chunk of
    each pass priced with its neighbours in the schedule order of ``c``.

    Args:
        exchange: the passes move source rows through transition buffers of ``capacity`` rows.
        multi_part: a chunk's rows are assembled from several buffers (several partitions).
        resident: blocks stay on the device (their bytes are priced by the caller, not per load).
        idx: bytes of a topology index (int32 while the graph has fewer than 2^31 vertices).
        fused_min: elements from which keyed dropout runs the fused CPU kernel (:class:`Drops`).
        views: destination slices are views of host memory, no device bytes (the CPU's mover,
            :meth:`~gnnscale.engines.core.mover.RowMover.slice`).
    """
    layers = model.block_layers
    L = len(layers)
    e = _Epoch(model, c, exchange, capacity, multi_part, resident, idx, fused_min, views,
               weights=model.adjacency.norm == "gcn", p_in=getattr(model, "input_dropout", model.dropout),
               p=model.dropout, relu=model.activation is F.relu,
               ids_view=torch.zeros_like(c.R) if resident else idx * c.R, out={})
    for l in range(L - 1):
        _forward_pass(e, l, layers[l])
    _loss_pass(e, L - 1, layers[L - 1])
    for l in reversed(range(L - 1)):
        _backward_pass(e, l, layers[l])
    return e.out


def block_cache_bytes(model: Stack, V: Tensor, R: Tensor, E: Tensor, transpose: bool = True) -> Tensor:
    """What a chunk's block caches beside its tensors once a layer used it (kept as long as the block: for a
    pass, or the run when blocks are resident): GAT's int64 destination of every edge, the unit edge values of
    the sparse adjacency (and its transpose) of a model whose adjacency has no weights, and what a user's layer
    was measured to leave (:attr:`~gnnscale.plan.layer_memory.LayerMemory.cache`: PyG's ``edge_index``; the
    layers share it, so the largest)."""
    out = torch.zeros_like(E)
    layers = model.block_layers
    if any(isinstance(layer, GATLayer) for layer in layers):
        out = out + I64 * E
    if model.adjacency.norm != "gcn" and any(isinstance(layer, (GCNLayer, GINLayer, *SAGE_LIKE)) for layer in layers):
        out = out + F32 * E * (2 if transpose else 1)
    caches = [layer_memory(layer).cache(V, R, _edges(layer, V, E)) for layer in layers if measured(layer)]
    return out + (torch.stack(caches).amax(dim=0) if caches else 0)


# ------------------------------------------------------------------------------------------------ the schedule
def worker_chunks(sizes: Tensor, schedule: Tensor, device_of: list[int], capacity: list[int], *, exchange: bool,
                  moves: list[list[Tensor]] | None = None) -> list[Chunks]:
    """Each worker's chunks in its schedule order (batch by batch, its partitions in turn, as the engine's sweep
    walks them) with the newcomer rows each loads: the exchange plan's (``moves[w][batch]``: the rows loaded
    for the batch) when known, else a bound (the batch's rows, at most the worker's buffer).

    Args:
        sizes: ``[K, 3]`` per chunk ``V, R, E``.
        schedule: ``[m, n]`` chunk ids per partition and batch.
    """
    m, n = schedule.shape
    out = []
    for w in range(max(device_of) + 1):
        parts = [i for i in range(m) if device_of[i] == w]
        order = [int(schedule[i, b]) for b in range(n) for i in parts]
        s = sizes[order].double()
        staged = torch.zeros(len(order), dtype=torch.float64)
        first = torch.zeros(len(order), dtype=torch.float64)
        held = torch.zeros(len(order), dtype=torch.float64)
        if exchange:
            per = len(parts)
            for b in range(n):
                p = b * per
                rows = (float(moves[w][b].numel()) if moves is not None
                        else min(float(capacity[w]), float(s[p : p + per, 1].sum())))
                staged[p], first[p] = rows, 1.0
                held[p + 1 : p + per] = rows
        else:
            first[:] = 1.0
        out.append(Chunks(s[:, 0], s[:, 1], s[:, 2], staged, held, first))
    return out


def epoch_peak(model: Stack, sizes: Tensor, schedule: Tensor, device_of: list[int], capacity: list[int], *,
               exchange: bool, resident: bool, num_nodes: int, moves: list[list[Tensor]] | None = None,
               fused_min: float = math.inf, views: bool = False) -> tuple[int, dict[str, int]]:
    """The modelled peak device bytes of a training epoch on the fullest device (without resident blocks), and
    each pass's: the passes' largest, plus the parameters, their gradients and Adam's two moments. ``fused_min``:
    elements from which keyed dropout runs the fused CPU kernel (:func:`fused_dropout_min`); ``views``: destination
    slices are views of host memory (the CPU's)."""
    idx = 4 if num_nodes < 2**31 else 8
    multi = schedule.shape[0] > 1
    passes: dict[str, int] = {}
    for w, c in enumerate(worker_chunks(sizes, schedule, device_of, capacity, exchange=exchange, moves=moves)):
        cap = capacity[w] if capacity else 0
        for name, v in pass_peaks(model, c, exchange=exchange, capacity=cap, multi_part=multi, resident=resident,
                                  idx=idx, fused_min=fused_min, views=views).items():
            passes[name] = max(passes.get(name, 0), v)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    return max(passes.values()) + 4 * params, passes
