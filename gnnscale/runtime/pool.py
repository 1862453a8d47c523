"""The sim device's memory: a bounded pool of bytes, counted per storage; and the primitives every piece of sim
state shares (one lock, the runtime's own-ops flag, a tensor's byte span).

A sim device's tensors live in host memory. The pool counts each tensor's *storage* once (views share it) when
it is allocated (:meth:`SimPool.allocate`) or added (:meth:`SimPool.add`); a ``weakref.finalize`` on the storage
returns its bytes the moment the last tensor using it is garbage (CPython frees on the last reference; a reference
cycle waits for ``gc.collect()``).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor

from gnnscale.runtime.errors import DeviceOutOfMemory, oom_message

__all__ = ["LOCK", "SimPool", "internal", "is_internal", "span", "storage_key"]

LOCK = threading.RLock()
"""Guards all sim state (the engines issue work from several threads). Re-entrant: a storage finalizer may run
in a thread that holds it."""

_TLS = threading.local()


@contextmanager
def internal() -> Iterator[None]:
    """Mark the runtime's own tensor operations (poisoning, completing a copy, allocating) so the sim's dispatch
    mode lets them through unchecked and uncounted."""
    prev = getattr(_TLS, "internal", False)
    _TLS.internal = True
    try:
        yield
    finally:
        _TLS.internal = prev


def is_internal() -> bool:
    """Whether the calling thread is inside :func:`internal`."""
    return bool(getattr(_TLS, "internal", False))


def storage_key(t: Tensor) -> int | None:
    """An id of ``t``'s storage, unique while the storage lives (its ``StorageImpl`` address); None for tensors
    without one of their own (sparse layouts, meta tensors)."""
    if t.layout != torch.strided or t.device.type == "meta":
        return None
    try:
        return int(t.untyped_storage()._cdata)
    except (RuntimeError, NotImplementedError):  # pragma: no cover - wrapper subclasses without storage
        return None


def span(t: Tensor) -> tuple[int, int, int] | None:
    """``(storage key, first byte, end byte)`` of the bytes ``t`` can touch in its storage (a strided view: from
    its first to its last element); None where :func:`storage_key` is None."""
    key = storage_key(t)
    if key is None:
        return None
    es = t.element_size()
    lo = int(t.storage_offset()) * es
    if t.numel() == 0:
        return key, lo, lo
    extent = 1 + sum((int(n) - 1) * int(s) for n, s in zip(t.shape, t.stride(), strict=True))
    return key, lo, lo + extent * es


class SimPool:
    """A sim device's bounded memory, in bytes: ``capacity`` (the bound), ``used`` (allocated now), ``peak`` (the
    most at once since :meth:`reset_peak`).

    Args:
        name: the device's name, for error messages.
        capacity: the bound.
        on_release: called with a storage's key when its bytes return to the pool.
    """

    def __init__(self, name: str, capacity: int, on_release: Callable[[int], None] | None = None):
        if capacity < 0:
            raise ValueError(f"a sim device's capacity must be >= 0 bytes, got {capacity}")
        self.name = name
        self.capacity = capacity
        self.used = 0
        self.peak = 0
        self._on_release = on_release
        self._live: dict[int, int] = {}  # storage key -> bytes

    def allocate(self, shape: Sequence[int], dtype: torch.dtype) -> Tensor:
        """An uninitialised CPU tensor of ``shape``, its bytes counted.

        Raises:
            DeviceOutOfMemory: the pool cannot hold it (nothing is allocated then).
        """
        nbytes = int(torch.Size(tuple(shape)).numel()) * torch.empty((), dtype=dtype).element_size()
        with LOCK:
            self._check(nbytes)
            with internal():
                t = torch.empty(tuple(shape), dtype=dtype)
            self._register(t, nbytes)
        return t

    def add(self, t: Tensor) -> bool:
        """Count ``t``'s whole storage; False (and nothing counted) if it is counted already.

        Raises:
            DeviceOutOfMemory: the pool cannot hold it.
        """
        key = storage_key(t)
        assert key is not None
        with LOCK:
            if key in self._live:
                return False
            nbytes = t.untyped_storage().nbytes()
            self._check(nbytes)
            self._register(t, nbytes)
        return True

    def holds(self, t: Tensor) -> bool:
        """Whether ``t``'s storage is counted here."""
        key = storage_key(t)
        with LOCK:
            return key is not None and key in self._live

    def reset_peak(self) -> None:
        """Start a new peak window: the peak becomes what is in use now."""
        with LOCK:
            self.peak = self.used

    def resize(self, capacity: int) -> None:
        """Change the bound to ``capacity`` bytes (e.g. to the run's memory budget).

        Raises:
            DeviceOutOfMemory: more than ``capacity`` bytes are in use already.
        """
        with LOCK:
            if capacity < self.used:
                raise DeviceOutOfMemory(oom_message(self.name, 0, self.used, capacity))
            self.capacity = capacity

    def _check(self, nbytes: int) -> None:
        if self.used + nbytes > self.capacity:
            raise DeviceOutOfMemory(oom_message(self.name, nbytes, self.used, self.capacity))

    def _register(self, t: Tensor, nbytes: int) -> None:
        storage = t.untyped_storage()
        key = int(storage._cdata)
        self._live[key] = nbytes
        self.used += nbytes
        self.peak = max(self.peak, self.used)
        fin = weakref.finalize(storage, self._release, key)
        fin.atexit = False

    def _release(self, key: int) -> None:
        with LOCK:
            nbytes = self._live.pop(key, None)
            if nbytes is not None:
                self.used -= nbytes
                if self._on_release is not None:
                    self._on_release(key)
