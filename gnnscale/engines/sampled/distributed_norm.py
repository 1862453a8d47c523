"""``--norm batch`` in the distributed engine: BatchNorm over the whole global batch of an iteration, whichever
ranks and time steps compute it (torch's ``SyncBatchNorm`` across ranks, HopGNN's micrographs included).

**The batch.** An iteration trains one global batch (``R x --batch-size`` seeds: one step of the single-process
mini-batch engine). A layer's BatchNorm normalises over the *distinct* vertices of that layer's rows of the whole
batch, as the mini-batch engine's one trainer does: sampling is keyed by vertex, so the union of the ranks' (or
the micrographs') sampled rows of a layer is exactly that trainer's. A vertex that several *participants* (ranks,
micrographs) sampled into the same layer counts once: each copy's row weighs ``1 / copies``
(:attr:`~gnnscale.nn.batchnorm.SplitBatchNorm.row_weight`), the copies counted by the vertices' owners in one
exchange per iteration (:meth:`RankBatchNorm.weigh`); a copy's gradient then takes its weight's share of the
correction, and the copies' gradients add up to the vertex's.

**Model-centric.** Every rank computes its whole mini-batch in one forward and one backward, so every rank reaches
every norm in the same order: each norm call all-reduces its moments ``(Σw, Σwx, Σwx²)``, and its backward the two
sums ``(Σdy, Σdy·x̂)`` (the norm's reducer, :attr:`~gnnscale.nn.batchnorm.SplitBatchNorm.reduce`). A rank whose
share of a short last batch is empty takes part with zeros (:meth:`RankBatchNorm.synced`).

**Micrograph (HopGNN).** A mini-batch's micrographs are trained at different time steps on different ranks, so no
single call sees the batch. The parameters do not change within an iteration, so before the first step every rank
computes what BatchNorm needs from all its micrographs with its own replica, and the ranks add it up
(:meth:`RankBatchNorm.prepare`):

1. a *statistics pass* per norm, in forward order: every micrograph's forward up to that norm (the norms before it
   normalise with their frozen statistics), its rows' moments summed, one all-reduce, frozen (the running
   statistics move once, as one call on the whole batch's rows would move them);
2. a *gradient-sums pass* per norm, in reverse order: every micrograph's forward and the loss's gradient at the
   norm's output (``torch.autograd.grad``: nothing below the norm is computed, no parameter's gradient moves),
   ``Σdy`` and ``Σdy·x̂`` summed, one all-reduce (the norms above it already correct their gradients with theirs);
3. the time steps as without BatchNorm (:meth:`RankBatchNorm.step`): each micrograph's forward normalises with the
   frozen statistics, its backward gives each row its exact gradient from the sums; the models migrate as before.

Every rank makes the same ``2 x norms`` all-reduces an iteration, whatever its micrographs (none included), so the
collectives always match. The price: each micrograph's forward runs up to ``norms + 1`` times an iteration and its
backward (partly) as often, and a rank reads the inputs of all its micrographs before the first step and keeps
them for the iteration (with ``--pregather off`` each step's rows still come in an exchange of their own).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gnnscale.distributed.comm import Comm
from gnnscale.engines.sampled.loop import forward
from gnnscale.graph.block import Block
from gnnscale.nn.batchnorm import SplitBatchNorm, split_norms
from gnnscale.nn.stack import Stack

WHAT = "batch-norm statistics"
"""What the statistics' collectives are called (in a failure's message)."""


class _Stop(Exception):
    """A statistics pass's norm has summed its rows: the rest of the forward is not needed."""


def norm_levels(model: Stack) -> list[tuple[SplitBatchNorm, int]]:
    """The model's BatchNorms in forward order, each with the *level* of the rows it normalises: level ``s`` is the
    output rows of layer ``s - 1`` (``blocks[s - 1]``'s destinations, the input rows of layer ``s``).
    ``norms[l - 1]`` normalises level ``l``; a norm inside layer ``l`` (GIN's MLP) its destination rows, level
    ``l + 1``."""
    out: list[tuple[SplitBatchNorm, int]] = []
    for i, layer in enumerate(model.layers):
        if i > 0 and isinstance(model.norms[i - 1], SplitBatchNorm):
            out.append((model.norms[i - 1], i))  # type: ignore[arg-type]
        out.extend((bn, i + 1) for bn in split_norms(layer))
    seen = {id(bn) for bn, _ in out}
    assert all(id(bn) in seen for bn in split_norms(model)), "a BatchNorm off the layers' path (--jk is refused)"
    return out


