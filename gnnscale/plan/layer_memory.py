"""The memory of a layer the planners have no formula for, measured rather than guessed.

A user's layer (a PyG conv wrapped as :class:`~gnnscale.nn.pyg.PyGConv`, a :class:`~gnnscale.nn.base.BlockLayer`
subclass) allocates what its code allocates: attention scores per edge and head, messages, the self-loops it adds,
the block's ``edge_index`` it builds. :func:`layer_memory` runs the layer (a deep copy, in training mode, where its
parameters are, the global random state forked) on probe blocks of different shapes under
:class:`~gnnscale.plan.memory.LiveBytesCounter` and prices a chunk of ``V`` destinations, ``R`` source rows and
``E`` edges from their peaks beyond the inputs. The widths are the layer's own: nothing is scaled by width.

Every chunk's sizes lie in a cone: ``R >= V`` (the destinations are the first sources) and ``E >= R - V`` (every
outside source has an edge into the chunk), so ``(V, R, E) = V (1, 1, 0) + (R - V) (0, 1, 1) + (E - R + V) (0, 0, 1)``
with no coefficient below zero. A peak is the largest of the live bytes at each moment, each a linear function of
the sizes: it is convex and grows in proportion to the block, so at a chunk that is a sum of multiples of probe
shapes it is at most the same sum of the probes' peaks. The probes (:data:`PROBES`) are the cone's three edges and
points between them, denser where chunks are (few destinations per edge); a chunk is priced by the three probes
that price it lowest among those whose multiples sum to it (:class:`Bound`), plus the peak of a one-edge block
(the fixed part). That bound holds for every chunk of up to 512 edges per destination (the third edge's probe has
that many; beyond, the three edges' rates extrapolate) and is the probes' own count at each probe.

It prices (:class:`LayerMemory`):

* ``forward``: the forward without autograd (the offload engine's forward pass), its output included;
* ``saved``: the forward with autograd, its output and what it saves for backward;
* ``train``: the forward and the backward of a given output gradient, with the parameters' gradients already
  allocated (as they are after a pass's first chunk) and, with an input gradient, the source rows' gradient;
* ``cache``: what the layer leaves cached on the block (PyG's ``edge_index``, the destination of every edge):
  kept as long as the block is, priced with the block's topology.

The measurement is made once per layer object (:func:`measured`) and takes a fraction of a second; a layer that
does not run on the probes keeps its default guess (:meth:`~gnnscale.nn.base.BlockLayer.workspace_bytes`).
"""

from __future__ import annotations

import copy
import functools
import itertools
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from gnnscale.graph.block import AdjacencySpec, Block
from gnnscale.nn.base import BlockLayer
from gnnscale.nn.probe import probed
from gnnscale.notes import warn
from gnnscale.plan.memory import LiveBytesCounter

SCALE = 1024
"""``V + E`` of each probe block: big enough that no fixed overhead dominates, small enough to run in milliseconds."""
SHAPES = ((1, 0, 0), (0, 1, 0), (0, 0, 1), (0.5, 0.5, 0), (0.5, 0, 0.5), (0, 0.5, 0.5), (1 / 3, 1 / 3, 1 / 3),
          (0.1, 0.8, 0.1), (0.1, 0.45, 0.45), (0.1, 0.1, 0.8), (0.1, 0, 0.9), (0.02, 0.49, 0.49))
"""The probes in the cone's coordinates ``(V, R - V, E - R + V) / (V + E)``: its three edges (destinations that are
their own sources, one edge among them; one destination reached once from each of many sources; one destination
reached many times from another, here two destinations reaching each other), the midpoints between them, the
centre, and shapes with one destination per ten or fifty edges, as chunks of a sparse graph have (``(0.1, 0,
0.9)``: a whole graph)."""


def _shape(v: float, a: float, b: float) -> tuple[int, int, int]:
    """``(V, R, E)`` of a probe from its cone coordinates: at least one edge, and one destination, or two where
    all sources are destinations (their edges between them: an edge from a vertex to itself is a self-loop, which
    a conv may drop)."""
    V = max(1 if a > 0 else 2, round(SCALE * v))
    return V, V + round(SCALE * a), max(1, round(SCALE * (a + b)))


PROBES = tuple(_shape(*s) for s in SHAPES)
"""``(V, R, E)`` of each probe block (:data:`SHAPES`)."""
TINY = (1, 2, 1)
"""The one-edge block whose peak is the fixed part (per-call vectors, scalars, the parameters' gradient temporaries)."""


