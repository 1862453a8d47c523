"""HopGNN's traffic model: a distributed epoch's time and network bytes on ``N`` machines (``gnnscale plan
--engine distributed --machines N --devices-per-machine G --network 25Gbit,latency=50us``).

The model starts from the real partition of the user's graph into one part per rank (the project's partitioner:
METIS by default, the saved plan reused) and replays the engine's iterations without running them: it cuts the
epoch's global batches (``ranks x --batch-size`` seeds), samples every rank's mini-batch (model-centric) or every
rank's micrographs per time step (HopGNN §5.1's schedule, :mod:`gnnscale.distributed.schedule`, with the
configured merges) and counts, per rank and iteration:

* remote feature rows: the sampled inputs another rank owns, each distinct row once per exchange (pre-gathering,
  §5.2, de-duplicates a whole iteration's), with their 8-byte id requests;
* model migrations: parameters and gradients (``2 x P x 4`` bytes) point to point after every step but the last;
* the gradient all-reduce (a ring: ``2 (N-1)/N x P x 4`` bytes, ``2 (N-1)`` messages in turn);
* the compute of the sampled blocks (:func:`work_seconds`: aggregation edges at the measured rate per width, dense
  FLOPs, elementwise bytes; forward and backward), fitted to this model on this machine (:class:`ComputeFit`: a
  step's fixed cost and the ratio of real to counted work, timed on a few replayed steps), and the sampling (edges
  at the rate measured while replaying);
* the exchanges' local work (``exchange``: owners looked up, ids de-duplicated and sorted, the peers' requests
  served, the received rows stitched back; :class:`ExchangeFit`, a fixed cost and a price per received and served
  row, timed on rank 0's replayed exchanges run through the engine's feature source without the collectives):
  it does not overlap the network (about a tenth of a 1 Gbit epoch of 2 ranks on this 2-core machine);
* every collective's synchronisation (``wait``: the last rank's arrival, the jitter of the ranks' work between
  collectives, and being scheduled again; measured once per rank count on this machine, ranks of bursts of
  work and small all-to-alls: :func:`gnnscale.plan.network_rate.sync_cost`);
* the synchronisations' local work (``sync``: the gradients flattened for the all-reduce and the optimiser's
  step every iteration, a model and its gradients flattened and unflattened every migration; :class:`SyncFit`,
  timed on the engine's model).

Time of an iteration = the slowest rank's sampling, compute and local exchange and sync work between
synchronisations, times the core sharing of the ranks of one machine (``max(1, G / cores)``), plus every
collective's ``messages x latency + bytes / rate``.
The rate: with one machine, each rank's own (loopback, or the emulated network the validation sets); with more,
each machine's link carries the bytes its ``G`` ranks send off the machine.

Partition: METIS over the whole graph up to :data:`METIS_MAX_EDGES` edges (the partition the engine would use, its
saved plan reused). Beyond, a sample of it (:func:`sampled_owner`): METIS into ``N`` parts of the subgraph the
replayed iterations touch (their seeds' sampled neighbourhoods, induced), which holds every vertex the replay asks
an owner of; nothing needs scaling, as the counts are per iteration and the replay's iterations are the ones
partitioned. Part sizes are balanced over the touched vertices, not the whole graph's.

Scale: the replay samples at most :data:`SIM_ITERATIONS` iterations (evenly spread over the epoch) and, beyond
:data:`SIM_RANKS` ranks, an even subset of the ranks (the others are like them: their slowest stands for all);
it scales the counts to the epoch's iterations. Predicting 64 machines takes seconds, with no processes.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from gnnscale.config import TrainConfig
from gnnscale.distributed.comm import ring_bytes, ring_rounds
from gnnscale.distributed.schedule import build_schedule, home_groups
from gnnscale.graph.block import Block
from gnnscale.graph.graph import Graph
from gnnscale.nn.stack import Stack
from gnnscale.partition import load_or_partition, partition_graph
from gnnscale.plan.distributed_fit import (
    FIT_EXCHANGES,
    FIT_STEPS,
    ComputeFit,
    ExchangeFit,
    ExchangeFn,
    StepFn,
    SyncFit,
    SyncFn,
)
from gnnscale.plan.epoch_time import Cluster, EpochTime
from gnnscale.plan.rates import Rates
from gnnscale.sample import CSRTopology, SampledAdjacency, sample_blocks, sample_key

SIM_ITERATIONS = 3
"""Iterations of the epoch the model replays (scaled to all of them)."""
SIM_RANKS = 8
"""Ranks the model replays at most (an even subset beyond)."""
ELEMENTWISE_PASSES = 6
"""Elementwise passes over each layer's output rows per training step (activation, dropout, bias, loss, and
their backward), each reading and writing ``rows x width x 4`` bytes."""
ID_BYTES = 8
METIS_MAX_EDGES = 50_000_000
"""Beyond this many edges the model partitions a sample of the graph (:func:`sampled_owner`)."""


@dataclass
class RankStep:
    """What one rank does in one time step (model-centric: the one step) of an iteration."""

    compute: float = 0.0
    """Seconds of forward and backward (:func:`work_seconds`)."""
    sample: float = 0.0
    """Seconds of sampling."""
    src: Tensor | None = None
    """The step's input rows' ids."""


@dataclass
class Replay:
    """The counts of one strategy, per replayed iteration, per replayed rank, per step."""

    steps: list[list[list[RankStep]]] = field(default_factory=list)
    """``steps[i][r][k]``."""
    exchanges: list[list[list[tuple[int, int]]]] = field(default_factory=list)
    """``[i][e][r]``: the rows rank ``r`` receives and serves in exchange ``e`` of iteration ``i`` (one per step;
    with pre-gathering one per iteration)."""
    iterations: int = 0
    """Iterations in the whole epoch."""
    exchange: ExchangeFit = field(default_factory=ExchangeFit)
    """How an exchange's local work is priced."""
    sync: SyncFit = field(default_factory=SyncFit)
    """How the local work around the all-reduce and the migrations is priced."""


