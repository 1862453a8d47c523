"""The sampled training loop: one loop for every engine that trains on sampled neighbourhoods (mini-batch, hybrid,
distributed, and any new one), nanoGPT's loop with its parts plugged in.

One epoch, :meth:`SampledLoop.run`::

    batches = the epoch's keyed order of the training vertices, cut into global batches      # epoch_order
    for each global batch (from a checkpoint's iteration on, when resuming):
        item = next(feed)           # seeds -> keyed sample -> fetch features: inline, ahead on threads, a pipeline
        zero the gradients
        train(item, batch size)     # forward and backward of every trainer's share, wherever the trainers sit
        reducer.reduce()            # the trainers' gradients summed where the optimiser steps
        optimizer.step()
        reducer.sync()              # every trainer takes the new parameters
        after(step)                 # the engine's own look at the step (HyScale-GNN's DRM)
        on_iteration(epoch, done)   # iteration checkpoints (progress and counters kept for a resume)

An engine specialises the loop by the parts it passes, never by overriding it:

* the **feed** (``feed(batches, first) -> iterable``) prepares each global batch's inputs: the mini-batch engine's
  producer thread per trainer (XGNN), the hybrid engine's four-stage :class:`~gnnscale.engines.core.pipeline.Pipeline`
  (HyScale-GNN), the distributed engine's batches as they are (its strategies sample and exchange rows as they
  train);
* **train** (``train(item, total)``) runs every trainer's forward and backward: one thread per device over model
  replicas (:class:`~gnnscale.engines.core.replicas.Replicas`), or one rank's model, hopping between ranks (HopGNN);
* the **reducer** (:class:`GradientReducer`) sums the gradients: the replicas' into the master, or an all-reduce
  between ranks.

What every sampled engine shares besides the loop lives here too: the epoch's order (:func:`epoch_order`), the
fanouts (:func:`default_fanouts`, :func:`check_fanouts`), one trainer's share of a batch (:class:`SampledBatch`),
its forward (:func:`forward`) and backward (:func:`backward_share`), and the counters (:class:`SampledCounters`).
Evaluation is :mod:`gnnscale.engines.sampled.eval`'s; the common set-up (fanouts, masks, training vertices, the
blocks' adjacency) :class:`~gnnscale.engines.sampled.engine.SampledEngine`'s.

Sampling is keyed by ``(seed, epoch, hop, vertex)`` (:func:`gnnscale.sample.sample_key`), and each share's loss is
its summed loss over the global batch's size: a step equals one trainer's step on the whole batch whatever the
trainers, devices, ranks or shares, which the exactness tests check engine against engine.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor

from gnnscale.errors import ConfigError
from gnnscale.graph.block import Block
from gnnscale.nn.stack import Stack
from gnnscale.sample import SampledAdjacency, Topology, sample_blocks

if TYPE_CHECKING:
    from gnnscale.config import TrainConfig

T = TypeVar("T")
R = TypeVar("R")

EVAL_BATCH = 16384
"""Destinations per step of layer-wise inference (at least ``--batch-size``): few large steps, no sampling."""
EVAL_EPOCH = -1
"""The epoch number keying sampled evaluation (``--eval-fanouts``): the same sample at every evaluation."""


# ------------------------------------------------------------------------------------------------ batches
def epoch_order(seed: int, epoch: int, n: int) -> Tensor:
    """The epoch's shuffle of ``n`` training vertices, a function of seed and epoch only: every sampled engine
    (mini-batch, hybrid, distributed; every rank) cuts its batches from the same order."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=gen)


def default_fanouts(layers: int) -> tuple[int, ...]:
    """``15, 10`` for two layers (PyG/DGL's usual), 10 per hop otherwise."""
    return (15, 10) if layers == 2 else (10,) * layers


def model_depth(config: TrainConfig, model: Stack | None = None) -> int:
    """How many layers the sampled blocks feed (one fanout per layer): ``model``'s, a user's model
    (``train(model=...)``, ``--model-factory``); else ``config.layers`` (the built-in model's)."""
    return config.layers if model is None else len(model.layers)


def check_fanouts(config: TrainConfig, *, evaluation: bool = False) -> None:
    """``--fanouts`` (and with ``evaluation``, ``--eval-fanouts``) give one value per layer, or none. Not with
    ``--model-factory``: the factory's model says how many layers there are (:func:`sampling_reasons` checks
    them when it is built)."""
    if config.model_factory is not None:
        return
    hint = " (with a model of your own, also set layers to its number of convs)"
    if config.fanouts is not None and len(config.fanouts) != config.layers:
        raise ConfigError(f"--fanouts has {len(config.fanouts)} value(s) for {config.layers} layers; give one per "
                          f"layer{hint}")
    if evaluation and config.eval_fanouts is not None and len(config.eval_fanouts) != config.layers:
        raise ConfigError(f"--eval-fanouts has {len(config.eval_fanouts)} value(s) for {config.layers} layers"
                          f"{hint}")


