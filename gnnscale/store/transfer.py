"""How the store moves data between host memory and its devices, through :mod:`gnnscale.runtime` only.

A store device is a :data:`~gnnscale.runtime.Device`: a ``torch.device`` (the CPU, a GPU) or a sim device
(:class:`~gnnscale.runtime.SimDevice`, whose tensors live in host memory and whose copies read as the poison until
waited for). Every read runs on the *reader's stream*, the current stream of the reading device when the read is
made (``rt.current_stream``; ``None`` on the CPU): what a read returns is ready for that stream, and a consumer on
another stream waits on an event recorded there after the read.

* :func:`place`: a tensor on a device (an asynchronous copy on the device's current stream; a blocking one to the
  host).
* :func:`host_values`: a small device tensor's values on the host, one counted sync.
* :class:`PeerLink`: one reader's requests to one holder device (XGNN's remote reads): the request goes over on the
  reader's stream, the holder answers on a stream of its own, the answer comes back on that stream, and each side
  waits for the other where it must (two stream waits per request, no host sync).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from gnnscale import runtime as rt

__all__ = ["PeerLink", "as_device", "host_values", "place"]

Run = tuple[Callable[[Tensor, Tensor], None], int]
"""``(read, count)``: ``read(positions, out)`` writes the ``[count, width]`` answer rows for ``count`` positions
into ``out`` (on the holder, on the holder's current stream)."""


def as_device(device: rt.Device | str) -> rt.Device:
    """A device given as a ``torch.device``, a sim device, or a spec string (``"cpu"``, ``"cuda:0"``)."""
    return torch.device(device) if isinstance(device, str) else device


def place(t: Tensor, device: rt.Device) -> Tensor:
    """``t`` on ``device`` (``t`` itself when it is there): to an accelerator an asynchronous copy on its current
    stream (ready for that stream), to the host a blocking one (one counted sync, when ``t`` is on an accelerator).

    Raises:
        DeviceOutOfMemory: the copy does not fit on ``device``.
    """
    if rt.is_accelerator(device):
        return rt.to_device(t, device)
    if rt.is_accelerator(rt.device_of(t)):
        return rt.to_host(t, blocking=True)
    return t if t.device == device else t.to(rt.torch_device(device))


def host_values(t: Tensor, device: rt.Device) -> list[Any]:
    """``t.tolist()`` for a tensor computed on ``device``: the host first waits for the device's current stream.
    One counted sync, on the CPU too (a CPU run shows the syncs an accelerator run makes); a sim device checks the
    host read came after it (:func:`gnnscale.runtime.host_list`)."""
    rt.synchronize(rt.current_stream(device) if rt.is_accelerator(device) else device)
    return rt.host_list(t, device)


class PeerLink:
    """One reader device's requests to one holder device (XGNN §4.3's remote reads).

    For a holder that is the reader's own device (or the same ``torch.device``, as CPU test devices are) a request
    is read in place. Otherwise, per request (:meth:`ask`), with ``S`` the reader's stream and ``V`` this link's
    stream on the holder:

    1. the positions are copied to the holder on ``S`` (a real cross-device copy runs on the source device's
       stream);
    2. ``V`` waits for ``S`` (the request has landed), then the holder reads the answer rows on ``V`` into a buffer
       of its own;
    3. the answer is copied back on ``V`` into a new buffer on the reader;
    4. ``S`` waits for ``V`` (the answer has landed): the rows are ready for the reader's stream.

    Two stream waits per request (one counted on each device), no host sync. The buffers are made on the stream
    that uses them, so the caching allocator of a real GPU reuses them only after that stream is done.

    Args:
        reader: the reading device.
        holder: the device holding the rows.
    """

    def __init__(self, reader: rt.Device, holder: rt.Device):
        self.reader, self.holder = reader, holder
        self.local = holder == reader
        """Whether requests are read in place (no copy, no stream of its own)."""
        self.stream = None if self.local else rt.new_stream(holder)
        """The holder's stream that answers this reader (``None``: read in place, or the CPU)."""

    def ask(self, idx: Tensor, runs: Sequence[Run], width: int, dtype: torch.dtype) -> Tensor:
        """``[len(idx), width]`` rows of ``dtype`` answering positions ``idx`` (on the reader's device, computed on
        its stream), ready on the reader's stream: ``runs`` answer consecutive slices of ``idx`` in turn."""
        n = idx.numel()
        if self.local:
            out = rt.empty((n, width), dtype=dtype, device=self.reader)
            _answer(idx, runs, out)
            return out
        reader_stream = rt.current_stream(self.reader)
        idx = rt.adopt(idx, self.reader)  # computed on the reader's device (a sim device counts it there)
        ans = rt.empty((n, width), dtype=dtype, device=self.reader)  # made on the reader's stream, which reads it
        with rt.use_stream(self.stream):
            at = rt.empty((n,), dtype=idx.dtype, device=self.holder)
            rt.copy_async(at, idx, reader_stream)  # the request, on the reader's stream
            rt.wait_stream(self.stream, reader_stream)  # the holder reads it after it has landed
            rows = rt.empty((n, width), dtype=dtype, device=self.holder)
            _answer(at, runs, rows)
            rt.copy_async(ans, rows, self.stream)  # the answer, on the holder's stream
        rt.wait_stream(reader_stream, self.stream)  # the reader uses it after it has landed
        return ans


def _answer(at: Tensor, runs: Sequence[Run], out: Tensor) -> None:
    lo = 0
    for read, c in runs:
        read(at[lo : lo + c], out[lo : lo + c])
        lo += c
