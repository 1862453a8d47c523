"""The sim device, its streams and events, and its deferred copies.

A :class:`SimDevice` has a bounded memory pool (:mod:`gnnscale.runtime.pool`), a default stream, the streams made
for it, and per thread a current stream. Which CPU tensors are on it is known by their storage (:func:`owner`).

Copies. An asynchronous copy is checked against the other streams' marks (:mod:`gnnscale.runtime.clocks`), marks
what it reads and writes, fills its destination with a poison (:func:`poison`), and is queued on its stream. It is
performed when somebody is ordered after it: a stream waiting on its stream, or on an event recorded after it,
completes the copies into *device* memory; only a host synchronisation completes a copy into *host* memory (the
host reads that memory, and a stream-side wait does not block the host). Completing a copy first completes the
earlier pending copies that write the bytes it reads or writes. Each copy is performed exactly once, reading its
source as it is then (the latest a GPU could). A copy on the default stream into device memory is performed at
once: the host's later work on that stream is ordered after it. A copy between two sim devices is first ordered
after the other device's current stream (:func:`_peer_barrier`), as CUDA does. Nothing runs on a thread; nothing
depends on time.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from gnnscale.runtime import clocks, counters
from gnnscale.runtime.clocks import Clock
from gnnscale.runtime.pool import LOCK, SimPool, internal, span, storage_key
from gnnscale.units import format_bytes

__all__ = ["SimDevice", "SimEvent", "SimStream", "issue_copy", "owner", "poison"]

_TICKETS = itertools.count(1)
_OWNERS: dict[int, SimDevice] = {}  # storage key -> the sim device holding it
_BUSY: weakref.WeakSet[SimStream] = weakref.WeakSet()  # streams with pending copies


class SimDevice:
    """One sim device: a memory pool of ``capacity`` bytes, a default stream, per-thread current streams.

    ``type`` is ``"sim"`` and ``str(device)`` is ``"sim:N"``; its tensors are CPU tensors its pool counts.
    ``copies_issued`` / ``copies_completed`` count the asynchronous copies run on its streams.
    """

    type = "sim"

    def __init__(self, index: int = 0, capacity: int = 1 << 30):
        self.index = index
        self.pool = SimPool(str(self), capacity, self._released)
        self.default_stream = SimStream(self, "default")
        self.streams: list[SimStream] = [self.default_stream]
        self.copies_issued = 0
        self.copies_completed = 0
        self._local = threading.local()

    def __str__(self) -> str:
        return f"sim:{self.index}"

    def __repr__(self) -> str:
        return f"SimDevice('{self}', capacity={format_bytes(self.pool.capacity)})"

    @property
    def capacity(self) -> int:
        """The pool's bound in bytes."""
        return self.pool.capacity

    def new_stream(self) -> SimStream:
        """A new stream on this device."""
        with LOCK:
            s = SimStream(self, f"stream{len(self.streams)}")
            self.streams.append(s)
        return s

    def current_stream(self) -> SimStream:
        """The calling thread's current stream here (the default stream outside ``use_stream``)."""
        stack: list[SimStream] = getattr(self._local, "stack", [])
        return stack[-1] if stack else self.default_stream

    @contextmanager
    def current(self, stream: SimStream) -> Iterator[None]:
        """Make ``stream`` (one of this device's) the calling thread's current stream inside the block."""
        if stream.device is not self:
            raise ValueError(f"{stream} is not a stream of {self}")
        stack = self._local.__dict__.setdefault("stack", [])
        stack.append(stream)
        try:
            yield
        finally:
            stack.pop()

    def empty(self, shape: Sequence[int], dtype: torch.dtype = torch.float32) -> Tensor:
        """An uninitialised tensor on this device, counted against the pool, allocated on the calling thread's
        current stream (:func:`gnnscale.runtime.clocks.allocated`).

        Raises:
            DeviceOutOfMemory: it does not fit.
            StreamOrderError: that stream could get bytes freed while another stream may still use them.
        """
        with LOCK:
            x = self.current_stream()
            clocks.catch_up(x)
            clocks.check_reuse(x, "an allocation")
            t = self.pool.allocate(shape, dtype)
            _OWNERS[int(t.untyped_storage()._cdata)] = self
            clocks.allocated(x, t)
        return t

    def adopt(self, t: Tensor) -> Tensor:
        """Count a CPU tensor's storage (once) as allocated on this device; return ``t``.

        Raises:
            ValueError: ``t`` is not a strided CPU tensor, or is on another sim device.
            DeviceOutOfMemory: it does not fit.
            StreamOrderError: see :meth:`empty`.
        """
        key = storage_key(t)
        if key is None or t.device.type != "cpu":
            raise ValueError(f"a sim device holds strided CPU tensors, got a {t.layout} tensor on {t.device}")
        with LOCK:
            held = _OWNERS.get(key)
            if held is not None and held is not self:
                raise ValueError(f"the tensor is on {held}, not {self}; copy it (to_device)")
            if held is None:
                x = self.current_stream()
                clocks.catch_up(x)
                clocks.check_reuse(x, "an allocation")
                self.pool.add(t)
                _OWNERS[key] = self
                clocks.allocated(x, t)
        return t

    def owns(self, t: Tensor) -> bool:
        """Whether ``t`` is on this device."""
        return owner(t) is self

    def synchronize(self) -> None:
        """Block the host until every stream's work is done (counted as a sync): completes every pending copy."""
        with LOCK:
            counters.count_sync(str(self))
            for s in self.streams:
                host_wait(s.vector())

    def _released(self, key: int) -> None:
        _OWNERS.pop(key, None)


