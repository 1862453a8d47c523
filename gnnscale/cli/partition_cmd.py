"""``gnnscale partition`` (alias ``plan``): a partition plan and what it costs, per engine, without training."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, replace
from typing import Any

import torch

from gnnscale import runtime as rt
from gnnscale.cli.common import _device_list, _num_list
from gnnscale.cli.whatif_cmd import check_whatif, cmd_whatif
from gnnscale.config import TrainConfig
from gnnscale.engines import (
    ENGINES,
    Candidate,
    candidates,
    chosen,
    no_engine_error,
    requested_mode,
    resolve_devices,
    why_chosen,
)
from gnnscale.errors import ConfigError
from gnnscale.graph.datasets import load_dataset
from gnnscale.graph.graph import Graph
from gnnscale.nn import Stack, build_model
from gnnscale.nn.factory import build_from_factory
from gnnscale.notes import note, warn
from gnnscale.partition import load_or_chunk, load_or_partition, partition_graph, permute_csr
from gnnscale.partition.dedup import chunk_rows, comm_volume, default_schedule, reorganize
from gnnscale.plan.host import host_base, host_peak_bytes
from gnnscale.plan.hybrid import mteps
from gnnscale.plan.rates import rates
from gnnscale.plan.taskparallel import p_group_parts, plan_taskparallel, replication_factor
from gnnscale.trainable import check_model_fits, check_trainable
from gnnscale.units import format_bytes, parse_budget


def _own_model(args: argparse.Namespace, g: Graph) -> Stack | None:
    """The model ``--model-factory`` builds for ``g`` (its module imported), or ``None`` without the flag; a
    ``--model`` given beside it is ignored, said in a warning."""
    spec = args.model_factory
    if spec is None:
        return None
    if args.model is not None:
        warn(f"--model-factory {spec}: --model {args.model} is ignored; the factory's model is planned")
    check_trainable(g)
    assert g.num_classes is not None
    model = build_from_factory(spec, g.num_features, g.num_classes, args.seed)
    check_model_fits(model, g)
    return model


def _model_name(config: TrainConfig, own: Stack | None) -> str:
    return config.model if own is None else f"{own.kind} (--model-factory {config.model_factory})"


def cmd_plan(args: argparse.Namespace) -> int:
    """``gnnscale plan``: every engine of the training mode with its estimate or the reasons against it, and the
    one ``--engine auto`` would choose; with ``--engine``, that engine's own plan (as ``gnnscale partition``)."""
    check_whatif(args)
    if args.engine is not None:
        return cmd_partition(args)
    config = TrainConfig(model=args.model or "gcn", layers=args.layers, hidden=args.hidden, mode=args.mode,
                         devices=_device_list(args.devices), batch_size=args.batch_size, seed=args.seed,
                         fanouts=_num_list("--fanouts", args.fanouts, int, "15,10"),
                         shares=_num_list("--shares", args.shares, float, "0.25,0.75"),
                         threads=_num_list("--threads", args.threads, int, "1,1,2"),
                         memory_budget=None if args.gpu_memory is None else parse_budget(args.gpu_memory),
                         partitions=args.partitions, chunks=args.chunks, partition_method=args.method,
                         chunker=args.chunker, plan_dir=args.plan_dir, t_devices=args.t_devices,
                         subgraphs=args.subgraphs,
                         host_memory=None if args.host_memory is None else parse_budget(args.host_memory),
                         model_factory=args.model_factory)
    device = resolve_devices(config, args.device)
    g = load_dataset(args.dataset, args.root, seed=args.seed)
    check_trainable(g)
    loaded = host_peak_bytes()  # as train measures it: the graph loaded, no planner run yet
    own = _own_model(args, g)
    if args.recalibrate:
        rates(rt.torch_device(device), recalibrate=True)
    found = candidates(g, config, device, model=own)  # what train's select_engine asks too (engines.assess)
    pick = chosen(found)
    base = None
    if config.host_memory is not None and pick is not None and ENGINES[pick].honours_host_memory():
        base = host_base(g.num_nodes, g.num_edges, ENGINES[pick].host_topology_copies, loaded)
    if args.json:
        print(json.dumps({"dataset": g.name, "mode": requested_mode(config), "device": str(device),
                          "chosen": pick, "why": why_chosen(found),
                          "candidates": [_candidate_dict(c) for c in found],
                          "host_base_bytes": None if base is None else base.total}))
    else:
        print(f"dataset  {g.name}: {g.num_nodes:,} nodes, {g.num_edges:,} edges; model {_model_name(config, own)}; "
              f"{requested_mode(config)} mode on {device}")
        for c in found:
            mark = "->" if c.name == pick else "  "
            what = f"rejected: {'; '.join(c.reasons)}" if c.reasons else "fits" + f": {c.estimate}" * bool(c.estimate)
            if c.skipped and not c.reasons:
                what += f" (with --engine {c.name}; auto skips it: {c.skipped})"
            print(f"{mark} {c.name:<13} {what}")
            if c.predicted is not None:
                print(f"   {'':<13} predicted {c.predicted.line()}")
        if pick:
            print(f"--engine auto would choose {pick} ({why_chosen(found)})")
        if base is not None:
            assert config.host_memory is not None
            print(f"{pick}: {base.describe(config.host_memory)}")
    if pick is None:  # what train says and does (exit 2) for the same flags
        raise no_engine_error(g, config, device, found)
    return 0