def sampling_reasons(config: TrainConfig, model: Stack | None = None) -> list[str]:
    """Why sampled training (any sampled engine) cannot train ``config``'s model, or ``model`` (a user's): a
    fanout per layer of it."""
    layers = model_depth(config, model)
    whose = "layers" if model is None else "layers of the model"
    fanouts = config.fanouts or default_fanouts(layers)
    reasons = []
    if len(fanouts) != layers:
        reasons.append(f"--fanouts has {len(fanouts)} values for {layers} {whose}")
    if config.eval_fanouts is not None and len(config.eval_fanouts) != layers:
        reasons.append(f"--eval-fanouts has {len(config.eval_fanouts)} values for {layers} {whose}")
    return reasons


def cut(batch: Tensor, split: Sequence[float]) -> list[Tensor]:
    """Trainer ``g``'s share of ``batch`` under ``split`` (fractions summing to 1): seeds
    ``[round(n c_{g-1}), round(n c_g))`` of the batch, ``c`` the cumulative split."""
    cum = torch.cumsum(torch.tensor(split, dtype=torch.float64), 0)[:-1]
    bounds = torch.round(cum * batch.numel()).long().tolist()
    return list(torch.tensor_split(batch, bounds))


@dataclass(eq=False)
class SampledBatch:
    """One trainer's share of a global batch, sampled and fetched: its seeds, the blocks (``blocks[0]`` the input
    layer's, whose ``src_ids`` are the fetched rows of ``x``), and the seconds sampling and fetching took."""

    seeds: Tensor
    blocks: list[Block]
    x: Tensor
    sample_s: float = 0.0
    extract_s: float = 0.0
    ready: Any = None
    """Set where the share was made on another stream: an event training waits for (CUDA)."""


def fetch_batch(topology: Topology, features: Callable[[Tensor], Tensor], seeds: Tensor, fanouts: Sequence[int],
                key: int, adjacency: SampledAdjacency | None = None) -> SampledBatch:
    """Seeds -> keyed sample -> fetched input rows: ``seeds``' blocks sampled from ``topology`` (with ``key``, on
    ``seeds``' device; ``adjacency`` makes them the layers'), then the rows of their input vertices from
    ``features``; each step timed. The batch's seeds are the last block's destinations (``seeds``, where the
    sample was made)."""
    t0 = time.perf_counter()
    blocks = sample_blocks(topology, seeds, fanouts, key, adjacency)
    t1 = time.perf_counter()
    src = blocks[0].src_ids
    assert src is not None
    x = features(src)
    return SampledBatch(blocks[-1].row_ids(blocks[-1].num_dst), blocks, x, t1 - t0, time.perf_counter() - t1)


def inline_feed(topology: Topology, features: Callable[[Tensor], Tensor], fanouts: Sequence[int], key: int,
                adjacency: SampledAdjacency | None = None) -> Callable[[list[Tensor], int], Iterator[SampledBatch]]:
    """The simplest feed: each global batch sampled and fetched (:func:`fetch_batch`) when the loop asks for it,
    nothing ahead."""

    def feed(batches: list[Tensor], first: int) -> Iterator[SampledBatch]:
        del first
        for seeds in batches:
            yield fetch_batch(topology, features, seeds, fanouts, key, adjacency)

    return feed


def forward(model: Stack, blocks: Sequence[Block], x: Tensor, se: tuple[int, int] | None) -> Tensor:
    """``[num_dst of the last block, C]`` logits of ``model`` over sampled ``blocks`` from input rows ``x``;
    dropout keyed by ``se = (seed, epoch)`` (``None``: none, as in evaluation). With ``--jk`` the head combines
    every layer's output at the seeds (the leading rows of every block)."""
    h, hs = x, []
    seeds = blocks[-1].num_dst
    for i, (layer, block) in enumerate(zip(model.block_layers, blocks, strict=True)):
        h = model.layer_input(i, h, block.row_ids(), se)
        if i > 0 and model.lin is not None:
            hs.append(h[:seeds])  # normalised over the layer's rows, as without --jk; kept at the seeds
        h = layer(block, h)
    if model.lin is None:
        return h
    return model.head([*hs, model.layer_input(len(blocks), h, blocks[-1].row_ids(seeds), se)])