def owner(t: Tensor) -> SimDevice | None:
    """The sim device ``t`` is on, or None for a tensor that is where ``t.device`` says."""
    key = storage_key(t)
    if key is None:
        return None
    with LOCK:
        return _OWNERS.get(key)


class SimStream(Clock):
    """An in-order queue of a sim device's work. Mirrors ``torch.Stream``'s methods (``wait_stream``,
    ``wait_event``, ``record_event``, ``synchronize``, ``query``); the runtime counts them like its functions."""

    def __init__(self, device: SimDevice, name: str):
        super().__init__(f"{device}/{name}")
        self.device = device
        self.pending: deque[_Copy] = deque()
        """Copies issued here and not performed yet, in issue order."""

    def __repr__(self) -> str:
        return f"<SimStream {self.name}>"

    @property
    def is_default(self) -> bool:
        """Whether this is its device's default stream."""
        return self is self.device.default_stream

    def wait_stream(self, other: SimStream) -> None:
        """Order this stream's later work after all work issued on ``other`` so far (device side)."""
        if other is not self:
            wait_on(self, other.record_event())

    def wait_event(self, event: SimEvent) -> None:
        """Order this stream's later work after the work ``event`` captured (device side)."""
        wait_on(self, event)

    def record_event(self, event: SimEvent | None = None) -> SimEvent:
        """Record ``event`` (a new one by default) here and return it."""
        event = event if event is not None else SimEvent()
        event.record(self)
        return event

    def synchronize(self) -> None:
        """Block the host until this stream's work so far is done (counted as a sync)."""
        with LOCK:
            counters.count_sync(str(self.device))
            host_wait(self.vector())

    def query(self) -> bool:
        """Whether every copy issued here is done. Never performs one: a sim stream does nothing by itself."""
        with LOCK:
            return not self.pending


class SimEvent:
    """A point in a sim stream's work. Mirrors ``torch.Event``'s ``record``/``wait``/``synchronize``/``query``."""

    def __init__(self) -> None:
        self.stream: SimStream | None = None
        self.vector: dict[Clock, int] = {}
        """The work captured: stream -> count (its own stream's, and what that stream had waited for)."""

    def record(self, stream: SimStream) -> None:
        """Capture the work issued on ``stream`` so far (a later record replaces it)."""
        with LOCK:
            self.stream = stream
            self.vector = stream.vector()

    def wait(self, stream: SimStream) -> None:
        """Make ``stream`` wait for the captured work (device side)."""
        wait_on(stream, self)

    def synchronize(self) -> None:
        """Block the host until the captured work is done (counted as a sync); nothing for an unrecorded event."""
        with LOCK:
            if self.stream is not None:
                counters.count_sync(str(self.stream.device))
                host_wait(self.vector)

    def query(self) -> bool:
        """Whether the captured copies are done (never performs one)."""
        with LOCK:
            return not any(c.seq <= n for s, n in self.vector.items() if isinstance(s, SimStream) for c in s.pending)


@dataclass(eq=False)
class _Copy:
    ticket: int  # global issue order
    stream: SimStream
    seq: int
    dst: Tensor
    src: Tensor
    to_host: bool  # the destination is host memory: only a host synchronisation completes it