def work_seconds(blocks: list[Block], model: Stack, rates: Rates) -> float:
    """Forward and backward seconds of ``model`` over ``blocks`` at ``rates``: per layer, the aggregation's edges
    at the layer's input width (twice: forward and the transposed backward), the dense ``2 x rows x params`` FLOPs
    (three times: forward, input and weight gradients) and :data:`ELEMENTWISE_PASSES` over the output rows.
    (A local stand-in for the planner's shared work counting.)"""
    seconds = 0.0
    for block, layer in zip(blocks, model.block_layers, strict=False):
        rows = int(block.indptr.numel()) - 1
        width_in, width_out = int(layer.in_features), int(layer.out_features)
        params = sum(p.numel() for p in layer.parameters())
        seconds += 2 * block.num_edges / rates.aggregate_rate(width_in)
        seconds += 3 * 2 * rows * params / rates.flops
        seconds += ELEMENTWISE_PASSES * rows * width_out * 4 / rates.memory
    return seconds


def owner_of_parts(graph: Graph, ranks: int, config: TrainConfig) -> Tensor:
    """``[N]``: every vertex's rank under the partition the engine would use (saved plans reused)."""
    plan, _, _ = load_or_partition(graph, ranks, 1, config.partition_method, config.seed, config.plan_dir)
    return plan.owners()


