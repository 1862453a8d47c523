"""Engines and the engine selector (xformers-style dispatch: each engine says why not)."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields

import torch

from gnnscale import runtime as rt
from gnnscale.config import ModelOptions, RunOptions, TrainConfig, register_check
from gnnscale.distributed.job import launched
from gnnscale.engines.core import Engine
from gnnscale.engines.core.devices import rank_device, resolve_device
from gnnscale.engines.inmemory import InMemoryEngine
from gnnscale.engines.offload import OffloadEngine
from gnnscale.engines.sampled import DistributedEngine, HybridEngine, MiniBatchEngine
from gnnscale.engines.taskparallel import TaskParallelEngine
from gnnscale.errors import ConfigError, EngineError
from gnnscale.graph.graph import Graph
from gnnscale.nn.stack import Stack
from gnnscale.plan.epoch_time import EpochTime
from gnnscale.plan.rates import Rates, rates

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
    """One engine as the planner sees it: what ``gnnscale plan`` prints and ``train`` chooses by."""

    name: str
    reasons: list[str]
    """Why it cannot run; empty when it can."""
    estimate: str
    """Its own estimate (peak memory, plan) when it can run."""
    skipped: str | None = None
    """Why ``--engine auto`` passes it over although it can run (``--engine NAME`` runs it)."""
    predicted: EpochTime | None = None
    """Its predicted epoch (:meth:`Engine.predict_epoch`) when it can run; ``None`` when it has no model."""

    @property
    def eligible(self) -> bool:
        """Whether ``--engine auto`` may choose it."""
        return not self.reasons and self.skipped is None


def assess(name: str, graph: Graph, config: TrainConfig, device: torch.device, *, purpose: str = "train",
           estimate: bool = False, model: Stack | None = None, predict: bool | None = None) -> Candidate:
    """The planner's one answer about engine ``name`` (``train`` and ``gnnscale plan`` both ask it): the reasons
    it cannot ``purpose`` (:meth:`Engine.not_supported_reasons`), why ``--engine auto`` skips it, and with
    ``estimate`` its estimate and predicted epoch (``predict``: the prediction alone; it defaults to
    ``estimate``) when it can run, priced with this machine's :func:`~gnnscale.plan.rates.rates`. ``model``: a
    user's model (``None``: ``config``'s built-in one)."""
    cls = ENGINES[name]
    if purpose != "train" and not cls.predicts:
        reasons = [f"it only trains; a model it saved can {purpose} with any other engine"]
    else:
        reasons = cls.not_supported_reasons(graph, config, device, model=model)
    skipped = cls.auto_skip_reason(config) if config.engine == "auto" else None
    line = cls.estimate(graph, config, device, model=model) if estimate and not reasons else ""
    predicted = None
    wanted = (estimate if predict is None else predict) and not reasons and (estimate or skipped is None)
    if wanted and cls.predicts_epochs():  # (an engine without a model calibrates nothing)
        predicted = cls.predict_epoch(graph, config, device, rates(rt.torch_device(device)), model=model)
    return Candidate(name, reasons, line, skipped, predicted)


def candidates(graph: Graph, config: TrainConfig, device: torch.device, *,
               model: Stack | None = None) -> list[Candidate]:
    """Every engine of the requested mode with its reasons or its estimate (each engine's planner runs)."""
    return [assess(name, graph, config, device, estimate=True, model=model) for name in candidate_names(config)]


def chosen(found: list[Candidate]) -> str | None:
    """The engine :func:`select_engine` runs among ``found``: the eligible one predicted fastest (one without a
    prediction after those with one, the registry's order among equals)."""
    able = ranked(found)
    return able[0].name if able else None


def ranked(found: list[Candidate]) -> list[Candidate]:
    """The eligible candidates of ``found``, fastest predicted first (no prediction last; stable)."""
    able = [c for c in found if c.eligible]
    return sorted(able, key=lambda c: (c.predicted is None, c.predicted.seconds if c.predicted else 0.0))


def why_chosen(found: list[Candidate], slower: dict[str, float] | None = None) -> str:
    """One line: which engine ``--engine auto`` runs and why (``auto: offload, predicted 1.2 s/epoch against
    inmemory 1.9 s``). ``slower``: engines not planned because their floor was already slower (seconds)."""
    able = ranked(found)
    if not able:
        return ""
    best, rest = able[0], able[1:]
    if best.predicted is None:
        return f"auto: {best.name}, the first that fits (no engine that fits predicts its epoch)"
    others = [f"{c.name} {_secs(c.predicted.seconds)}" if c.predicted else f"{c.name} (no prediction)"
              for c in rest] + [f"{name} at least {_secs(s)}" for name, s in (slower or {}).items()]
    head = f"auto: {best.name}, predicted {_secs(best.predicted.seconds)}/epoch"
    return head + (f" against {', '.join(others)}" if others else " (the only engine that fits)")


def _secs(s: float) -> str:
    return f"{s:.3g} s"


class Rejected(dict[str, list[str]]):
    """What :func:`select_engine` returns beside the engine: the engines ``auto`` rejected before it (and why),
    and :attr:`why`, the one line saying why it chose the engine it did (empty for a named engine)."""

    why: str = ""


def model_trainers(config: TrainConfig, model: Stack | None = None) -> list[str]:
    """The engines, of any mode, that train ``config``'s model with its options (``--jk``, ``--norm``): those whose
    :meth:`Engine.model_option_reasons` are empty (their capabilities, not their names). ``model``: a user's
    model instead, whose layers must pass the engine's probe too (:meth:`Engine.layer_reasons`)."""
    return [name for name, cls in ENGINES.items()
            if not cls.model_option_reasons(config, model) and not cls.layer_reasons(model)]


def model_refusers(config: TrainConfig) -> list[str]:
    """The engines that refuse ``config``'s model or its options (``--help`` lists them for ``--jk`` and
    ``--residual``): the complement of :func:`model_trainers`."""
    return [name for name in ENGINES if name not in model_trainers(config)]


def disk_tier_engines() -> list[str]:
    """The engines that read ``--host-memory`` (the disk tier of a converted directory's features)."""
    return [name for name, cls in ENGINES.items() if "host_memory" in cls.also_reads
            or any("host_memory" in {f.name for f in fields(g)} for g in cls.options)]


def _model_words(config: TrainConfig) -> str:
    """``config``'s model as its flags say it: ``gcn --jk cat --norm batch``."""
    flags = [f"--jk {config.jk}"] * (config.jk != "none") + ["--norm batch"] * (config.norm == "batch")
    return " ".join([config.model, *flags])


def no_engine_error(graph: Graph, config: TrainConfig, device: torch.device, found: list[Candidate],
                    purpose: str = "train", model: Stack | None = None) -> EngineError:
    """What :func:`select_engine` raises (and ``gnnscale plan`` says) when no engine of ``found`` can run: the
    named engine's reasons (``--engine NAME``), or every engine's of the mode; where the model is what an engine
    refuses, the engines that train it."""
    hint = ""
    if all(ENGINES[c.name].model_option_reasons(config, model) for c in found):  # the model's kind or options
        able = model_trainers(config, model)
        words = _model_words(config) if model is None else "this model"
        hint = (f"; the engines that train {words}: {', '.join(able)}" if able else f"; no engine trains {words}")
    if config.engine != "auto":
        c = found[0]
        return EngineError(f"the {c.name} engine cannot {purpose} {graph.name} on {device}: "
                           f"{'; '.join(c.reasons)}{hint}")
    detail = "; ".join(f"{c.name}: {', '.join(c.reasons or [c.skipped or ''])}" for c in found)
    return EngineError(f"no engine can {purpose} {graph.name} on {device} in {requested_mode(config)} mode: "
                       f"{detail}{hint}")


def select_engine(
    graph: Graph, config: TrainConfig, device: torch.device, *, purpose: str = "train", model: Stack | None = None
) -> tuple[type[Engine], Rejected]:
    """The engine to run and, for ``auto``, the reasons each engine before it in the registry was rejected, with
    the line saying why it was chosen (:attr:`Rejected.why`): among the engines of the requested mode
    (:func:`requested_mode`) with no reason against them, the one predicted fastest (:func:`ranked`; one
    without a prediction after those with one, the registry's order among equals). It asks :func:`assess`, as
    ``gnnscale plan`` does; an engine whose floor (:meth:`Engine.predict_floor`) is already slower than one
    predicted is not planned. ``purpose`` (``train``, ``predict for``) is what the error says no engine can do.
    ``model``: a user's model (``train(model=...)``).

    Raises:
        EngineError: the named engine, or with ``auto`` every engine of the mode, cannot run; lists every reason.
    """
    names = candidate_names(config)
    if config.engine != "auto":
        c = assess(names[0], graph, config, device, purpose=purpose, model=model)
        if c.eligible:
            return ENGINES[c.name], Rejected()
        raise no_engine_error(graph, config, device, [c], purpose, model)
    found, slower = _assess_auto(names, graph, config, device, purpose, model)
    pick = chosen(found)
    if pick is None:
        raise no_engine_error(graph, config, device, found, purpose, model)
    rejected = Rejected()
    for c in found[: [f.name for f in found].index(pick)]:
        if not c.eligible:
            rejected[c.name] = c.reasons or [c.skipped or ""]
    rejected.why = why_chosen(found, slower)
    return ENGINES[pick], rejected


def _assess_auto(names: list[str], graph: Graph, config: TrainConfig, device: torch.device, purpose: str,
                 model: Stack | None) -> tuple[list[Candidate], dict[str, float]]:
    """Every candidate of ``names`` assessed with its prediction, but for those whose floor is already slower
    than the best predicted so far (returned apart, with their floors)."""
    found: list[Candidate] = []
    slower: dict[str, float] = {}
    the_rates: list[Rates] = []
    for name in names:
        best = min((c.predicted.seconds for c in found if c.eligible and c.predicted), default=None)
        if best is not None:
            if not the_rates:
                the_rates.append(rates(rt.torch_device(device)))
            floor = ENGINES[name].predict_floor(graph, config, device, the_rates[0], model=model)
            if floor >= best:
                slower[name] = floor
                continue
        found.append(assess(name, graph, config, device, purpose=purpose, model=model, predict=True))
    return found, slower




def _beside_accelerators(config: TrainConfig) -> bool:
    """Whether the named engine trains on the CPU and the accelerators together (its device is the CPU)."""
    return config.engine in ENGINES and ENGINES[config.engine].trains_beside_accelerators


def resolve_devices(config: TrainConfig, device: str | torch.device) -> torch.device:
    """The training device; with ``config.devices`` (validated here, all CPU or all CUDA), their first. The hybrid
    engine's is always the CPU (its synchronizer and master model live there), and so is any engine's that trains
    beside the accelerators (``Engine.trains_beside_accelerators``)."""
    if not config.devices:
        if requested_mode(config) == "distributed":  # one device per rank: torchrun's LOCAL_RANK picks the GPU
            return rank_device(device, int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
                               int(os.environ.get("LOCAL_RANK", "0")))
        if _beside_accelerators(config):
            if not (isinstance(device, str) and device == "auto") and resolve_device(device).type != "cpu":
                raise ConfigError(f"--device {device}: the {config.engine} engine trains on the CPU and the "
                                  "accelerators together; name them with --devices (e.g. --devices cpu,cuda:0)")
            return torch.device("cpu")
        return resolve_device(device)
    devs = [resolve_device(d) for d in config.devices]
    if any(d.type == "cuda" and d.index is None for d in devs):
        raise ConfigError("--devices takes explicit devices: cpu, or cuda:0,cuda:1,...")
    if _beside_accelerators(config):  # CPU and accelerators together; the synchronizer (master model) on the CPU
        return next(d for d in devs if d.type == "cpu")
    if len({d.type for d in devs}) > 1:
        raise ConfigError(f"--devices mixes CPU and CUDA devices ({', '.join(config.devices)}); use one kind")
    if not (isinstance(device, str) and device == "auto") and resolve_device(device) != devs[0]:
        raise ConfigError(f"--device {device} disagrees with --devices {','.join(config.devices)}; give one of them")
    return devs[0]


__all__ = [
    "ENGINES", "DistributedEngine", "Engine", "HybridEngine",
    "InMemoryEngine", "MiniBatchEngine", "OffloadEngine", "TaskParallelEngine",
    "Candidate", "Rejected", "assess", "candidate_names", "candidates", "chosen", "ranked", "why_chosen",
    "ignored_options", "ignored_settings",
    "disk_tier_engines", "ignored_warning", "model_refusers", "model_trainers", "no_engine_error",
    "readers_of", "requested_mode", "resolve_devices",
    "select_engine",
]
