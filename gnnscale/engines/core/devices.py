"""A device spec resolved (``--device``, a distributed rank's ``LOCAL_RANK``), and the peak-memory window an epoch is
measured in. Which device an engine trains on (``--devices``, an engine beside the accelerators) is the registry's
:func:`gnnscale.engines.resolve_devices`."""

from __future__ import annotations

import os

import torch

from gnnscale import runtime as rt
from gnnscale.errors import ConfigError


def resolve_device(spec: str | torch.device) -> torch.device:
    """``auto`` -> the accelerator when available (``$GNNSCALE_DEVICE`` first), else CPU; validates ``cuda`` /
    ``cuda:N`` (or the accelerator's own type) against what is present (:func:`gnnscale.runtime.resolve_device`).
    ``sim:N``, the runtime's test device, only where ``$GNNSCALE_SIM_DEVICES`` says how many there are (a test's
    or a CI run's choice, never a user's by accident)."""
    if isinstance(spec, torch.device):
        return spec
    dev = rt.resolve_device(spec)
    if rt.is_sim(dev) and rt.SIM_DEVICES_ENV not in os.environ:
        raise ConfigError(f"--device {spec}: the sim device is the runtime's test mode (gnnscale.runtime); the "
                          f"command line takes it only where ${rt.SIM_DEVICES_ENV} is set")
    return dev  # type: ignore[return-value]


def rank_device(device: str | torch.device, local_ranks: int, local_rank: int) -> torch.device:
    """A distributed rank's device: ``cuda:LOCAL_RANK`` for ``cuda``, since NCCL takes one GPU per rank (more
    ranks on a machine than GPUs, or one ``cuda:N`` for all of them, is a :class:`ConfigError`)."""
    if isinstance(device, str) and device == "sim":  # the runtime's test device: each rank sim:LOCAL_RANK
        return resolve_device(f"sim:{local_rank}")
    dev = resolve_device(device)
    if dev.type != "cuda":
        return dev
    if local_ranks > 1 and dev.index is not None:
        raise ConfigError(f"--device {device} would put all {local_ranks} ranks of this machine on one GPU, which "
                          "NCCL refuses; give --device cuda (each rank takes cuda:LOCAL_RANK)")
    if local_ranks > rt.device_count():
        raise ConfigError(f"{local_ranks} ranks on this machine but {rt.device_count()} CUDA device(s): NCCL "
                          "takes one GPU per rank; start at most that many ranks per machine, or train CPU ranks "
                          "with --device cpu")
    return dev if dev.index is not None else resolve_device(f"cuda:{local_rank}")


def reset_peak_device_bytes(device: torch.device) -> None:
    """Start a new peak-memory window: the accelerator allocator's peak, or on Linux the process's peak RSS."""
    rt.reset_peak(device)


def peak_device_bytes(device: torch.device) -> int:
    """Peak bytes since :func:`reset_peak_device_bytes`: the accelerator's allocated peak, or the process's peak
    resident memory on CPU (VmHWM; where it cannot be reset, the lifetime peak)."""
    return rt.peak_bytes(device)
