"""HyScale-GNN's dynamic resource management (Lin et al., §IV-A, Algorithm 1): after each iteration, the stage
times decide whether to move *work* (seeds between the CPU and accelerator trainers, or sampling between the CPU
and accelerator samplers; the global batch is unchanged) or *threads* (between the CPU sampler, the feature loader
and the CPU trainer).

:func:`drm_decide` is Algorithm 1's decision table as a pure function of the stage times; the hybrid engine
applies its decisions.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor

from gnnscale.plan.throughput import _name, _rate, cached, throughput
from gnnscale.sample import sample_blocks

if TYPE_CHECKING:
    from gnnscale.graph.block import Block
    from gnnscale.sample.adjacency import SampledAdjacency
    from gnnscale.sample.neighbor import Topology

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


# ------------------------------------------------------------------------------------------- threads and work
THREAD_STAGES = {"SC": "sampler", "Load": "loader", "TC": "trainer"}
"""Algorithm 1's CPU stages and the thread pool each one owns."""


@dataclass(frozen=True)
class Threads:
    """The CPU's threads: the CPU sampler's, the feature loader's and the CPU trainer's (``--threads S,L,T``)."""

    sampler: int
    loader: int
    trainer: int

    def as_tuple(self) -> tuple[int, int, int]:
        return (self.sampler, self.loader, self.trainer)

    def move(self, src: str, dst: str) -> Threads | None:
        """One thread from stage ``src`` to stage ``dst`` (Algorithm 1's names); ``None`` when ``src`` has one
        thread left or either is not a CPU stage."""
        if src not in THREAD_STAGES or dst not in THREAD_STAGES or src == dst:
            return None
        counts = {name: getattr(self, name) for name in THREAD_STAGES.values()}
        if counts[THREAD_STAGES[src]] <= 1:
            return None
        counts[THREAD_STAGES[src]] -= 1
        counts[THREAD_STAGES[dst]] += 1
        return Threads(**counts)