@dataclass(frozen=True)
class ByteRates:
    """Bytes ``per_dst * V + per_src * R + per_edge * E + fixed``: the bound of the cone's three edges alone,
    linear (no rate below zero)."""

    per_dst: float
    per_src: float
    per_edge: float
    fixed: float

    def __call__(self, V: Tensor, R: Tensor, E: Tensor) -> Tensor:
        return self.per_dst * V + self.per_src * R + self.per_edge * E + self.fixed


@functools.cache
def _triples() -> tuple[Tensor, Tensor]:
    """``([T, 3] probe indices, [T, 3, 3] inverses)``: the triples of :data:`PROBES` not in one plane, and what
    turns sizes into multiples of each triple's probes."""
    sizes = torch.tensor(PROBES, dtype=torch.float64)
    unit = sizes / sizes.norm(dim=1, keepdim=True)
    index = torch.tensor([t for t in itertools.combinations(range(len(PROBES)), 3)
                          if abs(float(torch.linalg.det(unit[list(t)]))) > 1e-3])
    return index, torch.linalg.inv(sizes[index])


class Bound:
    """A peak measured at :data:`PROBES` (``peaks``) and at :data:`TINY` (``fixed``), priced at any sizes by the
    three probes that bound it lowest (see the module docstring); :attr:`rates` is the cone's edges' bound."""

    def __init__(self, peaks: Tensor, fixed: float):
        self.peaks, self.fixed = peaks.double(), float(fixed)
        self._index, self._inverse = _triples()
        rays = torch.linalg.solve(torch.tensor(PROBES[:3], dtype=torch.float64), self.peaks[:3]).clamp(min=0)
        self.rates = ByteRates(float(rays[0]), float(rays[1]), float(rays[2]), self.fixed)

    def __call__(self, V: Tensor, R: Tensor, E: Tensor) -> Tensor:
        """Bytes at ``[K]`` (float64) sizes: the least sum of probes' peaks over the triples whose multiples sum
        to the sizes (none below zero), or, outside every triple's cone, :attr:`rates`; plus the fixed part."""
        s = torch.stack(torch.broadcast_tensors(V, R, E), dim=-1).double()  # [K, 3]
        mult = torch.einsum("ki,tij->tkj", s, self._inverse)  # [T, K, 3]: s = mult @ sizes[triple]
        value = (mult * self.peaks[self._index].unsqueeze(1)).sum(-1)  # [T, K]
        value = value.masked_fill((mult < -1e-7).any(-1), float("inf")).amin(0)
        return torch.where(value.isfinite(), value + self.fixed, self.rates(*s.unbind(-1)))


@dataclass(frozen=True)
class LayerMemory:
    """A layer's measured peaks beyond its input rows (see the module docstring)."""

    forward: Bound
    """Without autograd: the output and the temporaries of the forward."""
    saved: tuple[Bound, Bound]
    """With autograd, through the forward: ``saved[input_grad]``, the output and what autograd keeps."""
    train: tuple[Bound, Bound]
    """Through the forward and the backward: ``train[input_grad]`` (with the source rows' gradient when true)."""
    cache: Bound
    """What the layer leaves cached on the block (or on itself) after a forward."""


_MEASURED: weakref.WeakKeyDictionary[nn.Module, LayerMemory | None] = weakref.WeakKeyDictionary()
"""Per layer object: its measurement, or ``None`` when it did not run on the probes."""


def measured(layer: BlockLayer) -> bool:
    """Whether the planners price ``layer`` by measuring it: a user's layer (:func:`~gnnscale.nn.probe.probed`),
    not one of gnnscale's, whose costs are written down, that ran on the probe blocks (measured here, once per
    layer object; one that does not run is priced by its default guess, with a warning)."""
    if not probed(layer):
        return False
    if layer not in _MEASURED:
        try:
            _MEASURED[layer] = measure(layer)
        except Exception as exc:  # noqa: BLE001 -- a user's layer: its error said in one line, the guess kept
            first = str(exc).splitlines()[0] if str(exc) else ""
            warn(f"{getattr(layer, 'name', type(layer).__name__)} did not run on the planner's probe blocks "
                 f"({type(exc).__name__}: {first}); its memory is priced by a default guess, which can be low")
            _MEASURED[layer] = None
    return _MEASURED[layer] is not None


def whole(layer: BlockLayer) -> bool:
    """Whether a chunked engine runs ``layer`` whole in every pass (its aggregation has parameters, so it is
    recomputed rather than cached, and it does not project first): the measurement then prices each pass."""
    return not layer.cacheable and not layer.projects_first


