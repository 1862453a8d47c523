"""Building a model by name: the layer stacks (:class:`~gnnscale.nn.model.GNN`) and the decoupled models
(:class:`~gnnscale.nn.decoupled.DecoupledGNN`)."""

from __future__ import annotations

import torch

from gnnscale.errors import ConfigError
from gnnscale.nn.decoupled import DECOUPLED_MODELS, DecoupledGNN
from gnnscale.nn.model import GNN, MODELS

ALL_MODELS = (*MODELS, *DECOUPLED_MODELS)
"""Every ``--model`` name: the layer stacks and the decoupled models."""


def build_model(
    kind: str, in_features: int, hidden: int, num_classes: int, *, layers: int, dropout: float, heads: int, seed: int,
    norm: str = "none", residual: bool = False, jk: str = "none", input_dropout: float | None = None,
) -> GNN:
    """Build a model with weights determined by ``seed`` alone (same seed -> same initial weights everywhere);
    ``dgcn``/``dgat`` build a :class:`~gnnscale.nn.decoupled.DecoupledGNN` (which takes ``norm`` between its T
    tasks, no ``residual`` or ``jk``: :mod:`gnnscale.nn.norm`)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if kind in DECOUPLED_MODELS:
            if (residual, jk, input_dropout) != (False, "none", None):
                raise ConfigError(f"--residual, --jk and --input-dropout apply to the layer-stack models, not {kind}")
            return DecoupledGNN(kind, in_features, hidden, num_classes, num_layers=layers, dropout=dropout, norm=norm)
        return GNN(kind, in_features, hidden, num_classes, num_layers=layers, dropout=dropout, heads=heads, norm=norm,
                   residual=residual, jk=jk, input_dropout=input_dropout)
