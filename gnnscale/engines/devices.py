"""Which devices a run trains on (``--device``, ``--devices``, a distributed rank's ``LOCAL_RANK``), and the
peak-memory window an epoch is measured in."""

from __future__ import annotations

import os
import resource
from typing import TYPE_CHECKING

import torch

from gnnscale.errors import ConfigError
from gnnscale.plan.memory import proc_kib

if TYPE_CHECKING:
    from gnnscale.config import TrainConfig


def resolve_device(spec: str | torch.device) -> torch.device:
    """``auto`` -> CUDA when available else CPU; validates ``cuda``/``cuda:N`` against what is present."""
    if isinstance(spec, torch.device):
        return spec
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(spec)
    except RuntimeError:
        raise ConfigError(f"unknown device {spec!r}; use auto, cpu, cuda or cuda:N") from None
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"unsupported device {spec!r}; use auto, cpu, cuda or cuda:N")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {spec} requested but no CUDA device is available")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(f"--device {spec}: only {torch.cuda.device_count()} CUDA device(s) present")
    return dev


def rank_device(device: str | torch.device, local_ranks: int, local_rank: int) -> torch.device:
    """A distributed rank's device: ``cuda:LOCAL_RANK`` for ``cuda``, since NCCL takes one GPU per rank (more
    ranks on a machine than GPUs, or one ``cuda:N`` for all of them, is a :class:`ConfigError`)."""
    dev = resolve_device(device)
    if dev.type != "cuda":
        return dev
    if local_ranks > 1 and dev.index is not None:
        raise ConfigError(f"--device {device} would put all {local_ranks} ranks of this machine on one GPU, which "
                          "NCCL refuses; give --device cuda (each rank takes cuda:LOCAL_RANK)")
    if local_ranks > torch.cuda.device_count():
        raise ConfigError(f"{local_ranks} ranks on this machine but {torch.cuda.device_count()} CUDA device(s): NCCL "
                          "takes one GPU per rank; start at most that many ranks per machine, or train CPU ranks "
                          "with --device cpu")
    return dev if dev.index is not None else resolve_device(f"cuda:{local_rank}")


def resolve_devices(config: TrainConfig, device: str | torch.device) -> torch.device:
    """The training device; with ``config.devices`` (validated here, all CPU or all CUDA), their first. The hybrid
    engine's is always the CPU (its synchronizer and master model live there)."""
    if not config.devices:
        if config.engine == "distributed":  # one device per rank: torchrun's LOCAL_RANK picks the GPU
            return rank_device(device, int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
                               int(os.environ.get("LOCAL_RANK", "0")))
        if config.engine == "hybrid":
            if not (isinstance(device, str) and device == "auto") and resolve_device(device).type != "cpu":
                raise ConfigError(f"--device {device}: the hybrid engine trains on the CPU and the accelerators "
                                  "together; name them with --devices (e.g. --devices cpu,cuda:0)")
            return torch.device("cpu")
        return resolve_device(device)
    devs = [resolve_device(d) for d in config.devices]
    if any(d.type == "cuda" and d.index is None for d in devs):
        raise ConfigError("--devices takes explicit devices: cpu, or cuda:0,cuda:1,...")
    if config.engine == "hybrid":  # CPU and accelerators together; the synchronizer (the master model) on the CPU
        return next(d for d in devs if d.type == "cpu")
    if len({d.type for d in devs}) > 1:
        raise ConfigError(f"--devices mixes CPU and CUDA devices ({', '.join(config.devices)}); use one kind")
    if not (isinstance(device, str) and device == "auto") and resolve_device(device) != devs[0]:
        raise ConfigError(f"--device {device} disagrees with --devices {','.join(config.devices)}; give one of them")
    return devs[0]


def reset_peak_device_bytes(device: torch.device) -> None:
    """Start a new peak-memory window: the CUDA allocator's peak, or on Linux the process's peak RSS."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        with open("/proc/self/clear_refs", "w") as fh:  # "5" resets VmHWM (Linux >= 4.0)
            fh.write("5")
    except OSError:
        pass


def peak_device_bytes(device: torch.device) -> int:
    """Peak bytes since :func:`reset_peak_device_bytes`: CUDA allocated, or the process's peak resident memory
    on CPU (VmHWM; where it cannot be reset, the lifetime peak)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    hwm = proc_kib("/proc/self/status", "VmHWM")
    return (hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
