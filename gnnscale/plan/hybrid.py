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


# ------------------------------------------------------------------------------------------- performance model
S_FEAT = 4
"""Bytes per feature value (float32), Eqs. 7-8, 11, 13's ``S_feat``."""


@dataclass(frozen=True)
class TrainerModel:
    """What Eqs. 10-12 need of one trainer: the bandwidth its aggregation reads at (host memory for a CPU trainer,
    device memory for an accelerator), its multiply-accumulate rate (``N x freq``), and whether aggregation and
    update overlap (``⊕ = max``, a pipelined kernel) or follow each other (``⊕ = +``, a CPU)."""

    bandwidth: float
    macs_per_s: float
    pipelined: bool = False


@dataclass(frozen=True)
class BatchShape:
    """One trainer's mini-batch, input side first: ``dims[0]`` input features, ``dims[l]`` layer ``l``'s output
    width (``L = len(dims) - 1`` layers); layer ``l`` aggregates ``edges[l - 1]`` edges into ``vertices[l - 1]``
    destinations, and ``input_vertices`` rows of features are loaded (``|V^0|``)."""

    dims: tuple[int, ...]
    edges: tuple[int, ...]
    vertices: tuple[int, ...]
    input_vertices: int

    def __post_init__(self) -> None:
        L = len(self.dims) - 1
        if L < 1 or len(self.edges) != L or len(self.vertices) != L:
            raise ValueError(f"a batch of {L} layers needs {L} edge and vertex counts, got {self.edges}, "
                             f"{self.vertices}")


def t_load(batches: list[BatchShape], ddr_bandwidth: float) -> float:
    """Eq. 7: every trainer's input features read from host memory."""
    return sum(b.input_vertices * b.dims[0] * S_FEAT for b in batches) / ddr_bandwidth


def t_trans(batch: BatchShape, pcie_bandwidth: float) -> float:
    """Eq. 8: one accelerator's input features over PCIe."""
    return batch.input_vertices * batch.dims[0] * S_FEAT / pcie_bandwidth


def t_aggregate(batch: BatchShape, layer: int, trainer: TrainerModel) -> float:
    """Eq. 11 for layer ``layer`` (1-based): its edges' source rows (its input width) read at the trainer's
    bandwidth."""
    return batch.edges[layer - 1] * batch.dims[layer - 1] * S_FEAT / trainer.bandwidth


def t_update(batch: BatchShape, layer: int, trainer: TrainerModel) -> float:
    """Eq. 12: the layer's multiply-accumulates, ``|V^l| x f_in x f_out``, at ``N x freq``."""
    return batch.vertices[layer - 1] * batch.dims[layer - 1] * batch.dims[layer] / trainer.macs_per_s


def t_trainer(batch: BatchShape, trainer: TrainerModel) -> float:
    """Eq. 10: forward over every layer, then backward: layer 1's update only (no gradient for the input
    features) and every later layer's aggregation and update; ``⊕`` is ``max`` for a pipelined trainer."""
    L = len(batch.dims) - 1

    def both(l: int) -> float:
        a, u = t_aggregate(batch, l, trainer), t_update(batch, l, trainer)
        return max(a, u) if trainer.pipelined else a + u

    forward = sum(both(l) for l in range(1, L + 1))
    backward = t_update(batch, 1, trainer) + sum(both(l) for l in range(2, L + 1))
    return forward + backward


def t_sync(dims: tuple[int, ...], pcie_bandwidth: float) -> float:
    """Eq. 13: the model's weights over PCIe twice (gathered, then scattered back)."""
    return 2 * sum(dims[l - 1] * dims[l] for l in range(1, len(dims))) * S_FEAT / pcie_bandwidth


def t_prop(batches: list[BatchShape], trainers: list[TrainerModel], pcie_bandwidth: float) -> float:
    """Eq. 9: the slowest trainer, then the gradient synchronisation."""
    return max(t_trainer(b, t) for b, t in zip(batches, trainers, strict=True)) + t_sync(batches[0].dims,
                                                                                         pcie_bandwidth)


def t_execution(t_samp: float, t_load_s: float, t_trans_s: float, t_prop_s: float) -> float:
    """Eq. 6: the pipeline's iteration time is its slowest stage's."""
    return max(t_samp, t_load_s, t_trans_s, t_prop_s)


def mteps(batches: list[BatchShape], t_execution_s: float) -> float:
    """Eq. 5: edges traversed by every trainer in an iteration, per second, in millions."""
    return sum(sum(b.edges) for b in batches) / t_execution_s / 1e6
