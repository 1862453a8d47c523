"""HyScale-GNN's dynamic resource management (Lin et al., §IV-A, Algorithm 1): after each iteration, the stage
times decide whether to move *work* (seeds between the CPU and accelerator trainers, or sampling between the CPU
and accelerator samplers; the global batch is unchanged) or *threads* (between the CPU sampler, the feature loader
and the CPU trainer).

:func:`drm_decide` is Algorithm 1's decision table as a pure function of the stage times, and
:func:`apply_decision` carries a decision out on an :class:`Assignment` (the split, the threads, the samplers);
the hybrid engine runs both after every iteration. The rest of its planning lives beside it, one module per role:

* :mod:`gnnscale.plan.hybrid_model`: the performance model of §V (Eqs. 5-13, the sampling table, the devices'
  rates, :class:`HybridModel`'s stage predictions and initial split);
* :mod:`gnnscale.plan.hybrid_resources`: what DRM moves (the CPU's :class:`Threads`, the trainers' split by
  :func:`rebalance` over fitted costs);
* :mod:`gnnscale.plan.hybrid_measure`: the measurements the model reads (sampling tables, device rates).

Their names are re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from gnnscale.plan.hybrid_measure import SAMPLE_REPEATS, batch_shape, device_rates, measure_rates, measure_sampling
from gnnscale.plan.hybrid_model import (
    S_FEAT,
    BatchShape,
    DeviceRates,
    HybridModel,
    SamplingTable,
    TrainerModel,
    mteps,
    t_aggregate,
    t_execution,
    t_load,
    t_prop,
    t_sync,
    t_trainer,
    t_trans,
    t_update,
)
from gnnscale.plan.hybrid_resources import (
    COST_SPREAD,
    THREAD_STAGES,
    Cost,
    Threads,
    check_devices,
    check_threads,
    default_threads,
    fit_cost,
    rebalance,
)

STAGES = ("SA", "SC", "Load", "TC", "Accel")
"""Sampling on the accelerator, sampling on the CPU, feature loading, training on the CPU, and the accelerator
trainer bundled with its data transfer (``T_Accel = max(T_Tran, T_TA)``: the two move together)."""
CPU_STAGES = ("SC", "Load", "TC")
"""The stages that share the CPU's threads."""


@dataclass(frozen=True)
class StageTimes:
    """One iteration's seconds per stage; ``None`` for a stage this machine does not run (no GPU sampler, ...)."""

    SC: float
    Load: float
    TC: float
    Tran: float | None = None
    TA: float | None = None
    SA: float | None = None

    def stages(self) -> dict[str, float]:
        """Algorithm 1's five inputs, the accelerator's transfer and training bundled (line 1)."""
        out = {"SC": self.SC, "Load": self.Load, "TC": self.TC}
        if self.SA is not None:
            out["SA"] = self.SA
        if self.TA is not None or self.Tran is not None:
            out["Accel"] = max(t for t in (self.Tran, self.TA) if t is not None)
        return out


@dataclass(frozen=True)
class Decision:
    """``kind = "work"``: move work from stage ``src`` to stage ``dst`` (the pair's slower to its faster);
    ``kind = "thread"``: move a CPU thread from ``src`` to ``dst``; ``kind = "none"``: nothing to move."""

    kind: Literal["work", "thread", "none"]
    src: str | None = None
    dst: str | None = None
    bottleneck: str | None = None


def _balance_work(t: dict[str, float], a: str, b: str, bottleneck: str) -> Decision:
    if a not in t or b not in t:  # the pair's other side does not exist here: nothing to move work to
        return Decision("none", bottleneck=bottleneck)
    slow, fast = (a, b) if t[a] >= t[b] else (b, a)
    return Decision("work", slow, fast, bottleneck)


def _balance_thread(t: dict[str, float], donor: str, bottleneck: str) -> Decision:
    if donor not in CPU_STAGES or donor == bottleneck:
        # Algorithm 1 names the fastest stage; threads can only come from a CPU stage: its fastest other one
        cpu = [s for s in sorted(CPU_STAGES, key=lambda s: t[s]) if s != bottleneck]
        donor = cpu[0]
    return Decision("thread", donor, bottleneck, bottleneck)


