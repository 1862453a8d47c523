"""Helpers for gnnscale's tests: tiny literal graphs, device parametrisation, shared-data lookup."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from gnnscale.graph.graph import Graph

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

with_device = pytest.mark.parametrize("device", DEVICES)
"""Run a test on CPU and, where present, CUDA."""

only_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def shared_datasets() -> Path:
    """The shared real-data folder (``$GNNSCALE_DATASETS`` or ``../shared/datasets`` beside the repo)."""
    env = os.environ.get("GNNSCALE_DATASETS")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2].parent / "shared" / "datasets"


def need_file(rel: str) -> Path:
    """Path of a shared dataset file, or skip the test saying which file is missing."""
    p = shared_datasets() / rel
    if not p.exists():
        pytest.skip(f"shared dataset {p} not present (set GNNSCALE_DATASETS to its folder)")
    return p


def tiny_graph(with_data: bool = True) -> Graph:
    """6 vertices, 2 classes, 9 directed edges incl. self-loops 2->2 and 4->4, and a vertex (5) with no in-edges."""
    src = torch.tensor([1, 2, 0, 3, 2, 4, 3, 0, 4])
    dst = torch.tensor([0, 0, 1, 1, 2, 3, 4, 4, 4])
    if not with_data:
        return Graph.from_edge_index(torch.stack([src, dst]), 6, name="tiny")
    g = torch.Generator().manual_seed(0)
    return Graph.from_edge_index(
        torch.stack([src, dst]),
        6,
        x=torch.randn(6, 3, generator=g),
        y=torch.tensor([0, 1, 0, 1, 0, 1]),
        train_mask=torch.tensor([True, True, False, False, False, False]),
        val_mask=torch.tensor([False, False, True, True, False, False]),
        test_mask=torch.tensor([False, False, False, False, True, True]),
        name="tiny",
    )
