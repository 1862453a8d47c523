"""The offload engine's layer passes: what each chunk computes in a layer's forward, in the last layer's fused
loss and backward, in a layer's backward, and in the projections (HongTu Algorithm 1, §4.2).

Every vertex's rows live in host memory (:class:`HostRows`); a pass walks the chunk schedule
(:class:`~gnnscale.engines.offload.sweep.Sweep`) and each worker computes its chunks in order, reading the rows its
:class:`~gnnscale.engines.offload.sweep.LayerPass` names and writing its outputs back to host memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gnnscale import runtime as rt
from gnnscale.engines.offload.rows import HostRows
from gnnscale.engines.offload.sweep import ChunkStep, LayerPass, Sweep
from gnnscale.engines.offload.workers import Worker
from gnnscale.nn.batchnorm import (
    SplitBatchNorm,
    end_grad_sums_together,
    end_stats_together,
    kept_grads,
    split_norms,
)
from gnnscale.nn.stack import Stack

Key = tuple[int, int]
"""``(seed, epoch)``: what dropout masks are keyed by (``None`` in inference: no dropout)."""


class LayerPasses:
    """The passes of an epoch over the chunk schedule; the engine's epoch calls them layer by layer.

    Each public method is one pass (or two: a projecting layer's projection comes first in the forward and last in
    the backward); its ``_*_chunks`` method is what one worker computes over its chunks.
    """

    def __init__(self, model: Stack, host: HostRows, sweep: Sweep, num_train: int):
        self.model, self.host, self.sweep, self.num_train = model, host, sweep, num_train
        self.num_layers = len(model.layers)
        self.norm_passes = 0
        """BatchNorm's extra passes this epoch (statistics and gradient sums: one of each per norm and layer)."""
        self.norm_reduced_bytes = 0
        """Bytes of BatchNorm sums the workers' partial sums added up this epoch (float64 vectors)."""

    # ------------------------------------------------------------------------------------------------ BatchNorm
    # A layer with BatchNorm (inside it, as GIN's MLP has, or on its output, ``norms[layer]``) is computed over the
    # chunks once per norm before its real pass: a statistics pass in forward, a gradient-sums pass in backward
    # (:mod:`gnnscale.nn.batchnorm`), so each chunk normalises with, and backpropagates through, all vertices'
    # statistics: the in-memory engine's function, not one chunk's.
    def split_norms(self, layer: int) -> list[list[SplitBatchNorm]]:
        """Layer ``layer``'s BatchNorms in forward order (inside the layer, then on its output), each as its copies
        on every worker's replica."""
        per_worker = []
        for w in self.sweep.group.workers:
            m = w.model
            outer = [m.norms[layer]] if layer < len(m.norms) and isinstance(m.norms[layer], SplitBatchNorm) else []
            per_worker.append([*split_norms(m.block_layers[layer]), *outer])
        return [list(copies) for copies in zip(*per_worker, strict=True)]

    def _statistics(self, layer: int, run: Callable[[], object]) -> None:
        """Before a training forward of ``layer``: one statistics pass (``run``) per BatchNorm, in forward order
        (the norms after it sum meanwhile, and start again in their own pass)."""
        norms = self.split_norms(layer)
        for i, copies in enumerate(norms):
            for later in norms[i:]:
                for bn in later:
                    bn.begin_stats()
            run()
            self.norm_passes += 1
            self.norm_reduced_bytes += end_stats_together(copies)

    def _gradient_sums(self, layer: int, run: Callable[[], object]) -> None:
        """Before a backward of ``layer``: one gradient-sums pass (``run``) per BatchNorm, in backward order."""
        for copies in reversed(self.split_norms(layer)):
            for bn in copies:
                bn.begin_grad_sums()
            run()
            self.norm_passes += 1
            self.norm_reduced_bytes += end_grad_sums_together(copies)

    def release_norms(self) -> None:
        """Every BatchNorm back to a plain one (the end of an epoch, or a failed one)."""
        for layer in range(self.num_layers):
            for copies in self.split_norms(layer):
                for bn in copies:
                    bn.release()

    def _stats_chunks(self, layer: int, key: Key, worker: Worker, steps: Iterator[ChunkStep]) -> None:
        """A statistics pass: the layer (and the norm on its output) per chunk; nothing is stored."""
        model = worker.model
        for step in steps:
            with worker.io.compute():
                x_dst = step.slices[0]
                y = self._apply(worker, layer, step, step.source_rows(), x_dst, key, False)
                if layer < len(model.norms):
                    model.norms[layer](y)

    # ------------------------------------------------------------------------------------------------ forward
    @torch.no_grad()
    def forward(self, layer: int, key: Key | None) -> None:
        """Layer ``layer`` over every chunk into the next layer's input ``h[layer + 1]``; while training (``key``
        given) a caching layer also stores its aggregation for the backward."""
        if layer in self.host.projecting:
            self.project(layer, key)
        src, dst_rows = self.host.source(layer)
        cache = key is not None and layer in self.host.caching
        layer_pass = LayerPass(src=src, slices=(dst_rows,))
        if key is not None:
            self._statistics(layer, lambda: self.sweep.run(layer_pass, partial(self._stats_chunks, layer, key)))
        # a propagation, or a cached parameter-free AGGREGATE of rows already written (not layer 0's features,
        # whose dropout each chunk applies), reads its source rows only through products of the block
        in_place = self.model.block_layers[layer].reads_by_product and (
            layer in self.host.projecting or (cache and layer > 0))
        self.sweep.run(replace(layer_pass, in_place=in_place), partial(self._forward_chunks, layer, key, cache))

    def _forward_chunks(self, layer: int, key: Key | None, cache: bool, worker: Worker,
                        steps: Iterator[ChunkStep]) -> None:
        next_input = self.host.inputs[layer + 1]
        for step in steps:
            with worker.io.compute():  # the chunk's compute; the next step is loaded outside it
                (x_dst,) = step.slices
                y = self._apply(worker, layer, step, step.source_rows(), x_dst, key, cache)
                # the next layer's input: activation and dropout applied once per vertex (not once per copy)
                dst_ids, chunk = step.block.row_ids(step.chunk.num_dst), step.chunk
                out = worker.io.output(next_input, chunk.lo, chunk.hi)  # on a CPU reading in place: no copy
                worker.io.store(next_input, chunk.lo, worker.model.layer_input(layer + 1, y, dst_ids, key, out))

    def _apply(self, worker: Worker, layer: int, step: ChunkStep, x_src: Tensor, x_dst: Tensor | None,
               key: Key | None, cache: bool) -> Tensor:
        """Layer ``layer`` on the step's chunk from its source rows (projected rows for a projecting layer); with
        ``cache`` the aggregation is copied to host memory for the backward. A step that reads in place
        (:attr:`ChunkStep.in_place`) has the whole host table as ``x_src`` and its own block over it."""
        block_layer, block, num_dst = worker.model.block_layers[layer], step.block, step.chunk.num_dst
        ids = block.row_ids()
        reads = block if step.in_place is None else step.in_place  # the block the source rows are read through
        if layer in self.host.projecting:
            out = worker.io.output(self.host.aggregates[layer], step.chunk.lo, step.chunk.hi) if cache else None
            agg = block_layer.propagate(reads, x_src, out)
            xd = None if x_dst is None else self._layer_input(worker, layer, x_dst, ids[:num_dst], key)
        else:
            x = self._layer_input(worker, layer, x_src, ids, key)
            if not cache:
                return block_layer(block, x)
            own = x[:num_dst] if step.in_place is None else x[step.chunk.lo : step.chunk.hi]  # the chunk's own rows
            agg, xd = block_layer.aggregate(reads, x), own
        if cache:
            worker.io.store(self.host.aggregates[layer], step.chunk.lo, agg)
        return block_layer.update(agg, xd)  # type: ignore[arg-type]  # None when UPDATE ignores x_dst

    @staticmethod
    def _layer_input(worker: Worker, layer: int, rows: Tensor, ids: Tensor, key: Key | None) -> Tensor:
        """Layer ``layer``'s input from rows read from host memory: ``h[layer]`` already holds it (activation and
        dropout were applied once per vertex when it was written); the features still need layer 0's dropout."""
        return worker.model.layer_input(0, rows, ids, key) if layer == 0 else rows

    # ------------------------------------------------------------------------------------------------ projection
    @torch.no_grad()
    def project(self, layer: int, key: Key | None) -> None:
        """``p[layer]`` = the layer's projection of its input, once per vertex, chunk by chunk (destination rows
        only)."""
        self.sweep.run(LayerPass(slices=(self.host.input(layer),), blocks=False),
                       partial(self._project_chunks, layer, key))

    def _project_chunks(self, layer: int, key: Key | None, worker: Worker, steps: Iterator[ChunkStep]) -> None:
        projected = self.host.projected[layer]
        for step in steps:
            with worker.io.compute():  # the chunk's compute; the next step is loaded outside it
                (x_dst,) = step.slices
                assert x_dst is not None
                x = self._layer_input(worker, layer, x_dst, step.dst_ids(), key)
                out = worker.io.output(projected, step.chunk.lo, step.chunk.hi)
                worker.io.store(projected, step.chunk.lo, worker.model.block_layers[layer].project(x, out))

    def project_backward(self, layer: int, key: Key) -> None:
        """Backpropagate the accumulated ``dL/dp[layer]`` through the projection, chunk by chunk, into the
        parameters and ``dL/dh[layer]``; ``dL/dp[layer]`` is zeroed after (consumed)."""
        grads = self.host.projected_grads[layer]
        self.sweep.run(LayerPass(slices=(self.host.input(layer), grads), blocks=False),
                       partial(self._project_backward_chunks, layer, key))
        grads.zero_()

    def _project_backward_chunks(self, layer: int, key: Key, worker: Worker, steps: Iterator[ChunkStep]) -> None:
        for step in steps:
            with worker.io.compute():  # the chunk's compute; the next step is loaded outside it
                x_dst, grad_projected = step.slices
                assert x_dst is not None and grad_projected is not None
                x = self._layer_input(worker, layer, x_dst, step.dst_ids(), key)
                x_grad = worker.model.block_layers[layer].project_vjp(x, grad_projected, layer > 0)
                if x_grad is not None:
                    worker.io.accumulate(self.host.input_grads[layer], step.chunk.rows[: step.chunk.num_dst], x_grad)

    # ------------------------------------------------------------------------------------------------ loss
    def loss_and_last_backward(self, key: Key) -> float:
        """The last layer, the loss and their backward, fused per chunk (the last layer's output never makes a
        host round trip); returns the loss: the sum over the training vertices divided by their count."""
        layer = self.num_layers - 1
        projecting = layer in self.host.projecting
        if projecting:
            self.project(layer, key)
        src, dst_rows = self.host.source(layer)
        # backward through the propagation needs the blocks' transposes (rows that require a gradient)
        transpose = self.model.block_layers[layer].sparse_backward and (projecting or layer > 0)
        slices = (dst_rows, *self._jk_slices())
        # a propagation reads its projected rows in place; their gradient goes through its transpose (as backward)
        in_place = projecting and self.model.block_layers[layer].reads_by_product
        layer_pass = LayerPass(src=src, grad=self.host.source_grad(layer), slices=slices, transpose=transpose,
                               in_place=in_place)
        forward_only = LayerPass(src=src, slices=slices)
        self._statistics(layer, lambda: self.sweep.run(forward_only, partial(self._stats_chunks, layer, key)))
        self._gradient_sums(layer, lambda: self.sweep.run(forward_only, partial(self._loss_chunks, layer, key,
                                                                                 sums=True)))
        loss = sum(float(t) for t in self.sweep.run(layer_pass, partial(self._loss_chunks, layer, key)))
        if projecting:
            self.project_backward(layer, key)
        return loss

    def _jk_slices(self) -> tuple[Tensor, ...]:
        """With ``--jk``: every earlier layer's output as the next layer takes it (``h[1..L-1]``, which the
        forward passes stored), read per chunk beside the last layer for :meth:`GNN.head
        <gnnscale.nn.stack.Stack.head>`; nothing without."""
        if self.model.lin is None:
            return ()
        return tuple(self.host.inputs[l] for l in range(1, self.num_layers))

    @staticmethod
    def _head(worker: Worker, layer: int, y: Tensor, prev: list[Tensor], dst_ids: Tensor, key: Key | None) -> Tensor:
        """The class scores of the last layer's output ``y`` (``--jk``: combined with the earlier layers' ``prev``
        rows of the same destinations; without: ``y``)."""
        model = worker.model
        if model.lin is None:
            return y
        return model.head([*prev, model.layer_input(layer + 1, y, dst_ids, key)])

    def _loss_chunks(self, layer: int, key: Key, worker: Worker, steps: Iterator[ChunkStep],
                     sums: bool = False, keep: bool = True) -> Tensor:
        """The worker's share of the loss (on its device: read back once per pass); with ``sums``, a
        gradient-sums pass (nothing is pushed or accumulated, no parameter gradient kept)."""
        if sums:
            with kept_grads(worker.model):
                return self._loss_chunks(layer, key, worker, steps, keep=False)
        block_layer, projecting = worker.model.block_layers[layer], layer in self.host.projecting
        total = torch.zeros((), device=rt.torch_device(worker.device))
        for step in steps:
            with worker.io.compute():  # the chunk's compute; the next step is loaded outside it
                x_dst, *earlier = step.slices
                block, chunk = step.block, step.chunk
                ids = block.row_ids()
                prev = [h.detach().requires_grad_(True) for h in earlier if h is not None]  # --jk: h[1..L-1]
                xd = agg = None
                if projecting:  # gradients flow into the projected rows (then the projection) and the dst rows
                    if step.in_place is None:
                        x = step.source_rows().detach().requires_grad_(True)
                        agg = block_layer.propagate(block, x)
                    else:  # read in place: the propagation's gradient is pushed through its transpose
                        x, agg = None, block_layer.propagate(step.in_place, step.source_rows()).requires_grad_(True)
                    if x_dst is not None:
                        xd = self._layer_input(worker, layer, x_dst, ids[: chunk.num_dst], key)
                        xd = xd.detach().requires_grad_(layer > 0)
                    logits = block_layer.update(agg, xd)  # type: ignore[arg-type]
                else:
                    x = self._layer_input(worker, layer, step.source_rows(), ids, key)
                    x = x.detach().requires_grad_(layer > 0)
                    logits = block_layer(block, x)  # [V, C]
                logits = self._head(worker, layer, logits, prev, ids[: chunk.num_dst], key)
                train, y = worker.io.index(chunk.train_local), worker.io.index(chunk.y_train, kind="row")
                loss = F.cross_entropy(logits.index_select(0, train), y, reduction="sum") / self.num_train
                loss.backward()
                total += loss.detach()
                if keep and step.grad is not None:
                    if x is None:
                        assert agg is not None and agg.grad is not None
                        self._push_vjp(worker, layer, step, agg.grad)
                    else:
                        assert x.grad is not None
                        step.push(x.grad)
                if keep and xd is not None and xd.grad is not None:
                    worker.io.accumulate(self.host.input_grads[layer], chunk.rows[: chunk.num_dst], xd.grad)
                for l, h in enumerate(prev, start=1):  # --jk: the head's gradient into each earlier output
                    if keep and h.grad is not None:
                        worker.io.accumulate(self.host.input_grads[l], chunk.rows[: chunk.num_dst], h.grad)
        return total

    # ------------------------------------------------------------------------------------------------ backward
    def backward(self, layer: int, key: Key) -> None:
        """Recompute layer ``layer`` per chunk and backpropagate ``dL/dh[layer + 1]`` into the parameters and the
        layer's source rows; ``dL/dh[layer + 1]`` is zeroed after (consumed: ready for the next epoch)."""
        block_layer, next_grad = self.model.block_layers[layer], self.host.input_grads[layer + 1]
        caching = layer in self.host.caching
        # a caching layer backpropagates through its cached propagation to its source rows (not layer 0's features)
        through_propagation = caching and (layer > 0 or layer in self.host.projecting)
        layer_pass = LayerPass(
            src=None if caching else self.host.input(layer),
            grad=self.host.source_grad(layer),
            slices=(self.host.aggregates[layer] if caching else None,
                    self.host.input(layer) if caching and layer in self.host.reading_dst else None,
                    next_grad),
            blocks=not caching or through_propagation,  # a cached layer 0 needs no topology: its dst ids only
            transpose=block_layer.sparse_backward and (through_propagation or (not caching and layer > 0)))
        sums_pass = replace(layer_pass, grad=None, transpose=False, blocks=not caching)
        self._gradient_sums(layer, lambda: self.sweep.run(sums_pass, partial(self._backward_chunks, layer, key,
                                                                             False, sums=True)))
        self.sweep.run(layer_pass, partial(self._backward_chunks, layer, key, through_propagation))
        next_grad.zero_()
        if layer in self.host.projecting:
            self.project_backward(layer, key)

    def _backward_chunks(self, layer: int, key: Key, through_propagation: bool, worker: Worker,
                         steps: Iterator[ChunkStep], sums: bool = False) -> None:
        if sums:  # a gradient-sums pass: the backward as far as the norm, nothing pushed, no parameter gradient
            with kept_grads(worker.model):
                for step in steps:
                    with worker.io.compute():
                        self._recompute_backward(layer, key, worker, step, through_propagation=False)
            return
        for step in steps:
            with worker.io.compute():  # the chunk's compute; the next step is loaded outside it
                agg, x, xd = self._recompute_backward(layer, key, worker, step, through_propagation)
                caching = layer in self.host.caching
                if through_propagation and agg is not None and agg.grad is not None:
                    self._push_vjp(worker, layer, step, agg.grad)
                elif not caching and layer > 0:
                    assert x is not None and x.grad is not None
                    step.push(x.grad)
                if xd is not None and xd.grad is not None:
                    worker.io.accumulate(self.host.input_grads[layer], step.chunk.rows[: step.chunk.num_dst], xd.grad)

    @staticmethod
    def _push_vjp(worker: Worker, layer: int, step: ChunkStep, grad_agg: Tensor) -> None:
        """The source rows' gradients through layer ``layer``'s cached propagation into the pass's host gradient:
        on a CPU that reads in place, without an exchange, each row added as it is made
        (:meth:`~gnnscale.nn.base.BlockLayer.aggregate_vjp_add`); else made whole, then pushed."""
        block_layer = worker.model.block_layers[layer]
        if step.exchange is None and worker.io.in_place:
            assert step.grad is not None
            worker.io.accumulate_in_place(step.grad, step.chunk.rows, grad_agg.shape[1], lambda host: (
                block_layer.aggregate_vjp_add(step.block, grad_agg, host, step.chunk.rows)))
            return
        step.push(block_layer.aggregate_vjp(step.block, grad_agg))

    def _recompute_backward(self, layer: int, key: Key, worker: Worker, step: ChunkStep,
                            through_propagation: bool) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        """Recompute the step's chunk of layer ``layer`` and backpropagate ``dL/dh[layer + 1]`` through it;
        returns the leaves that took gradients: the aggregation, the source rows, the destination rows."""
        block_layer, caching = worker.model.block_layers[layer], layer in self.host.caching
        agg, x_dst, grad_next = step.slices
        assert grad_next is not None
        dst_ids = step.dst_ids()
        xd = x = None
        if caching:  # recompute only UPDATE from the cached aggregation
            assert agg is not None
            agg = agg.detach().requires_grad_(through_propagation)
            if x_dst is not None:
                xd = self._layer_input(worker, layer, x_dst, dst_ids, key).detach().requires_grad_(layer > 0)
            if self._update_by_vjp(layer):  # not even UPDATE recomputed, where the layer has its backward
                h_next = worker.io.view_in_place(self.host.inputs[layer + 1], step.chunk.lo, step.chunk.hi)
                if self._update_vjp(worker, layer, key, dst_ids, agg, xd, grad_next, h_next):
                    return agg, x, xd
            y = block_layer.update(agg, xd)  # type: ignore[arg-type]  # None when UPDATE ignores x_dst
        else:  # recompute the whole layer (GAT)
            block = step.block
            x = self._layer_input(worker, layer, step.source_rows(), block.row_ids(), key)
            x = x.detach().requires_grad_(layer > 0)
            y = block_layer(block, x)
        # the next layer's input backpropagated without its forward where it is ReLU and dropout (no norm)
        grad_y = worker.model.layer_input_vjp(layer + 1, y.detach(), dst_ids, key, grad_next)
        if grad_y is None:
            worker.model.layer_input(layer + 1, y, dst_ids, key).backward(grad_next)
        elif y.requires_grad:
            y.backward(grad_y)
        return agg, x, xd

    def _update_by_vjp(self, layer: int) -> bool:
        """Whether layer ``layer``'s backward skips recomputing UPDATE: a caching layer whose UPDATE has a
        backward of its own (:meth:`~gnnscale.nn.base.BlockLayer.update_vjp`), followed by ReLU and dropout only
        (:meth:`~gnnscale.nn.stack.Stack.layer_input_vjp`), on a CPU that reads its host rows in place (the next
        layer's stored input ``h[layer + 1]`` is then read where it is: ``h > 0`` exactly where ``y > 0`` and the
        dropout kept the element, and elsewhere the gradient is zero either way). On a device, reading
        ``h[layer + 1]`` would move rows: UPDATE is recomputed there (and the counters, which count what a device
        moves, are the same on both paths)."""
        model, layer_obj = self.model, self.model.block_layers[layer]
        return (layer in self.host.caching and model.activation is F.relu
                and isinstance(model.norms[layer], nn.Identity)
                and layer_obj.has_update_vjp
                and all(w.io.in_place for w in self.sweep.group.workers))

    @staticmethod
    def _update_vjp(worker: Worker, layer: int, key: Key, dst_ids: Tensor, agg: Tensor, xd: Tensor | None,
                    grad_next: Tensor, h_next: Tensor) -> bool:
        """``dL/dh[layer + 1]`` through the next layer's input (ReLU, dropout) and UPDATE without their forward
        products; the aggregation's and destination rows' gradients land in ``agg.grad`` and ``xd.grad`` (leaves
        that require them), as autograd would put them. False (nothing done) where the layer's ``update_vjp``
        declines (a residual layer's: its UPDATE has a term the base layer's backward does not know)."""
        grad_y = worker.model.layer_input_vjp(layer + 1, h_next, dst_ids, key, grad_next)
        assert grad_y is not None
        block_layer = worker.model.block_layers[layer]
        grads = block_layer.update_vjp(agg, xd, grad_y, agg.requires_grad, xd is not None and xd.requires_grad)
        if grads is None:
            return False
        if grads[0] is not None:
            agg.grad = grads[0]
        if grads[1] is not None:
            assert xd is not None
            xd.grad = grads[1]
        return True

    # ------------------------------------------------------------------------------------------------ inference
    def predict_last(self, pred: Tensor) -> None:
        """Every vertex's predicted class into host ``pred`` (after the forward of the layers before the last)."""
        layer = self.num_layers - 1
        if layer in self.host.projecting:
            self.project(layer, None)
        src, dst_rows = self.host.source(layer)
        self.sweep.run(LayerPass(src=src, slices=(dst_rows, *self._jk_slices())),
                       partial(self._predict_chunks, layer, pred))

    def _predict_chunks(self, layer: int, pred: Tensor, worker: Worker, steps: Iterator[ChunkStep]) -> None:
        for step in steps:
            with worker.io.compute():  # the chunk's compute; the next step is loaded outside it
                x_dst, *earlier = step.slices
                out = self._apply(worker, layer, step, step.source_rows(), x_dst, None, False)
                prev = [h for h in earlier if h is not None]
                out = self._head(worker, layer, out, prev, step.dst_ids(), None)
                worker.io.store(pred, step.chunk.lo, out.argmax(dim=-1))
