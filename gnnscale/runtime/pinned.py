"""Pinned host buffers: page-lock a host tensor *in place* (``cudaHostRegister``) instead of keeping a pinned copy.

``tensor.pin_memory()`` allocates new page-locked memory and copies: a store that keeps every feature row in host
memory would hold it twice. :func:`pin_in_place` registers the tensor's own pages with CUDA, in slices of at most
``slice_bytes`` (one huge registration can fail or stall where smaller ones succeed), flagged portable (pinned for
every CUDA context) and mapped (readable by kernels: under UVA the device address is the host address, which the
zero-copy gather relies on). ``Tensor.is_pinned()`` asks CUDA about the pointer, so a registered tensor reports
pinned. (A copy of ``gnnscale.store.pinning`` adapted to the runtime; that module goes when its callers move here.
Run on an H200 by ``make gpu-check``: benchmarks/RESULTS.md.)

Every return code is checked. If a slice fails, the slices already registered are unregistered, then either a
:class:`~gnnscale.errors.ConfigError` names the size and the CUDA error, or (``fallback=True``) ``None`` tells the
caller to take a pinned copy (:func:`pinned_host`). A :class:`PinnedRegion` is a hold on a registration; the
slices are unregistered exactly once, when the last hold goes (:meth:`~PinnedRegion.close`, leaving a ``with``
block, or garbage collection); the registration keeps the tensor alive meanwhile. Pinning a tensor whose memory
this process registered already (a second engine over the same graph) shares that registration instead of
registering again, which CUDA refuses (``cudaErrorHostMemoryAlreadyRegistered``, an error that also surfaces at the
next kernel launch). Pinning only means something for a real CUDA device: for the CPU and the sim device
:func:`pinned_host` and :func:`pinned_empty` hand back ordinary host memory.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from gnnscale.errors import ConfigError
from gnnscale.runtime import backend
from gnnscale.runtime.device import Device
from gnnscale.runtime.pool import internal
from gnnscale.runtime.simdevice import SimDevice

__all__ = ["HOST_REGISTER_FLAGS", "SLICE_BYTES", "PinnedRegion", "needs_pinning", "pin_in_place", "pinned_empty",
           "pinned_host"]

HOST_REGISTER_FLAGS = 1 | 2
"""``cudaHostRegisterPortable | cudaHostRegisterMapped``."""
SLICE_BYTES = 1 << 30
"""Largest single registration, in bytes."""


def _code(ret: Any) -> int:
    """A cudart call's error code (the binding returns a ``cudaError`` enum, or a tuple starting with one)."""
    if isinstance(ret, tuple):
        ret = ret[0]
    return int(getattr(ret, "value", ret))


def _unregister(cudart: Any, ptrs: list[int], tensor: Tensor, key: tuple[int, int]) -> None:
    del tensor  # only kept alive until now
    _LIVE.pop(key, None)
    while ptrs:
        cudart.cudaHostUnregister(ptrs.pop())


class _Registration:
    """One ``cudaHostRegister`` of a memory range, shared by every :class:`PinnedRegion` that asked for it: CUDA
    refuses to register a range twice (``cudaErrorHostMemoryAlreadyRegistered``, which then also surfaces at the
    next kernel launch), so a second engine over the same host tensor takes a hold on the first registration."""

    def __init__(self, tensor: Tensor, ptrs: list[int], cudart: Any, key: tuple[int, int]):
        self.holders = 0
        self.slices = len(ptrs)
        self.finalizer = weakref.finalize(self, _unregister, cudart, ptrs, tensor, key)

    def release(self) -> None:
        self.holders -= 1
        if self.holders <= 0:
            self.finalizer()


_LIVE: dict[tuple[int, int], weakref.ref[_Registration]] = {}
"""Live registrations by (address, bytes): the ranges this process has registered and not yet unregistered."""


def _covering(base: int, total: int) -> tuple[_Registration | None, bool]:
    """The live registration holding ``[base, base + total)`` whole, and whether some live one overlaps it."""
    overlap = False
    for (b, n), ref in list(_LIVE.items()):
        reg = ref()
        if reg is None or not reg.finalizer.alive:
            continue
        if b <= base and base + total <= b + n:
            return reg, True
        overlap |= b < base + total and base < b + n
    return None, overlap


