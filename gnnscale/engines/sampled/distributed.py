"""Distributed mini-batch training on torch.distributed: model-centric (DistDGL) or feature-centric (HopGNN).

A job runs ``R`` ranks (torchrun, or ``gnnscale train --ranks R``). The graph is partitioned into ``R`` parts
(METIS by default, a saved plan reused; ``--plan FILE`` names one): every rank keeps the features of its own part
only (:class:`~gnnscale.store.partitioned.PartitionedFeatures`) and the whole topology (replicated: sampling
needs no communication; it costs each rank ``8 (N + 1) + 8 E`` bytes of CSR, or less for a memory-mapped
on-disk graph, whose pages are shared by the ranks of a machine).

An *iteration* trains ``R`` mini-batches of ``--batch-size`` seeds, one per model (rank ``d``'s model trains
batch ``d``, DistDGL's per-trainer batch): the epoch's shuffle (a function of seed and epoch, the mini-batch
engine's) cut into global batches of ``R x --batch-size``, each split into ``R`` parts. Gradients of all ``R``
models are summed (each loss is its seeds' summed loss over the global batch's size) and every rank takes the
same optimiser step, so an iteration equals one step of the single-process mini-batch engine on the global
batch. Sampling is keyed by ``(seed, epoch, hop, vertex)``: a micrograph is the same wherever it is sampled.

Strategies (``--strategy``):

- ``model-centric``: each rank samples its batch and fetches the input features it lacks from their owners in
  one batched, de-duplicated exchange (:meth:`Comm.exchange`); gradients are all-reduced.
- ``micrograph`` (HopGNN §5.1, the default): roots are grouped by home rank; at time step ``t`` model ``d`` is on
  rank ``(d + t) % R`` and trains the micrographs of its roots homed there, then migrates (parameters and
  accumulated gradients, point to point) to the next rank. After the last step the gradients are all-reduced
  and every rank steps. ``--pregather on`` (§5.2) fetches the remote features of a rank's whole iteration in one
  de-duplicated exchange before its first step; off, every step fetches its own. ``--merge`` (§5.3) removes time
  steps (:mod:`gnnscale.distributed.schedule`).

``--norm batch``: BatchNorm normalises over the whole global batch (the mini-batch engine's), all-reduced between
the ranks; with micrographs, statistics and gradient-sums passes before the first step (:mod:`.distributed_norm`).

Counters (rank 0's record, summed over ranks; seconds are summed over ranks too): ``remote_rows`` and
``remote_bytes`` (feature rows received from other ranks), ``network_bytes`` (every byte received in the epoch's
training, as the comm layer counted it: the exchanges' id requests, counts and rows, the model migrations, the
gradient all-reduces, checkpoints' counter gathers), ``needed_rows`` and ``local_rows`` (input rows of the
trained batches or micrographs, and how many were this rank's: ``local_hit_rate``), ``migration_bytes``,
``time_steps`` (per iteration, mean), ``sample_s``, ``fetch_s``, ``train_s``, ``migrate_s``, ``sync_s``; per rank
``rank_feature_bytes`` (its part of the features) and ``rank_cache_peak_bytes`` (its largest set of fetched
rows held at once: one iteration's with pre-gathering) and ``rank_rss_bytes`` (its resident memory at the epoch's
end).

The engine is the shared sampled loop (:class:`~gnnscale.engines.sampled.loop.SampledLoop`) with HopGNN's parts: the
global batches as the feed (the strategies sample and exchange rows as they train), the strategy's iteration as
the trainers (this rank's model, or the models hopping through it), an all-reduce between the ranks as the
reducer; the loop's iteration hook writes §8's iteration checkpoints, with every rank's counters.

Testing hook: ``GNNSCALE_FAULT=RANK:EPOCH:ITERATION:kill|raise`` makes that rank SIGKILL itself (or raise) as
that iteration (0-based) starts, after a ``GNNSCALE_FAULT: rank R fails ...`` line on stderr.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from gnnscale.config import DistributedOptions, PartitionOptions, SamplingOptions
from gnnscale.distributed.comm import SETUP_TIMEOUT, Comm
from gnnscale.distributed.schedule import MergeController, build_schedule, home_groups
from gnnscale.engines.core.disk_tier import anon_rss_bytes, host_plan, open_disk_tier
from gnnscale.engines.sampled.distributed_norm import RankBatchNorm
from gnnscale.engines.sampled.distributed_predict import predict_distributed
from gnnscale.engines.sampled.engine import IterationCheckpoints, SampledEngine
from gnnscale.engines.sampled.exchange import RankReducer, blocks_on, layerwise_across_ranks
from gnnscale.engines.sampled.loop import SampledCounters, SampledLoop, backward_share, check_fanouts, forward
from gnnscale.errors import ConfigError
from gnnscale.graph.block import Block
from gnnscale.graph.graph import MASK_NAMES, Graph
from gnnscale.nn.stack import Stack
from gnnscale.partition.plan import PartitionPlan, graph_fingerprint, load_or_partition
from gnnscale.plan.epoch_time import HERE, Cluster, EpochTime
from gnnscale.plan.rates import Rates
from gnnscale.runtime.host import proc_kib
from gnnscale.sample import CSRTopology, sample_blocks, sample_key
from gnnscale.store.features import FeatureSource, ReadStats
from gnnscale.store.partitioned import FetchedRows, PartitionedFeatures
from gnnscale.store.transfer import place

if TYPE_CHECKING:
    from gnnscale.config import TrainConfig

SUMMED = ("loss_sum", "remote_rows", "remote_bytes", "needed_rows", "local_rows", "migration_bytes", "time_steps",
          "iterations", "sample_s", "fetch_s", "train_s", "migrate_s", "sync_s", "sampled_edges", "network_bytes",
          "norm_reduced_bytes")
"""Per-epoch counters, summed over ranks (in this order in the reduced vector)."""
RANK_COUNTERS = tuple(k for k in SUMMED if k not in ("iterations", "sync_s", "network_bytes", "norm_reduced_bytes"))
"""What the rank's trainer counts (the loop counts ``iterations`` and ``sync_s``)."""


