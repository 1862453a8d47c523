"""HyScale-GNN's performance model (Lin et al., §V): each pipeline stage's seconds per iteration from the
batch's shape and the devices' measured rates (Eqs. 5-13), the sampling time from a measured table, and
:class:`HybridModel`, which predicts every stage for a split and thread assignment and picks the initial split.

The measurements it reads are :mod:`gnnscale.plan.hybrid_measure`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gnnscale.plan.hybrid_resources import Threads

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

@dataclass(frozen=True)
class SamplingTable:
    """Seconds to sample a batch of ``size`` seeds cut into ``threads`` shares sampled at once on ``threads``
    threads, measured at a few of each (§V: sampling is measured, not modelled); with the batch's shape."""

    sizes: tuple[int, ...]
    threads: tuple[int, ...]
    seconds: tuple[tuple[float, ...], ...]
    """``seconds[i][j]``: ``threads[i]`` threads, ``sizes[j]`` seeds."""
    shapes: tuple[BatchShape, ...]
    """The sampled batch at each of ``sizes`` (averaged)."""

    def predict(self, size: float, threads: int) -> float:
        """Linear in the batch size between the measured ones (through zero below the smallest, proportional
        above the largest), at the largest measured thread count not above ``threads``."""
        if size <= 0:
            return 0.0
        i = max((k for k, t in enumerate(self.threads) if t <= threads), default=0)
        return _interp(size, self.sizes, self.seconds[i])

    def shape(self, size: float, dims: tuple[int, ...]) -> BatchShape:
        """The batch expected for ``size`` seeds: each count interpolated like :meth:`predict`."""
        def at(values: list[float]) -> int:
            return max(0, int(round(_interp(size, self.sizes, tuple(values)))))

        L = len(dims) - 1
        return BatchShape(dims=dims, input_vertices=at([s.input_vertices for s in self.shapes]),
                          edges=tuple(at([s.edges[l] for s in self.shapes]) for l in range(L)),
                          vertices=tuple(at([s.vertices[l] for s in self.shapes]) for l in range(L)))


def _one(threads: Threads) -> Threads:
    return Threads(threads.sampler, threads.loader, 1)


def _interp(x: float, xs: tuple[int, ...], ys: tuple[float, ...]) -> float:
    if x <= xs[0]:
        return ys[0] * x / xs[0]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys, strict=True), zip(xs[1:], ys[1:], strict=True), strict=False):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return ys[-1] * x / xs[-1]


@dataclass(frozen=True)
class DeviceRates:
    """Measured figures of one trainer's device for Eqs. 7-13 (per thread on a CPU: the CPU stages' threads
    scale them): gather bandwidth from host memory (Eq. 7), aggregation bandwidth (Eq. 11: a sparse
    aggregation's source-row bytes per second), multiply-accumulates per second (Eq. 12) and the link from host
    memory (Eq. 8, 13; for a CPU stand-in, a copy within host memory)."""

    gather: float
    aggregate: float
    macs: float
    link: float
    per_thread: bool


