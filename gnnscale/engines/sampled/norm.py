"""BatchNorm over the whole global batch when several trainers of one process compute it together (torch's
``SyncBatchNorm`` semantics, for the mini-batch and hybrid engines' model replicas on threads).

With one trainer a layer's BatchNorm normalises over the batch's rows of that layer (PyG with a NeighborLoader).
With several, each trainer holds the rows its own share's sampled neighbourhoods reach, and a vertex reached from
two shares is a row in both (keyed sampling gives it the same neighbourhood, so the same values, in each). One
step of :class:`BatchNormSync`:

1. every trainer posts the vertex ids of the rows each norm will see (:func:`norm_sites`), and one of them counts
   each vertex's copies over the trainers' shares; each row weighs ``1 / copies`` (:attr:`SplitBatchNorm.row_weight
   <gnnscale.nn.batchnorm.SplitBatchNorm.row_weight>`), so the statistics count each vertex once, as the one
   trainer's deduplicated block does;
2. every norm's forward adds its moments over the trainers, and its backward ``Σ dy`` and ``Σ dy·x̂``
   (:attr:`SplitBatchNorm.reduce <gnnscale.nn.batchnorm.SplitBatchNorm.reduce>`): :class:`TrainerGroup`'s
   rendezvous of the threads, summed on the host in the trainers' order (deterministic; the vectors are a few
   hundred numbers, so moving them to the host costs nothing that matters).

A trainer whose share is empty posts no rows and leaves: the reductions are among the trainers that train. Every
trainer that trains moves its running statistics with the same global moments; the master takes them from one of
those when it had no share (:meth:`BatchNormSync.settle`), and :class:`~gnnscale.engines.core.replicas.Replicas` hands
the master's buffers to the replicas with its parameters.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from concurrent.futures import Executor, Future, wait
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import Tensor

from gnnscale.errors import ConfigError
from gnnscale.graph.block import Block
from gnnscale.nn.batchnorm import SplitBatchNorm, split_norms
from gnnscale.nn.stack import Stack

T = TypeVar("T")


class GroupAborted(RuntimeError):
    """Another trainer of the group failed during the step: this one stops waiting for it."""


@dataclass(eq=False)
class _Round:
    result: Any
    readers: int


class TrainerGroup:
    """Collectives among ``size`` trainer threads of one process: :meth:`exchange` is a rendezvous of the trainers
    named by ``parties`` (a count: every caller of a round passes the same), where the last to arrive combines every
    contribution and each gets the result. Rounds follow one another in the order the trainers call them; each
    call's ``tag`` must match the others' of its round (a trainer calling out of order fails loudly instead of
    adding the wrong vectors)."""

    def __init__(self, size: int):
        self.size = size
        self._cond = threading.Condition()
        self._slots: dict[int, tuple[Hashable, Any]] = {}
        self._parties = 0
        self._generation = 0
        self._rounds: dict[int, _Round] = {}
        self._aborted = False
        self.rounds = 0
        """Rounds completed since created."""
        self.waited = [0.0] * size
        """Seconds each trainer spent waiting for the others (its busy time is the rest)."""

    def exchange(self, rank: int, value: Any, parties: int, tag: Hashable,
                 combine: Callable[[dict[int, Any]], Any]) -> Any:
        """Post ``value`` as trainer ``rank``; once ``parties`` trainers have posted, ``combine`` (called once, on
        ``{rank: value}`` in rank order) gives what every one of them returns."""
        t0 = time.perf_counter()
        with self._cond:
            if self._aborted:
                raise GroupAborted("another trainer failed in this step")
            if self._slots and parties != self._parties:
                self._fail()
                raise RuntimeError(f"trainer {rank} joined a round of {self._parties} trainers as one of {parties}")
            gen, self._parties = self._generation, parties
            self._slots[rank] = (tag, value)
            if len(self._slots) == parties:
                slots = dict(sorted(self._slots.items()))
                self._slots = {}
                tags = {t for t, _ in slots.values()}
                try:
                    if len(tags) > 1:
                        raise RuntimeError(f"trainers reduce different things in one round: {sorted(map(str, tags))}")
                    result = combine({r: v for r, (_, v) in slots.items()})
                except BaseException:
                    self._fail()
                    raise
                if parties > 1:
                    self._rounds[gen] = _Round(result, parties - 1)
                self._generation += 1
                self.rounds += 1
                self._cond.notify_all()
                self.waited[rank] += time.perf_counter() - t0
                return result
            while self._generation == gen and not self._aborted:
                self._cond.wait()
            self.waited[rank] += time.perf_counter() - t0
            if self._generation == gen:
                raise GroupAborted("another trainer failed in this step")
            done = self._rounds[gen]
            done.readers -= 1
            if done.readers == 0:
                del self._rounds[gen]
            return done.result

    def _fail(self) -> None:
        self._aborted = True
        self._cond.notify_all()

    def abort(self) -> None:
        """A trainer failed: every trainer waiting in (or later entering) a round raises :class:`GroupAborted`."""
        with self._cond:
            self._fail()

    def reset(self) -> None:
        """A new step (no trainer inside a round): forget a failed one's rounds."""
        with self._cond:
            self._aborted, self._slots, self._rounds = False, {}, {}