def default_threads(cores: int) -> Threads:
    """Half the cores to the CPU trainer, the rest split between the sampler and the loader; one each at least
    (so three threads share fewer than three cores)."""
    trainer = max(1, cores // 2)
    sampler = max(1, (cores - trainer) // 2)
    return Threads(sampler, max(1, cores - trainer - sampler), trainer)


def check_threads(threads: tuple[int, ...], cores: int) -> str | None:
    """Why ``--threads`` cannot run on ``cores`` cores, or ``None``."""
    if len(threads) != 3:
        return f"--threads takes three counts (sampler, loader, CPU trainer), got {len(threads)}"
    if any(t < 1 for t in threads):
        return f"--threads must each be >= 1, got {','.join(map(str, threads))}"
    if max(threads) > cores or sum(threads) > max(cores, 3):
        return (f"--threads {','.join(map(str, threads))} asks for {sum(threads)} threads, more than this "
                f"machine's {cores} cores (they share them: the sum may be at most {max(cores, 3)})")
    return None


Cost = tuple[float, float]
"""A trainer's seconds per iteration as ``a + b * seeds``: a fixed part (launches, the loss, the optimiser's
hand-over) and a part per seed."""


COST_SPREAD = 3.0
"""The least ratio of a trainer's largest to smallest sampled seed count for :func:`fit_cost` to fit a fixed
part: closer counts make the slope mostly noise."""


def fit_cost(samples: list[tuple[int, float]]) -> Cost | None:
    """``(a, b)`` of ``seconds = a + b * seeds`` by least squares over ``(seeds, seconds)`` samples; through zero
    (``a = 0``) when the seed counts vary too little to tell the parts apart (less than :data:`COST_SPREAD`
    times) or the fit is not a cost (a negative part); ``None`` without a sample."""
    pts = [(n, t) for n, t in samples if n > 0 and t > 0]
    if not pts:
        return None
    ns = [n for n, _ in pts]
    proportional = (0.0, sum(t for _, t in pts) / sum(ns))
    if max(ns) < COST_SPREAD * min(ns):
        return proportional
    mn = sum(ns) / len(ns)
    mt = sum(t for _, t in pts) / len(pts)
    b = sum((n - mn) * (t - mt) for n, t in pts) / sum((n - mn) ** 2 for n in ns)
    a = mt - b * mn
    return (a, b) if a >= 0 and b > 0 else proportional


def rebalance(split: list[float], busy: list[float], seeds: list[int], *, min_share: float,
              tolerance: float, costs: list[Cost | None] | None = None) -> list[float] | None:
    """*balance work*: new shares of the global batch under which every trainer takes the same time, the fast
    ones taking work from the slow ones. A trainer's time is its cost model (``costs[g]``, fitted over
    iterations by :func:`fit_cost`) or, without one, this iteration's seconds per seed (``busy[g] / seeds[g]``).
    ``None`` when the times the models give this split already lie within ``tolerance`` of each other. A trainer
    with no seeds keeps its share; none falls below ``min_share``."""
    measured = [g for g in range(len(split)) if seeds[g] > 0 and busy[g] > 0]
    if len(measured) < 2:
        return None
    cost = {g: (costs[g] if costs is not None and costs[g] is not None else None) or (0.0, busy[g] / seeds[g])
            for g in measured}
    times = [cost[g][0] + cost[g][1] * seeds[g] for g in measured]  # what the models say this split costs
    if max(times) <= (1 + tolerance) * min(times):
        return None
    free = sum(split[g] for g in measured)  # the measured trainers' shares are redistributed among themselves
    total = sum(seeds[g] for g in measured)  # ... as seeds of this batch
    floor = min_share * total / free
    floored: set[int] = set()
    while True:  # equal time T over the trainers not held at the floor: sum (T - a) / b = their seeds
        rest = [g for g in measured if g not in floored]
        left = total - floor * len(floored)
        t = (left + sum(cost[g][0] / cost[g][1] for g in rest)) / sum(1 / cost[g][1] for g in rest)
        n = {g: (t - cost[g][0]) / cost[g][1] for g in rest}
        low = [g for g in rest if n[g] < floor]
        if not low or len(low) == len(rest):
            break
        floored.update(low)
    new = list(split)
    for g in measured:
        new[g] = free * (floor if g in floored else n[g]) / total
    return new


# ------------------------------------------------------------------------------------------- stage predictions
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
    """Per trainer: measured over Eq. 10's seconds on one batch (:meth:`calibrate`); 1 until measured."""
    pipeline_factor: float = 1.0
    """Measured over modelled seconds per iteration (:meth:`calibrate`), at least 1; 1 until measured."""

    def _trainer(self, g: int, threads: Threads) -> TrainerModel:
        r = self.rates[g]
        k = min(threads.trainer, self.cores) if r.per_thread else 1
        return TrainerModel(bandwidth=r.aggregate * k, macs_per_s=r.macs * k, pipelined=False)

    def trainer_time(self, g: int, shape: BatchShape, threads: Threads) -> float:
        """Eq. 10 for trainer ``g`` on ``shape``, times its calibration."""
        k = self.calibration[g] if g < len(self.calibration) else 1.0
        return k * t_trainer(shape, self._trainer(g, threads))

    def calibrate(self, measured: list[float], shapes: list[BatchShape], threads: Threads,
                  iteration: float | None = None, batch: int = 0, split: list[float] | None = None) -> None:
        """Scale each trainer's Eq. 10 to its measured forward and backward on ``shapes`` (``measured``: the
        trainers running at once, inside the pipeline, as in training), and Eq. 6 to a measured ``iteration``
        (seconds per iteration of the pipeline at ``batch`` and ``split``). Eq. 10 counts the aggregation's bytes
        and the update's multiply-accumulates; a framework's kernels add launches, activations, dropout and the
        loss, which the paper leaves out (§VI-C) and which dominate small CPU batches. Eq. 6 takes the slowest
        stage; the hand-over between stages, the synchronizer and stages sharing a few cores (and Python's
        interpreter lock) add to it: the ratios carry both."""
        self.calibration = []
        for g, (m, shape) in enumerate(zip(measured, shapes, strict=True)):
            eq10 = t_trainer(shape, self._trainer(g, threads))
            self.calibration.append(m / eq10 if m > 0 and eq10 > 0 else 1.0)
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
                    + sum(train[g] * (threads.trainer if self.rates[g].per_thread else 0) for g in range(G)))
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


# ------------------------------------------------------------------------------------------- measurements
SAMPLE_REPEATS = 3
"""Runs per table entry (the median is kept)."""


def batch_shape(blocks: list[Block], dims: tuple[int, ...]) -> BatchShape:
    """The counts of Eqs. 5-12 of one sampled batch (``blocks[0]`` the input layer)."""
    return BatchShape(dims=dims, edges=tuple(b.num_edges for b in blocks),
                      vertices=tuple(b.num_dst for b in blocks), input_vertices=blocks[0].num_src)


def measure_sampling(topo: Topology, ids: Tensor, fanouts: tuple[int, ...], dims: tuple[int, ...],
                     batch: int, max_threads: int, key: int = 0,
                     adjacency: SampledAdjacency | None = None) -> SamplingTable:
    """The sampling-time table: a batch of each of ``batch / 4``, ``batch / 2`` and ``batch`` seeds (drawn from
    ``ids`` on ``ids``' device), cut into ``k`` shares sampled at once on ``k`` threads, for ``k`` in 1, 2, 4, ...
    up to ``max_threads``; the median of :data:`SAMPLE_REPEATS` runs after a warm-up. ``adjacency``: the blocks
    made the layers' (loops, GCN weights), as training samples them."""
    from concurrent.futures import ThreadPoolExecutor

    n = ids.numel()
    sizes = tuple(sorted({max(1, min(n, s)) for s in (batch // 4, batch // 2, batch)}))
    threads = tuple(k for k in (1, 2, 4, 8, 16, 32) if k <= max(1, max_threads))
    gen = torch.Generator().manual_seed(key)
    order = torch.randperm(n, generator=gen).to(ids.device)
    seconds = []
    shapes: dict[int, list[BatchShape]] = {s: [] for s in sizes}
    cuda = ids.device.type == "cuda"
    for k in threads:
        row = []
        with ThreadPoolExecutor(k) as pool:
            for s in sizes:
                runs = []
                for r in range(SAMPLE_REPEATS + 1):
                    seeds = ids[order[(r * s) % max(1, n - s + 1):][:s]]
                    parts = [p for p in torch.tensor_split(seeds, k) if p.numel()]
                    if cuda:
                        torch.cuda.synchronize(ids.device)
                    t0 = time.perf_counter()
                    out = list(pool.map(lambda p: sample_blocks(topo, p, fanouts, key, adjacency), parts))
                    if cuda:
                        torch.cuda.synchronize(ids.device)
                    if r:
                        runs.append(time.perf_counter() - t0)
                    if k == 1 and r:
                        shapes[s].append(batch_shape(out[0], dims))
                row.append(sorted(runs)[len(runs) // 2])
        seconds.append(tuple(row))

    def mean(bs: list[BatchShape]) -> BatchShape:
        L = len(dims) - 1
        return BatchShape(dims=dims, input_vertices=round(sum(b.input_vertices for b in bs) / len(bs)),
                          edges=tuple(round(sum(b.edges[l] for b in bs) / len(bs)) for l in range(L)),
                          vertices=tuple(round(sum(b.vertices[l] for b in bs) / len(bs)) for l in range(L)))

    return SamplingTable(sizes, threads, tuple(seconds), tuple(mean(shapes[s]) for s in sizes))


def measure_rates(device: torch.device) -> DeviceRates:
    """Eqs. 7-13's figures for ``device``, measured the way the stages run: on a CPU with one thread (the
    stages' threads scale them); a GPU's link is the host-row gather onto it (pinned staging, async copy)."""
    gen = torch.Generator().manual_seed(0)
    rows, width, edges = 1 << 16, 64, 1 << 18
    cpu = device.type == "cpu"
    before = torch.get_num_threads()
    if cpu:
        torch.set_num_threads(1)
    try:
        host = torch.randn(2 * rows, width, generator=gen)
        idx = torch.randperm(2 * rows, generator=gen)[:rows]
        gather = _rate(lambda: host.index_select(0, idx), rows * width * 4, torch.device("cpu"))
        dst = rows // 2
        crow = torch.arange(0, edges + 1, edges // dst)
        col = torch.randint(0, rows, (edges,), generator=gen)
        adj = torch.sparse_csr_tensor(crow, col, torch.ones(edges), (dst, rows)).to(device)
        x = host[:rows].to(device)
        aggregate = _rate(lambda: adj @ x, edges * width * 4, device)
        a = torch.randn(1 << 14, 128, generator=gen).to(device)
        w = torch.randn(128, 128, generator=gen).to(device)
        macs = _rate(lambda: a @ w, (1 << 14) * 128 * 128, device)
        # a CPU stand-in for an accelerator "transfers" by a copy in host memory
        link = _rate(lambda: host.clone(), host.numel() * 4, device) if cpu else throughput([device]).hd
    finally:
        torch.set_num_threads(before)
    return DeviceRates(gather=gather, aggregate=aggregate, macs=macs, link=link, per_thread=cpu)


def device_rates(device: torch.device) -> DeviceRates:
    """:func:`measure_rates`, measured once per machine and cached beside the other throughputs (key
    ``hybrid:<device name>``)."""
    names = ("gather", "aggregate", "macs", "link")

    def measure() -> dict[str, float]:
        r = measure_rates(device)
        return {"gather": r.gather, "aggregate": r.aggregate, "macs": r.macs, "link": r.link}

    e = cached(f"hybrid:{_name(device)}", names, measure)
    return DeviceRates(e["gather"], e["aggregate"], e["macs"], e["link"], per_thread=device.type == "cpu")
