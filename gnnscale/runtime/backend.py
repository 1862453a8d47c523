"""The real accelerator: the one module of gnnscale that names ``torch.cuda`` or ``torch.accelerator``.

Every function takes a ``torch.device`` of the accelerator's type (``cuda`` on CUDA and ROCm builds, ``xpu``,
...). Where the installed torch has the device-generic API (``torch.accelerator``, ``torch.Stream``,
``torch.Event``: torch >= 2.6 for the basics, later versions for memory statistics), it is used, so other
accelerators work; otherwise the device's own module (``torch.cuda`` for CUDA), so torch >= 2.4 keeps working.
Each probe is a ``hasattr`` on the installed torch, made once at import.

Nothing here validates a device spec or counts a synchronisation: :mod:`gnnscale.runtime.device` does both.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch

__all__ = [
    "OOM_ERRORS", "accelerator_type", "can_access_peer", "cudart", "current_stream", "device_context",
    "device_count", "device_name", "is_available", "mem_get_info", "memory_allocated", "new_event", "new_stream",
    "peak_bytes", "reset_peak", "stream_context", "synchronize",
]

_ACC: Any = getattr(torch, "accelerator", None)
_STREAM: Any = getattr(torch, "Stream", None)
_EVENT: Any = getattr(torch, "Event", None)
"""The device-generic API (``gnnscale.testing.FakeAccelerator`` replaces these three for a test)."""


def _has(*names: str) -> bool:
    return _ACC is not None and all(hasattr(_ACC, n) for n in names)


_GENERIC_STREAMS = (_has("current_stream", "set_stream", "current_device_index", "set_device_index")
                    and _STREAM is not None and _EVENT is not None)
"""torch.accelerator can create, select and restore streams and events of any accelerator type."""

OOM_ERRORS: tuple[type[BaseException], ...] = (
    (torch.OutOfMemoryError,) if hasattr(torch, "OutOfMemoryError") else (torch.cuda.OutOfMemoryError,))
"""The exception an accelerator allocation raises when memory runs out."""


def _module(device: torch.device) -> Any:
    """The device type's own torch module (``torch.cuda``, ``torch.xpu``, ...; None where torch has none)."""
    return getattr(torch, device.type, None)


def accelerator_type() -> str | None:
    """The accelerator type this torch was built for (``"cuda"`` also on ROCm), or None for a CPU-only build.
    A build for an accelerator reports its type even on a machine without one: ask :func:`is_available`."""
    if _has("current_accelerator"):
        acc = _ACC.current_accelerator()
        return None if acc is None else str(acc.type)
    return "cuda" if torch.backends.cuda.is_built() else None


def _own_module() -> Any:
    """The accelerator type's own module (without the generic API), or None for a CPU-only build."""
    acc = accelerator_type()
    return None if acc is None else _module(torch.device(acc))


def is_available() -> bool:
    """Whether at least one accelerator device can be used now."""
    if _has("is_available"):
        return bool(_ACC.is_available())
    mod = _own_module()
    return mod is not None and bool(mod.is_available())


def device_count() -> int:
    """Number of accelerator devices visible to this process."""
    if _has("device_count"):
        return int(_ACC.device_count())
    mod = _own_module()
    return 0 if mod is None else int(mod.device_count())


def current_index() -> int:
    """The current accelerator device's index (what an index-less ``cuda`` device means)."""
    if _has("current_device_index"):
        return int(_ACC.current_device_index())
    mod = _own_module()
    return 0 if mod is None else int(mod.current_device())


# ------------------------------------------------------------------------------------------------ streams, events
def new_stream(device: torch.device) -> Any:
    """A new stream on ``device`` (``torch.Stream``, or the device module's stream class on older torch)."""
    if _GENERIC_STREAMS:
        return _STREAM(device)
    return _module(device).Stream(device)


def current_stream(device: torch.device) -> Any:
    """The calling thread's current stream on ``device``."""
    if _GENERIC_STREAMS:
        return _ACC.current_stream(device)
    return _module(device).current_stream(device)


@contextmanager
def stream_context(stream: Any) -> Iterator[None]:
    """Make ``stream`` the calling thread's current stream (and its device the current device) inside the block;
    restore both after."""
    if not _GENERIC_STREAMS:
        with _module(stream.device).stream(stream):
            yield
        return
    prev_index = _ACC.current_device_index()
    prev = _ACC.current_stream(stream.device)
    _ACC.set_stream(stream)  # also makes the stream's device current
    try:
        yield
    finally:
        _ACC.set_stream(prev)
        _ACC.set_device_index(prev_index)


def new_event(device: torch.device) -> Any:
    """A new (unrecorded, timing-free) event for ``device``."""
    if _GENERIC_STREAMS:
        return _EVENT(device=device)
    return _module(device).Event()


def synchronize(device: torch.device) -> None:
    """Block the host until every stream of ``device`` has finished its work."""
    if _has("synchronize"):
        _ACC.synchronize(device)
    else:
        _module(device).synchronize(device)


def device_context(device: torch.device) -> Any:
    """A context manager making ``device`` the current accelerator device (kernels that launch on the current
    device, such as Triton's, then run there); a no-op for an index-less device."""
    if device.index is None:
        return nullcontext()
    if _has("device_index"):
        return _ACC.device_index(device.index)
    return _module(device).device(device)


# ------------------------------------------------------------------------------------------------------- memory
def mem_get_info(device: torch.device) -> tuple[int, int]:
    """``(free, total)`` bytes of ``device``'s memory (free across every process using it)."""
    if _has("get_memory_info"):
        free, total = _ACC.get_memory_info(device)
    else:
        free, total = _module(device).mem_get_info(device)
    return int(free), int(total)


def memory_allocated(device: torch.device) -> int:
    """Bytes the caching allocator has handed out on ``device`` now."""
    if _has("memory_allocated"):
        return int(_ACC.memory_allocated(device))
    return int(_module(device).memory_allocated(device))


def reset_peak(device: torch.device) -> None:
    """Start a new peak window for :func:`peak_bytes`."""
    if _has("reset_peak_memory_stats"):
        _ACC.reset_peak_memory_stats(device)
    else:
        _module(device).reset_peak_memory_stats(device)


def peak_bytes(device: torch.device) -> int:
    """Most bytes allocated on ``device`` at once since the last :func:`reset_peak`."""
    if _has("max_memory_allocated"):
        return int(_ACC.max_memory_allocated(device))
    return int(_module(device).max_memory_allocated(device))


# ---------------------------------------------------------------------------------------------- device queries
def device_name(device: torch.device) -> str:
    """The product name of ``device`` (``"NVIDIA H100 80GB HBM3"``), or its type where torch cannot say."""
    mod = _module(device)
    if mod is not None and hasattr(mod, "get_device_name"):
        return str(mod.get_device_name(device))
    return device.type


def can_access_peer(a: torch.device, b: torch.device) -> bool:
    """Whether kernels on ``a`` can read ``b``'s memory directly (NVLink or PCIe peer access)."""
    if a.type != b.type:
        return False
    mod = _module(a)
    if mod is None or not hasattr(mod, "can_device_access_peer"):
        return False
    return bool(mod.can_device_access_peer(a, b))


def cudart() -> Any:
    """The CUDA runtime binding (``cudaHostRegister``/``cudaHostUnregister``); raises where torch has no CUDA."""
    return torch.cuda.cudart()
