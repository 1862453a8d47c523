"""A fake accelerator of a type other than CUDA, for tests of :mod:`gnnscale.runtime` without a device.

:class:`FakeAccelerator` stands in for what :mod:`gnnscale.runtime.backend` asks torch: the device-generic API
(torch's ``accelerator`` module, ``Stream``, ``Event``), or, with ``generic=False``, the device type's own
module (``torch.xpu``, as torch < 2.6 has it). Its streams and events only log what is done to them
(:attr:`FakeAccelerator.log`) and its memory statistics are counters a test sets (:meth:`FakeAccelerator.allocate`):
nothing runs anywhere, so the runtime's selection, stream, event and memory calls can be checked for a backend type
that is not ``cuda``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from gnnscale.runtime import backend as rt_backend

__all__ = ["FakeAccelerator", "FakeEvent", "FakeStream"]


class FakeStream:
    """A stream of the fake accelerator: ``device`` and the logged calls a ``torch.Stream`` answers."""

    def __init__(self, fake: FakeAccelerator, device: torch.device, name: str):
        self.fake, self.device, self.name = fake, device, name

    def __repr__(self) -> str:
        return f"<FakeStream {self.name}>"

    def wait_event(self, event: FakeEvent) -> None:
        self.fake.log.append(("wait_event", self.name, event.recorded_on))

    def wait_stream(self, other: FakeStream) -> None:
        self.fake.log.append(("wait_stream", self.name, other.name))

    def synchronize(self) -> None:
        self.fake.log.append(("synchronize", self.name))

    def query(self) -> bool:
        return True


class FakeEvent:
    """An event of the fake accelerator: remembers the stream (and device) it was last recorded on."""

    def __init__(self, fake: FakeAccelerator, device: torch.device | None = None):
        self.fake, self.device = fake, device
        self.recorded_on: str | None = None

    def record(self, stream: FakeStream | None = None) -> None:
        target = stream if stream is not None else self.fake.current_stream(self.device)
        self.recorded_on, self.device = target.name, target.device  # as torch's events: on the stream's device
        self.fake.log.append(("record", target.name))

    def synchronize(self) -> None:
        self.fake.log.append(("synchronize", f"event@{self.recorded_on}"))

    def query(self) -> bool:
        return True


class FakeAccelerator:
    """``count`` devices of type ``kind`` (any ``torch.device`` type but ``cuda`` and ``cpu``; ``xpu`` by default).

    :meth:`install` makes the runtime use it: as torch's ``accelerator`` module with its ``Stream``/``Event``
    (``generic=True``, torch >= 2.6's path), or as ``torch.<kind>`` with the generic API absent (torch 2.4's path).
    Per-thread state is not modelled: one current device and one current stream per device.

    Attributes:
        log: every stream and event call, in order: ``("record", stream)``, ``("wait_event", stream, recorded
            on)``, ``("wait_stream", stream, other)``, ``("synchronize", what)``, ``("set_stream", stream)``.
        allocated / peak / total: the memory statistics the fake reports, in bytes (:meth:`allocate` moves them).
    """

    def __init__(self, count: int = 2, kind: str = "xpu", total: int = 16 << 30):
        if kind in ("cuda", "cpu"):
            raise ValueError(f"a fake accelerator is of a type other than cuda and cpu, got {kind!r}")
        self.kind, self.count, self.total = kind, count, total
        self.index = 0
        self.log: list[tuple[str | None, ...]] = []
        self.allocated = self.peak = 0
        self._streams: dict[int, FakeStream] = {}
        self._made = 0

    # --- what a test does
    def install(self, monkeypatch: pytest.MonkeyPatch, *, generic: bool = True) -> FakeAccelerator:
        """Patch :mod:`gnnscale.runtime.backend` (the one module that asks torch) to ask this fake; undone with
        ``monkeypatch``."""
        monkeypatch.setattr(rt_backend, "_ACC", self if generic else None)
        monkeypatch.setattr(rt_backend, "_STREAM", self._new_stream if generic else None)
        monkeypatch.setattr(rt_backend, "_EVENT", self._new_event if generic else None)
        monkeypatch.setattr(rt_backend, "_GENERIC_STREAMS", generic)
        real = rt_backend._module
        monkeypatch.setattr(rt_backend, "_module", lambda d: self if d.type == self.kind else real(d))
        if not generic:  # torch 2.4: no generic module, so the type comes from the CUDA build flag
            monkeypatch.setattr(rt_backend, "accelerator_type", lambda: self.kind)
        return self

    def allocate(self, nbytes: int) -> None:
        """Count ``nbytes`` more (negative: fewer) as allocated by the fake's allocator."""
        self.allocated += nbytes
        self.peak = max(self.peak, self.allocated)

    # --- torch's device-generic accelerator module
    def current_accelerator(self) -> torch.device:
        return torch.device(self.kind)

    def is_available(self) -> bool:
        return self.count > 0

    def device_count(self) -> int:
        return self.count

    def current_device_index(self) -> int:
        return self.index

    def set_device_index(self, index: int) -> None:
        self.index = index

    def _index(self, device: Any) -> int:
        d = torch.device(device) if device is not None else torch.device(self.kind, self.index)
        return self.index if d.index is None else int(d.index)

    def current_stream(self, device: Any = None) -> FakeStream:
        i = self._index(device)
        if i not in self._streams:
            self._streams[i] = FakeStream(self, torch.device(self.kind, i), f"{self.kind}:{i}/default")
        return self._streams[i]

    def set_stream(self, stream: FakeStream) -> None:
        self.index = self._index(stream.device)
        self._streams[self.index] = stream
        self.log.append(("set_stream", stream.name))

    def synchronize(self, device: Any = None) -> None:
        self.log.append(("synchronize", f"{self.kind}:{self._index(device)}"))

    @contextmanager
    def device_index(self, index: int) -> Iterator[None]:
        prev, self.index = self.index, index
        try:
            yield
        finally:
            self.index = prev

    def get_memory_info(self, device: Any = None) -> tuple[int, int]:
        return self.total - self.allocated, self.total

    def memory_allocated(self, device: Any = None) -> int:
        return self.allocated

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        self.peak = self.allocated

    def max_memory_allocated(self, device: Any = None) -> int:
        return self.peak

    def _new_stream(self, device: Any = None) -> FakeStream:
        self._made += 1
        return FakeStream(self, torch.device(self.kind, self._index(device)), f"{self.kind}:{self._index(device)}/"
                          f"stream{self._made}")

    def _new_event(self, device: Any = None) -> FakeEvent:
        return FakeEvent(self, None if device is None else torch.device(device))

    # --- torch.<kind>, the device module (torch < 2.6)
    def Stream(self, device: Any = None) -> FakeStream:  # noqa: N802 (torch's name)
        return self._new_stream(device)

    def Event(self) -> FakeEvent:  # noqa: N802 (torch's name)
        return FakeEvent(self)

    @contextmanager
    def stream(self, stream: FakeStream) -> Iterator[None]:
        prev_index, prev = self.index, self.current_stream(stream.device)
        self.set_stream(stream)
        try:
            yield
        finally:
            self.set_stream(prev)
            self.index = prev_index

    def current_device(self) -> int:
        return self.index

    def device(self, device: Any) -> Any:
        return self.device_index(self._index(device))

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        return self.get_memory_info(device)

    def get_device_name(self, device: Any = None) -> str:
        return f"Fake {self.kind.upper()} accelerator {self._index(device)}"

    def can_device_access_peer(self, a: Any, b: Any) -> bool:
        return self._index(a) != self._index(b)
