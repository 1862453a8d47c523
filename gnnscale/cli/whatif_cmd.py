"""``gnnscale plan --engine distributed --machines N --devices-per-machine G --network 25Gbit,latency=50us``: the
distributed engine's predicted epoch time and network bytes on ``N`` machines, for both strategies (HopGNN's
traffic model, :mod:`gnnscale.plan.distributed_time`)."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import torch

from gnnscale.cli.common import _num_list
from gnnscale.config import STRATEGIES, TrainConfig
from gnnscale.engines import ENGINES
from gnnscale.errors import ConfigError
from gnnscale.graph.datasets import load_dataset
from gnnscale.plan.epoch_time import Cluster
from gnnscale.plan.rates import rates
from gnnscale.train import check_trainable
from gnnscale.units import format_bytes, parse_network

MAX_MACHINES = 64


def cluster_of(args: argparse.Namespace) -> Cluster | None:
    """The what-if of ``--machines``, ``--devices-per-machine`` and ``--network`` (``None``: none given)."""
    machines = getattr(args, "machines", None)
    per = getattr(args, "devices_per_machine", None)
    spec = getattr(args, "network", None)
    if machines is None and per is None and spec is None:
        return None
    if machines is not None and not 1 <= machines <= MAX_MACHINES:
        raise ConfigError(f"--machines must be between 1 and {MAX_MACHINES}, got {machines}")
    if per is not None and per < 1:
        raise ConfigError(f"--devices-per-machine must be >= 1, got {per}")
    network, latency = parse_network(spec) if spec is not None else (None, None)
    return Cluster(machines=machines or 1, devices_per_machine=per, network=network, latency=latency)


def check_whatif(args: argparse.Namespace) -> None:
    """A what-if flag with an engine that has no model of more machines: a clear error."""
    engine = getattr(args, "engine", None)
    if getattr(args, "machines", None) is not None and (engine is None or ENGINES[engine].plan_kind != "whatif"):
        raise ConfigError(("--machines needs --engine distributed" if engine is None else
                           f"--machines: --engine {engine} has no model of more machines; give --engine distributed")
                          + " (offload and minibatch take --devices-per-machine G)")


def cmd_whatif(args: argparse.Namespace) -> int:
    """Both strategies' predicted epochs on the what-if cluster (default: this machine, one rank)."""
    cluster = cluster_of(args) or Cluster()
    config = TrainConfig(model=args.model or "sage", layers=args.layers, hidden=args.hidden, engine=args.engine,
                         batch_size=args.batch_size, seed=args.seed, partition_method=args.method,
                         plan_dir=args.plan_dir, merge="off",
                         fanouts=_num_list("--fanouts", args.fanouts, int, "15,10"))
    g = load_dataset(args.dataset, args.root, seed=args.seed)
    check_trainable(g)
    device = torch.device("cpu")
    r = rates(device, recalibrate=bool(getattr(args, "recalibrate", False)))
    out = {}
    for strategy in STRATEGIES:
        cfg = replace(config, strategy=strategy)
        predicted = ENGINES[args.engine].predict_epoch(g, cfg, device, r, cluster=cluster)
        assert predicted is not None
        out[strategy] = predicted
    ranks = cluster.machines * (cluster.devices_per_machine or 1)
    if args.json:
        print(json.dumps({"dataset": g.name, "engine": args.engine, "machines": cluster.machines,
                          "devices_per_machine": cluster.devices_per_machine or 1, "ranks": ranks,
                          "network_bytes_per_s": cluster.network, "latency_s": cluster.latency,
                          "strategies": {k: v.as_dict() for k, v in out.items()}}))
        return 0
    link = "measured loopback" if cluster.network is None else f"{cluster.network * 8 / 1e9:g} Gbit/s"
    print(f"dataset     {g.name}: {g.num_nodes:,} nodes, {g.num_edges:,} edges")
    print(f"what-if     {cluster.machines} machine(s) x {cluster.devices_per_machine or 1} rank(s), {link}"
          + (f", latency {cluster.latency * 1e6:g} us" if cluster.latency is not None else ""))
    for strategy, e in out.items():
        terms = ", ".join(f"{k} {v:.3f}" for k, v in e.terms.items() if v)
        print(f"{strategy:<13} {e.seconds:.3f} s/epoch, network {format_bytes(e.bytes.get('network', 0))} ({terms})")
    return 0
