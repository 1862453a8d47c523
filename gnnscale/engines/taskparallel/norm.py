"""BatchNorm in the task-parallel engine: statistics over every vertex while the T tasks run subgraph by subgraph.

A decoupled model with ``--norm batch`` normalises the output of each hidden T task with a
:class:`~gnnscale.nn.batchnorm.SplitBatchNorm` (``norms[j]``, applied at the start of T task ``j + 1``). The T stages
compute a subgraph's rows at a time, on several devices (each a replica of the model), so each norm gets two extra
passes per epoch over every subgraph, barriers the pipeline waits for (:mod:`gnnscale.nn.batchnorm` says why they
make the result exact):

* a **statistics pass** per norm, in forward order, before the T forward: each subgraph runs the T stages up to
  T task ``j`` (features read again, hand-offs counted as ever; nothing kept) and the stage that computes it gives its
  output to its replica's norm, which sums the rows' moments. The replicas' sums are added on the host and every
  replica's norm freezes the same statistics of all vertices (and moves its running statistics once, as one
  BatchNorm1d call on the whole graph does).
* a **gradient-sums pass** per norm, in backward order, once every P backward is done (so ``--dependency skip``
  starts no T backward before the last P backward) and before the T backward: each subgraph recomputes the T stages
  (NeutronTask §5.1, as the T backward itself does) and backpropagates ``dL/dH^0`` down to the norm without touching
  a parameter's gradient; the norm sums ``Σ dy`` and ``Σ dy·x̂``, the sums are added over the replicas, and the T
  backward then gives every row its exact gradient.

Running statistics: every replica's norm moves them with the same sums, and :meth:`NormPasses.sync_buffers` copies
the master's into the replicas before each epoch and prediction (a checkpoint loads only the master).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future
from functools import partial
from typing import Any

import torch
from torch import Tensor

from gnnscale.engines.taskparallel.runner import Runner
from gnnscale.engines.taskparallel.tasks import TaskOps
from gnnscale.nn.batchnorm import SplitBatchNorm, end_grad_sums_together, end_stats_together

Key = tuple[int, int]
"""``(T stage, subgraph)``."""


def _wait(futures: Iterable[Future[Any]]) -> None:
    errors = [e for e in (f.exception() for f in futures) if e is not None]
    if errors:
        raise errors[0]


class NormPasses:
    """The statistics and gradient-sums passes of a decoupled model's BatchNorms (none: :attr:`active` is false).

    ``queue_depth``: with several T stages, how many subgraphs' passes (times the largest T group) may be under way
    at once (the outputs handed between stages wait in memory meanwhile)."""

    def __init__(self, tasks: TaskOps, runners: list[Runner], queue_depth: int = 2):
        self.tasks, self.runners = tasks, runners
        self.ids = [j for j, m in enumerate(runners[0].model.norms) if isinstance(m, SplitBatchNorm)]
        """The norms that are BatchNorms (``norms[j]``: T task ``j``'s output)."""
        self.in_flight = queue_depth * max(len(st.devices) for st in tasks.t_stages)
        self.passes = 0
        """Passes this epoch (one statistics and one gradient-sums pass per BatchNorm)."""
        self.reduced_bytes = 0
        """Bytes of the float64 sums added over the replicas this epoch."""

    @property
    def active(self) -> bool:
        return bool(self.ids)

    def copies(self, j: int) -> list[SplitBatchNorm]:
        """``norms[j]`` on every runner's replica (the master's first)."""
        out = []
        for r in self.runners:
            bn = r.model.norms[j]
            assert isinstance(bn, SplitBatchNorm)
            out.append(bn)
        return out

    def sync_buffers(self) -> None:
        """The replicas' norms take the master's running statistics (:class:`~gnnscale.engines.core.replicas.Replicas`
        copies parameters only)."""
        for j in self.ids:
            master, *replicas = self.copies(j)
            with torch.no_grad():
                for bn in replicas:
                    for mine, theirs in zip(bn.buffers(), master.buffers(), strict=True):
                        mine.copy_(theirs)

    def start(self) -> None:
        self.passes = self.reduced_bytes = 0

    def release(self) -> None:
        """Every BatchNorm back to a plain one (the end of an epoch, or a failed one)."""
        for j in self.ids:
            for bn in self.copies(j):
                bn.release()

    def _stage_of(self, task: int) -> int:
        return next(k for k, st in enumerate(self.tasks.t_stages) if st.start <= task < st.stop)

    def _bounded(self, chain_ends: list[Future[Any]], s: int) -> list[Future[Any]]:
        """With several T stages, subgraph ``s``'s pass waits for subgraph ``s - in_flight``'s to end."""
        if len(self.tasks.t_stages) > 1 and s >= self.in_flight:
            return [chain_ends[s - self.in_flight]]
        return []

    # ------------------------------------------------------------------------------------------- statistics
    def statistics(self, se: tuple[int, int]) -> None:
        """The statistics pass of every BatchNorm, in forward order (each normalising the passes after it)."""
        tasks = self.tasks
        for j in self.ids:
            copies = self.copies(j)
            for bn in copies:
                bn.begin_stats()
            outs: dict[Key, Tensor] = {}
            ends: list[Future[Any]] = []
            for s in range(len(tasks.subs)):
                fut: Future[Any] | None = None
                for k, stage in enumerate(tasks.t_stages[: self._stage_of(j) + 1]):
                    deps = [fut] if fut is not None else self._bounded(ends, s)
                    fut = tasks.t_runner(stage, s).submit("TS", partial(self._forward, outs, k, s, se, j), deps)
                assert fut is not None
                ends.append(fut)
            _wait(ends)
            self.reduced_bytes += end_stats_together(copies)
            self.passes += 1

    def _forward(self, outs: dict[Key, Tensor], k: int, s: int, se: tuple[int, int], norm: int | None,
                 keep_input: bool = False) -> None:
        """Stage ``k`` of a pass for subgraph ``s``: its input taken from ``outs`` (left there with
        ``keep_input``: the gradient-sums pass reads it again), its output put there (none from the norm's)."""
        prev = (outs.get if keep_input else outs.pop)((k - 1, s), None)  # dict get/pop/set: atomic across threads
        out = self.tasks.t_partial(k, s, prev, se, norm)
        if out is not None:
            outs[(k, s)] = out

    # ------------------------------------------------------------------------------------------- gradient sums
    def gradient_sums(self, se: tuple[int, int]) -> None:
        """The gradient-sums pass of every BatchNorm, in backward order; every P backward must be done."""
        tasks = self.tasks
        K = len(tasks.t_stages)
        for j in reversed(self.ids):
            copies = self.copies(j)
            for bn in copies:
                bn.begin_grad_sums()
            kn = self._stage_of(j + 1)  # the stage applying the norm
            outs: dict[Key, Tensor] = {}
            grads: dict[Key, Tensor] = {}
            ends: list[Future[Any]] = []
            for s in range(len(tasks.subs)):
                fwd: dict[int, Future[Any]] = {}
                for k in range(K - 1):  # every stage's input, recomputed
                    deps = [fwd[k - 1]] if k else self._bounded(ends, s)
                    fwd[k] = tasks.t_runner(tasks.t_stages[k], s).submit(
                        "TG", partial(self._forward, outs, k, s, se, None, k >= kn), deps)
                fut: Future[Any] | None = None
                for k in range(K - 1, kn - 1, -1):
                    deps = [f for f in (fwd.get(k - 1), fut) if f is not None] or self._bounded(ends, s)
                    fut = tasks.t_runner(tasks.t_stages[k], s).submit(
                        "TG", partial(self._backward, outs, grads, k, s, se, j), deps)
                assert fut is not None
                ends.append(fut)
            _wait(ends)
            self.reduced_bytes += end_grad_sums_together(copies)
            self.passes += 1

    def _backward(self, outs: dict[Key, Tensor], grads: dict[Key, Tensor], k: int, s: int, se: tuple[int, int],
                  norm: int) -> None:
        """Stage ``k``'s part in the gradient-sums pass for subgraph ``s``: its output's gradient is ``dL/dH^0``
        (the last stage) or the next stage's input gradient, handed over."""
        tasks = self.tasks
        prev = outs.pop((k - 1, s), None)
        if k == len(tasks.t_stages) - 1:
            grad: Callable[[Runner], Tensor] = partial(tasks.subgraph_grad, s, keep=True)
        else:
            up, sender = grads.pop((k + 1, s)), tasks.t_runner(tasks.t_stages[k + 1], s)
            grad = partial(_handed, up, sender)
        gx = tasks.t_grad_sums(k, s, prev, grad, se, norm)
        if gx is not None:
            grads[(k, s)] = gx


def _handed(t: Tensor, sender: Runner, r: Runner) -> Tensor:
    return r.receive(t, sender, "t2t")
