"""Devices: resolving a spec, what a device is, memory statistics, names, and the sync counts.

A *device* is a ``torch.device`` (``cpu``, ``cuda:0``, ...) or a :class:`~gnnscale.runtime.simdevice.SimDevice`. Sizes
are bytes throughout.
"""

from __future__ import annotations

import os
import platform
import re
from typing import TypeAlias, TypeGuard

import torch
from torch import Tensor

from gnnscale.errors import ConfigError
from gnnscale.runtime import backend, counters, host
from gnnscale.runtime.pool import LOCK
from gnnscale.runtime.sim import sim_count, sim_device
from gnnscale.runtime.simdevice import SimDevice, owner
from gnnscale.units import format_bytes

DEVICE_ENV = "GNNSCALE_DEVICE"
"""What ``auto`` resolves to when set (any spec :func:`resolve_device` takes): ``GNNSCALE_DEVICE=sim`` runs a whole
test suite on the sim device."""

Device: TypeAlias = "torch.device | SimDevice"

_ACCELERATOR_TYPES = ("cuda", "xpu", "mps", "hpu", "mtia")


# ------------------------------------------------------------------------------------------------------ devices
def _choices() -> str:
    acc = backend.accelerator_type() or "cuda"
    return f"auto, cpu, sim, sim:N, {acc} or {acc}:N"


def _check_accelerator(dev: torch.device, spec: str) -> None:
    acc = backend.accelerator_type()
    if dev.type not in _ACCELERATOR_TYPES and dev.type != acc:
        raise ConfigError(f"unsupported device {spec!r}; use {_choices()}")
    if dev.type != acc or not backend.is_available():
        raise ConfigError(f"--device {spec} requested but no {dev.type.upper()} device is available")
    count = backend.device_count()
    if dev.index is not None and dev.index >= count:
        raise ConfigError(f"--device {spec}: only {count} {dev.type.upper()} device(s) present")


def resolve_device(spec: str | torch.device | SimDevice = "auto") -> Device:
    """The device a spec names, checked against what is present.

    ``auto``: ``$GNNSCALE_DEVICE`` when set, else the accelerator when one is available, else the CPU. ``cpu``;
    ``sim`` / ``sim:N`` (:func:`~gnnscale.runtime.sim.sim_device`); the accelerator's type with or without an
    index (``cuda``, ``cuda:1``, ``xpu:0``). A ``torch.device`` is checked the same way.

    Raises:
        ConfigError: unknown spec, no such accelerator, or an index past the devices present (one line, e.g.
            ``--device cuda:3: only 1 CUDA device(s) present``).
    """
    if isinstance(spec, SimDevice):
        return spec
    if isinstance(spec, torch.device):
        if spec.type != "cpu":
            _check_accelerator(spec, str(spec))
        return spec
    text = spec.strip()
    if text == "auto":
        env = os.environ.get(DEVICE_ENV, "").strip()
        if env and env != "auto":
            try:
                return resolve_device(env)
            except ConfigError as exc:
                raise ConfigError(f"{DEVICE_ENV}={env}: {exc}") from None
        acc = backend.accelerator_type()
        return torch.device(acc) if acc is not None and backend.is_available() else torch.device("cpu")
    m = re.fullmatch(r"sim(?::(\d+))?", text)
    if m:
        return sim_device(int(m.group(1) or 0))
    try:
        dev = torch.device(text)
    except RuntimeError:
        raise ConfigError(f"unknown device {spec!r}; use {_choices()}") from None
    if dev.type != "cpu":
        _check_accelerator(dev, text)
    return dev


def default_device() -> Device:
    """``resolve_device("auto")``."""
    return resolve_device("auto")


def accelerator_type() -> str | None:
    """The real accelerator's device type (``"cuda"``, also on ROCm; ``"xpu"``, ...), None on a CPU-only build."""
    return backend.accelerator_type()


def is_available() -> bool:
    """Whether a real accelerator can be used."""
    return backend.is_available()


