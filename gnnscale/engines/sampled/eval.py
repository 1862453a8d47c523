"""Evaluation of the sampled engines, without dropout: layer-wise full-neighbour inference (every vertex's exact
output, layer by layer over destination batches, with the whole graph's weights: the in-memory engine's evaluation
and PyG's full-batch ``model(x, edge_index)``), or sampled inference over keyed samples (``--eval-fanouts``: the
training blocks' semantics, keyed by :data:`~gnnscale.engines.sampled.loop.EVAL_EPOCH`, the same sample every time).

An engine says where inference reads with a :class:`SampledInference`: a topology and a feature source (the
mini-batch engine's store, the hybrid engine's host memory); the distributed engine infers across ranks (its own
``_layerwise``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import Tensor

from gnnscale import runtime as rt
from gnnscale.engines.sampled.loop import EVAL_BATCH, SampledBatch, forward, inline_feed
from gnnscale.nn.stack import Stack
from gnnscale.sample import SampledAdjacency, Topology, sample_blocks
from gnnscale.store.transfer import place


def layerwise(model: Stack, topology: Topology, features: Callable[[Tensor], Tensor], num_nodes: int,
              adjacency: SampledAdjacency, *, batch_size: int, device: rt.Device,
              targets: Tensor | None = None, degree: Tensor | None = None, max_rows: int | None = None) -> Tensor:
    """Exact outputs, layer by layer over full neighbourhoods from ``topology``, in steps of at least
    :data:`EVAL_BATCH` destinations; the first layer's input rows from ``features`` (on ``device``), every later
    layer's from the layer before (kept in host memory, on the CPU).

    Without ``targets``: ``[N, C]`` outputs of every vertex. With ``targets`` (vertex ids): ``[N]`` int64 predicted
    classes of ``targets``, -1 elsewhere, and each layer computes only the rows a later layer reads
    (:func:`needed_rows`): evaluating a graph whose labelled vertices are a few percent of it (ogbn-papers100M's
    1.3%) computes and holds a few percent of the last layer and the neighbourhood of those below, not every vertex
    (a layer whose rows would be more than :data:`ALL_ROWS_SHARE` of the graph computes every vertex, and so do the
    layers below it). A row's value does not depend on which other rows are computed with it.

    With ``max_rows`` (a host budget, ``--host-memory``) and ``degree`` (every vertex's in-degree, a bound on its
    sampled neighbours), a step ends before its destinations' input rows (each one's degree plus itself) pass
    ``max_rows``, so one step's gathered rows stay within the budget's working set (a vertex alone is a step)."""
    size = max(batch_size, EVAL_BATCH)
    exact = adjacency.exact()
    layers = model.block_layers
    rows = (needed_rows(topology, targets, len(layers), exact, size, device, num_nodes) if targets is not None
            else None)
    h: Tensor | None = None
    before: Tensor | None = None  # the vertex of each row of h (None: h has every vertex, in order)
    head = _Head(model, None if rows is None else rows[-1])
    for i, layer in enumerate(layers):
        ids = None if rows is None else rows[i]
        count = num_nodes if ids is None else ids.numel()
        out = None
        for lo, hi in _steps(count, size, ids, degree, max_rows):
            dst = place(torch.arange(lo, hi) if ids is None else ids[lo:hi], device)
            block = sample_blocks(topology, dst, (-1,), adjacency=exact)[0]
            src = block.src_ids
            assert src is not None
            if h is None:
                x = features(src)
            else:
                at = src.cpu() if before is None else torch.searchsorted(before, src.cpu())
                x = place(h[at], device)
            y = layer(block, model.layer_input(i, x, block.row_ids(), None)).cpu()  # [dst, F_out]
            if out is None:
                out = torch.empty(count, y.shape[1])
            out[lo:hi] = y
        h, before = out, ids
        assert h is not None
        head.add(i, h, before)
    assert h is not None
    h = head.scores(h)
    if targets is None:
        return h
    pred = torch.full((num_nodes,), -1, dtype=torch.int64)
    done = before if before is not None else torch.unique(targets.cpu())
    pred[done] = (h if before is not None else h[done]).argmax(-1)
    return pred


def _steps(count: int, size: int, ids: Tensor | None, degree: Tensor | None,
           max_rows: int | None) -> list[tuple[int, int]]:
    """``[lo, hi)`` positions of each step over ``count`` destinations (``ids``, or every vertex): ``size`` at a
    time, and with ``max_rows`` also cut where the destinations' input rows (degree + 1 each) would pass it."""
    if max_rows is None or degree is None:
        return [(lo, min(lo + size, count)) for lo in range(0, count, size)]
    rows = (degree if ids is None else degree[ids.cpu()]).to(torch.int64) + 1
    ends = torch.cumsum(rows, 0)
    out, lo = [], 0
    while lo < count:
        base = int(ends[lo - 1]) if lo else 0
        hi = int(torch.searchsorted(ends, base + max_rows, right=True))  # first position past the budget
        hi = min(max(hi, lo + 1), lo + size, count)
        out.append((lo, hi))
        lo = hi
    return out


