"""The sampled engines' predicted epochs (``Engine.predict_epoch`` of minibatch and hybrid): the engines' own
choices (devices, fanouts, the store's placement and hot rows, the split and threads) handed to the models of
:mod:`gnnscale.plan.sampled_epoch`, with a few batches of the real graph sampled to measure (no training)."""

from __future__ import annotations

import os

import torch

from gnnscale import runtime as rt
from gnnscale.config import TrainConfig
from gnnscale.engines.sampled.loop import default_fanouts, model_depth
from gnnscale.graph.block import AdjacencySpec, sampling_csr
from gnnscale.graph.graph import Graph
from gnnscale.nn import build_model
from gnnscale.nn.stack import Stack, class_count
from gnnscale.plan import sampled_epoch as se
from gnnscale.plan.epoch_time import Cluster, EpochTime
from gnnscale.plan.hybrid_resources import Threads, default_threads
from gnnscale.plan.rates import Rates
from gnnscale.plan.rates import rates as machine_rates
from gnnscale.sample import CSRTopology, sample_key
from gnnscale.sample.adjacency import SampledAdjacency
from gnnscale.store.global_store import default_links, fit_hot_counts
from gnnscale.store.placement import solve_placement

CPU = torch.device("cpu")


def hybrid_devices(config: TrainConfig) -> list[rt.Device]:
    """The hybrid engine's trainers' devices: ``--devices`` as given (``cpu:N`` stand-ins and sim devices
    included), else the CPU and every visible GPU."""
    if config.devices:
        return [rt.resolve_device(d) for d in config.devices]
    kind = rt.accelerator_type() or "cuda"
    return [CPU, *(torch.device(kind, i) for i in range(rt.device_count()))]


def _model(graph: Graph, config: TrainConfig, model: Stack | None) -> Stack:
    if model is not None:
        return model
    assert graph.num_classes is not None
    return build_model(config.model, graph.num_features, config.hidden, graph.num_classes, **config.model_kwargs())


def _setting(graph: Graph, config: TrainConfig, model: Stack | None
             ) -> tuple[Stack, tuple[int, ...], tuple[int, ...], torch.Tensor]:
    """The model, its widths (input first), the fanouts and the training vertices."""
    m = _model(graph, config, model)
    layers = m.block_layers
    dims = (layers[0].in_features, *(layer.out_features for layer in layers[:-1]), class_count(m))
    fanouts = tuple(config.fanouts or default_fanouts(model_depth(config, m)))
    assert graph.train_mask is not None
    return m, dims, fanouts, torch.nonzero(graph.train_mask).view(-1)


def _store(graph: Graph, config: TrainConfig, devices: list[rt.Device], share: float,
           cluster: Cluster) -> tuple[se.Store, torch.Tensor]:
    """The store the engine would build (its placement for ``G`` devices, ``cluster.devices_per_machine`` in a
    what-if, and its hot feature rows: the ratio given, else as many as the budget's ``share`` holds beside the
    topology), and the vertices' hotness ranks (out-degree, the store's default)."""
    G = cluster.devices_per_machine or len(devices)
    # a what-if's devices linked as this machine's are (one device: linked if CPU "devices", not if accelerators)
    linked = default_links(devices)[0][1] > 0 if len(devices) > 1 else not rt.is_accelerator(devices[0])
    links = [[0.0 if i == j else float(linked) for j in range(G)] for i in range(G)]
    placement = solve_placement(links)
    n = graph.num_nodes
    order = torch.sort(-graph.out_degree().double(), stable=True).indices
    rank = torch.empty(n, dtype=torch.int64)
    rank[order] = torch.arange(n)
    assert graph.x is not None
    row = graph.num_features * graph.x.element_size()
    hot = None if config.gpu_feature_ratio is None else int(round(config.gpu_feature_ratio * n))
    if hot is None:
        budget = config.memory_budget if config.memory_budget is not None else int(rt.mem_get_info(devices[0])[0])
        indptr, _, weight = sampling_csr(graph, AdjacencySpec())[:3]
        list_bytes = 8 + (indptr[1:] - indptr[:-1])[order] * (8 + (4 if weight is not None else 0))
        graph_hot = None if config.gpu_graph_ratio is None else int(round(config.gpu_graph_ratio * n))
        hot = fit_hot_counts(list_bytes, row, placement.stored, int(share * budget) - 8 * n, graph_hot, None)[1]
    return se.Store(placement, hot, row), rank


def _probe(graph: Graph, config: TrainConfig, m: Stack, dims: tuple[int, ...], fanouts: tuple[int, ...],
           ids: torch.Tensor, share: int, rank: torch.Tensor | None, max_threads: int = 1) -> se.SampledProbe:
    topo = CSRTopology.from_graph(graph, m.adjacency)
    adjacency = SampledAdjacency.from_graph(graph, m.adjacency, config.sample_norm)  # type: ignore[arg-type]
    size = min(config.batch_size, ids.numel())
    return se.probe(topo, ids, fanouts, dims, size, min(share, ids.numel()), rank, sample_key(config.seed, 0),
                    adjacency, max_threads, tuple(layer.projects_first for layer in m.block_layers))


def predict_minibatch(graph: Graph, config: TrainConfig, devices: list[rt.Device], rates: Rates, *,
                      store_share: float, model: Stack | None, cluster: Cluster) -> EpochTime:
    """The minibatch engine's epoch on ``devices`` (:func:`~gnnscale.plan.sampled_epoch.minibatch_epoch`)."""
    m, dims, fanouts, ids = _setting(graph, config, model)
    store, rank = _store(graph, config, devices, store_share, cluster)
    G = store.placement.num_gpus
    p = _probe(graph, config, m, dims, fanouts, ids, -(-config.batch_size // G), rank)
    return se.minibatch_epoch(p, store, rates, accelerator=rt.is_accelerator(devices[0]), num_train=ids.numel(),
                              batch=config.batch_size, parameters=sum(x.numel() for x in m.parameters()),
                              cores=os.cpu_count() or 1, cluster=cluster)


def predict_hybrid(graph: Graph, config: TrainConfig, devices: list[rt.Device], rates: Rates, *,
                   model: Stack | None, cpu_rates: Rates | None = None) -> EpochTime:
    """The hybrid engine's epoch on ``devices`` (a CPU trainer among them): HyScale-GNN's model at the configured
    split (else its initial split) and threads (else the engine's default), the CPU's rates ``cpu_rates`` (else
    ``rates`` when every trainer is on the CPU, else this machine's cached ones)."""
    m, dims, fanouts, ids = _setting(graph, config, model)
    cores = os.cpu_count() or 1
    accel = [rt.is_accelerator(d) for d in devices]
    cpu = cpu_rates if cpu_rates is not None else rates if not any(accel) else machine_rates(CPU)
    p = _probe(graph, config, m, dims, fanouts, ids, 0, None, cores)  # the table alone: no rows ranked
    # trainers and stages all on the CPU are threads of one Python process: their many small calls hold the
    # interpreter lock and barely overlap (measured on ego-Twitter: 0.22 s an epoch, its sampling 0.12 s plus its
    # training 0.10 s), so Eq. 6's busy core-seconds are over one core; beside an accelerator, the machine's
    perf = se.hybrid_model(p.table, cpu, rates, accel, cores if any(accel) else 1, p.projects)
    threads = Threads(*config.threads) if config.threads else default_threads(cores)
    return se.hybrid_epoch(perf, num_train=ids.numel(), batch=config.batch_size,
                           split=list(config.shares) if config.shares else None, threads=threads,
                           parameters=sum(x.numel() for x in m.parameters()), rates=cpu)