def layer_memory(layer: BlockLayer) -> LayerMemory:
    """``layer``'s measured memory (:func:`measure`), once per layer object (a layer :func:`measured` says is)."""
    got = _MEASURED.get(layer) if measured(layer) else None
    if got is None:
        raise ValueError(f"{type(layer).__name__} is not measured: gnnscale's own layer, or one that did not run")
    return got


def workspace_bytes(layer: BlockLayer, num_src: int, num_dst: int, num_edges: int) -> int:
    """:meth:`~gnnscale.nn.base.BlockLayer.workspace_bytes` for the coarse bound: for a user's layer, its measured
    forward and backward with the input's gradient, and the block's cache; gnnscale's layers' own formula."""
    if not measured(layer):
        return layer.workspace_bytes(num_src, num_dst, num_edges)
    m = layer_memory(layer)
    V, R, E = (torch.tensor([float(n)], dtype=torch.float64) for n in (num_dst, num_src, num_edges))
    return int((m.train[True](V, R, E) + m.cache(V, R, E)).ceil())


def measure(layer: BlockLayer) -> LayerMemory:
    """Run ``layer`` (a deep copy in training mode, where its parameters are, the random state forked) on the
    :data:`TINY` block and each of :data:`PROBES` (:class:`Bound`)."""
    p = next(layer.parameters(), None)
    device = torch.device("cpu") if p is None else p.device
    probe = copy.deepcopy(layer).train()
    for q in probe.parameters():
        q.grad = torch.zeros_like(q)  # a pass's later chunks add into gradients that exist
    gen = torch.Generator().manual_seed(0)
    rows: list[list[float]] = []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        for V, R, E in (TINY, *PROBES):
            block = probe_block(V, R, E, probe.adjacency, gen).to(device)
            x = torch.randn(R, probe.in_features, generator=gen).to(device)
            run = functools.partial(probe, block, x)
            with torch.no_grad():
                cache = _count(run)[1]  # what stays: the block's (or the layer's) caches
                row = [float(_count(run)[0]), float(cache)]
            grad = torch.randn(V, probe.out_features, generator=gen).to(device)
            for input_grad in (False, True):
                row += _train(probe, block, x.detach().requires_grad_(input_grad), grad)
            rows.append(row)
    counts = torch.tensor(rows, dtype=torch.float64)
    b = [Bound(counts[1:, i], float(counts[0, i])) for i in range(counts.shape[1])]
    return LayerMemory(forward=b[0], cache=b[1], saved=(b[2], b[4]), train=(b[3], b[5]))


def _count(run: Callable[[], Any]) -> tuple[int, int]:
    """``(peak, kept)``: the peak bytes ``run`` allocates, and those still alive once its result is let go."""
    with LiveBytesCounter() as counter:
        out = run()
    peak = counter.peak
    del out
    counter.reset_peak()
    return peak, counter.current


def _train(layer: BlockLayer, block: Block, x: Tensor, grad: Tensor) -> list[float]:
    """``[through the forward, through the backward]`` peak bytes of ``layer`` on ``block`` with autograd."""
    with torch.enable_grad(), LiveBytesCounter() as counter:
        y = layer(block, x)
        saved = counter.peak
        y.backward(grad)
        del y
    x.grad = None
    return [float(saved), float(counter.peak)]


def probe_block(V: int, R: int, E: int, adjacency: AdjacencySpec, gen: torch.Generator) -> Block:
    """A block of ``V`` destinations, ``R`` source rows and ``E`` edges as a chunk's is (int32 topology, the
    sources' ids, weights when the adjacency has them): the edges spread over the destinations as evenly as ``E``
    allows, each outside source on one of them (while ``E`` lasts), the rest from random sources, none from the
    destination itself; with self-loops, one per destination among them."""
    deg = torch.full((V,), E // V, dtype=torch.int64)
    deg[: E % V] += 1
    indptr = torch.zeros(V + 1, dtype=torch.int64)
    torch.cumsum(deg, 0, out=indptr[1:])
    outside = torch.arange(V, R)[:E]
    indices = torch.cat([outside, torch.randint(0, R, (E - outside.numel(),), generator=gen)])
    indices = indices[torch.randperm(E, generator=gen)]
    dst = torch.repeat_interleave(torch.arange(V), deg)
    loops = indices == dst
    indices[loops] = (dst[loops] + 1) % R  # a conv that removes self-loops would see fewer edges
    if adjacency.self_loops:
        first = indptr[:-1][deg > 0]
        indices[first] = torch.arange(V)[deg > 0]
    weight = torch.rand(E, generator=gen) + 0.5 if adjacency.weighted else None
    return Block(indptr=indptr.int(), indices=indices.int(), num_src=R, edge_weight=weight,
                 src_ids=torch.arange(R))
