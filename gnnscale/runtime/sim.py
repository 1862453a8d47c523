"""The process's sim devices (``--device sim`` / ``sim:N``), and the dispatch mode that sees ops run on them.

The devices are made on first use: ``GNNSCALE_SIM_DEVICES`` says how many exist (default 2) and
``GNNSCALE_SIM_MEMORY`` each one's pool (e.g. ``512MiB``; default 1 GiB), read when a device is first resolved.

Ops on a sim device's tensors run on the host at once. The runtime sees them only inside :func:`scope` (entered
by ``use_stream`` of a sim stream and by ``on_device`` of a sim device): there, through a ``TorchDispatchMode``,
an op on a sim tensor first gets the current stream's pending copies into the bytes it touches (the stream runs
them before the op), is checked against other streams' work on those bytes (a
:class:`~gnnscale.runtime.errors.StreamOrderError` when it was never waited for), and marks them used by the
current stream; under ``on_device`` the tensors it creates count against the pool and are marked as written by
the current stream (a consumer on another stream must wait for it). Outside a scope an op reads
whatever the bytes hold: the poison, for a copy nobody waited on.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from gnnscale.errors import ConfigError
from gnnscale.runtime import clocks
from gnnscale.runtime.pool import LOCK, is_internal, storage_key
from gnnscale.runtime.simdevice import SimDevice, SimStream, complete_for, owner
from gnnscale.units import parse_bytes

__all__ = ["DEFAULT_CAPACITY", "SIM_DEVICES_ENV", "SIM_MEMORY_ENV", "scope", "sim_count", "sim_device"]

SIM_MEMORY_ENV = "GNNSCALE_SIM_MEMORY"
SIM_DEVICES_ENV = "GNNSCALE_SIM_DEVICES"
DEFAULT_CAPACITY = 1 << 30
DEFAULT_COUNT = 2

_DEVICES: dict[int, SimDevice] = {}


def sim_count() -> int:
    """How many sim devices exist (``$GNNSCALE_SIM_DEVICES``, default 2).

    Raises:
        ConfigError: the variable is not a whole number of at least 1.
    """
    text = os.environ.get(SIM_DEVICES_ENV, str(DEFAULT_COUNT)).strip()
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"{SIM_DEVICES_ENV}={text!r}: give a whole number of sim devices, at least 1")
    return int(text)


def sim_device(index: int = 0) -> SimDevice:
    """The process's sim device ``index``, made on first use with a pool of ``$GNNSCALE_SIM_MEMORY`` bytes.

    Raises:
        ConfigError: ``index`` is not below :func:`sim_count`, or a variable is malformed.
    """
    count = sim_count()
    if not 0 <= index < count:
        raise ConfigError(f"--device sim:{index}: only {count} sim device(s) present (set {SIM_DEVICES_ENV})")
    with LOCK:
        dev = _DEVICES.get(index)
        if dev is None:
            text = os.environ.get(SIM_MEMORY_ENV)
            try:
                capacity = parse_bytes(text) if text else DEFAULT_CAPACITY
            except ConfigError as exc:
                raise ConfigError(f"{SIM_MEMORY_ENV}={text}: {exc}") from None
            dev = _DEVICES[index] = SimDevice(index, capacity)
        return dev


# ------------------------------------------------------------------------------------------ the dispatch mode
_TLS = threading.local()


def _accesses(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[Tensor, bool]]:
    """The tensors an aten op touches, each with whether the op writes it (``Tensor(a!)`` in its schema)."""
    writes: set[int] = set()
    schema = getattr(func, "_schema", None)
    if schema is not None:
        for i, a in enumerate(schema.arguments):
            if a.alias_info is not None and a.alias_info.is_write:
                v = args[i] if i < len(args) and not a.kwarg_only else kwargs.get(a.name)
                writes.update(id(t) for t in pytree.tree_leaves(v) if isinstance(t, Tensor))
    return [(t, id(t) in writes) for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, Tensor)]


def _parts(t: Tensor) -> list[Tensor]:
    """The strided tensors holding ``t``'s memory (a sparse tensor's index and value tensors)."""
    if t.layout == torch.strided:
        return [t]
    if t.layout == torch.sparse_csr:
        return [t.crow_indices(), t.col_indices(), t.values()]
    if t.layout == torch.sparse_csc:
        return [t.ccol_indices(), t.row_indices(), t.values()]
    if t.layout == torch.sparse_coo:
        return [t._indices(), t._values()]
    return []


def _counting() -> SimDevice | None:
    stack: list[SimDevice | None] = getattr(_TLS, "devices", [])
    return next((d for d in reversed(stack) if d is not None), None)


class _SimMode(TorchDispatchMode):
    """Sees every op the thread runs inside a sim :func:`scope` (see the module docstring)."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if is_internal():
            return func(*args, **kwargs)
        touched = _accesses(func, args, kwargs)
        on_sim = False
        target = _counting()
        with LOCK:
            for t, write in touched:
                dev = owner(t)
                if dev is None:
                    continue
                on_sim = True
                x = dev.current_stream()
                clocks.catch_up(x)
                complete_for(x, t)
                clocks.check(x, t, write, f"op {func}")
                clocks.mark(x, t, write, local=target is None or target is dev)
        out = func(*args, **kwargs)
        if target is not None and (on_sim or not touched):  # an op on sim tensors, or a factory
            inputs = {storage_key(t) for t, _ in touched}
            for t in pytree.tree_leaves(out):
                if isinstance(t, Tensor) and t.device.type == "cpu":
                    for part in _parts(t):
                        if storage_key(part) not in inputs and owner(part) is None:
                            target.adopt(part)
                            with LOCK:  # the op wrote its result on the current stream
                                clocks.mark(target.current_stream(), part, True)
        return out


@contextmanager
def scope(stream: SimStream | None = None, device: SimDevice | None = None) -> Iterator[None]:
    """Run the block under the sim's dispatch mode, with ``stream`` (if given) current on its device and the
    tensors ops create counted against ``device``'s pool (if given). Nests; the mode is pushed once per thread."""
    stack: list[SimDevice | None] = _TLS.__dict__.setdefault("devices", [])
    mode = _SimMode() if not stack else None
    stack.append(device)
    try:
        with stream.device.current(stream) if stream is not None else nullcontext(), mode or nullcontext():
            yield
    finally:
        stack.pop()