def poison(dtype: torch.dtype) -> float | int | bool:
    """What a pending copy's destination holds: NaN for floating and complex dtypes, the most negative value for
    signed integers (an index that fails loudly), the largest for unsigned ones, True for bool."""
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    if dtype == torch.bool:
        return True
    info = torch.iinfo(dtype)
    return info.min if info.min < 0 else info.max


def _hits(a: Tensor, b: Tensor) -> bool:
    sa, sb = span(a), span(b)
    return sa is not None and sb is not None and sa[0] == sb[0] and sa[1] < sb[2] and sb[1] < sa[2]


def issue_copy(stream: SimStream, dst: Tensor, src: Tensor, *, to_host: bool) -> None:
    """Issue ``dst.copy_(src)`` on ``stream``: checked, marked, then performed now (the default stream, into
    device memory) or poisoned and queued.

    Raises:
        StreamOrderError: the copy races with another stream's use of ``src`` or ``dst``.
        ValueError: ``src`` cannot be copied into ``dst`` (shapes).
    """
    try:
        ok = torch.broadcast_shapes(dst.shape, src.shape) == dst.shape
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(f"cannot copy a {tuple(src.shape)} tensor into a {tuple(dst.shape)} one")
    with LOCK:
        clocks.catch_up(stream)
        _peer_barrier(stream, dst, src)
        clocks.check(stream, src, False, "a copy")
        clocks.check(stream, dst, True, "a copy")
        clocks.mark(stream, src, False)
        clocks.mark(stream, dst, True)
        copy = _Copy(next(_TICKETS), stream, stream.seq, dst, src, to_host)
        stream.device.copies_issued += 1
        if stream.is_default and not to_host:
            _perform(copy)
            return
        with internal():
            dst.fill_(poison(dst.dtype))
        stream.pending.append(copy)
        _BUSY.add(stream)


def _peer_barrier(stream: SimStream, dst: Tensor, src: Tensor) -> None:
    """A copy between two sim devices comes after the other device's current stream, as CUDA orders a copy between
    devices after both devices' current streams (a barrier it inserts, not counted as a wait)."""
    for t in (src, dst):
        other = owner(t)
        if other is not None and other is not stream.device:
            vec = other.current_stream().vector()
            clocks.merge(stream, vec)
            _complete(vec, to_host=False)


def _perform(c: _Copy) -> None:
    """Do copy ``c`` (already off its queue) now, after the earlier pending copies writing the bytes it reads or
    writes."""
    for s in list(_BUSY):
        for d in list(s.pending):
            if d.ticket < c.ticket and d in s.pending and (_hits(d.dst, c.src) or _hits(d.dst, c.dst)):
                _take(d)
                _perform(d)
    with internal():
        c.dst.copy_(c.src)
    c.stream.device.copies_completed += 1


def _take(c: _Copy) -> None:
    c.stream.pending.remove(c)
    if not c.stream.pending:
        _BUSY.discard(c.stream)


def _complete(vec: Mapping[Clock, int], to_host: bool) -> None:
    for s, upto in list(vec.items()):
        if isinstance(s, SimStream):
            for c in [c for c in s.pending if c.seq <= upto and (to_host or not c.to_host)]:
                if c in s.pending:  # an earlier one may have performed it as a dependency
                    _take(c)
                    _perform(c)


def complete_for(x: SimStream, t: Tensor) -> None:
    """An op on ``x`` is about to touch ``t``: perform ``x``'s pending copies into those bytes first (a stream
    runs its work in order)."""
    with LOCK:
        for c in [c for c in x.pending if _hits(c.dst, t)]:
            if c in x.pending:
                _take(c)
                _perform(c)


def wait_on(x: SimStream, event: SimEvent) -> None:
    """``x`` waits (device side) for the work ``event`` captured: counted as a wait on ``x``'s device; performs
    the captured copies into device memory. A never-recorded event is a no-op."""
    with LOCK:
        if event.stream is None:
            return
        counters.count_wait(str(x.device))
        clocks.merge(x, event.vector)
        _complete(event.vector, to_host=False)


def host_wait(vec: Mapping[Clock, int]) -> None:
    """The host has waited for the work in ``vec``: perform all of it (copies into host memory too) and remember
    it. The caller counts the sync."""
    with LOCK:
        _complete(vec, to_host=True)
        clocks.host_saw(vec)