def drm_decide(times: StageTimes) -> Decision:
    """Algorithm 1: the bottleneck stage (the slowest) picks the action; ties go to the earlier of
    :data:`STAGES`."""
    t = times.stages()
    order = sorted(t, key=lambda s: (-t[s], STAGES.index(s)))  # slowest first (Sorted_all)
    bottleneck, fastest = order[0], order[-1]
    second = order[-2] if len(order) > 1 else None
    fastest_cpu = min(CPU_STAGES, key=lambda s: (t[s], STAGES.index(s)))  # Sorted_CPU[2]
    if bottleneck == "SA":
        return _balance_work(t, "SC", "SA", bottleneck)
    if bottleneck == "Accel":
        return _balance_work(t, "TC", "Accel", bottleneck)
    if bottleneck == "Load":
        return _balance_thread(t, fastest_cpu, bottleneck)
    if bottleneck == "SC":
        if fastest == "SA" or (fastest == "Accel" and second == "SA"):
            return _balance_work(t, "SC", "SA", bottleneck)
        return _balance_thread(t, fastest, bottleneck)
    # bottleneck == "TC"
    if fastest == "Accel" or (fastest == "SA" and second == "Accel"):
        return _balance_work(t, "TC", "Accel", bottleneck)
    return _balance_thread(t, fastest, bottleneck)



@dataclass(frozen=True)
class Assignment:
    """What DRM moves: the trainers' ``split`` of every global batch, the CPU's ``threads``, and per trainer
    whether its accelerator samples its own share (``gpu_sampler``: SA rather than the CPU sampler's SC)."""

    split: tuple[float, ...]
    threads: Threads
    gpu_sampler: tuple[bool, ...]


def apply_decision(d: Decision, a: Assignment, *, cuda: list[int],
                   balance: Callable[[list[float]], list[float] | None]) -> tuple[Decision, Assignment] | None:
    """Carry out ``d`` on ``a``: the decision carried out and the new assignment, or ``None`` when there is nothing
    to move. A thread move with no thread to give (the donor has one) speeds the bottleneck up the other way
    Algorithm 1 knows: its work moves to its counterpart (the CPU trainer's to the accelerators, the CPU
    sampler's to the GPU samplers), where there is one.

    Args:
        cuda: the trainers whose accelerator can sample its own share (a CUDA device).
        balance: *balance work* between the CPU trainer and the accelerators: the new split for a split
            (:func:`rebalance` over the iteration decided on), ``None`` to keep it.
    """
    if d.kind == "thread":
        moved = a.threads.move(d.src, d.dst)  # type: ignore[arg-type]
        if moved is not None:
            return d, replace(a, threads=moved)
        other = {"TC": "Accel", "SC": "SA"}.get(d.dst or "")
        if other is None:
            return None
        d = Decision("work", d.dst, other, d.bottleneck)
    if d.kind == "work" and {d.src, d.dst} == {"TC", "Accel"}:
        new = balance(list(a.split))
        return None if new is None else (d, replace(a, split=tuple(new)))
    if d.kind == "work":  # SC <-> SA: one accelerator's sampling moves between the CPU and its device
        movable = [g for g in cuda if a.gpu_sampler[g] == (d.dst == "SC")]
        if not movable:
            return None
        flags = list(a.gpu_sampler)
        flags[movable[0]] = d.dst == "SA"
        return d, replace(a, gpu_sampler=tuple(flags))
    return None


__all__ = [
    "COST_SPREAD", "CPU_STAGES", "SAMPLE_REPEATS", "STAGES", "S_FEAT", "THREAD_STAGES", "Assignment", "BatchShape",
    "Cost", "Decision", "DeviceRates", "HybridModel", "SamplingTable", "StageTimes", "Threads", "TrainerModel",
    "apply_decision", "batch_shape", "check_devices", "check_threads", "default_threads", "device_rates",
    "drm_decide", "fit_cost", "measure_rates", "measure_sampling", "mteps", "rebalance", "t_aggregate",
    "t_execution", "t_load", "t_prop", "t_sync", "t_trainer", "t_trans", "t_update",
]