class DistributedEngine(IterationCheckpoints, SampledEngine):
    """One rank of a distributed job: its part of the features, a model replica, and the strategy's iteration."""

    name = "distributed"
    predicts = False  # a job of ranks trains; a model it saved predicts with any other engine
    mode = "distributed"
    plan_kind = "whatif"  # gnnscale plan --engine distributed --machines N: HopGNN's traffic model
    options = (SamplingOptions, DistributedOptions, PartitionOptions)
    also_reads = ("host_memory",)  # each rank reads its own rows from a converted directory's x.npy by preadv

    @classmethod
    def check_options(cls, config: TrainConfig) -> None:
        check_fanouts(config)

    @classmethod
    def predict_epoch(cls, graph: Graph, config: TrainConfig, device: torch.device, rates: Rates, *,
                      model: Stack | None = None, cluster: Cluster = HERE) -> EpochTime | None:
        """HopGNN's traffic model for ``config.strategy`` (:mod:`gnnscale.plan.distributed_time`)."""
        del device
        return predict_distributed(graph, config, rates, model, cluster)

    def checkpoint_written(self) -> None:
        self.comm.barrier("iteration checkpoint")  # rank 0 has renamed the checkpoint into place

    @classmethod
    def _not_supported_reasons(cls, graph: Graph, config: TrainConfig, device: torch.device, *,
                               model: Stack | None = None) -> list[str]:
        return cls.sampling_reasons(config, model)

    @classmethod
    def batch_norm_reason(cls, config: TrainConfig) -> str | None:
        """None: BatchNorm spans the global batch over the ranks and time steps (:mod:`.distributed_norm`)."""
        del config
        return None

    def __init__(self, graph: Graph, model: Stack, config: TrainConfig, device: torch.device):
        super().__init__(graph, model, config, device)
        self.comm = Comm.setup(device, config.timeout)
        self.rank, self.world = self.comm.rank, self.comm.world
        if config.ranks is not None and config.ranks != self.world:
            raise ConfigError(f"--ranks {config.ranks} disagrees with the job's {self.world} ranks (torchrun's "
                              "--nproc-per-node x --nnodes); give one of them")
        if self.world > graph.num_nodes:
            raise ConfigError(f"{self.world} ranks are more than the graph's {graph.num_nodes} vertices: every rank "
                              "needs a part; use fewer ranks")
        t0 = time.perf_counter()
        self.owner, self.plan_path = self._partition()
        self.timings["partition_s"] = time.perf_counter() - t0
        assert graph.x is not None and graph.y is not None
        tier = open_disk_tier(graph, host_plan(graph, config, model), self.name)
        self.features = PartitionedFeatures(graph.x if tier is None else tier.source, self.owner, self.rank, device,
                                            exchange=self.comm)
        """This rank's feature source: its rows local, the others from their owners (every input row is read
        through it, or through the rows it fetched ahead: :meth:`_inputs`)."""
        self.topo = CSRTopology.from_graph(graph, model.adjacency)
        self.y = place(graph.y, device)
        self.merge = MergeController(config.merge if config.strategy == "micrograph" else "off", self.world)
        self.reducer = RankReducer(self.comm, model)
        self.batch_norm = RankBatchNorm(model, self.comm, self.owner, device)
        self.loop = SampledLoop(self.optimizer, self.train_ids, seed=config.seed,
                                batch_size=config.batch_size * self.world, reducer=self.reducer,
                                gather=self.reducer.gather, rank=self.rank)
        self._cache_peak = 0
        self._model_of_last_step = self.rank
        self._keep_held = False
        self._held: tuple[int, list[Tensor]] | None = None
        with torch.no_grad():  # every replica starts from rank 0's weights (they are seeded alike; make sure)
            flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            self.comm.broadcast(flat, 0, "initial weights")
            self._unflatten(flat, grads=False)
        self.disk_read_bytes: int | None = None
        """With the disk tier (``--host-memory`` on a converted directory): the bytes this rank read from the
        directory's ``x.npy`` (its own rows, each once, at set-up), reported by the first epoch's record."""
        if tier is not None:
            self.disk_read_bytes = int(tier.source.read_stats().bytes["disk"])
            tier.close()  # the rank's rows are read: the file is not read again

    @property
    def is_primary(self) -> bool:
        return self.rank == 0

    # ----------------------------------------------------------------------------------------------- set-up
    def _partition(self) -> tuple[Tensor, str | None]:
        """Every vertex's rank: from ``--plan``, or rank 0 partitions (reusing a saved plan) and broadcasts."""
        cfg, g = self.config, self.graph
        if cfg.plan is not None:
            plan = PartitionPlan.load_for_ranks(cfg.plan, self.world)
            if plan.num_nodes != g.num_nodes or plan.graph_key != graph_fingerprint(g):
                raise ConfigError(f"--plan {cfg.plan} was made for another graph ({plan.num_nodes:,} vertices), not "
                                  f"{g.name} ({g.num_nodes:,}); partition this graph")
            return plan.owners(), cfg.plan
        owner = torch.empty(g.num_nodes, dtype=torch.int64)
        path = None
        if self.rank == 0:
            plan, where, _ = load_or_partition(g, self.world, 1, cfg.partition_method, cfg.seed, cfg.plan_dir)
            owner = plan.owners()
            path = None if where is None else str(where)
        self.comm.barrier("partitioning", SETUP_TIMEOUT)  # the others wait for rank 0's partitioner
        self.comm.broadcast(owner, 0, "partition")
        return owner, path

    def describe(self) -> str:
        c = self.config
        parts = torch.bincount(self.owner, minlength=self.world).tolist()
        how = (c.strategy if c.strategy == "model-centric" else
               f"micrograph (pre-gathering {c.pregather}, merging {c.merge})")
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        return (f"distributed: {self.world} ranks ({self.device.type}, {backend}), "
                f"{how}; batch {c.batch_size} per rank, fanouts {','.join(map(str, self.fanouts))}; "
                f"{c.partition_method} parts of {min(parts):,}-{max(parts):,} vertices, features of "
                f"{self.features.nbytes / 2**20:.2f} MiB on rank {self.rank}")

    # ------------------------------------------------------------------------------------------ helpers
    def _params(self) -> list[torch.nn.Parameter]:
        return list(self.model.parameters())

    def _grads(self) -> list[Tensor]:
        """The hosted model's gradients, one per parameter (zeros where a parameter has none yet)."""
        return self.reducer.grads()

    def _flat(self, grads: bool) -> Tensor:
        parts = [p.detach().reshape(-1) for p in self._params()]
        if grads:
            parts += [g.reshape(-1) for g in self._grads()]
        return torch.cat(parts)

    def _unflatten(self, flat: Tensor, grads: bool) -> None:
        ps = self._params()
        n = sum(p.numel() for p in ps)
        with torch.no_grad():
            off = 0
            for p in ps:
                p.copy_(flat[off : off + p.numel()].view_as(p))
                off += p.numel()
            if grads:
                for p in ps:
                    p.grad = flat[off : off + p.numel()].view_as(p).clone()
                    off += p.numel()
        assert off == (2 * n if grads else n)

    def _fetch(self, ids: Tensor, c: dict[str, float]) -> FetchedRows:
        """The remote ones of ``ids`` fetched in one exchange (collective), as a source over them and this rank's
        rows (HopGNN's pre-gathering); counted from the rank's feature source."""
        t0 = time.perf_counter()
        before = self.features.read_stats()
        rows = self.features.fetch(ids)
        self._count_fetched(self.features.read_stats() - before, c)
        c["fetch_s"] += time.perf_counter() - t0
        return rows

    def _count_fetched(self, read: ReadStats, c: dict[str, float]) -> None:
        """Rows the other ranks sent (the ``"remote"`` tier: each distinct row once)."""
        c["remote_rows"] += read.rows["remote"]
        c["remote_bytes"] += read.bytes["remote"]
        self._cache_peak = max(self._cache_peak, read.bytes["remote"])

    def _inputs(self, src: Tensor, rows: FeatureSource, c: dict[str, float]) -> Tensor:
        """Feature rows of ``src`` (unique ids, on the CPU) read through ``rows``: the rank's feature source (own
        rows, the others fetched from their owners now, in one exchange: collective) or the rows fetched before
        (:meth:`_fetch`). The counters come from the source's read counters."""
        t0 = time.perf_counter()
        before = rows.read_stats()
        x = rows.gather(src)
        read = rows.read_stats() - before
        c["needed_rows"] += read.total_rows
        c["local_rows"] += read.rows["local"]
        if rows is self.features:  # fetched now (src is unique: each remote row once)
            self._count_fetched(read, c)
            c["fetch_s"] += time.perf_counter() - t0
        return x

    @staticmethod
    def _src(blocks: list[Block]) -> Tensor:
        """The input rows' ids of a sample (on the CPU)."""
        src = blocks[0].src_ids
        assert src is not None
        return src.cpu()

    def _sample(self, seeds: Tensor, key: int, c: dict[str, float]) -> list[Block]:
        t0 = time.perf_counter()
        blocks = sample_blocks(self.topo, seeds, self.fanouts, key, self.adjacency)  # topology in host memory
        blocks = blocks_on(blocks, self.device)
        c["sample_s"] += time.perf_counter() - t0
        c["sampled_edges"] += sum(b.num_edges for b in blocks)
        return blocks

    def _train(self, blocks: list[Block], x: Tensor, seeds: Tensor, total: int, se: tuple[int, int],
               c: dict[str, float]) -> None:
        """Forward and backward of ``seeds``' micrographs; gradients add to the hosted model's."""
        if seeds.numel() == 0:
            return
        t0 = time.perf_counter()
        loss = backward_share(forward(self.model, blocks, x, se), self.y[place(seeds, self.device)], total)
        c["loss_sum"] += float(loss) * total
        c["train_s"] += time.perf_counter() - t0

    # ----------------------------------------------------------------------------------------- iterations
    def _model_centric(self, parts: list[Tensor], total: int, key: int, se: tuple[int, int],
                       c: dict[str, float]) -> None:
        seeds = parts[self.rank]
        blocks = self._sample(seeds, key, c)
        x = self._inputs(self._src(blocks), self.features, c)
        with self.batch_norm.synced(blocks if seeds.numel() else None):  # BatchNorm: all-reduced as it runs
            self._train(blocks, x, seeds, total, se, c)
        self._model_of_last_step = self.rank
        c["time_steps"] += 1

    def _micrograph(self, parts: list[Tensor], total: int, key: int, se: tuple[int, int],
                    c: dict[str, float]) -> None:
        sched = build_schedule(home_groups(parts, self.owner, self.world), self.merge.merges)
        mine = [sched.roots_on(self.rank, k) for k in range(sched.steps)]
        blocks: list[list[Block] | None] = [None] * sched.steps
        rows: FeatureSource = self.features  # each step fetches its own remote rows
        if self.config.pregather == "on" or self.batch_norm.active:
            blocks = [self._sample(r, key, c) for r in mine]
        if self.config.pregather == "on":  # §5.2: the whole iteration's remote rows in one exchange
            srcs = [self._src(b) for b in blocks if b is not None]
            rows = self._fetch(torch.cat(srcs) if srcs else torch.empty(0, dtype=torch.int64), c)
        xs: list[Tensor | None] = [None] * sched.steps
        if self.batch_norm.active:  # BatchNorm: the global batch's statistics and gradient sums before the steps
            sampled = [b for b in blocks if b is not None]
            inputs = [self._inputs(self._src(b), rows, c) for b in sampled]
            t0 = time.perf_counter()
            self.batch_norm.prepare(sampled, inputs, [self.y[place(r, self.device)] for r in mine], total, se)
            xs = [x for x in inputs]
            c["train_s"] += time.perf_counter() - t0
        for k in range(sched.steps):
            bk = blocks[k] if blocks[k] is not None else self._sample(mine[k], key, c)
            assert bk is not None
            x = xs[k]
            if x is None:
                x = self._inputs(self._src(bk), rows, c)
            with self.batch_norm.step(k):
                self._train(bk, x, mine[k], total, se, c)
            blocks[k], xs[k] = None, None  # the step's intermediate data is dropped; only the gradients go on
            if k + 1 < sched.steps:  # migrate: this model to rank + hop, the next one from rank - hop
                t0 = time.perf_counter()
                hop = sched.hop(k)
                out = self._flat(grads=True)
                into = torch.empty_like(out)
                self.comm.send_recv(out, (self.rank + hop) % self.world, into, (self.rank - hop) % self.world)
                self._unflatten(into, grads=True)
                c["migration_bytes"] += out.numel() * out.element_size()
                c["migrate_s"] += time.perf_counter() - t0
        self._model_of_last_step = sched.model_on(self.rank, sched.steps - 1)
        c["time_steps"] += sched.steps

    def _iteration(self, batch: Tensor, total: int, key: int, se: tuple[int, int], c: dict[str, float]) -> None:
        """The loop's trainers: one iteration's gradients, ``R`` mini-batches of ``batch`` by the strategy (the
        loop sums them over the ranks)."""
        parts = list(torch.tensor_split(batch, self.world))
        try:
            if self.config.strategy == "model-centric":
                self._model_centric(parts, total, key, se, c)
            else:
                self._micrograph(parts, total, key, se, c)
        finally:
            self.batch_norm.release()
        self._held = (self._model_of_last_step, [g.clone() for g in self._grads()]) if self._keep_held else None

    def _batches(self, epoch: int) -> list[Tensor]:
        """The epoch's global batches (``R x --batch-size`` seeds each, the last one shorter)."""
        return self.loop.batches(epoch)

    def iteration_gradients(self, epoch: int, iteration: int) -> dict[str, Any]:
        """Iteration ``iteration`` (0-based) of ``epoch`` without its optimiser step (the exactness tests). Every
        rank must call it together. Returns the global batch's mean ``loss``, the summed ``grads`` (one per
        parameter), the ``counters``, and what this rank held before the all-reduce: the model it ended the
        iteration with (``held_model``; the micrograph strategy's models migrate) and that model's gradients
        (``held_grads``: its whole mini-batch's, when the migrations carried them)."""
        self.model.train()
        counters = SampledCounters(1, RANK_COUNTERS)
        batch = self._batches(epoch)[iteration]
        self._keep_held = True
        try:
            self.loop.gradients(functools.partial(self._iteration, batch, batch.numel(),
                                                  sample_key(self.config.seed, epoch), (self.config.seed, epoch),
                                                  counters[0]))
        finally:
            self._keep_held = False
        c = counters.state()
        loss = torch.tensor([c["loss_sum"]], dtype=torch.float64)
        self.comm.all_reduce(loss, "sum", "loss")
        grads = [g.clone() for g in self._grads()]
        self.optimizer.zero_grad(set_to_none=True)
        assert self._held is not None
        return {"loss": float(loss) / batch.numel(), "grads": grads, "counters": c, "held_model": self._held[0],
                "held_grads": self._held[1]}

    def _fault(self, epoch: int, it: int) -> None:
        spec = os.environ.get("GNNSCALE_FAULT")
        if not spec:
            return
        rank, ep, when, kind = spec.split(":")
        if (int(rank), int(ep), int(when)) == (self.rank, epoch, it):
            print(f"GNNSCALE_FAULT: rank {self.rank} fails ({kind}) at epoch {epoch}, iteration {it}",
                  file=sys.stderr, flush=True)
            if kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"fault injected at epoch {epoch}, iteration {it} (GNNSCALE_FAULT)")

    def _feed(self, batches: list[Tensor], first: int, epoch: int) -> Iterator[Tensor]:
        """The loop's feed: the global batches as they are (the strategies sample and fetch as they train); the
        testing hook's fault as an iteration starts."""
        for it, batch in enumerate(batches, first):
            self._fault(epoch, it)
            yield batch

    def train_epoch(self, epoch: int) -> dict[str, float]:
        self.model.train()
        cfg = self.config
        se, key = (cfg.seed, epoch), sample_key(cfg.seed, epoch)
        counters = SampledCounters(1, RANK_COUNTERS)
        self._cache_peak = 0
        t_start, received = time.perf_counter(), self.comm.counters["received_bytes"]
        reduced = self.batch_norm.counters["reduced_bytes"]
        batches = self.loop.run(epoch, functools.partial(self._feed, epoch=epoch),
                                functools.partial(self._iteration, key=key, se=se, c=counters[0]), counters)
        elapsed = torch.tensor([time.perf_counter() - t_start], dtype=torch.float64)
        received = self.comm.counters["received_bytes"] - received  # the training's, not the record's collectives
        self.comm.all_reduce(elapsed, "max", "epoch time")
        self.merge.epoch_done(epoch, float(elapsed))
        state = counters.state()
        state["network_bytes"] = received
        state["norm_reduced_bytes"] = self.batch_norm.counters["reduced_bytes"] - reduced
        vec = torch.tensor([state[k] for k in SUMMED], dtype=torch.float64)
        self.comm.all_reduce(vec, "sum", "counters")
        per_rank = torch.zeros(5, self.world, dtype=torch.float64)
        rss = (proc_kib("/proc/self/status", "VmRSS") or 0) * 1024
        disk, self.disk_read_bytes = self.disk_read_bytes, (None if self.disk_read_bytes is None else 0)
        per_rank[:, self.rank] = torch.tensor([self.features.nbytes, self._cache_peak, rss, disk or 0,
                                               anon_rss_bytes() or 0], dtype=torch.float64)
        self.comm.all_reduce(per_rank, "sum", "counters")
        s = dict(zip(SUMMED, vec.tolist(), strict=True))
        iters = max(s.pop("iterations"), 1.0) / self.world
        n_train = sum(b.numel() for b in batches)
        out: dict[str, Any] = {"loss": s.pop("loss_sum") / n_train, "batches": len(batches), "ranks": self.world,
                               "strategy": cfg.strategy}
        for k in ("remote_rows", "needed_rows", "local_rows", "sampled_edges"):
            out[k] = int(s.pop(k))
        out["remote_bytes"] = int(s.pop("remote_bytes"))
        out["migration_bytes"] = int(s.pop("migration_bytes"))
        out["network_bytes"] = int(s.pop("network_bytes"))
        out["local_hit_rate"] = out["local_rows"] / out["needed_rows"] if out["needed_rows"] else None
        out["time_steps"] = s.pop("time_steps") / self.world / iters
        reduced = s.pop("norm_reduced_bytes")  # BatchNorm's all-reduced sums (float64), every rank's
        if self.batch_norm.active:
            out["norm_reduced_bytes"] = int(reduced)
        out.update(s)  # the seconds
        out["merges"] = self.merge.history[-1][1]
        out["rank_feature_bytes"] = [int(v) for v in per_rank[0].tolist()]
        out["rank_cache_peak_bytes"] = [int(v) for v in per_rank[1].tolist()]
        out["rank_rss_bytes"] = [int(v) for v in per_rank[2].tolist()]
        if disk is not None:  # the disk tier: bytes the ranks read from disk since the last record, the largest
            out["disk_read_bytes"] = int(per_rank[3].sum())  # rank's anonymous memory
            out["anon_rss_bytes"] = int(per_rank[4].max())
        return out

    # --------------------------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {"merge": self.merge.state_dict(), "ranks": self.world, **super().state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("ranks", self.world) != self.world:
            raise ConfigError(f"--resume: the checkpoint was written by {state['ranks']} ranks, this job has "
                              f"{self.world}; resume with --ranks {state['ranks']}")
        self.merge.load_state_dict(state.get("merge", {}))
        super().load_state_dict({k: v for k, v in state.items() if k not in ("merge", "ranks")})

    # --------------------------------------------------------------------------------------------- inference
    @torch.no_grad()
    def _layerwise(self) -> Tensor:
        """``[n_own, C]``: this rank's vertices' exact outputs (:func:`layerwise_across_ranks`)."""
        return layerwise_across_ranks(self.model, self.comm, self.topo, self.features, self.owner, self.adjacency,
                                      self.device)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float | None]:
        self.model.eval()
        pred = self._layerwise().argmax(-1)
        own = self.features.own
        counts = torch.zeros(2, len(MASK_NAMES), dtype=torch.float64)
        for j, m in enumerate(MASK_NAMES):
            mask = self.masks.get(m)
            if mask is None:
                continue
            sel = place(mask[own], self.device)
            counts[0, j] = float((pred[sel] == self.y[place(own, self.device)][sel]).sum())
            counts[1, j] = float(sel.sum())
        self.comm.all_reduce(counts, "sum", "evaluation")
        return {m.replace("_mask", "_acc"): (float(counts[0, j] / counts[1, j]) if counts[1, j] > 0 else None)
                for j, m in enumerate(MASK_NAMES)}

    def predict(self) -> Tensor:
        self.model.eval()
        pred = torch.zeros(self.graph.num_nodes, dtype=torch.int64)
        pred[self.features.own] = self._layerwise().argmax(-1).cpu()
        return self.comm.all_reduce(pred, "sum", "prediction")  # every vertex is one rank's: the rest add 0
