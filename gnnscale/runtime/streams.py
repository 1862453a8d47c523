"""Streams and events: one call for CPU, a real accelerator and the sim device alike.

A *stream* is a ``torch.Stream`` (real accelerator), a :class:`~gnnscale.runtime.simdevice.SimStream`, or None: the CPU
has no streams, and every function taking a stream treats None as "nothing to order" (``use_stream(None)`` is a
no-op), so engine code needs no ``if cuda`` branches.

Host-blocking synchronisations and stream-side waits made through these functions are counted per device, on the
CPU too (:func:`~gnnscale.runtime.device.sync_count`, :func:`~gnnscale.runtime.device.wait_count`): call them
rather than a ``torch.Stream``'s own methods.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any, TypeAlias

import torch
from torch import Tensor

from gnnscale.runtime import backend, clocks, counters
from gnnscale.runtime.device import Device, device_key, device_of
from gnnscale.runtime.pool import LOCK
from gnnscale.runtime.sim import scope
from gnnscale.runtime.simdevice import SimDevice, SimEvent, SimStream, wait_on

Stream: TypeAlias = "torch.Stream | SimStream"
Event: TypeAlias = "torch.Event | SimEvent"


def _device_of_stream(x: Stream | Event) -> Device:
    if isinstance(x, SimStream):
        return x.device
    if isinstance(x, SimEvent):
        return x.stream.device if x.stream is not None else torch.device("cpu")
    dev = getattr(x, "device", None)
    return torch.device(dev) if dev is not None else torch.device(backend.accelerator_type() or "cpu")


# ------------------------------------------------------------------------------------------ streams and events
def new_stream(device: Device) -> Stream | None:
    """A new stream on ``device`` (None on the CPU)."""
    if isinstance(device, SimDevice):
        return device.new_stream()
    return None if device.type == "cpu" else backend.new_stream(device)


def current_stream(device: Device) -> Stream | None:
    """The calling thread's current stream on ``device`` (None on the CPU)."""
    if isinstance(device, SimDevice):
        return device.current_stream()
    return None if device.type == "cpu" else backend.current_stream(device)


def use_stream(stream: Stream | None) -> AbstractContextManager[None]:
    """A context in which ``stream`` is the thread's current stream on its device (work issued without a stream
    goes there); a no-op for None. For a sim stream it is also a sim scope (see :mod:`gnnscale.runtime.sim`)."""
    if stream is None:
        return nullcontext()
    if isinstance(stream, SimStream):
        return scope(stream=stream)
    return backend.stream_context(stream)


def on_device(device: Device) -> AbstractContextManager[None]:
    """A context for a device's compute: the current accelerator device (real), a sim scope that checks ops
    against pending copies and counts the tensors they create against the pool (sim), nothing (CPU)."""
    if isinstance(device, SimDevice):
        return scope(device=device)
    return nullcontext() if device.type == "cpu" else backend.device_context(device)


def new_event(device: Device) -> Event | None:
    """A new unrecorded event for ``device`` (None on the CPU)."""
    if isinstance(device, SimDevice):
        return SimEvent()
    return None if device.type == "cpu" else backend.new_event(device)


def record_event(stream: Stream | None, event: Event | None = None) -> Event | None:
    """Record ``event`` (a new one by default) on ``stream`` and return it: it captures the work issued there so
    far. None for a None stream."""
    if stream is None:
        return None
    if isinstance(stream, SimStream):
        if event is not None and not isinstance(event, SimEvent):
            raise ValueError(f"a sim stream records sim events, got {type(event).__name__}")
        return stream.record_event(event)
    if isinstance(event, SimEvent):
        raise ValueError("a sim event is recorded on sim streams only")
    ev = event if event is not None else backend.new_event(stream.device)
    ev.record(stream)
    return ev


def wait_event(event: Event | None, stream: Stream | None) -> None:
    """Make ``stream`` wait (on the device, the host does not block) for the work ``event`` captured; counted as a
    wait on ``stream``'s device. A no-op when either is None."""
    if event is None or stream is None:
        return
    if isinstance(stream, SimStream) or isinstance(event, SimEvent):
        if not (isinstance(stream, SimStream) and isinstance(event, SimEvent)):
            raise ValueError("a sim stream waits on sim events only, and a sim event is waited on by sim streams")
        wait_on(stream, event)
        return
    stream.wait_event(event)
    counters.count_wait(device_key(stream.device))


def wait_stream(stream: Stream | None, other: Stream | None) -> None:
    """Make ``stream`` wait (device side) for all work issued on ``other`` so far; counted as a wait on
    ``stream``'s device. A no-op when either is None or both are the same stream."""
    if stream is None or other is None or stream is other:
        return
    if isinstance(stream, SimStream) or isinstance(other, SimStream):
        if not (isinstance(stream, SimStream) and isinstance(other, SimStream)):
            raise ValueError("a sim stream can wait for sim streams only")
        stream.wait_stream(other)
        return
    stream.wait_stream(other)
    counters.count_wait(device_key(stream.device))


def synchronize(target: Device | Stream | Event | None) -> None:
    """Block the host until ``target``'s work is done: a device (all its streams), a stream, or an event. Counted
    as one sync on its device, the CPU included (a CPU run shows the syncs a GPU run makes); None is a no-op."""
    if target is None:
        return
    if isinstance(target, (SimDevice, SimStream, SimEvent)):
        target.synchronize()
        return
    if isinstance(target, torch.device):
        if target.type != "cpu":
            backend.synchronize(target)
        counters.count_sync(device_key(target))
        return
    target.synchronize()
    counters.count_sync(device_key(_device_of_stream(target)))


def item(t: Tensor) -> int | float | bool:
    """``t.item()``, counted as a sync on ``t``'s device; on a sim device the host first waits for the current
    stream (as a GPU's scalar read does), so a copy pending on another stream still reads as the poison."""
    dev = device_of(t)
    if isinstance(dev, SimDevice):
        dev.current_stream().synchronize()
    else:
        counters.count_sync(device_key(dev))
    return t.item()


def host_list(t: Tensor, device: Device) -> list[Any]:
    """``t.tolist()`` for a tensor computed on ``device``, read by a host that has already waited for the work
    (:func:`synchronize`; not counted again). A real accelerator's ``tolist`` would wait for the current stream by
    itself, an uncounted sync; a sim device instead raises
    :class:`~gnnscale.runtime.errors.StreamOrderError` when the host has not waited for all the work issued on
    its current stream, or for a stream's write of ``t``'s bytes (a copy into host memory among them)."""
    if isinstance(device, SimDevice):
        with LOCK:
            clocks.check_host_read(device.current_stream(), t, "a host read")
    return list(t.tolist())
