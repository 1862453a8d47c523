"""Micrograph time steps (HopGNN §5.1) and their merging (§5.3): pure functions of the iteration's roots.

Vocabulary: ``R`` ranks (HopGNN's servers), one model per rank. An iteration trains ``R`` mini-batches, model
``d`` the ``d``-th. *Root redistribution* groups every model's roots by their *home* rank (the rank holding
their features): ``roots[d][s]``. Micrograph training runs time steps; at original step ``t`` model ``d`` is on
rank ``(d + t) % R`` and trains the micrographs of ``roots[d][(d + t) % R]``, so every root is trained where its
features live. *Merging* removes the step with the fewest roots (the count approximates the features the step
needs, §5.3) and hands each model's roots of that step to the same model's other steps, as evenly as possible:
fewer steps (fewer migrations and synchronisations), more remote features.

Every function here is deterministic, so every rank computes the same schedule without talking to the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

WARMUP_EPOCHS = 1
"""Epochs (this run's first) whose time the merging examination does not use."""
MERGE_GAIN = 0.05
"""How much faster (a fraction) an epoch must be than the one before for the examination to merge on."""


def home_groups(parts: list[Tensor], owner: Tensor, ranks: int) -> list[list[Tensor]]:
    """``roots[d][s]``: the seeds of model ``d``'s mini-batch ``parts[d]`` whose home is rank ``s``, in batch
    order (§5.1 step 1, root redistribution)."""
    out = []
    for seeds in parts:
        home = owner[seeds]
        out.append([seeds[home == s] for s in range(ranks)])
    return out


@dataclass
class Schedule:
    """The time steps of one iteration after ``merged`` merges.

    ``offsets[k]`` is step ``k``'s original offset ``t`` (model ``d`` is on rank ``(d + t) % R`` there);
    ``work[d][k]`` the roots model ``d`` trains at step ``k``.
    """

    ranks: int
    offsets: list[int]
    work: list[list[Tensor]]
    merged: list[int] = field(default_factory=list)
    """The original offsets removed, in merge order."""

    @property
    def steps(self) -> int:
        return len(self.offsets)

    def host(self, model: int, step: int) -> int:
        """The rank model ``model`` is on at step ``step``."""
        return (model + self.offsets[step]) % self.ranks

    def model_on(self, rank: int, step: int) -> int:
        """The model on rank ``rank`` at step ``step``."""
        return (rank - self.offsets[step]) % self.ranks

    def roots_on(self, rank: int, step: int) -> Tensor:
        """What rank ``rank`` trains at step ``step``."""
        return self.work[self.model_on(rank, step)][step]

    def step_counts(self) -> list[int]:
        """Roots trained per step, over all models (§5.3's stand-in for the features a step needs)."""
        return [sum(int(self.work[d][k].numel()) for d in range(self.ranks)) for k in range(self.steps)]

    def hop(self, step: int) -> int:
        """How far (in ranks) every model moves after ``step``: it goes to ``rank + hop`` and the next model comes
        from ``rank - hop``."""
        return (self.offsets[step + 1] - self.offsets[step]) % self.ranks


def build_schedule(roots: list[list[Tensor]], merges: int = 0) -> Schedule:
    """The ``R`` time steps of §5.1 over ``roots`` (:func:`home_groups`), then ``merges`` merges (§5.3): each
    removes the step with the fewest roots (the earliest of equals), splitting every model's roots of it into
    contiguous pieces appended to that model's remaining steps in order (sizes differ by at most one, larger
    first). At least one step is always left."""
    R = len(roots)
    sched = Schedule(R, list(range(R)), [[roots[d][(d + t) % R] for t in range(R)] for d in range(R)])
    for _ in range(min(merges, R - 1)):
        counts = sched.step_counts()
        k = min(range(sched.steps), key=lambda i: (counts[i], i))
        rest = [i for i in range(sched.steps) if i != k]
        for d in range(R):
            pieces = torch.tensor_split(sched.work[d][k], len(rest))
            for i, piece in zip(rest, pieces, strict=True):
                if piece.numel():
                    sched.work[d][i] = torch.cat([sched.work[d][i], piece])
        sched.merged.append(sched.offsets[k])
        sched.offsets = [sched.offsets[i] for i in rest]
        sched.work = [[w[i] for i in rest] for w in sched.work]
    return sched


@dataclass
class MergeController:
    """How many merges an iteration gets (§5.3's examination period).

    ``auto``: the first epochs run every step: :data:`WARMUP_EPOCHS` of warm-up (lazy initialisation, first
    connections: a slow first epoch would make any merge look good), then the examination's baseline. After
    that, each epoch one merge more than the last, while the epoch is faster than the one before; the first
    epoch that is not faster ends the examination, and every later epoch uses the merges of the fastest epoch.
    "Faster" means by at least :data:`MERGE_GAIN`: an epoch time's noise (a few percent between equal epochs)
    must not buy merges, which cost remote features. ``off``: no merging. A number: that many merges, fixed.
    """

    mode: str = "auto"
    ranks: int = 1
    merges: int = 0
    frozen: bool = False
    last_s: float | None = None
    best_s: float | None = None
    best_merges: int = 0
    history: list[tuple[int, int, float]] = field(default_factory=list)
    """``(epoch, merges, seconds)`` of every epoch so far."""

    def __post_init__(self) -> None:
        if self.mode not in ("off", "auto"):
            self.merges = min(int(self.mode), self.ranks - 1)
            self.frozen = True
        elif self.mode == "off":
            self.frozen = True

    def epoch_done(self, epoch: int, seconds: float) -> None:
        """Record an epoch's time (the same figure on every rank: the slowest rank's) and choose the next
        epoch's merges."""
        self.history.append((epoch, self.merges, seconds))
        if self.frozen or len(self.history) <= WARMUP_EPOCHS:
            return
        if self.best_s is None or seconds < self.best_s * (1 - MERGE_GAIN):
            self.best_s, self.best_merges = seconds, self.merges
        if self.last_s is not None and seconds >= self.last_s * (1 - MERGE_GAIN) and self.merges > 0:
            self.merges, self.frozen = self.best_merges, True  # not faster: keep the fastest epoch's merging
        elif self.merges + 1 < self.ranks:
            self.merges += 1
        else:
            self.frozen = True  # one step left: nothing more to merge
        self.last_s = seconds

    def state_dict(self) -> dict[str, object]:
        return {"merges": self.merges, "frozen": self.frozen, "last_s": self.last_s, "best_s": self.best_s,
                "best_merges": self.best_merges, "history": list(self.history)}

    def load_state_dict(self, state: dict[str, object]) -> None:
        for k, v in state.items():
            setattr(self, k, list(v) if k == "history" else v)  # type: ignore[call-overload]