def _candidate_dict(c: Candidate) -> dict[str, Any]:
    """A candidate as ``plan --json`` prints it: its fields, the prediction as :meth:`EpochTime.as_dict`."""
    out = {k: v for k, v in asdict(c).items() if k != "predicted"}
    out["predicted"] = None if c.predicted is None else c.predicted.as_dict()
    return out


def cmd_partition(args: argparse.Namespace) -> int:
    kind = ENGINES[args.engine].plan_kind
    if kind == "whatif":
        return cmd_whatif(args)
    if kind == "tasks":
        return _partition_taskparallel(args)
    if kind == "pipeline":
        return _plan_hybrid(args)
    args.chunks = 1 if args.chunks is None else args.chunks
    for flag, value in (("--partitions", args.partitions), ("--chunks", args.chunks)):
        if value < 1:
            raise ConfigError(f"{flag} must be >= 1, got {value}")
    if args.model_factory is not None:  # (not imported: nothing here would use it)
        note(f"--model-factory {args.model_factory} has no effect on the offload partition plan, which does not "
             "depend on the model")
    g = load_dataset(args.dataset, args.root, seed=args.seed)
    t0 = time.perf_counter()
    plan, path, reused = load_or_partition(g, args.partitions, args.chunks, args.method, args.seed, args.plan_dir)
    plan = load_or_chunk(plan, g, args.chunks, args.chunker, args.plan_dir)
    seconds = time.perf_counter() - t0
    st = {"dataset": g.name, **plan.stats(g), "seconds": seconds, "reused": reused,
          "plan": None if path is None else str(path)}
    # rows per layer pass under each --dedup mode, as scheduled and reorganised (Algorithm 4), in units of |V|
    ip, ix = permute_csr(g.indptr, g.indices, None, plan.perm, plan.inverse())[:2]
    rows = chunk_rows(ip, ix, plan.chunk_ptr)
    n = max(g.num_nodes, 1)
    for name, sched in (("", default_schedule(plan.partitions, plan.chunks)),
                        ("reorganized_", reorganize(rows, plan.partitions, plan.chunks, g.num_nodes))):
        vol = comm_volume(rows, sched)
        st[f"{name}rows_per_pass"] = {mode: vol.h2d(mode) / n for mode in ("none", "reuse", "full")}
    if args.json:
        print(json.dumps(st))
        return 0
    print(f"dataset     {g.name}: {g.num_nodes:,} nodes, {g.num_edges:,} edges")
    print(f"plan        {st['partitions']} partition(s) x {st['chunks']} chunk(s), {st['method']}, {args.chunker} "
          f"chunks, "
          f"{'reused' if reused else 'computed'} in {seconds:.1f}s")
    print(f"alpha       {st['alpha']:.3f} (chunk in-neighbour sets a vertex appears in, on average)")
    print(f"edge cut    {100 * st['edge_cut']:.1f}% of edges cross partitions")
    print(f"partitions  {', '.join(f'{s:,}' for s in st['partition_sizes'])} vertices")
    print(f"chunks      max {st['chunk_vertices_max']:,} vertices, max {st['chunk_edges_max']:,} in-edges "
          f"(max/mean {st['chunk_edge_imbalance']:.2f}), max {st['chunk_rows_max']:,} rows with neighbours")
    for name, label in (("", "as split"), ("reorganized_", "reorganized")):
        per = st[f"{name}rows_per_pass"]
        print(f"host->dev   {label}: " + ", ".join(f"--dedup {m} {v:.2f}|V|" for m, v in per.items())
              + " rows per layer pass")
    print(f"saved       {path}" if path is not None else "saved       (plan directory not writable; not saved)")
    return 0