def norm_sites(model: Stack, blocks: Sequence[Block]) -> list[tuple[SplitBatchNorm, Tensor]]:
    """Every :class:`SplitBatchNorm` of ``model`` with the global ids of the rows it normalises in a sampled forward
    over ``blocks`` (:func:`gnnscale.engines.sampled.loop.forward`), in the order they run: ``norms[l - 1]`` on layer
    ``l``'s input rows (block ``l``'s sources), then those inside layer ``l`` (GIN's MLP) on its destinations; with
    ``--jk`` last the last layer's output norm, on the seeds."""
    sites: list[tuple[SplitBatchNorm, Tensor]] = []
    for i, (layer, block) in enumerate(zip(model.layers, blocks, strict=True)):
        if i > 0 and isinstance(model.norms[i - 1], SplitBatchNorm):
            sites.append((model.norms[i - 1], block.row_ids()))  # type: ignore[arg-type]
        sites += [(bn, block.row_ids(block.num_dst)) for bn in split_norms(layer)]
    if model.lin is not None and isinstance(model.norms[-1], SplitBatchNorm):  # --jk: the last output's, at the seeds
        sites.append((model.norms[-1], blocks[-1].row_ids(blocks[-1].num_dst)))  # type: ignore[arg-type]
    if len(sites) != len(split_norms(model)):
        raise ConfigError("--norm batch: a BatchNorm of this model runs outside the sampled layers (--jk); several "
                          "trainers cannot reduce its statistics")
    return sites


def _row_weights(posted: dict[int, list[Tensor] | None]) -> tuple[list[int], dict[int, list[Tensor | None]]]:
    """From every trainer's row ids per site (``None``: no share): the trainers that train, and each one's rows'
    weights per site, ``1 / copies`` (``None`` where every row of its site is its alone)."""
    ranks = [r for r, ids in posted.items() if ids is not None]
    weights: dict[int, list[Tensor | None]] = {r: [] for r in ranks}
    if not ranks:
        return ranks, weights
    sites = len(posted[ranks[0]])  # type: ignore[arg-type]
    for s in range(sites):
        parts = [posted[r][s] for r in ranks]  # type: ignore[index]
        if len(ranks) == 1:
            weights[ranks[0]].append(None)
            continue
        _, inverse, counts = torch.unique(torch.cat(parts), return_inverse=True, return_counts=True)
        for r, copies in zip(ranks, torch.split(counts[inverse], [p.numel() for p in parts]), strict=True):
            weights[r].append(None if copies.numel() == 0 or int(copies.max()) == 1
                              else 1.0 / copies.to(torch.float64))
    return ranks, weights


def wait_all(futures: Sequence[Future[T]]) -> list[T]:
    """Every future's result, once all are done; the first failure that is not :class:`GroupAborted` (the others
    only stopped waiting for it) is raised."""
    wait(futures)
    errors = [e for e in (f.exception() for f in futures) if e is not None]
    if errors:
        raise next((e for e in errors if not isinstance(e, GroupAborted)), errors[0])
    return [f.result() for f in futures]


def _sum(posted: dict[int, Tensor]) -> Tensor:
    """The trainers' vectors added in rank order (the same rounding on every run)."""
    vectors = list(posted.values())
    out = vectors[0].clone()
    for v in vectors[1:]:
        out += v
    return out