class PinnedRegion:
    """A hold on a host tensor's registered pages; :meth:`close` lets go of it (once), and the pages are
    unregistered when the last hold on the same registration goes (closed or garbage collected)."""

    def __init__(self, tensor: Tensor, registration: _Registration):
        self.tensor = tensor
        self._registration = registration
        registration.holders += 1
        self.slices = registration.slices
        self._finalizer = weakref.finalize(self, registration.release)

    @property
    def closed(self) -> bool:
        """Whether this hold is let go and its registration gone."""
        return not self._finalizer.alive and not self._registration.finalizer.alive

    def close(self) -> None:
        """Let go of this hold (a second call does nothing); the last hold unregisters every slice."""
        self._finalizer()

    def __enter__(self) -> PinnedRegion:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def needs_pinning(device: Device | None) -> bool:
    """Whether host memory feeding ``device`` should be page-locked: a real CUDA device (None: whichever
    accelerator is available). False for the CPU and the sim device."""
    if isinstance(device, SimDevice):
        return False
    if device is None:
        return backend.accelerator_type() == "cuda" and backend.is_available()
    return device.type == "cuda"


def pin_in_place(tensor: Tensor, *, slice_bytes: int = SLICE_BYTES, fallback: bool = False,
                 cudart: Callable[[], Any] = backend.cudart) -> PinnedRegion | None:
    """Register ``tensor``'s memory with CUDA as page-locked, without copying it.

    Args:
        tensor: a contiguous CPU tensor (an empty one registers nothing).
        slice_bytes: most bytes one ``cudaHostRegister`` call covers.
        fallback: on failure, return ``None`` (the caller copies into pinned memory) instead of raising.
        cudart: returns the CUDA runtime binding (tests pass a fake).

    Raises:
        ValueError: ``tensor`` is not a contiguous CPU tensor, or ``slice_bytes < 1``.
        ConfigError: a registration failed and ``fallback`` is false.
    """
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        raise ValueError(f"pin_in_place needs a contiguous CPU tensor, got one on {tensor.device}"
                         + ("" if tensor.is_contiguous() else ", not contiguous"))
    if slice_bytes < 1:
        raise ValueError(f"slice_bytes must be >= 1, got {slice_bytes}")
    rt = cudart()
    base, total = tensor.data_ptr(), tensor.numel() * tensor.element_size()
    shared, overlap = _covering(base, total)
    if shared is not None:  # registered already (another engine over the same tensor): share it
        return PinnedRegion(tensor, shared)
    if overlap:  # part of it is registered: CUDA would refuse the rest
        if fallback:
            return None
        raise ConfigError(f"could not pin a {total}-byte host tensor in place: part of it is already registered "
                          "with CUDA by another tensor")
    ptrs: list[int] = []
    for off in range(0, total, slice_bytes):
        size = min(slice_bytes, total - off)
        code = _code(rt.cudaHostRegister(base + off, size, HOST_REGISTER_FLAGS))
        if code != 0:
            _unregister(rt, ptrs, tensor, (base, total))
            if fallback:
                return None
            raise ConfigError(f"could not pin {size} bytes of a {total}-byte host tensor in place "
                              f"(cudaHostRegister error {code}); free host memory or raise the locked-memory "
                              "limit (ulimit -l)")
        ptrs.append(base + off)
    key = (base, total)
    reg = _Registration(tensor, ptrs, rt, key)
    _LIVE[key] = weakref.ref(reg)
    return PinnedRegion(tensor, reg)


def pinned_host(tensor: Tensor, *, device: Device | None = None,
                cudart: Callable[[], Any] = backend.cudart) -> tuple[Tensor, PinnedRegion | None]:
    """``tensor`` ready to feed ``device`` (default: the available accelerator) without a staging copy.

    For a CUDA device: registered in place when CUDA allows it (returned with its region, which must be kept
    while the tensor is used), else a pinned copy (region ``None``). For the CPU, the sim device, or no
    accelerator to pin for: the tensor as it is, contiguous (region ``None``).
    """
    t = tensor.contiguous()
    if device is not None and not needs_pinning(device):
        return t, None
    region = pin_in_place(t, fallback=True, cudart=cudart)
    if region is not None:
        return t, region
    return (t.pin_memory(), None) if needs_pinning(None) else (t, None)


def pinned_empty(shape: Sequence[int], *, dtype: torch.dtype = torch.float32,
                 device: Device | None = None) -> Tensor:
    """An uninitialised host tensor for copies to and from ``device``: page-locked when :func:`needs_pinning`;
    host memory even inside a sim device's scope (:func:`gnnscale.runtime.on_device`)."""
    with internal():
        return torch.empty(tuple(shape), dtype=dtype, pin_memory=needs_pinning(device))