def _plan_hybrid(args: argparse.Namespace) -> int:
    """``gnnscale plan --engine hybrid``: HyScale-GNN's performance model (§V) for this machine, graph and model:
    the initial split, each stage's predicted seconds per iteration, the epoch time and MTEPS, without training."""
    config = TrainConfig(model=args.model or "gcn", layers=args.layers, hidden=args.hidden, engine=args.engine,
                         devices=_device_list(args.devices), batch_size=args.batch_size, seed=args.seed,
                         fanouts=_num_list("--fanouts", args.fanouts, int, "15,10"),
                         shares=_num_list("--shares", args.shares, float, "0.25,0.75"),
                         threads=_num_list("--threads", args.threads, int, "1,1,2"),
                         model_factory=args.model_factory)
    device = resolve_devices(config, "auto")
    g = load_dataset(args.dataset, args.root, seed=args.seed)
    check_trainable(g)
    own = _own_model(args, g)
    reasons = ENGINES[args.engine].not_supported_reasons(g, config, device, model=own)
    if reasons:
        raise ConfigError(f"the hybrid engine cannot train {g.name}: {'; '.join(reasons)}")
    assert g.num_classes is not None
    model = own if own is not None else build_model(config.model, g.num_features, config.hidden, g.num_classes,
                                                    **config.model_kwargs())
    engine: Any = ENGINES[args.engine](g, model, config, device)
    n = int(engine.train_ids.numel())
    t = engine.perf.stage_times(config.batch_size, engine.split, engine.threads)
    epoch = engine.perf.epoch_time(n, config.batch_size, engine.split, engine.threads)
    shapes = [engine.perf.cpu_sampling.shape(s * config.batch_size, engine.perf.dims) for s in engine.split]
    st = {"dataset": g.name, "engine": args.engine, "model": model.kind, "model_factory": config.model_factory,
          "devices": [str(d) for d in engine.devices], "split": engine.split,
          "threads": list(engine.threads.as_tuple()), "batch_size": config.batch_size,
          "fanouts": list(engine.fanouts), "stages_s": t, "iterations": -(-n // config.batch_size),
          "epoch_s": epoch, "mteps": mteps(shapes, t["iteration"]) if t["iteration"] > 0 else None}
    if args.json:
        print(json.dumps(st))
        return 0
    print(f"dataset     {g.name}: {g.num_nodes:,} nodes, {g.num_edges:,} edges, {n:,} training vertices")
    print(f"trainers    {', '.join(str(d) for d in engine.devices)} (CPU trainer "
          f"{engine.devices[engine.cpu_index]})")
    print(f"split       {', '.join(f'{s:.3f}' for s in engine.split)} of each batch of {config.batch_size} "
          f"({'--shares' if config.shares else 'equal predicted trainer times'})")
    print(f"threads     sampler {engine.threads.sampler}, loader {engine.threads.loader}, CPU trainer "
          f"{engine.threads.trainer} of {torch.get_num_threads()} intra-op threads")
    print("per iteration (s): " + "  ".join(f"{k} {v:.4f}" for k, v in t.items()))
    print(f"epoch       {st['iterations']} iterations, {epoch:.3f}s predicted; "
          f"{st['mteps'] or 0:.2f} MTEPS (Eq. 5)")
    return 0


def _partition_taskparallel(args: argparse.Namespace) -> int:
    """``gnnscale partition --engine taskparallel``: the task assignment, per-device estimates and the replication
    factor of the P group against data parallelism over METIS parts of the same count."""
    config = TrainConfig(model=args.model or "dgcn", layers=args.layers, hidden=args.hidden, engine=args.engine,
                         devices=_device_list(args.devices or "cpu"), t_devices=args.t_devices,
                         subgraphs=args.subgraphs, chunks=None if args.chunks in (None, 1) else args.chunks,
                         seed=args.seed,
                         memory_budget=None if args.gpu_memory is None else parse_budget(args.gpu_memory))
    device = resolve_devices(config, "auto")
    g = load_dataset(args.dataset, args.root, seed=args.seed)
    own = _own_model(args, g)
    if own is not None:  # priced as the decoupled model it is; any other is refused as training would refuse it
        reasons = ENGINES[args.engine].model_option_reasons(config, own)
        if reasons:
            raise ConfigError(f"the {args.engine} engine cannot train the --model-factory {args.model_factory} "
                              f"model: {'; '.join(reasons)}")
        t_tasks = list(own.block_layers)
        config = replace(config, model=own.kind, layers=len(t_tasks), hidden=t_tasks[0].out_features,
                         norm=getattr(own, "norm", "none"))
        args.model = own.kind
    plan = plan_taskparallel(g, config, device)

    def factor(parts: int) -> float:
        if parts <= 1:
            return 1.0
        p = partition_graph(g, parts, 1, args.method, args.seed)
        owner = torch.empty(g.num_nodes, dtype=torch.int64)
        owner[p.perm] = torch.repeat_interleave(torch.arange(parts), p.part_ptr[1:] - p.part_ptr[:-1])
        return replication_factor(g, owner)

    n = len(plan.devices)
    group = max(len(s.devices) for s in plan.p_stages)
    st = {"dataset": g.name, "engine": args.engine, "model": args.model, "regime": plan.regime,
          "n_t": plan.n_t, "n_p": plan.n_p,
          "stages": [{"tasks": s.label(args.model == "dgat"), "kind": s.kind, "devices": s.devices}
                     for s in (*plan.t_stages, *plan.p_stages)],
          "subgraphs": plan.subgraphs, "chunks_per_subgraph": plan.chunks_per_subgraph,
          "device_estimate_bytes": plan.estimate, "budget": plan.budget,
          "p_group_size": group,
          "p_group_replication": replication_factor(g, p_group_parts(plan, args.seed)) if group > 1 else 1.0,
          "data_parallel_parts": n, "data_parallel_replication": factor(n), "method": args.method}
    if args.json:
        print(json.dumps(st))
        return 0
    print(f"dataset     {g.name}: {g.num_nodes:,} nodes, {g.num_edges:,} edges")
    print(f"assignment  {plan.regime}: N_t={plan.n_t}, N_p={plan.n_p}")
    for s in st["stages"]:
        print(f"  {s['kind']} {s['tasks']:<12} on device(s) " + ", ".join(
            f"{plan.devices[d]}#{d}" for d in s["devices"]))
    print(f"subgraphs   {plan.subgraphs} x {plan.chunks_per_subgraph} chunk(s)")
    print("memory      " + ", ".join(f"#{d} {format_bytes(b)}" for d, b in enumerate(plan.estimate))
          + f" estimated (budget {format_bytes(plan.budget)})")
    print(f"replication P group of {group} (whole chunks per member, reshuffled each epoch; epoch 1): "
          f"{st['p_group_replication']:.2f}; data parallelism over {n} {args.method} parts: "
          f"{st['data_parallel_replication']:.2f}")
    return 0