class BatchNormSync:
    """SyncBatchNorm for the trainers ``models`` (``models[master]`` the model the optimiser steps) of one process:
    each trainer runs its step inside :meth:`step`; the module docstring says what happens there."""

    def __init__(self, models: Sequence[Stack], master: int = 0):
        self.models, self.master = list(models), master
        self.group = TrainerGroup(len(self.models))
        self.trained: list[int] = []
        """The trainers that trained in the last step (the others' shares were empty)."""
        self.reductions = 0
        """Moment and gradient-sum vectors reduced since created (one per norm call and one per its backward)."""
        self.reduced_bytes = 0
        """Bytes those vectors held (each trainer's), the statistics traffic."""

    @classmethod
    def build(cls, models: Sequence[Stack], master: int = 0) -> BatchNormSync | None:
        """The sync for several trainers of a model with BatchNorm; ``None`` (nothing to reduce) otherwise."""
        if len(models) < 2 or not split_norms(models[master]):
            return None
        return cls(models, master)

    def begin(self) -> None:
        """Before a step's trainers start (from the thread that starts them)."""
        self.group.reset()
        self.group.waited = [0.0] * self.group.size
        self.trained = []

    def abort(self) -> None:
        """Trainer failed outside :meth:`step` (before it could post its rows): the others stop waiting."""
        self.group.abort()

    @contextmanager
    def step(self, rank: int, blocks: Sequence[Block] | None) -> Iterator[bool]:
        """Trainer ``rank``'s step on its share's ``blocks`` (``None``: an empty share): every trainer enters it
        once per step, from its own thread. Its norms reduce over the trainers that train while inside; yields
        whether this trainer trains."""
        sites: list[tuple[SplitBatchNorm, Tensor]] = []
        try:
            sites = [] if blocks is None else norm_sites(self.models[rank], blocks)
            ids = None if blocks is None else [r.detach().to("cpu") for _, r in sites]
            trained, weights = self.group.exchange(rank, ids, self.group.size, "rows", self._rows)
            if blocks is not None:
                for j, ((bn, rows), w) in enumerate(zip(sites, weights[rank], strict=True)):
                    bn.reduce = functools.partial(self._reduce, rank, j, len(trained))
                    bn.row_weight = None if w is None else w.to(rows.device)
            yield blocks is not None
        except BaseException:
            self.group.abort()
            raise
        finally:
            for bn, _ in sites:
                bn.reduce, bn.row_weight = None, None

    def _rows(self, posted: dict[int, list[Tensor] | None]) -> tuple[list[int], dict[int, list[Tensor | None]]]:
        trained, weights = _row_weights(posted)
        self.trained = trained
        return trained, weights

    def _reduce(self, rank: int, site: int, parties: int, v: Tensor) -> Tensor:
        """Norm ``site``'s vector ``v`` of trainer ``rank`` added over the ``parties`` trainers that train."""
        out: Tensor = self.group.exchange(rank, v.detach().to("cpu", torch.float64), parties, (site, v.numel()),
                                          self._count_sum)
        return out.to(v.device, copy=True)

    def _count_sum(self, posted: dict[int, Tensor]) -> Tensor:
        """:func:`_sum`, counted (called by one trainer at a time, under the group's lock)."""
        self.reductions += 1
        self.reduced_bytes += sum(v.numel() * v.element_size() for v in posted.values())
        return _sum(posted)

    def traffic(self) -> dict[str, int]:
        """The epoch record's ``norm_reduced_bytes`` since the last call (the statistics traffic), and a new count."""
        out, self.reduced_bytes = {"norm_reduced_bytes": self.reduced_bytes}, 0
        return out

    def settle(self) -> None:
        """After a step (from the thread that ran it): the master's running statistics are those every trainer
        that trained computed; a master without a share takes them from the first of those."""
        if not self.trained or self.master in self.trained:
            return
        source = self.models[self.trained[0]]
        with torch.no_grad():
            for mine, theirs in zip(split_norms(self.models[self.master]), split_norms(source), strict=True):
                for name in ("running_mean", "running_var", "num_batches_tracked"):
                    a, b = getattr(mine, name), getattr(theirs, name)
                    if a is not None and b is not None:
                        a.copy_(b)


def run_trainers(sync: BatchNormSync | None, pool: Executor, fn: Callable[[int], T], trainers: int) -> list[T]:
    """``fn(g)`` for every trainer ``g`` on ``pool`` (a thread each), as one step of ``sync`` when there is one:
    begun before, settled after; the first real failure raised."""
    if sync is not None:
        sync.begin()
    out = wait_all([pool.submit(fn, g) for g in range(trainers)])
    if sync is not None:
        sync.settle()
    return out


def traffic(sync: BatchNormSync | None) -> dict[str, int]:
    """:meth:`BatchNormSync.traffic`, nothing without a sync."""
    return {} if sync is None else sync.traffic()


def waited(sync: BatchNormSync | None, rank: int) -> float:
    """Seconds trainer ``rank`` has waited for the others in this step (0 without a sync)."""
    return 0.0 if sync is None else sync.group.waited[rank]


@contextmanager
def kept_buffers(module: torch.nn.Module) -> Iterator[None]:
    """``module``'s buffers (BatchNorm's running statistics) as they were before the block: runs that must leave no
    trace in the model (the hybrid engine's calibration)."""
    saved = [b.clone() for b in module.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, s in zip(module.buffers(), saved, strict=True):
                b.copy_(s)
