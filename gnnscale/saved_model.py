"""Saved models: :func:`save_model` writes a model's weights with what rebuilds it (its config, the graph's feature
and class counts and fingerprint, how it was built: :data:`BUILT_BY`), atomically and with a checksum
(:func:`gnnscale.checkpoint.atomic_save`). Below both the training loop, which saves ``model.pt`` beside each
checkpoint, and :mod:`gnnscale.predict`, which loads and runs saved models, so training never calls into
prediction to save one."""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from gnnscale.checkpoint import atomic_save
from gnnscale.config import TrainConfig
from gnnscale.errors import ConfigError, GnnscaleError
from gnnscale.fsutil import make_parents
from gnnscale.graph.fingerprint import fingerprint as graph_fingerprint
from gnnscale.graph.graph import Graph
from gnnscale.nn import build_model
from gnnscale.nn.stack import Stack

FORMAT = "gnnscale-model"
VERSION = 1
BUILT_BY = ("config", "factory", "given")
"""How a saved model was built, its ``built_by`` entry: ``config``, the built-in model its config names (rebuilt
from it); ``factory``, the config's ``model_factory`` (``--model-factory``: rebuilt only through a factory named
again); ``given``, a model given to ``train(model=...)`` (no name: rebuilt through a factory named when loading).
A file without the entry (written before it) is ``factory`` when its config names one, else ``config``."""


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
    how = built_by(model, config, graph.num_features, graph.num_classes)
    return atomic_save({"format": FORMAT, "version": VERSION, "config": asdict(config), "built_by": how,
                        "num_features": graph.num_features, "num_classes": graph.num_classes,
                        "dataset": graph.name, "fingerprint": graph_fingerprint(graph) if fingerprint is None
                        else fingerprint, "state_dict": weights, **meta}, make_parents(path))


def built_by(model: Stack, config: TrainConfig, num_features: int, num_classes: int | None) -> str:
    """How ``model`` was built (:data:`BUILT_BY`): through ``config.model_factory``, else as ``config``'s built-in
    model when it is one (the same class, kind, norm and jumping knowledge, and weights of the same names and
    shapes: what rebuilding it from ``config`` gives, built without memory), else ``given``."""
    if config.model_factory is not None:
        return "factory"
    try:
        with torch.device("meta"):
            ref = build_model(config.model, num_features, config.hidden, num_classes or 0, **config.model_kwargs())
    except GnnscaleError:
        return "given"
    same = (type(model) is type(ref) and model.kind == ref.kind
            and all(getattr(model, a, None) == getattr(ref, a, None) for a in ("norm", "jk", "residual"))
            and shapes(model.state_dict()) == shapes(ref.state_dict()))
    return "config" if same else "given"


def shapes(state: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The shape of each tensor of ``state`` (weights), by name."""
    return {k: tuple(v.shape) for k, v in state.items() if isinstance(v, Tensor)}