def backward_share(logits: Tensor, labels: Tensor, total: int) -> Tensor:
    """Backward of one share of a global batch of ``total`` seeds: its summed loss over ``total`` (the trainers'
    gradients then sum to the whole batch's mean loss). Returns that loss, detached."""
    loss = F.cross_entropy(logits, labels, reduction="sum") / total
    loss.backward()
    return loss.detach()


# ------------------------------------------------------------------------------------------------ counters
TRAINER_COUNTERS = ("loss_sum", "seeds", "sampled_edges", "sample_s", "extract_s", "train_s")
"""What every trainer counts over an epoch by default: its summed loss (over its seeds), its seeds, the edges of
its sampled blocks, and the seconds it spent sampling, fetching input rows (extraction) and training (forward
and backward)."""


class SampledCounters:
    """One epoch's counters of sampled training: one record per trainer (a device of this process, or this rank),
    updated only by its trainer (trainers run on threads of their own), and the loop's: ``iterations`` (optimiser
    steps) and ``sync_s`` (seconds reducing gradients, stepping and handing the parameters back).

    A trainer's summed loss may be a tensor on its device (no host sync per batch); :meth:`state` turns it into a
    number."""

    def __init__(self, trainers: int = 1, keys: Sequence[str] = TRAINER_COUNTERS):
        self.keys = tuple(keys)
        self.trainers: list[dict[str, Any]] = [dict.fromkeys(self.keys, 0.0) for _ in range(trainers)]
        self.iterations = 0
        self.sync_s = 0.0

    def __getitem__(self, t: int) -> dict[str, Any]:
        """Trainer ``t``'s counters (for it alone to update)."""
        return self.trainers[t]

    def took(self, t: int, batch: SampledBatch) -> None:
        """Trainer ``t`` took ``batch``: its seeds, sampled edges and the seconds it took to make."""
        c = self.trainers[t]
        c["seeds"] += batch.seeds.numel()
        c["sampled_edges"] += sum(b.num_edges for b in batch.blocks)
        c["sample_s"] += batch.sample_s
        c["extract_s"] += batch.extract_s

    def total(self, key: str) -> float:
        """``key`` summed over the trainers."""
        return sum(float(c[key]) for c in self.trainers)

    def per_trainer(self, key: str) -> list[int]:
        """``key`` of every trainer, as integers (seeds, edges)."""
        return [int(c[key]) for c in self.trainers]

    def record(self, keys: Sequence[str] = ("sample_s", "extract_s", "train_s")) -> dict[str, Any]:
        """The epoch's record: ``loss`` (mean over the seeds trained), ``batches``, ``trainers``, the seconds of
        ``keys`` summed over the trainers, ``sampled_edges``, and per trainer its seeds and sampled edges."""
        seeds = self.total("seeds")
        out: dict[str, Any] = {"loss": self.total("loss_sum") / seeds if seeds else float("nan"),
                               "batches": self.iterations, "trainers": len(self.trainers)}
        out.update({k: self.total(k) for k in keys})
        out["sampled_edges"] = int(self.total("sampled_edges"))
        out["trainer_seeds"] = self.per_trainer("seeds")
        out["trainer_sampled_edges"] = self.per_trainer("sampled_edges")
        return out

    def state(self) -> dict[str, float]:
        """Every counter as numbers, flat (a checkpoint's progress): the trainers' under their own names when there
        is one trainer, as ``name.t`` otherwise; ``iterations`` and ``sync_s``."""
        one = len(self.trainers) == 1
        out = {(k if one else f"{k}.{t}"): float(v) for t, c in enumerate(self.trainers) for k, v in c.items()}
        out.update(iterations=float(self.iterations), sync_s=self.sync_s)
        return out

    def load(self, state: dict[str, float]) -> None:
        """Take back what :meth:`state` returned (a resume within an epoch)."""
        one = len(self.trainers) == 1
        for t, c in enumerate(self.trainers):
            for k in c:
                c[k] = state[k if one else f"{k}.{t}"]
        self.iterations, self.sync_s = int(state["iterations"]), state["sync_s"]


# ------------------------------------------------------------------------------------------------ the loop
class GradientReducer(Protocol):
    """Where the trainers' gradients meet: :meth:`reduce` sums them into the model the optimiser steps, and
    :meth:`sync` hands the stepped parameters back to every trainer (model replicas in one process:
    :class:`~gnnscale.engines.core.replicas.Replicas`; ranks: an all-reduce)."""

    def reduce(self) -> None: ...

    def sync(self) -> None: ...


class NoReducer:
    """One trainer on the model the optimiser steps: nothing to sum, nothing to hand back."""

    def reduce(self) -> None:
        pass

    def sync(self) -> None:
        pass


