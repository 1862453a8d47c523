"""Loading a benchmark's graph in its case process, and the device name records carry. gnnscale is imported inside
the functions: a peer's own venv (DGL's, torch 2.2) calls :func:`device_name` on the CPU without gnnscale's
dependencies."""

from __future__ import annotations

import time
from typing import Any


def load_graph(spec: str, root: str | None = None, seed: int = 0) -> tuple[Any, float]:
    """Build and check the dataset ``spec`` (as ``--dataset`` takes it): the graph and the seconds it took."""
    from gnnscale.graph.datasets import load_dataset
    from gnnscale.trainable import check_trainable

    t0 = time.perf_counter()
    g = load_dataset(spec, root, seed=seed)
    check_trainable(g)
    return g, time.perf_counter() - t0


def device_name(device: str = "cpu") -> str:
    """The device a case ran on, as records name it: the CPU model with cores and threads, or the GPU's name."""
    import torch

    from benchmarks.harness.machine import cpu_model

    dev = torch.device(device)
    if dev.type == "cpu":
        import os
        return f"{cpu_model()} ({os.cpu_count()} cores, {torch.get_num_threads()} threads)"
    from gnnscale import runtime as rt
    return rt.device_name(dev)
