"""Engines and the engine selector (xformers-style dispatch: each engine says why not)."""

from __future__ import annotations

import torch

from gnnscale.config import TrainConfig, register_check
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


def select_engine(
    graph: Graph, config: TrainConfig, device: torch.device
) -> tuple[type[Engine], dict[str, list[str]]]:
    """The engine to run and, for ``auto``, the reasons each engine before it was rejected.

    Raises:
        EngineError: the named engine, or with ``auto`` every engine, cannot run; lists every reason.
    """
    names = list(ENGINES) if config.engine == "auto" else [config.engine]
    rejected: dict[str, list[str]] = {}
    for name in names:
        reasons = ENGINES[name].not_supported_reasons(graph, config, device)
        if not reasons:
            return ENGINES[name], rejected
        rejected[name] = reasons
    detail = "; ".join(f"{n}: {', '.join(r)}" for n, r in rejected.items())
    raise EngineError(f"no engine can train {graph.name} on {device}: {detail}")


__all__ = [
    "ENGINES", "DistributedEngine", "Engine", "HybridEngine",
    "InMemoryEngine", "MiniBatchEngine", "OffloadEngine", "TaskParallelEngine",
    "select_engine",
]
