"""``gnnscale info``, ``predict``, ``report`` and ``convert``: commands on datasets, models and metrics files."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from gnnscale import progress
from gnnscale.cli.common import _device_list, writes_folder
from gnnscale.engines import ENGINES
from gnnscale.errors import ConfigError
from gnnscale.fsutil import check_output, make_parents, write_output, write_text
from gnnscale.graph import attach, io, stream, stream_edges
from gnnscale.graph.datasets import load_dataset
from gnnscale.notes import note
from gnnscale.predict import OUTPUT_SUFFIXES, load_model, predict, write_predictions
from gnnscale.report import IMAGE_SUFFIXES, build_panels, markdown, read_run, render_png
from gnnscale.runtime import mem_get_info
from gnnscale.units import format_bytes, parse_budget


def cmd_info(args: argparse.Namespace) -> int:
    progress.enable(sys.stderr.isatty())  # a terminal sees the load and statistics steps tick
    with progress.stage("load"):
        g = load_dataset(args.dataset, args.root, seed=args.seed, keep_ids=args.keep_ids)
    with progress.stage("statistics"):
        st = g.stats()
    if args.json:
        print(json.dumps(st))
        return 0
    print(f"name        {st['name']}")
    print(f"nodes       {st['nodes']:,}")
    weighted = f", weighted ({st['weights_from'] or 'given'})" if st["weighted"] else ", unweighted"
    sym = st["symmetrized_from_edges"]
    sym = f"; symmetrised on load from {sym:,} listed edges" if sym is not None else ""
    print(f"edges       {st['edges']:,} (directed, in-neighbour CSR; {st['self_loops']:,} self-loops, "
          f"{st['duplicate_edges']:,} duplicates kept as multi-edges{weighted}{sym})")
    if st["spec"]:
        print(f"spec        {st['spec']}" + "".join(f" <- {s}" for s in reversed(st["converted_from"])))
    for line in _data_lines(st):
        print(line)
    for d in ("in_degree", "out_degree"):
        s = st[d]
        print(f"{d.replace('_', '-'):<11} min {s['min']:.0f}  mean {s['mean']:.2f}  median {s['median']:.0f}  "
              f"max {s['max']:.0f}")
    print(f"isolated    {st['isolated_nodes']:,}")
    print(f"split       train {st['train_mask']:,}  val {st['val_mask']:,}  test {st['test_mask']:,}")
    b = st["bytes"]
    print(f"memory      {format_bytes(b['total'])} total: topology {format_bytes(b['topology'])}, "
          f"features {format_bytes(b['features'])}, labels+masks {format_bytes(b['labels'] + b['masks'])}")
    return 0


def _data_lines(st: dict[str, Any]) -> list[str]:
    """``info``'s features and classes lines: the features' dtype, what a reader made up (drawn at random: the data
    had none) and the vertices without a label."""
    made_up = "; made up: drawn at random (the data has none)"
    features = f"{st['features']}" + (f", stored as {st['feature_dtype']}" if st["feature_dtype"] else "")
    classes = f"{st['classes']}"
    if st["class_names"]:
        names = st["class_names"]
        classes += f" ({', '.join(map(str, names[:10]))}{', ...' * (len(names) > 10)}: classes.json, 0 first)"
    if st["unlabelled_nodes"]:
        classes += f"; {st['unlabelled_nodes']:,} of {st['nodes']:,} vertices unlabelled (label -1)"
    return [f"features    {features}{made_up * ('features' in st['made_up'])}",
            f"classes     {classes}{made_up * ('labels' in st['made_up'])}"]


def _own_data(g: Any, args: argparse.Namespace) -> Any:
    """``g`` with the features of ``--features`` and the labels of ``--labels`` (:mod:`gnnscale.graph.attach`),
    the features in ``g``'s dtype (``--feature-dtype``)."""
    if args.features is not None:
        dtype = None if g.x is None else g.x.dtype
        g = attach.attach_features(g, args.features)
        g = g if dtype is None else g.with_feature_dtype(dtype)
    if args.labels is not None:
        g = attach.attach_labels(g, args.labels, args.seed)
    return g


