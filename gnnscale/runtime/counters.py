"""Per-device counts of the synchronisations the runtime performs: a test's eyes on what an epoch waits for.

Two kinds, counted for every device (CPU and the sim device included, so a CPU test sees what a GPU run does):

* **syncs**: the host blocks until device work is done (``synchronize`` of a device, stream or event, a blocking
  device-to-host copy, a scalar read such as :func:`gnnscale.runtime.item`);
* **waits**: one stream is made to wait for another on the device (``wait_stream``, waiting on an event); the host
  does not block.

Devices are keyed by their name (``"cpu"``, ``"cuda:0"``, ``"sim:1"``).
"""

from __future__ import annotations

import threading
from collections import Counter

__all__ = ["count_sync", "count_wait", "reset", "syncs", "waits"]

_LOCK = threading.Lock()
_SYNCS: Counter[str] = Counter()
_WAITS: Counter[str] = Counter()


def count_sync(device: str) -> None:
    """Count one host-blocking synchronisation on ``device``."""
    with _LOCK:
        _SYNCS[device] += 1


def count_wait(device: str) -> None:
    """Count one stream-side wait on ``device`` (the waiting stream's device)."""
    with _LOCK:
        _WAITS[device] += 1


def syncs(device: str) -> int:
    """Host-blocking synchronisations counted on ``device`` since the last :func:`reset`."""
    with _LOCK:
        return _SYNCS[device]


def waits(device: str) -> int:
    """Stream-side waits counted on ``device`` since the last :func:`reset`."""
    with _LOCK:
        return _WAITS[device]


def reset(device: str | None = None) -> None:
    """Zero the counts of ``device`` (of every device when None)."""
    with _LOCK:
        for c in (_SYNCS, _WAITS):
            if device is None:
                c.clear()
            else:
                c.pop(device, None)
