"""What every engine that trains on sampled neighbourhoods sets up the same way, and how it evaluates.

:class:`SampledEngine` holds the common set-up (the fanouts, the masks, the training vertices, the adjacency the
sampled blocks carry) and evaluation through the engine's :class:`~gnnscale.engines.sampled.eval.SampledInference`;
each engine composes its :class:`~gnnscale.engines.sampled.loop.SampledLoop` from its own parts (the feed, the
trainers, the reducer) and calls it from ``train_epoch``. A new sampled engine is one module: a subclass that
calls this constructor, builds its ``loop`` and ``inference``, and writes ``train_epoch`` as one
:meth:`SampledLoop.run <gnnscale.engines.sampled.loop.SampledLoop.run>`; with :class:`IterationCheckpoints` it also
checkpoints within epochs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from gnnscale.engines.core.base import Engine
from gnnscale.engines.core.disk_tier import DiskTier
from gnnscale.engines.sampled.eval import EVAL_READ_RATIO, SampledInference, eval_ids
from gnnscale.engines.sampled.loop import (
    EVAL_EPOCH,
    SampledLoop,
    check_fanouts,
    default_fanouts,
    epoch_order,
    model_depth,
    sampling_reasons,
)
from gnnscale.errors import ConfigError
from gnnscale.graph.graph import MASK_NAMES, Graph
from gnnscale.nn.stack import Stack
from gnnscale.notes import note
from gnnscale.sample import SampledAdjacency, sample_key

if TYPE_CHECKING:
    from gnnscale.config import TrainConfig


class SampledEngine(Engine):
    """An engine that trains on sampled neighbourhoods: the common set-up, evaluation and prediction.

    Subclasses call this constructor, then set :attr:`loop` (their :class:`SampledLoop`) and :attr:`inference`
    (where evaluation reads), and implement ``name``, ``_not_supported_reasons`` and ``train_epoch``.
    """

    sampling_reasons = staticmethod(sampling_reasons)
    host_layer_copies = 1  # layer-wise inference keeps each layer's output for every vertex
    loop: SampledLoop
    """The engine's training loop, composed of its parts."""
    inference: SampledInference
    """Where evaluation and prediction read (an engine that infers otherwise overrides :meth:`evaluate`)."""
    tier: DiskTier | None = None
    """The disk tier the features are read through (``--host-memory`` on a converted directory), if any."""
    _eval_fanouts: tuple[tuple[int, ...] | None] | None = None  # the choice of :meth:`eval_fanouts`, once made

    def __init__(self, graph: Graph, model: Stack, config: TrainConfig, device: torch.device):
        super().__init__(graph, model, config, device)
        self.fanouts = tuple(config.fanouts or default_fanouts(model_depth(config, model)))
        self.masks = {m: getattr(graph, m) for m in MASK_NAMES if getattr(graph, m) is not None}
        self.train_ids = torch.nonzero(self.masks["train_mask"]).view(-1)
        if self.train_ids.numel() == 0:
            raise ConfigError(f"graph {graph.name} has no training vertices")
        self.adjacency = SampledAdjacency.from_graph(graph, model.adjacency, config.sample_norm)  # type: ignore[arg-type]

    @classmethod
    def check_options(cls, config: TrainConfig) -> None:
        check_fanouts(config)

    def _order(self, epoch: int) -> Tensor:
        """The epoch's shuffle of the training vertices (:func:`~gnnscale.engines.sampled.loop.epoch_order`)."""
        return epoch_order(self.config.seed, epoch, self.train_ids.numel())

    @torch.no_grad()
    def evaluate(self) -> dict[str, float | None]:
        """Layer-wise full-neighbour inference, or with ``--eval-fanouts`` sampled inference over keyed samples
        (the same at every evaluation)."""
        self.model.eval()
        targets = eval_ids(self.masks)
        fanouts = self.eval_fanouts(targets)
        if fanouts is None:  # only the masks' vertices and the neighbourhoods they read
            pred = self.inference.layerwise(targets)
        else:
            pred = self.inference.sampled(targets, fanouts, sample_key(self.config.seed, EVAL_EPOCH))
        assert self.graph.y is not None
        return self.accuracies(pred, self.graph.y, self.masks)

    def eval_fanouts(self, targets: Tensor) -> tuple[int, ...] | None:
        """How evaluation infers ``targets``: ``--eval-fanouts`` when given; else exact layer-wise inference
        (``None``), except from disk (:attr:`tier`) when that would read more than :data:`EVAL_READ_RATIO` times
        the feature rows of sampled inference with the training fanouts (:func:`~gnnscale.engines.sampled.eval.
        eval_reads`): then those fanouts, said in a note. Layer-wise inference reads the labelled vertices' whole
        two-hop neighbourhoods, at random, which a disk serves at thousands of rows a second; the choice is made
        once, at the first evaluation."""
        if self.config.eval_fanouts is not None:
            return tuple(self.config.eval_fanouts)
        if self.tier is None:
            return None
        if self._eval_fanouts is None:
            layerwise, sampled = self.inference.reads(targets, self.graph.in_degree(), self.fanouts)
            choice = self.fanouts if layerwise > EVAL_READ_RATIO * sampled else None
            if choice is not None:
                note(f"evaluation samples with the training fanouts {','.join(map(str, choice))}: exact "
                     f"layer-wise inference from disk would read {layerwise:,} feature rows at random, "
                     f"{layerwise / max(sampled, 1):.1f}x sampled inference's {sampled:,} (--eval-fanouts chooses; "
                     f"-1 for every hop gives exact outputs)")
            self._eval_fanouts = (choice,)
        return self._eval_fanouts[0]

    def predict(self) -> Tensor:
        """Exact layer-wise inference over full neighbourhoods (``--eval-fanouts`` only changes evaluation)."""
        self.model.eval()
        return self._layerwise().argmax(dim=-1)

    @torch.no_grad()
    def _layerwise(self) -> Tensor:
        """``[N, C]`` outputs: layer by layer, every vertex, full neighbourhoods."""
        return self.inference.layerwise()

    def state_dict(self) -> dict[str, Any]:
        """Within an epoch (an iteration checkpoint, :class:`IterationCheckpoints`): the loop's progress, what a
        resume needs to go on from that iteration; nothing otherwise."""
        return {} if self.loop.progress is None else {"progress": self.loop.progress}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A checkpoint's progress makes the next epoch of its number start after its iterations."""
        self.loop.resume = state.get("progress")
        super().load_state_dict({k: v for k, v in state.items() if k != "progress"})


class IterationCheckpoints:
    """Mixin for a :class:`SampledEngine` that checkpoints within epochs (HopGNN §8's iteration checkpoints): its
    loop's hook, exposed as ``on_iteration``, which :func:`gnnscale.train.train` sets for
    ``--checkpoint-iterations``; the engine's state then carries the loop's progress, and a resume goes on from
    that iteration with the counters of the iterations before it. List it before :class:`SampledEngine`."""

    loop: SampledLoop

    @property
    def on_iteration(self) -> Callable[[int, int], None] | None:
        """Called after every optimiser step but an epoch's last with ``(epoch, iterations done)``."""
        return self.loop.on_iteration

    @on_iteration.setter
    def on_iteration(self, hook: Callable[[int, int], None] | None) -> None:
        if hook is None:
            self.loop.on_iteration = None
            return

        def checkpointed(epoch: int, done: int) -> None:
            hook(epoch, done)
            self.checkpoint_written()

        self.loop.on_iteration = checkpointed

    def checkpoint_written(self) -> None:
        """After an iteration checkpoint: an engine of several processes waits here until the writer is done, so
        that no process goes on (or fails) while the checkpoint is half in place; nothing by default."""
