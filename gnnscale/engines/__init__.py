"""Engines and the engine selector (xformers-style dispatch: each engine says why not)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from gnnscale.engines.base import Engine
from gnnscale.engines.distributed import DistributedEngine
from gnnscale.engines.hybrid import HybridEngine
from gnnscale.engines.inmemory import InMemoryEngine
from gnnscale.engines.minibatch import MiniBatchEngine
from gnnscale.engines.offload import OffloadEngine
from gnnscale.engines.taskparallel import TaskParallelEngine
from gnnscale.errors import EngineError
from gnnscale.graph.graph import Graph

if TYPE_CHECKING:
    from gnnscale.config import TrainConfig

ENGINES: dict[str, type[Engine]] = {"inmemory": InMemoryEngine, "taskparallel": TaskParallelEngine,
                                    "offload": OffloadEngine, "minibatch": MiniBatchEngine,
                                    "hybrid": HybridEngine, "distributed": DistributedEngine}
"""Registry, in the priority order ``--engine auto`` tries them."""


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
