"""The runtime's two errors: a device out of memory (user-fixable: a budget, a batch size) and a stream-ordering
mistake (a bug in the code that issued the work, caught by the sim device)."""

from __future__ import annotations

from gnnscale.errors import ConfigError
from gnnscale.units import format_bytes

__all__ = ["DeviceOutOfMemory", "StreamOrderError", "oom_message"]


class DeviceOutOfMemory(ConfigError):
    """An allocation did not fit on a device: the sim device's bounded pool, or a real accelerator's memory
    (``torch.OutOfMemoryError`` raised by an allocation the runtime makes is re-raised as this). The message has
    one shape for both (:func:`oom_message`), so tests on the sim device see what a GPU run would print."""


class StreamOrderError(RuntimeError):
    """Work on one stream touches memory that another stream may still be reading or writing, and the first
    stream never waited for the second (``wait_stream``, an event, or a synchronisation). Raised by the sim device
    at the moment the work is issued; on a GPU the same code is a data race. Not bad input: a bug."""


def oom_message(device: str, request: int, in_use: int, capacity: int) -> str:
    """The one line every device-out-of-memory error carries.

    Args:
        device: the device's name (``"sim:0"``, ``"cuda:1"``).
        request: bytes the failed allocation asked for.
        in_use: bytes allocated on the device before it.
        capacity: the device's total bytes (the sim pool's size, or the accelerator's memory).
    """
    return (f"out of memory on {device}: cannot allocate {format_bytes(request)} with {format_bytes(in_use)} of "
            f"{format_bytes(capacity)} in use; lower the memory budget (--gpu-memory), the batch or the chunk size")