class _Head:
    """With ``--jk``, what layer-wise inference keeps of each layer for :meth:`GNN.head
    <gnnscale.nn.stack.Stack.head>` at the last layer's rows: ``last`` nothing, ``max`` the running maximum, ``cat``
    the running sum of each output's share of ``lin`` (``lin(cat(h_1..h_L)) = Σ_l h_l W_l^T + b``): one
    ``[rows, hidden]`` or ``[rows, C]`` table, not one per layer."""

    def __init__(self, model: Stack, final: Tensor | None):
        self.model, self.final = model, final
        self.acc: Tensor | None = None

    def add(self, layer: int, out: Tensor, ids: Tensor | None) -> None:
        """Layer ``layer``'s outputs ``out`` (rows ``ids``; ``None``: every vertex in order)."""
        model = self.model
        if model.lin is None or model.jk == "last":
            return
        if self.final is not None and ids is not None and not torch.equal(ids, self.final):
            pos = torch.searchsorted(ids, self.final)
            out, ids = out[pos], self.final
        elif self.final is not None and ids is None:
            out, ids = out[self.final], self.final
        row_ids = torch.arange(out.shape[0]) if ids is None else ids
        dev = model.lin.weight.device
        with torch.no_grad():
            z = model.layer_input(layer + 1, out.to(dev), row_ids.to(dev), None)
            if model.jk == "max":
                self.acc = z if self.acc is None else torch.maximum(self.acc, z)
            else:
                width = z.shape[1]
                part = z @ model.lin.weight[:, layer * width: (layer + 1) * width].t()
                self.acc = part if self.acc is None else self.acc + part

    def scores(self, last: Tensor) -> Tensor:
        """The class scores from the last layer's outputs ``last`` (``last`` itself without ``--jk``)."""
        model = self.model
        if model.lin is None:
            return last
        dev = model.lin.weight.device
        with torch.no_grad():
            if model.jk == "last":
                n = last.shape[0]
                ids = torch.arange(n) if self.final is None else self.final
                return model.head([model.layer_input(len(model.layers), last.to(dev), ids.to(dev), None)]).cpu()
            assert self.acc is not None
            if model.jk == "max":
                return model.lin(self.acc).cpu()  # type: ignore[no-any-return]
            return (self.acc + model.lin.bias).cpu()


ALL_ROWS_SHARE = 0.5
"""A layer of targeted layer-wise inference that would compute more than this share of the vertices computes them
all (no neighbourhood pass, no lookups), and so do the layers below it."""


def needed_rows(topology: Topology, targets: Tensor, num_layers: int, adjacency: SampledAdjacency, size: int,
                device: rt.Device, num_nodes: int) -> list[Tensor | None]:
    """The sorted vertex ids whose output each layer computes so that the last layer's are ``targets``: layer
    ``L-1`` computes ``targets``, layer ``l`` the vertices that layer ``l+1``'s destinations read (their full
    in-neighbourhoods, themselves included); ``None`` for a layer that computes every vertex (more than
    :data:`ALL_ROWS_SHARE` of the ``num_nodes`` would be needed there, or above it)."""
    top = torch.unique(targets.cpu())
    if top.numel() > ALL_ROWS_SHARE * num_nodes:
        return [None] * num_layers
    rows: list[Tensor | None] = [top]
    for _ in range(num_layers - 1):
        dst, read = rows[0], []
        if dst is None:
            rows.insert(0, None)
            continue
        for lo in range(0, dst.numel(), size):
            src = sample_blocks(topology, place(dst[lo : lo + size], device), (-1,), adjacency=adjacency)[0].src_ids
            assert src is not None
            read.append(src.cpu())
        below = torch.unique(torch.cat([dst, *read]))
        rows.insert(0, None if below.numel() > ALL_ROWS_SHARE * num_nodes else below)
    return rows


EVAL_READ_RATIO = 4.0
"""From disk, evaluation samples (with the training fanouts) when exact layer-wise inference would read more than
this many times the feature rows sampled inference reads (:func:`eval_reads`): sampled inference is not exact, so
it must be much cheaper to be chosen."""


