"""HyScale-GNN's dynamic resource management (Lin et al., §IV-A, Algorithm 1): after each iteration, the stage
times decide whether to move *work* (seeds between the CPU and accelerator trainers, or sampling between the CPU
and accelerator samplers; the global batch is unchanged) or *threads* (between the CPU sampler, the feature loader
and the CPU trainer).

:func:`drm_decide` is Algorithm 1's decision table as a pure function of the stage times; the hybrid engine
applies its decisions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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