def sampled_owner(graph: Graph, ranks: int, config: TrainConfig, touched: Tensor) -> Tensor:
    """``[N]``: the ranks of ``touched`` (sorted unique ids) from METIS (``config.partition_method``) on their
    induced subgraph; ``-1`` elsewhere."""
    local = torch.full((graph.num_nodes,), -1, dtype=torch.int64)
    local[touched] = torch.arange(touched.numel())
    start, end = graph.indptr[touched], graph.indptr[touched + 1]
    deg = end - start
    dst = torch.repeat_interleave(torch.arange(touched.numel()), deg)
    pos = torch.repeat_interleave(start - torch.cumsum(deg, 0) + deg, deg) + torch.arange(int(deg.sum()))
    src = local[graph.indices[pos].long()]
    keep = src >= 0
    sub = Graph.from_edge_index(torch.stack([src[keep], dst[keep]]), int(touched.numel()))
    plan = partition_graph(sub, min(ranks, int(touched.numel())), 1, config.partition_method, config.seed)
    parts = torch.repeat_interleave(torch.arange(plan.partitions), plan.part_ptr[1:] - plan.part_ptr[:-1])
    owner = torch.full((graph.num_nodes,), -1, dtype=torch.int64)
    owner[touched[plan.perm]] = parts
    return owner


def _merges(config: TrainConfig, ranks: int) -> int:
    """The merges the model prices: a fixed ``--merge N``, else none (``auto`` starts unmerged)."""
    return min(int(config.merge), ranks - 1) if config.merge.isdigit() else 0


