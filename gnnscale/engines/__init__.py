"""Engines and the engine selector (xformers-style dispatch: each engine says why not)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from gnnscale.config import ModelOptions, RunOptions, TrainConfig, register_check
from gnnscale.distributed.job import launched
from gnnscale.engines.base import Engine
from gnnscale.engines.distributed import DistributedEngine
from gnnscale.engines.hybrid import HybridEngine
from gnnscale.engines.inmemory import InMemoryEngine
from gnnscale.engines.minibatch import MiniBatchEngine
from gnnscale.engines.offload import OffloadEngine
from gnnscale.engines.taskparallel import TaskParallelEngine
from gnnscale.errors import ConfigError, EngineError
from gnnscale.graph.graph import Graph

ENGINES: dict[str, type[Engine]] = {"inmemory": InMemoryEngine, "taskparallel": TaskParallelEngine,
                                    "offload": OffloadEngine, "minibatch": MiniBatchEngine,
                                    "hybrid": HybridEngine, "distributed": DistributedEngine}
"""Registry, in the priority order ``--engine auto`` tries them."""


@register_check
def check_engine(config: TrainConfig) -> None:
    """The engine ``config`` names exists, and its own options are right (:meth:`Engine.check_options`)."""
    if config.engine == "auto":
        return
    if config.engine not in ENGINES:
        raise ConfigError(f"unknown engine {config.engine!r}; choose auto or one of {', '.join(ENGINES)}")
    ENGINES[config.engine].check_options(config)


def readers_of(options: type) -> list[str]:
    """The engines that read the option group ``options`` (a dataclass of :mod:`gnnscale.config`)."""
    return [name for name, cls in ENGINES.items() if options in cls.options]


def ignored_options(config: TrainConfig, engine: str) -> list[str]:
    """The fields of ``config`` set to something other than their default that have no effect when ``engine``
    trains it (:func:`ignored_settings` says by which component)."""
    return [name for name, _ in ignored_settings(config, engine)]


def ignored_settings(config: TrainConfig, engine: str) -> list[tuple[str, str]]:
    """``(field, component)`` for each field of ``config`` set to something other than its default that has no
    effect: an option group ``engine`` does not read (``the offload engine``), ``heads`` of a model without
    attention heads (``the gcn model``), ``hidden`` of a one-layer model (which has no hidden layer)."""
    defaults = TrainConfig()
    read = {f.name for group in (ModelOptions, RunOptions, *ENGINES[engine].options) for f in fields(group)}
    read |= set(ENGINES[engine].also_reads)
    out = [(f.name, f"the {engine} engine") for f in fields(TrainConfig)
           if f.name not in read and getattr(config, f.name) != getattr(defaults, f.name)]
    if config.model != "gat" and config.heads != defaults.heads:
        out.append(("heads", f"the {config.model} model (only gat has attention heads)"))
    if config.layers == 1 and config.hidden != defaults.hidden:
        out.append(("hidden", "a 1-layer model (it has no hidden layer)"))
    return out


def ignored_warning(config: TrainConfig, engine: str) -> str | None:
    """One warning line's text for :func:`ignored_settings` (``None``: nothing ignored), naming each setting as
    the API and the CLI spell it."""
    by: dict[str, list[str]] = {}
    for name, component in ignored_settings(config, engine):
        by.setdefault(component, []).append(f"{name}={getattr(config, name)!r} (--{name.replace('_', '-')})")
    if not by:
        return None
    return "; ".join(f"{', '.join(names)} {'has' if len(names) == 1 else 'have'} no effect on {component}"
                     for component, names in by.items())


def requested_mode(config: TrainConfig) -> str:
    """The training mode: the named engine's; else ``config.mode``; else ``distributed`` when ranks are given
    (``--ranks``, or a job torch's launcher started), else ``full``."""
    if config.engine != "auto":
        return ENGINES[config.engine].mode
    if config.mode != "auto":
        return config.mode
    return "distributed" if config.ranks is not None or launched() else "full"


def candidate_names(config: TrainConfig) -> list[str]:
    """The engines ``config`` lets the planner choose from, in the order it tries them."""
    if config.engine != "auto":
        return [config.engine]
    mode = requested_mode(config)
    return [name for name, cls in ENGINES.items() if cls.mode == mode]


@dataclass
class Candidate:
    """One engine as the planner sees it (``gnnscale plan``)."""

    name: str
    reasons: list[str]
    """Why it cannot run; empty when it can."""
    estimate: str
    """Its own estimate (peak memory, plan) when it can run."""


def candidates(graph: Graph, config: TrainConfig, device: torch.device) -> list[Candidate]:
    """Every engine of the requested mode with its reasons or its estimate (each engine's planner runs)."""
    out = []
    for name in candidate_names(config):
        cls = ENGINES[name]
        reasons = cls.not_supported_reasons(graph, config, device)
        out.append(Candidate(name, reasons, "" if reasons else cls.estimate(graph, config, device)))
    return out


def select_engine(
    graph: Graph, config: TrainConfig, device: torch.device, *, purpose: str = "train"
) -> tuple[type[Engine], dict[str, list[str]]]:
    """The engine to run and, for ``auto``, the reasons each engine before it was rejected: the first engine of
    the requested mode (:func:`requested_mode`) with no reason against it, in the registry's order. ``purpose``
    (``train``, ``predict for``) is what the error says no engine can do.

    Raises:
        EngineError: the named engine, or with ``auto`` every engine of the mode, cannot run; lists every reason.
    """
    names = candidate_names(config)
    rejected: dict[str, list[str]] = {}
    for name in names:
        cls = ENGINES[name]
        if purpose != "train" and not cls.predicts:
            reasons = [f"it only trains; a model it saved can {purpose} with any other engine"]
        else:
            reasons = cls.not_supported_reasons(graph, config, device)
        if not reasons:
            return ENGINES[name], rejected
        rejected[name] = reasons
    detail = "; ".join(f"{n}: {', '.join(r)}" for n, r in rejected.items())
    mode = "" if config.engine != "auto" else f" in {requested_mode(config)} mode"
    raise EngineError(f"no engine can {purpose} {graph.name} on {device}{mode}: {detail}")


__all__ = [
    "ENGINES", "DistributedEngine", "Engine", "HybridEngine",
    "InMemoryEngine", "MiniBatchEngine", "OffloadEngine", "TaskParallelEngine",
    "Candidate", "candidate_names", "candidates", "ignored_options", "ignored_settings", "ignored_warning",
    "readers_of", "requested_mode",
    "select_engine",
]