@dataclass
class HybridModel:
    """HyScale-GNN's performance model (§V) for one machine, model and graph: predicts each stage's seconds per
    iteration for a split and thread assignment, and picks the initial split."""

    dims: tuple[int, ...]
    cpu_sampling: SamplingTable
    gpu_sampling: SamplingTable | None
    rates: list[DeviceRates]
    """Per trainer (``--devices`` order)."""
    cpu_index: int
    gpu_sampled: list[bool]
    cores: int
    calibration: list[float] = field(default_factory=list)
    """Per trainer: measured over Eq. 10's seconds on one batch and one thread (:meth:`calibrate`; the part over
    1 is the remainder Eq. 10 does not count, on the trainer's own thread); 1 until measured."""
    pipeline_factor: float = 1.0
    """Measured over modelled seconds per iteration (:meth:`calibrate`), at least 1; 1 until measured."""

    def _trainer(self, g: int, threads: Threads) -> TrainerModel:
        r = self.rates[g]  # the CPU trainer's threads: a CPU stand-in for an accelerator runs on its own one
        k = min(threads.trainer, self.cores) if r.per_thread and g == self.cpu_index else 1
        return TrainerModel(bandwidth=r.aggregate * k, macs_per_s=r.macs * k, pipelined=False)

    def trainer_time(self, g: int, shape: BatchShape, threads: Threads) -> float:
        """Eq. 10 for trainer ``g`` on ``shape`` at its threads, plus its calibration's remainder: what Eq. 10 does
        not count (launches, activations, the interpreter) runs on the trainer's own thread, so it does not shrink
        with the trainer's threads as Eq. 10's bytes and multiply-accumulates do."""
        return t_trainer(shape, self._trainer(g, threads)) + self._overhead(g, shape, threads)

    def trainer_work(self, g: int, shape: BatchShape, threads: Threads) -> float:
        """Trainer ``g``'s busy core-seconds on ``shape``: Eq. 10 on one thread (more threads share the same
        work) plus the calibration's remainder."""
        return t_trainer(shape, self._trainer(g, _one(threads))) + self._overhead(g, shape, threads)

    def _overhead(self, g: int, shape: BatchShape, threads: Threads) -> float:
        k = self.calibration[g] if g < len(self.calibration) else 1.0
        one = t_trainer(shape, self._trainer(g, _one(threads)))
        if k < 1.0:  # faster than Eq. 10 (a pipelined device): the whole time scaled
            return (k - 1.0) * t_trainer(shape, self._trainer(g, threads))
        return (k - 1.0) * one

    def calibrate(self, measured: list[float], shapes: list[BatchShape], threads: Threads,
                  iteration: float | None = None, batch: int = 0, split: list[float] | None = None) -> None:
        """Scale each trainer's Eq. 10 to its measured forward and backward on ``shapes`` (``measured``: the
        trainers running at once, inside the pipeline, as in training; a CPU trainer's own CPU seconds, not its
        wall time: the cores it waited for are the ``cpu_work / cores`` term of :meth:`stage_times`, which would
        otherwise count that sharing twice away from the calibration point), and Eq. 6 to a measured ``iteration``
        (seconds per iteration of the pipeline at ``batch`` and ``split``). Eq. 10 counts the aggregation's bytes
        and the update's multiply-accumulates; a framework's kernels add launches, activations, dropout and the
        loss, which the paper leaves out (§VI-C) and which dominate small CPU batches; they run on the trainer's
        own thread, so the remainder over Eq. 10 is kept apart (:meth:`trainer_time`: it does not shrink with the
        trainer's threads; priced, as the threads' CPU seconds are, in the busy core-seconds once). Eq. 6 takes
        the slowest stage; the hand-over between stages, the synchronizer and stages sharing a few cores (and
        Python's interpreter lock) add to it: the ratios carry both."""
        self.calibration = []
        for g, (m, shape) in enumerate(zip(measured, shapes, strict=True)):
            eq10, one = t_trainer(shape, self._trainer(g, threads)), t_trainer(shape, self._trainer(g, _one(threads)))
            # the remainder over Eq. 10 at the calibration's threads, as a multiple of Eq. 10 on one thread
            self.calibration.append(1.0 + (m - eq10) / one if m > 0 and eq10 > 0 and m >= eq10 else
                                    m / eq10 if m > 0 and eq10 > 0 else 1.0)
        self.pipeline_factor = 1.0
        if iteration is not None and split is not None:
            modelled = self.stage_times(batch, split, threads)["iteration"]
            self.pipeline_factor = max(1.0, iteration / modelled) if modelled > 0 else 1.0

    def stage_times(self, batch: int, split: list[float], threads: Threads) -> dict[str, float]:
        """Seconds per iteration of each stage for a global batch of ``batch`` seeds: ``SC``, ``SA``, ``Load``,
        ``Tran`` (the slowest accelerator's), ``TC``, ``TA`` (the slowest accelerator trainer), ``sync`` and
        ``iteration`` (Eq. 6, where the CPU stages also cannot use more cores than there are)."""
        G = len(split)
        sizes = [s * batch for s in split]
        cpu_sampled = [g for g in range(G) if not self.gpu_sampled[g]]
        shapes = [self.cpu_sampling.shape(sizes[g], self.dims) for g in range(G)]
        sc = self.cpu_sampling.predict(sum(sizes[g] for g in cpu_sampled), min(threads.sampler, len(cpu_sampled)))
        sa = max((self.gpu_sampling.predict(sizes[g], 1) for g in range(G) if self.gpu_sampled[g]
                  and self.gpu_sampling is not None), default=0.0)
        host = self.rates[self.cpu_index]
        load = t_load(shapes, host.gather * min(threads.loader, self.cores))
        accel = [g for g in range(G) if g != self.cpu_index]
        trans = {g: t_trans(shapes[g], self.rates[g].link) for g in accel}
        train = {g: self.trainer_time(g, shapes[g], threads) if sizes[g] > 0 else 0.0 for g in range(G)}
        sync = t_sync(self.dims, min((self.rates[g].link for g in accel), default=host.link))
        prop = max(train.values()) + sync
        # every stage on the CPU shares its cores (the paper's CPU has 128; ours may have 2): the iteration
        # takes at least the CPU's busy core-seconds over the cores
        cpu_work = (sc * max(1, min(threads.sampler, len(cpu_sampled))) + load * threads.loader
                    + sum(self.trainer_work(g, shapes[g], threads) for g in range(G)
                          if self.rates[g].per_thread and sizes[g] > 0))
        iteration = self.pipeline_factor * max(t_execution(max(sc, sa), load, max(trans.values(), default=0.0),
                                                           prop), cpu_work / self.cores)
        return {"SC": sc, "SA": sa, "Load": load, "Tran": max(trans.values(), default=0.0),
                "TC": train[self.cpu_index], "TA": max((train[g] for g in accel), default=0.0), "sync": sync,
                "iteration": iteration}

    def epoch_time(self, num_train: int, batch: int, split: list[float], threads: Threads) -> float:
        """Every iteration's Eq. 6, plus filling the pipeline (the first batch's sampling, loading and
        transfer)."""
        full, rest = divmod(num_train, batch)
        t = self.stage_times(batch, split, threads)
        total = full * t["iteration"] + (self.stage_times(rest, split, threads)["iteration"] if rest else 0.0)
        return total + max(t["SC"], t["SA"]) + t["Load"] + t["Tran"]

    def initial_split(self, batch: int, threads: Threads, min_share: float = 0.0) -> list[float]:
        """Shares that give every trainer the same predicted time (an accelerator's with its transfer, as
        Algorithm 1 bundles them): each trainer's share in proportion to its predicted seeds per second."""
        G = len(self.rates)
        if G == 1:
            return [1.0]
        t = []
        for g in range(G):
            shape = self.cpu_sampling.shape(batch, self.dims)
            busy = self.trainer_time(g, shape, threads)
            if g != self.cpu_index:
                busy = max(busy, t_trans(shape, self.rates[g].link))
            t.append(max(busy, 1e-12))
        speed = [1 / x for x in t]
        split = [max(min_share, s / sum(speed)) for s in speed]
        return [s / sum(split) for s in split]

