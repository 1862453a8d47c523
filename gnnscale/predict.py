"""Saved models and predictions: ``save_model`` / ``load_model`` and ``predict`` on any graph with the features
and classes the model was trained for, through an engine's own inference path (so a graph that trains under a
memory budget also predicts under it)."""

from __future__ import annotations

import os
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from gnnscale.checkpoint import atomic_save, check_fields, load_versioned
from gnnscale.config import TrainConfig
from gnnscale.engines import select_engine
from gnnscale.engines.devices import resolve_devices
from gnnscale.errors import ConfigError, GnnscaleError, GraphError
from gnnscale.fsutil import atomic_file, make_parents
from gnnscale.graph.fingerprint import fingerprint as graph_fingerprint
from gnnscale.graph.graph import Graph
from gnnscale.nn import build_model
from gnnscale.nn.stack import Stack

FORMAT = "gnnscale-model"
VERSION = 1
OUTPUT_SUFFIXES = (".npy", ".pt", ".csv")


def save_model(path: str | os.PathLike[str], model: Stack, config: TrainConfig, graph: Graph,
               state: dict[str, Tensor] | None = None, *, fingerprint: dict[str, str] | None = None,
               **meta: Any) -> Path:
    """Write ``model`` (or the weights ``state``, e.g. ``TrainResult.best_state``) with what rebuilds it: the
    config and the graph's feature and class counts, the graph's ``fingerprint`` (computed when not given:
    :func:`gnnscale.graph.fingerprint.fingerprint`), and ``meta`` (plain data: ``interrupted=True,
    epochs_done=k``). Atomic, with a checksum verified by :func:`load_model`; missing folders above ``path`` are
    created. Loads with ``weights_only=True``."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"--save-model {path} is a directory")
    weights = {k: v.detach().cpu() for k, v in (state or model.state_dict()).items()}
    return atomic_save({"format": FORMAT, "version": VERSION, "config": asdict(config),
                        "num_features": graph.num_features, "num_classes": graph.num_classes,
                        "dataset": graph.name, "fingerprint": graph_fingerprint(graph) if fingerprint is None
                        else fingerprint, "state_dict": weights, **meta}, make_parents(path))


def load_model(path: str | os.PathLike[str]) -> tuple[Stack, TrainConfig]:
    """The model saved at ``path`` (on CPU, eval mode) and the config it was trained with."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--model {path}: no such file")
    what = f"--model {path}"
    saved = load_versioned(path, FORMAT, VERSION, "model", what, " (write one with train --save-model)")
    check_fields(saved, {"config": dict, "num_features": int, "num_classes": int, "state_dict": dict}, what, "model")
    dims = {int(d) for t in saved["state_dict"].values() if isinstance(t, Tensor) for d in t.shape}
    for key in ("num_features", "num_classes"):  # sizes the weights hold, checked before a model is allocated
        if saved[key] not in dims:
            raise ConfigError(f"{what} is damaged: it says {key} {saved[key]}, which no weight matrix of it has")
    try:
        config = TrainConfig(**saved["config"])
        model = build_model(config.model, saved["num_features"], config.hidden, saved["num_classes"],
                            **config.model_kwargs())
        model.load_state_dict(saved["state_dict"])
    except GnnscaleError:
        raise
    except (TypeError, ValueError, KeyError, RuntimeError) as exc:  # an edited or damaged file that still reads
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"{what} is damaged: its config or weights do not make a model ({first})") from None
    model.num_features, model.num_classes = saved["num_features"], saved["num_classes"]  # type: ignore[assignment]
    return model.eval(), config


def predict(graph: Graph, model: str | os.PathLike[str] | tuple[Stack, TrainConfig],
            device: str | torch.device = "auto", **engine_options: Any) -> Tensor:
    """``[N]`` int64 predicted class of every vertex of ``graph``.

    Args:
        model: a file written by :func:`save_model` (``train --save-model``), or ``(model, config)``.
        engine_options: :class:`TrainConfig` fields for the engine (``engine``, ``memory_budget``, ``devices``,
            ``partitions``, ...); the model's own fields come from its config.
    """
    net, config = load_model(model) if isinstance(model, (str, os.PathLike)) else model
    want = getattr(net, "num_features", graph.num_features), getattr(net, "num_classes", graph.num_classes)
    if graph.x is None or (graph.num_features, graph.num_classes) != want:
        raise GraphError(f"the model takes {want[0]} features and {want[1]} classes; {graph.name} has "
                         f"{graph.num_features} features and {graph.num_classes} classes")
    config = replace(config, **engine_options)
    dev = resolve_devices(config, device)
    engine_cls, _ = select_engine(graph, config, dev, purpose="predict for")
    engine = engine_cls(graph, net, config, dev)
    try:
        with torch.no_grad():
            return engine.predict().cpu()
    finally:
        close = getattr(engine, "close", None)
        if close is not None:
            close()


def write_predictions(path: str | os.PathLike[str], pred: Tensor, node_ids: Tensor | None = None) -> Path:
    """``pred`` to ``.npy``, ``.pt`` or ``.csv`` (``vertex,label`` rows) by the file's extension, atomically.

    ``node_ids`` (``Graph.node_ids``: the original ids of renumbered vertices) are the csv's ``vertex`` column, so
    the rows join back to the user's data; without them it is ``0..n-1``. ``.npy`` and ``.pt`` hold the labels
    alone, row ``i`` for vertex ``i`` (the ``i``-th smallest original id)."""
    path = Path(path)
    if path.suffix not in OUTPUT_SUFFIXES:
        raise ConfigError(f"--out {path}: give a file ending in {', '.join(OUTPUT_SUFFIXES)}")
    if not path.parent.is_dir():
        raise ConfigError(f"--out {path}: directory {path.parent} does not exist")
    with atomic_file(path) as fh:
        if path.suffix == ".npy":
            np.save(fh, pred.numpy())
        elif path.suffix == ".pt":
            torch.save(pred, fh)
        else:
            vertex = np.arange(pred.numel()) if node_ids is None else node_ids.numpy()
            rows = np.stack([vertex, pred.numpy()], axis=1)
            np.savetxt(fh, rows, fmt="%d", delimiter=",", header="vertex,label", comments="")
    return path