def device_count(kind: str | None = None) -> int:
    """Number of real accelerator devices (0 without one), or of sim devices for ``kind="sim"``."""
    if kind == "sim":
        return sim_count()
    return backend.device_count() if backend.is_available() else 0


def is_sim(device: Device) -> TypeGuard[SimDevice]:
    """Whether ``device`` is a sim device."""
    return isinstance(device, SimDevice)


def is_accelerator(device: Device) -> bool:
    """True for a real accelerator and for a sim device; False for the CPU (and meta)."""
    return isinstance(device, SimDevice) or device.type not in ("cpu", "meta")


def torch_device(device: Device) -> torch.device:
    """Where ``device``'s tensors physically are: the CPU for a sim device, else ``device`` itself."""
    return torch.device("cpu") if isinstance(device, SimDevice) else device


def device_of(t: Tensor) -> Device:
    """The device ``t`` is on: the sim device whose pool holds it, else ``t.device``."""
    dev = owner(t)
    return dev if dev is not None else t.device


def device_key(device: Device) -> str:
    """The counters' key: ``"cpu"``, ``"sim:0"``, ``"cuda:1"`` (an index-less accelerator: the current one)."""
    if isinstance(device, SimDevice):
        return str(device)
    if device.type == "cpu":
        return "cpu"
    if device.index is None and backend.is_available():
        return f"{device.type}:{backend.current_index()}"
    return str(device)


def mem_get_info(device: Device) -> tuple[int, int]:
    """``(free, total)`` bytes: the sim pool's, the accelerator's, or the host's available and total RAM."""
    if isinstance(device, SimDevice):
        with LOCK:
            return device.pool.capacity - device.pool.used, device.pool.capacity
    return host.mem_get_info() if device.type == "cpu" else backend.mem_get_info(device)


def memory_allocated(device: Device) -> int:
    """Bytes allocated on ``device`` now (the CPU: the process's resident bytes)."""
    if isinstance(device, SimDevice):
        return device.pool.used
    return host.memory_allocated() if device.type == "cpu" else backend.memory_allocated(device)


def reset_peak(device: Device) -> None:
    """Start a new peak window for :func:`peak_bytes`."""
    if isinstance(device, SimDevice):
        device.pool.reset_peak()
    elif device.type == "cpu":
        host.reset_peak()
    else:
        backend.reset_peak(device)


def peak_bytes(device: Device) -> int:
    """Most bytes allocated on ``device`` at once since :func:`reset_peak` (the CPU: peak resident bytes)."""
    if isinstance(device, SimDevice):
        return device.pool.peak
    return host.peak_bytes() if device.type == "cpu" else backend.peak_bytes(device)


def device_name(device: Device) -> str:
    """A name for results and logs: the accelerator's product name, the CPU's, or the sim device and its pool."""
    if isinstance(device, SimDevice):
        return f"gnnscale sim device ({format_bytes(device.capacity)} pool)"
    if device.type == "cpu":
        return platform.processor() or platform.machine() or "cpu"
    return backend.device_name(device)


def can_access_peer(a: Device, b: Device) -> bool:
    """Whether kernels on ``a`` can read ``b``'s memory directly: the accelerator's answer; True between two
    different sim devices (they model NVLink-connected GPUs); False with the CPU or for a device and itself."""
    if isinstance(a, SimDevice) or isinstance(b, SimDevice):
        return isinstance(a, SimDevice) and isinstance(b, SimDevice) and a is not b
    if a.type == "cpu" or b.type == "cpu" or device_key(a) == device_key(b):
        return False
    return backend.can_access_peer(a, b)


# ------------------------------------------------------------------------------------------------------ counters
def sync_count(device: Device) -> int:
    """Host-blocking synchronisations the runtime performed on ``device`` since :func:`reset_counts`."""
    return counters.syncs(device_key(device))


def wait_count(device: Device) -> int:
    """Stream-side waits (``wait_stream``, ``wait_event``) on ``device`` since :func:`reset_counts`."""
    return counters.waits(device_key(device))


def reset_counts(device: Device | None = None) -> None:
    """Zero the sync and wait counts of ``device`` (of every device when None)."""
    counters.reset(None if device is None else device_key(device))