def eval_reads(degree: Tensor, rows: Tensor | None, num_targets: int, fanouts: tuple[int, ...]) -> tuple[int, int]:
    """``(layer-wise, sampled)``: the feature rows each kind of inference reads for ``num_targets`` labelled
    vertices, per destination before any deduplication (what a disk tier's random reads scale with).

    Layer-wise inference's first layer reads every in-neighbour of each row it computes, ``rows`` (the first entry
    of :func:`needed_rows`; ``None``: every vertex) and the row itself: ``sum(degree[rows] + 1)``. Sampled
    inference reads at most ``num_targets * (1 + f1 + f1 f2 + ...)`` rows with the seeds' hop first (a fanout of
    -1 counts the mean degree)."""
    d = degree if rows is None else degree[rows]
    layerwise = int(d.sum()) + d.numel()
    mean = float(degree.double().mean()) if degree.numel() else 0.0
    frontier, sampled = float(num_targets), float(num_targets)
    for f in fanouts:
        frontier *= mean if f == -1 else f
        sampled += frontier
    return layerwise, int(sampled)


def eval_ids(masks: dict[str, Tensor]) -> Tensor:
    """The vertices of any mask (training, validation, test): what sampled evaluation predicts."""
    return torch.nonzero(torch.stack(list(masks.values())).any(0)).view(-1)


def sampled_predictions(num_nodes: int, batches: Iterable[SampledBatch],
                        logits: Callable[[SampledBatch], Tensor]) -> Tensor:
    """``[N]`` int64: the predicted class of every seed of ``batches`` from its ``logits``, -1 elsewhere."""
    pred = torch.full((num_nodes,), -1, dtype=torch.int64)
    for batch in batches:
        pred[batch.seeds.cpu()] = logits(batch).argmax(-1).cpu()
    return pred


@dataclass(eq=False)
class SampledInference:
    """Where a sampled engine's evaluation reads, and how: ``model`` over ``topology``'s full neighbourhoods and
    ``features``' rows (layer-wise), or over keyed samples of them (sampled)."""

    model: Stack
    topology: Topology
    features: Callable[[Tensor], Tensor]
    """Input rows of the given vertices, on ``device``."""
    adjacency: SampledAdjacency
    num_nodes: int
    batch_size: int
    device: rt.Device
    batches: Callable[[list[Tensor], tuple[int, ...], int], Iterable[SampledBatch]] | None = None
    """Sampled evaluation's feed, ``batches(seed batches, fanouts, key)``; ``None``: each batch sampled and fetched
    inline from ``topology`` and ``features``."""
    done: Callable[[], object] | None = None
    """Called after every pass (the mini-batch store's counters are reset: inference is not an epoch's)."""
    degree: Tensor | None = None
    """Every vertex's in-degree, with :attr:`max_rows` (a host budget): layer-wise steps by their input rows."""
    max_rows: int | None = None
    """At most this many input rows per layer-wise step (``--host-memory``'s working set); ``None``: no bound."""

    def layerwise(self, targets: Tensor | None = None) -> Tensor:
        """``[N, C]`` exact outputs, or with ``targets`` ``[N]`` predictions of ``targets`` (:func:`layerwise`)."""
        h = layerwise(self.model, self.topology, self.features, self.num_nodes, self.adjacency,
                      batch_size=self.batch_size, device=self.device, targets=targets, degree=self.degree,
                      max_rows=self.max_rows)
        self._finish()
        return h

    def reads(self, targets: Tensor, degree: Tensor, fanouts: tuple[int, ...]) -> tuple[int, int]:
        """``(layer-wise, sampled with fanouts)`` feature rows that inferring ``targets`` reads
        (:func:`eval_reads`; ``degree``: every vertex's in-degree)."""
        rows = needed_rows(self.topology, targets, len(self.model.block_layers), self.adjacency.exact(),
                           max(self.batch_size, EVAL_BATCH), self.device, self.num_nodes)
        return eval_reads(degree, rows[0], torch.unique(targets).numel(), fanouts)

    def sampled(self, ids: Tensor, fanouts: tuple[int, ...], key: int) -> Tensor:
        """``[N]`` predictions of ``ids`` from their keyed samples with ``fanouts`` (``key``), -1 elsewhere."""
        parts = list(torch.split(ids, self.batch_size))
        if self.batches is not None:
            batches = self.batches(parts, fanouts, key)
        else:
            batches = inline_feed(self.topology, self.features, fanouts, key, self.adjacency)(parts, 0)
        pred = sampled_predictions(self.num_nodes, batches, lambda b: forward(self.model, b.blocks, b.x, None))
        self._finish()
        return pred

    def _finish(self) -> None:
        """After a pass: the host waits for the device's work (one counted sync; a GPU's reads of the results on
        the host did already, implicitly), so memory the pass's streams used is free to reuse; then :attr:`done`."""
        rt.synchronize(self.device)
        if self.done is not None:
            self.done()
