"""BatchNorm whose statistics span more rows than one call sees: the chunks of a layer, the trainers of a batch, the
ranks of a job.

:class:`SplitBatchNorm` is :class:`torch.nn.BatchNorm1d` (same parameters, buffers and ``state_dict``; the same
function when nothing is split) with two ways to see past the rows of one call:

* **passes** (full-graph engines that compute a layer one chunk at a time): a *statistics pass* over every chunk
  (:meth:`SplitBatchNorm.begin_stats` ... :meth:`~SplitBatchNorm.end_stats`; the module returns its input
  unchanged and sums the rows' moments), then the layer's real pass normalises each chunk with the frozen
  statistics of all rows. In backward, a *gradient-sums pass* (:meth:`~SplitBatchNorm.begin_grad_sums` ...
  :meth:`~SplitBatchNorm.end_grad_sums`) sums BatchNorm's two reductions over every chunk first, ``Σ dy`` and
  ``Σ dy·x̂``, and the real backward pass gives each row its exact gradient::

      dx = γ · invstd · (dy - (Σ dy + x̂ · Σ dy·x̂) / N)

  Both sums are linear in ``dy``: a vertex whose gradient arrives in parts (one per chunk that reads it) adds its
  parts, so each pass may see any part anywhere. The running statistics move once, as one full-batch call's.
* **a reducer** (:attr:`SplitBatchNorm.reduce`: several trainers or ranks computing one batch at once, torch's
  ``SyncBatchNorm``): each call sums its rows' moments, the reducer adds every participant's (a thread barrier, a
  ``torch.distributed`` all-reduce), and backward reduces ``Σ dy`` and ``Σ dy·x̂`` the same way.

Rows that several participants hold for the same vertex (a vertex sampled into two trainers' shares) carry a
weight (:attr:`SplitBatchNorm.row_weight`, ``1 / copies``) so that the statistics count each vertex once, as one
participant holding the whole batch would; a row's gradient then takes its weight's share of the correction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

Reducer = Callable[[Tensor], Tensor]
"""Sums a float64 vector over the participants (every participant gets the sum)."""


class Moments:
    """Weighted row count, sum and sum of squares of ``[rows, F]`` tensors, in float64 (a few chunks' rounding
    never reaches float32's precision)."""

    def __init__(self, width: int, device: torch.device | str = "cpu"):
        self.values = torch.zeros(2 * width + 1, dtype=torch.float64, device=device)
        """``[count, Σ x (F), Σ x² (F)]``: one vector, so a reducer adds it in one call."""

    def add(self, x: Tensor, weight: Tensor | None = None) -> None:
        """Add the rows of ``x`` (``weight``: ``[rows]``, each row's share of its vertex)."""
        x = x.detach().double()
        F = x.shape[1]
        v = self.values.to(x.device)
        if weight is None:
            v[0] += x.shape[0]
            v[1: F + 1] += x.sum(0)
            v[F + 1:] += (x * x).sum(0)
        else:
            w = weight.to(device=x.device, dtype=torch.float64).unsqueeze(1)
            v[0] += w.sum()
            v[1: F + 1] += (w * x).sum(0)
            v[F + 1:] += (w * x * x).sum(0)
        self.values = v

    def mean_var(self) -> tuple[float, Tensor, Tensor]:
        """``(count, mean, biased variance)`` (float64)."""
        n = float(self.values[0])
        F = (self.values.numel() - 1) // 2
        if n <= 0:
            raise ValueError("BatchNorm statistics over no rows")
        mean = self.values[1: F + 1] / n
        var = (self.values[F + 1:] / n - mean * mean).clamp_min(0.0)
        return n, mean, var


class _Normalise(torch.autograd.Function):
    """``y = γ (x - mean) invstd + β`` with statistics fixed in forward; backward applies BatchNorm's full-batch
    correction from the owner's gradient sums (or sums them, in a gradient-sums pass)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor, mean: Tensor, invstd: Tensor,
                row_weight: Tensor | None, owner: SplitBatchNorm) -> Tensor:
        xhat = (x - mean) * invstd
        ctx.owner = owner
        ctx.set_materialize_grads(False)  # a norm below one in a gradient-sums pass gets no gradient: not zeros
        ctx.save_for_backward(xhat, weight, invstd, row_weight)
        return xhat * weight + bias

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple[Tensor | None, ...]:
        (g,) = grads
        if g is None:  # nothing reached this norm (a norm above it stopped a gradient-sums pass)
            return None, None, None, None, None, None, None
        xhat, weight, invstd, row_weight = ctx.saved_tensors
        owner: SplitBatchNorm = ctx.owner
        sums = torch.cat([g.sum(0, dtype=torch.float64), (g * xhat).sum(0, dtype=torch.float64)])
        if owner.mode == "grad_sums":  # the sums pass: nothing flows below the norm, no parameter moves
            owner.grad_sums = sums if owner.grad_sums is None else owner.grad_sums + sums.to(owner.grad_sums.device)
            return None, None, None, None, None, None, None
        if owner.mode == "backward":
            assert owner.grad_sums is not None, "a backward pass before its gradient-sums pass"
            total = owner.grad_sums.to(g.device)
        else:
            assert owner.reduce is not None
            total = owner.reduce(sums)
        F = g.shape[1]
        s1, s2 = (total[:F] / owner.count).to(g.dtype), (total[F:] / owner.count).to(g.dtype)
        corr = s1 + xhat * s2
        if row_weight is not None:
            corr = corr * row_weight.unsqueeze(1).to(g.dtype)
        gx = (g - corr) * (weight * invstd)
        local = sums.to(g.dtype)
        return gx, local[F:], local[:F], None, None, None, None


class SplitBatchNorm(nn.BatchNorm1d):
    """:class:`torch.nn.BatchNorm1d` whose training statistics may span the rows of many calls (the module
    docstring says how). With no pass begun and no :attr:`reduce`, exactly ``BatchNorm1d``."""

    def __init__(self, num_features: int, **kwargs: Any):
        super().__init__(num_features, **kwargs)
        self.mode: str | None = None
        """``None`` (plain BatchNorm1d, or the reducer's), ``stats`` (summing moments, output = input),
        ``frozen`` (normalising with :meth:`end_stats`'s statistics), ``grad_sums``, ``backward``."""
        self.reduce: Reducer | None = None
        """Adds a float64 vector over the trainers or ranks that compute one batch together (``None``: alone)."""
        self.row_weight: Tensor | None = None
        """``[rows]`` of the next call: each row's share of its vertex (``None``: every row counts once)."""
        self.moments: Moments | None = None
        self.grad_sums: Tensor | None = None
        self.count = 0.0
        self._frozen: tuple[Tensor, Tensor] | None = None
        self.calls = 0
        """Training calls normalised since created (counted for tests: a statistics pass adds none)."""

    # ----------------------------------------------------------------------------------------------- passes
    def begin_stats(self) -> None:
        """Start a statistics pass: every call until :meth:`end_stats` sums its rows and returns them unchanged."""
        self.mode, self.moments, self.grad_sums, self._frozen = "stats", Moments(self.num_features), None, None

    def end_stats(self, reduce: Reducer | None = None) -> None:
        """Freeze the statistics of every row the pass saw (``reduce``: added over participants first) and move
        the running statistics once, as one call on all those rows would."""
        assert self.mode == "stats" and self.moments is not None, "end_stats() without begin_stats()"
        if reduce is not None:
            self.moments.values = reduce(self.moments.values)
        self._freeze(self.moments)
        self.mode = "frozen"

    def begin_grad_sums(self) -> None:
        """Start a gradient-sums pass: backward through every call until :meth:`end_grad_sums` adds ``Σ dy`` and
        ``Σ dy·x̂`` and stops there (nothing flows below the norm, its parameters get no gradient)."""
        assert self._frozen is not None, "a gradient-sums pass needs the statistics (end_stats) first"
        self.mode, self.grad_sums = "grad_sums", None

    def end_grad_sums(self, reduce: Reducer | None = None) -> None:
        """The sums are complete (``reduce``: added over participants): backward now gives exact gradients."""
        assert self.mode == "grad_sums", "end_grad_sums() without begin_grad_sums()"
        if self.grad_sums is None:  # no gradient reached the norm: no correction
            self.grad_sums = torch.zeros(2 * self.num_features, dtype=torch.float64)
        if reduce is not None:
            self.grad_sums = reduce(self.grad_sums)
        self.mode = "backward"

    def release(self) -> None:
        """Back to plain BatchNorm1d (the end of an epoch's passes)."""
        self.mode, self.moments, self.grad_sums, self._frozen = None, None, None, None

    # ----------------------------------------------------------------------------------------------- forward
    def _freeze(self, moments: Moments) -> None:
        n, mean, var = moments.mean_var()
        self.count = n
        if self.track_running_stats and self.running_mean is not None and self.running_var is not None:
            with torch.no_grad():
                assert self.num_batches_tracked is not None
                self.num_batches_tracked.add_(1)
                m = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
                unbiased = var * (n / (n - 1)) if n > 1 else var
                dev, dt = self.running_mean.device, self.running_mean.dtype
                self.running_mean.mul_(1 - m).add_(mean.to(dev, dt), alpha=m)
                self.running_var.mul_(1 - m).add_(unbiased.to(dev, dt), alpha=m)
        self._frozen = (mean, (var + self.eps).rsqrt())

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or (self.mode is None and self.reduce is None):
            return super().forward(x)
        weight, self.row_weight = self.row_weight, None
        if self.mode == "stats":
            assert self.moments is not None
            self.moments.add(x, weight)
            return x
        if self.mode is None:  # a reducer: this call's moments, added over the participants
            m = Moments(self.num_features, x.device)
            m.add(x, weight)
            assert self.reduce is not None
            m.values = self.reduce(m.values)
            self._freeze(m)
        assert self._frozen is not None, f"SplitBatchNorm in mode {self.mode!r} without statistics"
        self.calls += 1
        mean, invstd = (t.to(x.device, x.dtype) for t in self._frozen)
        assert self.weight is not None and self.bias is not None, "SplitBatchNorm needs affine=True"
        return _Normalise.apply(x, self.weight, self.bias, mean, invstd, weight, self)  # type: ignore[no-any-return]


def _added(parts: list[Tensor | None], width: int) -> tuple[Tensor, int]:
    """The copies' partial sums added on the host (``None``: a copy that saw no rows), and the bytes added."""
    total = torch.zeros(width, dtype=torch.float64)
    moved = 0
    for t in parts:
        if t is not None:
            total += t.cpu()
            moved += t.numel() * t.element_size()
    return total, moved


def end_stats_together(copies: list[SplitBatchNorm]) -> int:
    """End a statistics pass on every copy of one norm (one per worker or device replica, each having summed the
    rows it saw): each freezes the statistics of all their rows. Returns the bytes of partial sums added."""
    total, moved = _added([bn.moments.values if bn.moments is not None else None for bn in copies],
                          2 * copies[0].num_features + 1)
    for bn in copies:
        bn.end_stats(lambda mine: total.to(mine.device))
    return moved


def end_grad_sums_together(copies: list[SplitBatchNorm]) -> int:
    """End a gradient-sums pass on every copy of one norm: each takes the sums of all of them. Returns the bytes
    of partial sums added."""
    total, moved = _added([bn.grad_sums for bn in copies], 2 * copies[0].num_features)
    for bn in copies:
        bn.end_grad_sums(lambda mine: total.to(mine.device))
    return moved


def split_norms(module: nn.Module) -> list[SplitBatchNorm]:
    """The :class:`SplitBatchNorm` modules inside ``module``, in forward order (registration order)."""
    return [m for m in module.modules() if isinstance(m, SplitBatchNorm)]


@contextmanager
def kept_grads(module: nn.Module) -> Iterator[None]:
    """Parameters' gradients as they were before the block (a gradient-sums pass runs backward through layers
    above the norm, whose parameters must not count it)."""
    saved = {p: None if p.grad is None else p.grad.clone() for p in module.parameters()}
    try:
        yield
    finally:
        for p, g in saved.items():
            p.grad = g
