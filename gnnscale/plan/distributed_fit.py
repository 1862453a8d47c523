"""How the distributed traffic model (:mod:`gnnscale.plan.distributed_time`) turns counted work into this machine's
seconds: fits of the engine's training step (:class:`ComputeFit`), of an exchange's local work
(:class:`ExchangeFit`) and of the local work around the synchronisations (:class:`SyncFit`), each timed on the
engine's own code (one thread, as a rank has) or given (tests)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from gnnscale.graph.block import Block

FIT_STEPS = 6
"""Replayed steps timed for :class:`ComputeFit` (and one of a single root)."""

StepFn = Callable[[list[Block], Tensor], None]
"""Forward and backward of a model over sampled blocks and their seeds (the engine's; timed by the fit)."""
ExchangeFn = Callable[[Tensor, list[Tensor], Tensor], None]
"""Rank 0's local work of one exchange (the engine's, without its collectives): every vertex's rank, the input ids
of its steps (each step's unique ids) and the ids its peers asked it for (timed by :class:`ExchangeFit`)."""
SyncFn = Callable[[int], None]
"""A rank's local work around its collectives: ``0``, an iteration's (flattening the gradients, the optimiser's
step); ``1``, a model migration's (flattening and unflattening a model and its gradients) (timed by
:class:`SyncFit`)."""
FIT_EXCHANGES = 4
"""Replayed exchanges timed for :class:`ExchangeFit` (rank 0's)."""


def _best(fn: Callable[[], None], runs: int = 3) -> float:
    """The fastest of ``runs`` timed calls of ``fn``."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


@dataclass(frozen=True)
class ExchangeFit:
    """Real seconds of an exchange's local work on a rank, beyond its collectives: ``fixed + per_row x rows``
    (``rows``: those it receives and serves). The engine looks up the ids' owners, de-duplicates and sorts them,
    serves its peers' requests from its part and stitches the rows it received back in order; none of it overlaps
    the network (the emulated one sleeps only inside the collectives)."""

    fixed: float = 0.0
    per_row: float = 0.0

    def seconds(self, rows: float) -> float:
        return self.fixed + self.per_row * rows

    @classmethod
    def timed(cls, work: ExchangeFn, owner: Tensor, samples: list[tuple[list[Tensor], Tensor, int]]) -> ExchangeFit:
        """Time ``work`` on replayed exchanges (``(step inputs, served ids, rows received and served)``, the best
        of three each, one thread) and on an empty one (the fixed cost)."""
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            empty = torch.empty(0, dtype=torch.int64)
            fixed = _best(lambda: work(owner, [empty], empty))
            ratios = [max(_best(lambda s=s, v=v: work(owner, s, v)) - fixed, 0.0) / n  # type: ignore[misc]
                      for s, v, n in samples if n > 0]
        finally:
            torch.set_num_threads(threads)
        return cls(fixed, statistics.median(ratios) if ratios else 0.0)


@dataclass(frozen=True)
class SyncFit:
    """Real seconds of a rank's local work around the gradient all-reduce and the model migrations: ``iteration``
    (flattening the gradients for the all-reduce, the optimiser's step) and ``migration`` (a model and its
    gradients flattened to be sent and unflattened when received)."""

    iteration: float = 0.0
    migration: float = 0.0

    @classmethod
    def timed(cls, work: SyncFn) -> SyncFit:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return cls(_best(lambda: work(0), 5), _best(lambda: work(1), 5))
        finally:
            torch.set_num_threads(threads)


@dataclass(frozen=True)
class ComputeFit:
    """Real seconds of a training step from its counted work ``w`` (:func:`work_seconds`): ``fixed + scale x w``
    (``fixed``: a step's cost beyond its work -- Python, autograd, kernel launches; ``scale``: real over counted
    seconds, for what the counts leave out, such as building a block's transpose for the backward)."""

    fixed: float = 0.0
    scale: float = 1.0

    def seconds(self, work: float) -> float:
        return self.fixed + self.scale * work if work > 0 else 0.0

    @classmethod
    def timed(cls, step: StepFn, samples: list[tuple[list[Block], Tensor, float]],
              one: tuple[list[Block], Tensor, float] | None) -> ComputeFit:
        """Time ``step`` on replayed steps (``(blocks, seeds, work)``, the best of two runs each, one thread as a
        rank has) and on a single-root step ``one`` (the fixed cost)."""
        def best(blocks: list[Block], seeds: Tensor) -> float:
            times = []
            for _ in range(2):
                t0 = time.perf_counter()
                step(blocks, seeds)
                times.append(time.perf_counter() - t0)
            return min(times)

        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # a rank's (the launcher's OMP_NUM_THREADS=1)
        try:
            fixed = best(one[0], one[1]) if one is not None else 0.0
            ratios = [max(best(b, s) - fixed, 0.0) / w for b, s, w in samples if w > 0]
        finally:
            torch.set_num_threads(threads)
        return cls(fixed, statistics.median(ratios) if ratios else 1.0)
