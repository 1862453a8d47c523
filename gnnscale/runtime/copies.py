"""Memory on a device and copies between host and device: one call for CPU, a real accelerator and the sim device.

On a sim device every allocation made here counts against its pool, and an asynchronous copy's destination holds
the poison until the copy's stream is waited on (:mod:`gnnscale.runtime.simdevice`). On a real accelerator an
out-of-memory error of an allocation made here is re-raised as
:class:`~gnnscale.runtime.errors.DeviceOutOfMemory`, in the same one-line shape. Sizes are bytes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext

import torch
from torch import Tensor

from gnnscale.runtime import backend, clocks
from gnnscale.runtime.device import Device, device_key, device_of
from gnnscale.runtime.errors import DeviceOutOfMemory, oom_message
from gnnscale.runtime.pool import LOCK, internal
from gnnscale.runtime.simdevice import SimDevice, SimStream, issue_copy, owner
from gnnscale.runtime.streams import Stream, current_stream, synchronize, use_stream


@contextmanager
def _oom(device: torch.device, nbytes: int) -> Iterator[None]:
    """Re-raise an accelerator's out-of-memory error as DeviceOutOfMemory, in the sim pool's message shape."""
    try:
        yield
    except backend.OOM_ERRORS as exc:
        free, total = backend.mem_get_info(device)
        raise DeviceOutOfMemory(oom_message(device_key(device), nbytes, total - free, total)) from exc


def empty(shape: Sequence[int], *, dtype: torch.dtype = torch.float32, device: Device) -> Tensor:
    """An uninitialised tensor on ``device`` (on a sim device, counted against its pool).

    Raises:
        DeviceOutOfMemory: it does not fit.
    """
    if isinstance(device, SimDevice):
        return device.empty(shape, dtype)
    nbytes = int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
    with _oom(device, nbytes) if device.type != "cpu" else nullcontext():
        return torch.empty(tuple(shape), dtype=dtype, device=device)


def zeros(shape: Sequence[int], *, dtype: torch.dtype = torch.float32, device: Device) -> Tensor:
    """A zero-filled tensor on ``device`` (see :func:`empty`)."""
    t = empty(shape, dtype=dtype, device=device)
    with internal():
        return t.zero_()


def adopt(t: Tensor, device: Device) -> Tensor:
    """Count a tensor computed on the host as allocated on sim ``device`` (its storage, once) and return it; the
    identity on other devices.

    Raises:
        DeviceOutOfMemory: it does not fit in the sim pool.
    """
    return device.adopt(t) if isinstance(device, SimDevice) else t


def copy_async(dst: Tensor, src: Tensor, stream: Stream | None = None) -> Tensor:
    """``dst.copy_(src)`` issued on ``stream`` (default: the current stream of the accelerator side) without
    blocking the host; returns ``dst``. Read ``dst`` only after waiting for the stream (an event, ``wait_stream``,
    or ``synchronize`` on the host for a device-to-host copy). Host memory should be pinned on a real accelerator.

    On a sim device ``dst`` holds the poison until then (a copy on the default stream into device memory is done
    at once: later work on that stream is ordered after it); a copy racing with another stream's use of either
    buffer raises :class:`~gnnscale.runtime.errors.StreamOrderError`.
    """
    dsim, ssim = owner(dst), owner(src)
    if dsim is None and ssim is None:
        if isinstance(stream, SimStream):
            raise ValueError(f"{stream} copies to or from its device's memory only")
        if dst.device.type == "cpu" and src.device.type == "cpu":
            return dst.copy_(src)
        with use_stream(stream):
            return dst.copy_(src, non_blocking=True)
    for t in (dst, src):
        if owner(t) is None and t.device.type != "cpu":
            raise ValueError(f"cannot copy between a sim device and {t.device}")
    home = dsim if dsim is not None else ssim
    assert home is not None
    s = stream if stream is not None else home.current_stream()
    if not isinstance(s, SimStream) or s.device not in (dsim, ssim):
        raise ValueError(f"a copy from {device_of(src)} to {device_of(dst)} cannot run on {s}")
    issue_copy(s, dst, src, to_host=dsim is None)
    return dst


def to_device(src: Tensor, device: Device, *, stream: Stream | None = None) -> Tensor:
    """``src`` on ``device``, copied asynchronously on ``stream`` (see :func:`copy_async`); ``src`` itself when it
    is there already. To the CPU this is :func:`to_host`.

    Raises:
        DeviceOutOfMemory: the copy does not fit on ``device``.
    """
    if isinstance(device, SimDevice):
        if device.owns(src):
            return src
        return copy_async(device.empty(src.shape, src.dtype), src, stream)
    if device.type == "cpu":
        return to_host(src, stream=stream)
    if owner(src) is not None:
        raise ValueError(f"cannot copy a tensor on {device_of(src)} to {device}; bring it to the host first")
    with use_stream(stream), _oom(device, src.numel() * src.element_size()):
        return src.to(device, non_blocking=True)


def to_host(src: Tensor, *, stream: Stream | None = None, out: Tensor | None = None,
            blocking: bool = False) -> Tensor:
    """``src`` in host memory: copied into ``out`` (default: a new tensor, pinned when the source is on a real
    accelerator) on ``stream``, asynchronously unless ``blocking`` (which synchronises that stream, counted).
    A host ``src`` is returned as it is (or copied into ``out``)."""
    sim = owner(src)
    if sim is None and src.device.type == "cpu":
        return src if out is None else out.copy_(src)
    if out is None:
        with internal():  # host memory, even inside a sim device's scope (which would count a factory's result)
            out = torch.empty(src.shape, dtype=src.dtype, pin_memory=sim is None)
    copy_async(out, src, stream)
    if blocking:
        synchronize(stream if stream is not None else current_stream(device_of(src)))
    return out


def record_stream(t: Tensor, stream: Stream | None) -> None:
    """Tell the runtime ``t`` is used on ``stream`` (made on another stream and read here). Real accelerator: the
    caching allocator keeps its memory until that use is done. Sim: marks the read, so a later copy into ``t``
    on a stream that did not wait for ``stream`` since raises; raises now if ``stream`` never waited for the
    copy that wrote ``t``; and freeing ``t`` leaves its stream no debt for ``stream``'s use (without it, the
    stream ``t`` was allocated on raises at its next allocation unless it waited for ``stream``). A no-op for
    None (and for host tensors on a real accelerator)."""
    if stream is None:
        return
    if isinstance(stream, SimStream):
        with LOCK:
            clocks.catch_up(stream)
            clocks.check(stream, t, False, "a use (record_stream)")
            clocks.mark(stream, t, False)
            clocks.recorded(stream, t)
        return
    if t.device.type != "cpu":
        t.record_stream(stream)