class Replayer:
    """Samples the engine's iterations for ``ranks`` ranks and counts their work (:class:`Replay`)."""

    def __init__(self, graph: Graph, config: TrainConfig, model: Stack, rates: Rates, owner: Tensor, ranks: int,
                 fanouts: tuple[int, ...], sample_rate: float | None = None, fit: ComputeFit | StepFn | None = None,
                 exchange: ExchangeFit | ExchangeFn | None = None, sync: SyncFit | SyncFn | None = None):
        self.graph, self.config, self.model, self.rates = graph, config, model, rates
        self.owner, self.ranks, self.fanouts = owner, ranks, fanouts
        self.topo = CSRTopology.from_graph(graph, model.adjacency)
        self.adjacency = SampledAdjacency.from_graph(graph, model.adjacency, config.sample_norm)  # type: ignore[arg-type]
        self.sample_rate = sample_rate
        """Sampled edges per second (``None``: measured as the replay samples)."""
        self._edges, self._sample_s = 0, 0.0
        self.fit = fit
        """How counted work becomes seconds: a :class:`ComputeFit`, or the engine's step to time one on replayed
        steps (``None``: the counts as they are)."""
        self._timed: list[tuple[list[Block], Tensor, float]] = []
        self.exchange, self.sync = exchange, sync
        """The exchanges' and synchronisations' local work: fits, or the engine's work to time them on (``None``:
        left out)."""
        self._exchanges: list[tuple[list[Tensor], Tensor, int]] = []
        step = max(1, ranks // SIM_RANKS)
        self.watched = list(range(0, ranks, step))[:SIM_RANKS]

    def _blocks(self, seeds: Tensor, key: int) -> tuple[list[Block], float]:
        t0 = time.perf_counter()
        blocks = sample_blocks(self.topo, seeds, self.fanouts, key, self.adjacency)
        edges = sum(b.num_edges for b in blocks)
        self._sample_s += time.perf_counter() - t0
        self._edges += edges
        return blocks, float(edges)

    def _step(self, seeds: Tensor, key: int, rank: int) -> RankStep:
        if seeds.numel() == 0:
            return RankStep(src=torch.empty(0, dtype=torch.int64))
        blocks, edges = self._blocks(seeds, key)
        src = blocks[0].src_ids
        assert src is not None
        work = work_seconds(blocks, self.model, self.rates)
        if callable(self.fit) and len(self._timed) < FIT_STEPS:
            self._timed.append((blocks, seeds, work))
        return RankStep(compute=work, sample=edges, src=src)

    def batches(self, train_ids: Tensor) -> tuple[int, list[Tensor]]:
        """The epoch's iteration count and the global batches the replay samples (evenly spread)."""
        gen = torch.Generator().manual_seed(self.config.seed)
        order = train_ids[torch.randperm(train_ids.numel(), generator=gen)]
        batches = list(torch.split(order, self.ranks * self.config.batch_size))
        picks = sorted({int(i * len(batches) / SIM_ITERATIONS) for i in range(min(SIM_ITERATIONS, len(batches)))})
        return len(batches), [batches[i] for i in picks]

    def touched(self, batches: list[Tensor]) -> Tensor:
        """Every vertex the replay of ``batches`` samples (a vertex's sample is the same in any group)."""
        seeds = torch.unique(torch.cat(batches))
        src = sample_blocks(self.topo, seeds, self.fanouts, sample_key(self.config.seed, 0), self.adjacency)[0].src_ids
        return torch.unique(src if src is not None else seeds)

    def replay(self, strategy: str, iterations: int, batches: list[Tensor]) -> Replay:
        """Count ``strategy``'s ``batches`` of an epoch of ``iterations`` (``sample`` holds sampled edges until
        :meth:`finish` prices them)."""
        R = self.ranks
        key = sample_key(self.config.seed, 0)
        out = Replay(iterations=iterations)
        for batch in batches:
            parts = list(torch.tensor_split(batch, R))
            if strategy == "model-centric":
                per = [[self._step(parts[r], key, r)] for r in self.watched]
            else:
                sched = build_schedule(home_groups(parts, self.owner, R), _merges(self.config, R))
                per = [[self._step(sched.roots_on(r, k), key, r) for k in range(sched.steps)] for r in self.watched]
            out.steps.append(per)
            if strategy == "micrograph" and self.config.pregather == "on":
                out.exchanges.append([self._exchange([steps for steps in per])])
            else:
                out.exchanges.append([self._exchange([[steps[k]] for steps in per]) for k in range(len(per[0]))])
        return self.finish(out)

    def _exchange(self, per: list[list[RankStep]]) -> list[tuple[int, int]]:
        """``(received, served)`` rows of every watched rank in one exchange of the inputs of its steps ``per[r]``
        (each distinct remote row once); served rows are counted from the watched ranks' requests, scaled to all
        ranks."""
        asked = []
        for r, steps in zip(self.watched, per, strict=True):
            srcs = [s.src for s in steps if s.src is not None]
            ids = torch.unique(torch.cat(srcs)) if srcs else torch.empty(0, dtype=torch.int64)
            asked.append(ids[self.owner[ids] != r])
        every = torch.cat(asked)
        if callable(self.exchange) and len(self._exchanges) < FIT_EXCHANGES:
            first = self.watched[0]
            srcs = [s.src for s in per[0] if s.src is not None]
            wanted = every[self.owner[every] == first]
            self._exchanges.append((srcs, wanted, int(asked[0].numel() + wanted.numel())))
        served = torch.bincount(self.owner[every], minlength=self.ranks).double()
        served *= self.ranks / len(self.watched)
        return [(int(a.numel()), int(served[r])) for r, a in zip(self.watched, asked, strict=True)]

    def finish(self, out: Replay) -> Replay:
        """Price the sampled edges at the sampling rate (given, or measured as the replay sampled)."""
        rate = self.sample_rate or (self._edges / self._sample_s if self._sample_s > 0 else math.inf)
        fit = self.fit if isinstance(self.fit, ComputeFit) else ComputeFit()
        if callable(self.fit) and self._timed:
            seeds = self._timed[0][1][:1]
            one = self._blocks(seeds, 0)[0]
            fit = ComputeFit.timed(self.fit, self._timed, (one, seeds, work_seconds(one, self.model, self.rates)))
        self._timed.clear()
        if isinstance(self.exchange, ExchangeFit):
            out.exchange = self.exchange
        elif callable(self.exchange):
            out.exchange = ExchangeFit.timed(self.exchange, self.owner, self._exchanges)
        self._exchanges.clear()
        if isinstance(self.sync, SyncFit):
            out.sync = self.sync
        elif callable(self.sync):
            out.sync = SyncFit.timed(self.sync)
        for it in out.steps:
            for steps in it:
                for s in steps:
                    s.sample = s.sample / rate
                    s.compute = fit.seconds(s.compute)
        return out


@dataclass(frozen=True)
class Network:
    """How collectives are priced: ``seconds = latency x messages + bytes x per_byte``, and on one machine no
    less than its loopback's (``floor``: the ranks' messages cross it whatever network is named; an emulated one
    only sleeps the difference)."""

    per_byte: float
    latency: float
    floor: Network | None = None

    @classmethod
    def of(cls, cluster: Cluster, rates: Rates, ranks: int) -> Network:
        """One machine: each rank at the named (or measured loopback) rate, at least the loopback's time. More
        machines: a fraction ``(N - G) / (N - 1)`` of a rank's bytes leaves its machine, on a link its ``G`` ranks
        share; the rest goes at the loopback rate."""
        local = rates.network or rates.copy
        latency = cluster.latency if cluster.latency is not None else rates.latency
        if cluster.machines == 1:
            loopback = cls(1 / local, rates.latency) if rates.network > 0 else None
            return cls(1 / (cluster.network or local), latency, loopback)
        link = cluster.network or local
        g = ranks // cluster.machines
        off = (ranks - g) / max(ranks - 1, 1)
        return cls(max(g * off / link, (1 - off) / local), latency)

    def seconds(self, nbytes: float, messages: int) -> tuple[float, float]:
        """``(latency seconds, bandwidth seconds)`` of one collective."""
        named = self.latency * messages, nbytes * self.per_byte
        if self.floor is not None:
            real = self.floor.seconds(nbytes, messages)
            return real if sum(real) > sum(named) else named
        return named


def cores_shared(cluster: Cluster, ranks: int, cores: int | None = None) -> float:
    """How much slower a rank computes when the ``G`` ranks of a machine share its cores (one thread each)."""
    g = ranks // cluster.machines
    return max(1.0, g / (cores or os.cpu_count() or 1))


@dataclass
class Tally:
    """One iteration's priced terms (seconds) and the network bytes every rank received (the comm layer's
    ``received_bytes``, summed over ranks)."""

    terms: dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        ("sample", "compute", "exchange", "sync", "contention", "fetch", "migrate", "allreduce", "latency", "wait"),
        0.0))
    received: float = 0.0

    def collective(self, net: Network, term: str, nbytes: float, messages: int) -> None:
        lat, bw = net.seconds(nbytes, messages)
        self.terms["latency"] += lat
        self.terms[term] += bw