def level_ids(blocks: Sequence[Block], level: int) -> Tensor:
    """Global ids of the rows at ``level`` (:func:`norm_levels`) of a sample's ``blocks``."""
    b = blocks[level - 1]
    return b.row_ids(b.num_dst)


class RankBatchNorm:
    """This rank's side of BatchNorm over the ranks (the module docstring says how): the row weights, the
    all-reduces, and the micrograph passes. Inactive (every method a no-op) for a model without BatchNorm."""

    def __init__(self, model: Stack, comm: Comm, owner: Tensor, device: torch.device):
        self.model, self.comm, self.owner, self.device = model, comm, owner, device
        self.norms = norm_levels(model)
        self.levels = sorted({s for _, s in self.norms if s < len(model.layers)})
        """Levels whose vertices several participants may hold (the last is the seeds': each in one share)."""
        self.weights: list[dict[int, Tensor] | None] = []
        """Per participant of this rank (its micrographs; its mini-batch), each level's row weights."""
        self.current: int | None = None
        """The participant whose forward runs now (its weights go to each norm call)."""
        self.counters = {"reductions": 0, "reduced_bytes": 0}
        """The statistics' all-reduces this rank made, and the bytes of its vectors."""
        for bn, level in self.norms:
            bn.register_forward_pre_hook(functools.partial(self._rows, level=level))
            bn.register_forward_hook(self._stop)

    @property
    def active(self) -> bool:
        return bool(self.norms)

    # ------------------------------------------------------------------------------------------------- parts
    def reduce(self, v: Tensor) -> Tensor:
        """The norms' reducer: ``v`` summed over the ranks (a copy; ``v`` is left as it was)."""
        out = v.detach().clone()
        self.comm.all_reduce(out, "sum", WHAT)
        self.counters["reductions"] += 1
        self.counters["reduced_bytes"] += out.numel() * out.element_size()
        return out

    def _rows(self, bn: SplitBatchNorm, args: tuple[Any, ...], level: int) -> None:
        """Pre-hook: the current participant's weights of ``level`` for the norm's next call."""
        if self.current is None or not bn.training:
            return
        weights = self.weights[self.current]
        w = None if weights is None else weights.get(level)
        assert w is None or w.numel() == args[0].shape[0], "a norm's rows are not its level's"
        bn.row_weight = w

    def _stop(self, bn: nn.Module, args: tuple[Any, ...], out: Any) -> None:
        if self.current is not None and getattr(bn, "mode", None) == "stats":
            raise _Stop

    def weigh(self, participants: Sequence[Sequence[Block] | None]) -> None:
        """Each row's weight, ``1 / copies``, for every participant of this rank (its blocks; ``None``: nothing to
        train) at every level a norm reads. A vertex's copies at a level, over every participant of every rank,
        are counted by its owner: one request per peer (the keys and this rank's counts) and one reply (the
        totals). Collective: every rank calls it, with or without participants."""
        n, world = self.owner.numel(), self.comm.world
        keys = [torch.cat([level_ids(p, s).cpu() + (s - 1) * n for s in self.levels]) if p is not None and self.levels
                else torch.empty(0, dtype=torch.int64) for p in participants]
        if self.levels:  # else the norms read the seeds' level only: every row counts once
            flat = torch.cat(keys) if keys else torch.empty(0, dtype=torch.int64)
            uniq, inv, cnt = torch.unique(flat, return_inverse=True, return_counts=True)
            dest = self.owner[uniq % n]
            order = torch.argsort(dest, stable=True)
            send = torch.bincount(dest, minlength=world).tolist()
            recv = self.comm.all_to_all_counts(send, WHAT)
            asked = self.comm.all_to_all(torch.stack([uniq[order], cnt[order]], 1).to(self.comm.device), send,
                                         recv, WHAT).cpu()
            held, where = torch.unique(asked[:, 0], return_inverse=True)
            totals = torch.zeros(held.numel(), dtype=torch.int64).index_add_(0, where, asked[:, 1])
            back = self.comm.all_to_all(totals[where].unsqueeze(1).to(self.comm.device), recv, send, WHAT).cpu()
            copies = torch.empty_like(cnt)
            copies[order] = back[:, 0]
            weight = (1.0 / copies[inv].double()).float().to(self.device).split([k.numel() for k in keys])
        self.weights = []
        for i, p in enumerate(participants):
            if p is None or not self.levels:
                self.weights.append(None if p is None else {})
                continue
            sizes = [level_ids(p, s).numel() for s in self.levels]
            self.weights.append(dict(zip(self.levels, weight[i].split(sizes), strict=True)))

    @contextmanager
    def step(self, k: int) -> Iterator[None]:
        """Participant ``k``'s forward and backward run inside (its row weights go to the norms)."""
        self.current = k
        try:
            yield
        finally:
            self.current = None

    def release(self) -> None:
        """The iteration is over: the norms back to plain BatchNorm1d."""
        for bn, _ in self.norms:
            bn.reduce = None
            bn.release()
        self.weights, self.current = [], None

    # ----------------------------------------------------------------------------------------- model-centric
    @contextmanager
    def synced(self, blocks: Sequence[Block] | None) -> Iterator[None]:
        """Model-centric: this rank's mini-batch (its ``blocks``; ``None``: an empty share) trains inside, every
        norm call and its backward all-reduced as they run. A rank with an empty share makes the same all-reduces
        with zeros (the statistics, then the gradient sums in reverse order), and its running statistics move as
        the others'."""
        if not self.active:
            yield
            return
        self.weigh([blocks])
        for bn, _ in self.norms:
            bn.reduce = self.reduce
        try:
            with self.step(0):
                yield
            if blocks is None:
                for bn, _ in self.norms:
                    bn.begin_stats()
                    bn.end_stats(self.reduce)
                for bn, _ in reversed(self.norms):
                    self.reduce(torch.zeros(2 * bn.num_features, dtype=torch.float64))
        finally:
            self.release()

    # -------------------------------------------------------------------------------------------- micrograph
    def prepare(self, blocks: Sequence[Sequence[Block]], xs: Sequence[Tensor], labels: Sequence[Tensor], total: int,
                se: tuple[int, int]) -> None:
        """Micrograph: every norm's statistics and gradient sums over the global batch, from this rank's
        micrographs (``blocks[k]``, input rows ``xs[k]``, the roots' ``labels[k]``; a micrograph without roots has
        none) and every other rank's (collective). Then :meth:`step` ``k`` trains micrograph ``k`` exactly, until
        :meth:`release`. ``total``: the global batch's seeds (each loss is its summed loss over them)."""
        live = [k for k in range(len(blocks)) if labels[k].numel()]
        self.weigh([blocks[k] if k in live else None for k in range(len(blocks))])
        for bn, _ in self.norms:  # statistics passes, in forward order
            bn.begin_stats()
            with torch.no_grad():
                for k in live:
                    try:
                        with self.step(k):
                            forward(self.model, blocks[k], xs[k], se)
                    except _Stop:
                        pass
            bn.end_stats(self.reduce)
        for bn, _ in reversed(self.norms):  # gradient-sums passes, in reverse order
            bn.begin_grad_sums()
            assert bn.moments is not None
            _, mean, var = bn.moments.mean_var()  # what end_stats froze
            invstd = (var + bn.eps).rsqrt()
            sums = torch.zeros(2 * bn.num_features, dtype=torch.float64, device=self.device)
            for k in live:
                seen: list[tuple[Tensor, Tensor]] = []
                hook = bn.register_forward_hook(lambda m, a, o, seen=seen: seen.append((a[0], o)))
                try:
                    with self.step(k):
                        logits = forward(self.model, blocks[k], xs[k], se)
                finally:
                    hook.remove()
                ((x, y),) = seen
                loss = F.cross_entropy(logits, labels[k], reduction="sum") / total
                (dy,) = torch.autograd.grad(loss, y)
                xhat = (x.detach() - mean.to(x.device, x.dtype)) * invstd.to(x.device, x.dtype)
                sums += torch.cat([dy.sum(0, dtype=torch.float64), (dy * xhat).sum(0, dtype=torch.float64)])
            bn.grad_sums = sums
            bn.end_grad_sums(self.reduce)