def cmd_predict(args: argparse.Namespace) -> int:
    if args.engine in ENGINES and not ENGINES[args.engine].predicts:
        raise ConfigError(f"predict runs in one process; the {args.engine} engine only trains. A model it saved "
                          "predicts with any other engine (--engine auto, or offload for features beyond memory)")
    out = check_output(args.out, "--out")
    if out.suffix not in OUTPUT_SUFFIXES:
        raise ConfigError(f"--out {out}: give a .npy, .pt or .csv file")
    model, config = load_model(args.model, args.model_factory)
    options: dict[str, Any] = {"engine": args.engine, "partitions": args.partitions,
                               "devices": _device_list(args.devices),
                               "memory_budget": None if args.gpu_memory is None else parse_budget(args.gpu_memory)}
    g = load_dataset(args.dataset, args.root, seed=args.seed, keep_ids=args.keep_ids)
    pred = predict(g, (model, config), args.device, **options)
    out = write_output(out, lambda p: write_predictions(p, pred, g.node_ids), flag="--out", what="predictions")
    if g.node_ids is not None and out.suffix != ".csv":
        note(f"{out.name} holds one label per vertex in the order of the original ids; a .csv output pairs each "
             "label with its vertex's original id")
    line = f"wrote {out}: {pred.numel():,} predicted labels"
    if g.y is not None and g.test_mask is not None and bool(g.test_mask.any()):
        acc = float((pred[g.test_mask] == g.y[g.test_mask]).float().mean())
        line += f"; test accuracy {acc:.4f}"
    print(line)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    if args.out:
        check_output(args.out, "--out")
        if args.format == "md" and Path(args.out).suffix.lower() in IMAGE_SUFFIXES:
            raise ConfigError(f"--out {args.out}: --format md writes Markdown, not an image; give a .md file, or "
                              "--format png for the figure")
    elif args.format != "md":
        raise ConfigError("report --format png needs --out FILE.png (or use --format md)")
    runs = [read_run(p) for p in args.runs]
    if args.format == "md":
        text = markdown(runs)
        if not args.out:
            print(text)
            return 0
        out = write_output(args.out, lambda p: write_text(p, text + "\n"), flag="--out", what="report")
    else:
        out = write_output(args.out, lambda p: render_png(build_panels(runs), p), flag="--out", what="figure")
    print(f"wrote {out}: {len(runs)} run(s)")
    return 0


@writes_folder
def cmd_convert(args: argparse.Namespace) -> int:
    out = check_output(args.out, "--out", folder=True)
    if out.exists():  # checked before the (possibly slow) load
        raise ConfigError(f"output directory {out} already exists; choose a new path")
    for stale in io.remove_stale_partials(out):
        print(f"removed {stale}: partial output of an interrupted convert", file=sys.stderr)
    own = args.features is not None or args.labels is not None  # the vertex data from the user's files
    if not own and (stream.is_streamable(args.dataset) or stream_edges.is_streamable(args.dataset)):
        budget = (parse_budget(args.host_memory) if args.host_memory is not None
                  else mem_get_info(torch.device("cpu"))[0] // 4)
        if stream.is_streamable(args.dataset):
            w = stream.convert(args.dataset, make_parents(out), host_memory=budget, seed=args.seed,
                               feature_dtype=args.feature_dtype, show=sys.stderr.isatty())
        else:
            w = stream_edges.convert(args.dataset, make_parents(out), host_memory=budget, root=args.root,
                                     seed=args.seed, keep_ids=args.keep_ids, feature_dtype=args.feature_dtype,
                                     show=sys.stderr.isatty())
        dtype = f", {w.feature_dtype} features" if w.feature_dtype else ""
        print(f"wrote {out}: {w.nodes:,} nodes, {w.edges:,} edges, {format_bytes(w.nbytes)}{dtype}")
        return 0
    if args.host_memory is not None:
        note("--host-memory only applies to kronecker and edgelist specs, which are written block by block; this "
             "dataset is loaded whole" + (" (with --features or --labels)" if own else ""))
    progress.enable(sys.stderr.isatty())
    with progress.stage("load"):
        g = load_dataset(args.dataset, args.root, seed=args.seed, keep_ids=args.keep_ids,
                         feature_dtype=args.feature_dtype)
        g = _own_data(g, args)
    with progress.stage("write"):
        io.save(g, make_parents(out))
    dtype = "" if g.x is None else f", {str(g.x.dtype).removeprefix('torch.')} features"
    print(f"wrote {out}: {g.num_nodes:,} nodes, {g.num_edges:,} edges, {format_bytes(g.nbytes()['total'])}{dtype}")
    return 0