def price_iteration(replay: Replay, i: int, strategy: str, pregather: bool, net: Network, share: float,
                    ranks: int, row_bytes: int, param_bytes: int, wait: float = 0.0) -> Tally:
    """Replayed iteration ``i`` of ``replay`` priced: the slowest rank's work between synchronisations (times
    ``share``), and each collective at ``net`` plus ``wait`` (the ranks' synchronisation: the last one's arrival,
    being scheduled again)."""
    t, per, R = Tally(), replay.steps[i], ranks
    n_steps = len(per[0])
    mean_remote = 0.0
    for ex in replay.exchanges[i]:  # every rank's collective lasts as long as the busiest rank's
        rows = max(max(recv, served) for recv, served in ex)
        mean_remote += sum(recv for recv, _ in ex) / len(ex)
        t.terms["exchange"] += max(replay.exchange.seconds(recv + served) for recv, served in ex)
        t.collective(net, "fetch", ID_BYTES * (R - 1), R - 1)  # the counts
        t.collective(net, "fetch", ID_BYTES * rows, R - 1)  # the ids asked for
        t.collective(net, "fetch", row_bytes * rows, R - 1)  # the rows
    if strategy == "micrograph" and pregather:
        t.terms["sample"] = max(sum(s.sample for s in steps) for steps in per)
    else:
        t.terms["sample"] = sum(max(steps[k].sample for steps in per) for k in range(n_steps))
    t.terms["compute"] = sum(max(steps[k].compute for steps in per) for k in range(n_steps))
    t.terms["sync"] = replay.sync.iteration + (n_steps - 1) * replay.sync.migration
    t.terms["contention"] = (share - 1) * sum(t.terms[k] for k in ("sample", "compute", "exchange", "sync"))
    migration = 2 * param_bytes
    for _ in range(n_steps - 1):
        t.collective(net, "migrate", migration, 1)
    t.collective(net, "allreduce", ring_bytes(param_bytes, R), ring_rounds(R))
    t.terms["wait"] = wait * (3 * len(replay.exchanges[i]) + n_steps - 1 + 1)
    counts = ID_BYTES * (R - 1) * len(replay.exchanges[i])
    t.received = R * (mean_remote * (row_bytes + ID_BYTES) + counts + (n_steps - 1) * migration + param_bytes)
    return t


