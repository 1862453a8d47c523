"""Helpers for gnnscale's tests: tiny literal graphs, device parametrisation, shared-data lookup."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from gnnscale import runtime as rt
from gnnscale.graph.graph import Graph
from gnnscale.runtime import backend as rt_backend
from gnnscale.testing.accelerator import FakeAccelerator, FakeEvent, FakeStream

__all__ = ["DEVICES", "FakeAccelerator", "FakeCudart", "FakeEvent", "FakeStream", "SyncCounter", "fake_accelerator",
           "need_file", "only_cuda", "shared_datasets", "tiny_graph", "with_device"]

DEVICES = ["cpu"] + ([rt.accelerator_type() or "cuda"] if rt.is_available() else [])

with_device = pytest.mark.parametrize("device", DEVICES)
"""Run a test on CPU and, where present, CUDA."""

only_cuda = pytest.mark.skipif(not rt.is_available(), reason="needs a CUDA device")


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


class SyncCounter:
    """Counts the operations that make the host wait for a CUDA device, as they are issued (CPU runs too).

    A :class:`~torch.utils._python_dispatch.TorchDispatchMode` sees ``aten._local_scalar_dense`` (``int(t)``,
    ``bool(t)``, ``.item()``), ``aten.nonzero`` and the ops whose output size depends on data
    (``masked_select``, ``unique``, boolean indexing, ``repeat_interleave`` without ``output_size``), tensors made
    from Python data (``torch.tensor``: a blocking pageable copy when built on a device) and copies into CPU
    memory from another device. A :class:`~torch.overrides.TorchFunctionMode` sees the Python calls that pull a
    tensor to the host (``.cpu()``, ``.tolist()``, ``.numpy()``): on a CPU run they dispatch nothing, yet on a GPU
    each is a device-to-host copy and a sync. So a CPU test can assert what a GPU run syncs. (``.to(device)`` is
    not counted: device-agnostic code moves tensors to the worker's device, which is the CPU in such a run.)

    ``counts`` maps each kind to its number; ``total`` is their sum. Counting is per thread (modes are thread
    local): run single-device engines inline.
    """

    HOST_PULLS = ("cpu", "tolist", "numpy")

    def __init__(self) -> None:
        from collections import Counter

        self.counts: Counter[str] = Counter()

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __enter__(self) -> SyncCounter:
        from torch.overrides import TorchFunctionMode
        from torch.utils._python_dispatch import TorchDispatchMode

        counts = self.counts
        aten = torch.ops.aten
        always = {aten._local_scalar_dense.default: "item", aten.nonzero.default: "nonzero",
                  aten.masked_select.default: "masked_select", aten._unique2.default: "unique",
                  aten.unique_consecutive.default: "unique", aten.unique_dim.default: "unique",
                  aten.lift_fresh.default: "tensor_from_python"}

        class _Dispatch(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                kwargs = kwargs or {}
                kind = always.get(func)
                if kind is None and func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is None:
                    kind = "repeat_interleave"
                elif kind is None and func is aten.index.Tensor and any(
                        isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1]):
                    kind = "bool_index"
                elif kind is None and func in (aten._to_copy.default, aten.copy_.default):
                    src = args[0] if func is aten._to_copy.default else args[1]
                    dst_dev = kwargs.get("device") if func is aten._to_copy.default else args[0].device
                    if dst_dev is not None and torch.device(dst_dev).type == "cpu" and src.device.type != "cpu":
                        kind = "copy_to_host"
                if kind is not None:
                    counts[kind] += 1
                return func(*args, **kwargs)

        pulls = {getattr(torch.Tensor, n) for n in self.HOST_PULLS}

        class _Function(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                if func in pulls:
                    counts[f"{func.__name__}()"] += 1
                return func(*args, **(kwargs or {}))

        self._modes: list[Any] = [_Function(), _Dispatch()]
        for m in self._modes:
            m.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        for m in reversed(self._modes):
            m.__exit__(*exc)



class FakeCudart:
    """A stand-in for the CUDA runtime's host-registration calls (``cudart=lambda: fake`` of
    :func:`gnnscale.runtime.pin_in_place`): records what is registered, fails the ``fail_at``-th call, and refuses
    a range that overlaps a registered one as CUDA does."""

    def __init__(self, fail_at: int | None = None):
        self.fail_at = fail_at
        self.registered: dict[int, int] = {}  # ptr -> size
        self.calls = 0
        self.unregistered: list[int] = []
        self.last_error = 0
        """The error a real runtime would leave for the next kernel launch (712: a range registered twice)."""

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:  # noqa: N802 (CUDA's name)
        assert flags == rt.HOST_REGISTER_FLAGS
        self.calls += 1
        if self.fail_at is not None and self.calls - 1 == self.fail_at:
            return 2  # cudaErrorMemoryAllocation
        if any(p < ptr + size and ptr < p + n for p, n in self.registered.items()):
            self.last_error = 712  # as CUDA: refused, and the error also surfaces at the next kernel launch
            return 712  # cudaErrorHostMemoryAlreadyRegistered
        self.registered[ptr] = size
        return 0

    def cudaHostUnregister(self, ptr: int) -> int:  # noqa: N802
        assert ptr in self.registered, "unregistering what was not registered (or twice)"
        del self.registered[ptr]
        self.unregistered.append(ptr)
        return 0


def fake_accelerator(monkeypatch: pytest.MonkeyPatch, count: int, kind: str = "cuda") -> None:
    """Make the runtime report ``count`` accelerators of type ``kind`` (device resolution only: nothing can run
    on them). Patches :mod:`gnnscale.runtime.backend`, the one module that asks torch."""
    monkeypatch.setattr(rt_backend, "accelerator_type", lambda: kind)
    monkeypatch.setattr(rt_backend, "is_available", lambda: count > 0)
    monkeypatch.setattr(rt_backend, "device_count", lambda: count)