@dataclass
class Step(Generic[T, R]):
    """One optimiser step of :meth:`SampledLoop.run`, as its ``after`` hook sees it."""

    index: int
    """The iteration (0-based) within the epoch."""
    item: T
    """What the feed gave for it."""
    result: R
    """What ``train`` returned for it."""
    sync_s: float
    """Seconds reducing, stepping and syncing."""


class SampledLoop:
    """The sampled training loop (see the module docstring) over ``train_ids``, global batches of ``batch_size``
    seeds, gradients summed by ``reducer``.

    Args:
        optimizer: steps the model the reducer sums the gradients into.
        train_ids: ``[n]`` the training vertices.
        seed: keys the epochs' orders.
        batch_size: seeds per global batch (every trainer's shares together).
        reducer: sums the trainers' gradients and hands the parameters back.
        gather: every process's counters from this one's (the ranks of a job exchange them for an iteration
            checkpoint; ``None``: this process alone).
        rank: this process's index in what ``gather`` returns.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, train_ids: Tensor, *, seed: int, batch_size: int,
                 reducer: GradientReducer,
                 gather: Callable[[dict[str, float]], list[dict[str, float]]] | None = None, rank: int = 0):
        self.optimizer, self.train_ids, self.seed, self.batch_size = optimizer, train_ids, seed, batch_size
        self.reducer, self.gather, self.rank = reducer, gather, rank
        self.on_iteration: Callable[[int, int], None] | None = None
        """Called after every optimiser step but an epoch's last with ``(epoch, iterations done)``: iteration
        checkpoints (:attr:`progress` then holds what a resume needs)."""
        self.progress: dict[str, Any] | None = None
        """While :attr:`on_iteration` runs: the epoch, the iterations done and every process's counters."""
        self.resume: dict[str, Any] | None = None
        """A checkpoint's :attr:`progress`: the next :meth:`run` of its epoch starts after its iterations."""

    def order(self, epoch: int) -> Tensor:
        """The training vertices in ``epoch``'s order (:func:`epoch_order`)."""
        return self.train_ids[epoch_order(self.seed, epoch, self.train_ids.numel())]

    def batches(self, epoch: int) -> list[Tensor]:
        """``epoch``'s global batches, ``batch_size`` seeds each (the last one shorter)."""
        return list(torch.split(self.order(epoch), self.batch_size))

    def gradients(self, train: Callable[[], R]) -> R:
        """The gradients of one global batch, summed where the optimiser steps: cleared, computed by ``train``,
        reduced."""
        self.optimizer.zero_grad(set_to_none=True)
        out = train()
        self.reducer.reduce()
        return out

    def step(self) -> None:
        """The optimiser's step, and the trainers take the new parameters."""
        self.optimizer.step()
        self.reducer.sync()

    def run(self, epoch: int, feed: Callable[[list[Tensor], int], Iterable[T]], train: Callable[[T, int], R],
            counters: SampledCounters, after: Callable[[Step[T, R]], None] | None = None) -> list[Tensor]:
        """Train epoch ``epoch``; returns its global batches.

        Args:
            feed: ``feed(batches, first)``: what ``train`` takes for each of ``batches`` (the epoch's global batches
                from iteration ``first`` on), in order; closed (when it has ``close``) once the epoch ends.
            train: ``train(item, total)``: every trainer's forward and backward on its share of a global batch of
                ``total`` seeds; its gradients are the reducer's.
            counters: the epoch's; a resumed epoch starts from the checkpoint's.
            after: sees every step once the trainers hold the new parameters.
        """
        batches = self.batches(epoch)
        first = 0
        if self.resume is not None and self.resume["epoch"] == epoch:
            first = int(self.resume["iteration"])
            counters.load(self.resume["counters"][self.rank])
        self.resume = None
        work = feed(batches[first:], first)
        try:
            for index, (batch, item) in enumerate(zip(batches[first:], work, strict=False), first):
                self.optimizer.zero_grad(set_to_none=True)
                result = train(item, batch.numel())
                t0 = time.perf_counter()
                self.reducer.reduce()
                self.step()
                sync_s = time.perf_counter() - t0
                counters.sync_s += sync_s
                counters.iterations += 1
                if after is not None:
                    after(Step(index, item, result, sync_s))
                if self.on_iteration is not None and index + 1 < len(batches):
                    self._checkpoint(epoch, index + 1, counters, self.on_iteration)
        finally:
            close = getattr(work, "close", None)
            if close is not None:
                close()
        return batches

    def _checkpoint(self, epoch: int, done: int, counters: SampledCounters,
                    hook: Callable[[int, int], None]) -> None:
        state = counters.state()
        self.progress = {"epoch": epoch, "iteration": done,
                         "counters": self.gather(state) if self.gather is not None else [state]}
        try:
            hook(epoch, done)
        finally:
            self.progress = None