def predict(graph: Graph, config: TrainConfig, model: Stack, rates: Rates, cluster: Cluster, fanouts: tuple[int, ...],
            *, owner: Tensor | None = None, sample_rate: float | None = None, cores: int | None = None,
            fit: ComputeFit | StepFn | None = None, exchange: ExchangeFit | ExchangeFn | None = None,
            sync: SyncFit | SyncFn | None = None, wait: float = 0.0,
            metis_max_edges: int = METIS_MAX_EDGES) -> EpochTime:
    """The distributed engine's epoch under ``config.strategy`` on ``cluster`` (``machines x G`` ranks, ``G``
    default 1) at ``rates``; ``owner`` (every vertex's rank), ``sample_rate`` (edges/s), ``cores`` (per
    machine), ``fit`` (:class:`ComputeFit`, or the step to time one with), ``exchange`` (:class:`ExchangeFit`, or
    the engine's exchange work to time one with) and ``sync`` (:class:`SyncFit`, or the work to time) may be given
    (tests), else they come from the partitioner, the replay and this machine (``None``: those terms left out);
    ``wait``: the seconds every collective costs the ranks of a machine to synchronise
    (:func:`gnnscale.plan.network_rate.sync_cost`)."""
    ranks = cluster.machines * (cluster.devices_per_machine or 1)
    assert graph.train_mask is not None and graph.x is not None
    replayer = Replayer(graph, config, model, rates, torch.empty(0, dtype=torch.int64), ranks, fanouts, sample_rate,
                        fit, exchange, sync)
    iterations, batches = replayer.batches(torch.nonzero(graph.train_mask).view(-1))
    sampled = owner is None and graph.num_edges > metis_max_edges
    if owner is None:
        owner = (sampled_owner(graph, ranks, config, replayer.touched(batches)) if sampled else
                 owner_of_parts(graph, ranks, config))
    replayer.owner = owner
    replay = replayer.replay(config.strategy, iterations, batches)
    net, share = Network.of(cluster, rates, ranks), cores_shared(cluster, ranks, cores)
    row_bytes = graph.x.shape[1] * graph.x.element_size()
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    tallies = [price_iteration(replay, i, config.strategy, config.pregather == "on", net, share, ranks, row_bytes,
                               param_bytes, wait) for i in range(len(replay.steps))]
    scale = replay.iterations / max(len(tallies), 1)
    terms = {k: scale * sum(t.terms[k] for t in tallies) for k in tallies[0].terms} if tallies else {}
    received = int(scale * sum(t.received for t in tallies))
    how = "micrograph (HopGNN §5)" if config.strategy == "micrograph" else "model-centric (DistDGL)"
    part = f"{config.partition_method} of the replay's subgraph" if sampled else config.partition_method
    return EpochTime(sum(terms.values()), terms, {"network": received},
                     f"HopGNN traffic model, {how}, {ranks} ranks on {cluster.machines} machine(s), {part} parts")
