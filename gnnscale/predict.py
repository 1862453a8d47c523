"""Saved models and predictions: ``load_model`` (a file :func:`gnnscale.saved_model.save_model` wrote) and
``predict`` on any graph with the features and classes the model was trained for, through an engine's own
inference path (so a graph that trains under a memory budget also predicts under it).

A saved model is data: its weights, its config and how it was built (:data:`~gnnscale.saved_model.BUILT_BY`). A
built-in model is rebuilt from its config; a model of the user's only through a factory the user names again when
loading (``--model-factory``, ``model_factory=``): the factory's name stored in the file is compared with it, never
imported."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from gnnscale.checkpoint import check_fields, load_versioned
from gnnscale.config import TrainConfig
from gnnscale.engines import resolve_devices, select_engine
from gnnscale.errors import ConfigError, GnnscaleError, GraphError
from gnnscale.fsutil import atomic_file
from gnnscale.graph.graph import Graph
from gnnscale.nn import build_model
from gnnscale.nn.factory import build_from_factory
from gnnscale.nn.stack import Stack
from gnnscale.notes import warn
from gnnscale.saved_model import BUILT_BY, FORMAT, VERSION, built_by, shapes

OUTPUT_SUFFIXES = (".npy", ".pt", ".csv")


def _misfit(model: Stack, state: dict[str, Any]) -> str:
    """How the weights ``state`` do not fit ``model`` (names missing or extra, shapes that differ); empty if they
    do."""
    have, want = shapes(state), shapes(model.state_dict())
    missing, extra = [k for k in want if k not in state], [k for k in state if k not in want]
    differ = [f"{k} is {list(have[k])} in the file, {list(want[k])} in the model" for k in want
              if k in have and have[k] != want[k]]
    parts = ([f"the file lacks {', '.join(missing[:3])}{', ...' * (len(missing) > 3)}"] if missing else []) + (
        [f"the model has no {', '.join(extra[:3])}{', ...' * (len(extra) > 3)}"] if extra else []) + differ[:2]
    return "; ".join(parts)


def load_model(path: str | os.PathLike[str], model_factory: str | None = None) -> tuple[Stack, TrainConfig]:
    """The model saved at ``path`` (on CPU, eval mode) and the config it was trained with.

    A built-in model is rebuilt from its config. A model of your own (``train --model-factory``, or
    ``train(model=...)``) is rebuilt only through ``model_factory`` (``module:function``, as ``--model-factory``):
    naming it imports that module, code you chose to run; loading never imports the module the file names. When
    ``model_factory`` differs from the name the file holds, a warning says so and the model is built through
    ``model_factory``; the returned config names it. Given for a built-in model, it is ignored (a warning).

    Raises:
        ConfigError: one line: no such file, not a model, damaged; a model of your own without ``model_factory``;
            a factory that cannot be imported, or whose model the weights do not fit.
    """
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
    except GnnscaleError:
        raise
    except (TypeError, ValueError) as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"{what} is damaged: its config or weights do not make a model ({first})") from None
    how = saved.get("built_by", "config" if config.model_factory is None else "factory")
    if not isinstance(how, str) or how not in BUILT_BY or (how == "factory") != (config.model_factory is not None):
        raise ConfigError(f"{what} is damaged: its built_by entry {how!r:.40} does not go with its config")
    if how == "config":
        if model_factory is not None:
            warn(f"--model-factory {model_factory} is ignored: {path} holds the built-in {config.model} model, "
                 "rebuilt from its saved settings")
        model = _built_in(config, saved, what)
    else:
        model = _through_factory(model_factory, config, saved, path)
        config = replace(config, model_factory=model_factory)
    model.num_features, model.num_classes = saved["num_features"], saved["num_classes"]  # type: ignore[assignment]
    return model.eval(), config


def _built_in(config: TrainConfig, saved: dict[str, Any], what: str) -> Stack:
    try:
        model = build_model(config.model, saved["num_features"], config.hidden, saved["num_classes"],
                            **config.model_kwargs())
        model.load_state_dict(saved["state_dict"])
    except GnnscaleError:
        raise
    except (TypeError, ValueError, KeyError, RuntimeError) as exc:  # an edited or damaged file that still reads
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"{what} is damaged: its config or weights do not make a model ({first})") from None
    return model


def _through_factory(given: str | None, config: TrainConfig, saved: dict[str, Any], path: Path) -> Stack:
    """The model of the user's in ``saved`` (the file at ``path``), built through the factory ``given`` now, its
    weights loaded; the factory ``config`` names is compared with ``given``, never imported."""
    what, named = f"--model {path}", config.model_factory
    if given is None:
        if named is not None:
            raise ConfigError(f"{what} holds a model built by --model-factory {named}: name it again with "
                              f"--model-factory {named} (model_factory= in Python); loading a saved model never "
                              "imports the module it names")
        raise ConfigError(f"{what} holds a model of your own (trained with train(model=...)) and no factory's "
                          "name: give a function that builds it with --model-factory module:function "
                          "(model_factory= in Python)")
    other = named is not None and given != named
    model = build_from_factory(given, saved["num_features"], saved["num_classes"], config.seed)
    misfit = _misfit(model, saved["state_dict"])
    if misfit:
        raise ConfigError(f"{what}: its weights do not fit the model --model-factory {given} builds ({misfit})"
                          + (f"; it was built by {named}" if other else ""))
    try:
        model.load_state_dict(saved["state_dict"])
    except (TypeError, ValueError, KeyError, RuntimeError) as exc:  # a weight that is not a tensor, say
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"{what} is damaged: its weights do not load ({first})") from None
    if other:  # said once the model is built: a failure above is its one error line
        warn(f"--model-factory {given}: the model in {path} was built by {named}; built through {given}, its "
             "weights fit")
    return model


def predict(graph: Graph, model: str | os.PathLike[str] | tuple[Stack, TrainConfig],
            device: str | torch.device = "auto", *, model_factory: str | None = None, **engine_options: Any) -> Tensor:
    """``[N]`` int64 predicted class of every vertex of ``graph``.

    Args:
        model: a file written by :func:`save_model` (``train --save-model``), or ``(model, config)``.
        model_factory: for a file holding a model of your own: the ``module:function`` that builds it
            (:func:`load_model`; the module is imported).
        engine_options: :class:`TrainConfig` fields for the engine (``engine``, ``memory_budget``, ``devices``,
            ``partitions``, ...); the model's own fields come from its config.
    """
    if isinstance(model, (str, os.PathLike)):
        net, config = load_model(model, model_factory)
    elif model_factory is not None:
        raise ConfigError("predict: model_factory= rebuilds a saved model; a (model, config) pair is built already")
    else:
        net, config = model
    want = getattr(net, "num_features", graph.num_features), getattr(net, "num_classes", graph.num_classes)
    if graph.x is None or (graph.num_features, graph.num_classes) != want:
        raise GraphError(f"the model takes {want[0]} features and {want[1]} classes; {graph.name} has "
                         f"{graph.num_features} features and {graph.num_classes} classes")
    config = replace(config, **engine_options)
    dev = resolve_devices(config, device)
    own = None if built_by(net, config, graph.num_features, graph.num_classes) == "config" else net
    engine_cls, _ = select_engine(graph, config, dev, purpose="predict for", model=own)
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
