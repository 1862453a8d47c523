"""Page-lock host tensors *in place* (``cudaHostRegister``) instead of keeping a second, pinned copy.

``tensor.pin_memory()`` allocates new page-locked memory and copies: a store that keeps every feature row in host
memory would hold it twice. :func:`pin_in_place` registers the tensor's own pages with CUDA, in slices of at most
``slice_bytes`` (one huge registration can fail or stall where smaller ones succeed), flagged portable (pinned for
every CUDA context) and mapped (readable by kernels: under UVA the device address is the host address, which is
what the zero-copy gather of :mod:`gnnscale.store.gather` relies on). PyTorch's ``Tensor.is_pinned()`` asks CUDA
(``cudaPointerGetAttributes``) about the pointer, so a registered tensor reports pinned and passes the gather's
check. (TO VERIFY ON A GPU: no session has had one; ``tests/test_pinning.py`` has the CUDA test.)

Every return code is checked. If a slice fails, the slices already registered are unregistered, then either a
:class:`~gnnscale.errors.ConfigError` names the size and the CUDA error, or (``fallback=True``) ``None`` tells the
caller to take a pinned copy (:func:`pinned_host`). A :class:`PinnedRegion` unregisters its slices exactly once:
on :meth:`~PinnedRegion.close`, on leaving a ``with`` block, or when it is garbage collected; it keeps the tensor
alive meanwhile.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from gnnscale.errors import ConfigError

__all__ = ["HOST_REGISTER_FLAGS", "PinnedRegion", "pin_in_place", "pinned_host"]

HOST_REGISTER_FLAGS = 1 | 2
"""``cudaHostRegisterPortable | cudaHostRegisterMapped``."""
SLICE_BYTES = 1 << 30
"""Largest single registration."""


def _cudart() -> Any:
    """The CUDA runtime binding (``torch.cuda.cudart()``); tests substitute a fake."""
    return torch.cuda.cudart()


def _code(ret: Any) -> int:
    """A cudart call's error code (the binding returns a ``cudaError`` enum, or a tuple starting with one)."""
    if isinstance(ret, tuple):
        ret = ret[0]
    return int(getattr(ret, "value", ret))


def _unregister(cudart: Any, ptrs: list[int], tensor: Tensor) -> None:
    del tensor  # only kept alive until now
    while ptrs:
        cudart.cudaHostUnregister(ptrs.pop())


class PinnedRegion:
    """A host tensor's pages registered with CUDA, slice by slice; :meth:`close` unregisters them (once)."""

    def __init__(self, tensor: Tensor, ptrs: list[int], cudart: Any):
        self.tensor = tensor
        self.slices = len(ptrs)
        self._finalizer = weakref.finalize(self, _unregister, cudart, ptrs, tensor)

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def close(self) -> None:
        """Unregister every slice; a second call does nothing."""
        self._finalizer()

    def __enter__(self) -> PinnedRegion:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def pin_in_place(tensor: Tensor, *, slice_bytes: int = SLICE_BYTES, fallback: bool = False,
                 cudart: Callable[[], Any] = _cudart) -> PinnedRegion | None:
    """Register ``tensor``'s memory with CUDA as page-locked, without copying it.

    Args:
        tensor: a contiguous CPU tensor (an empty one registers nothing).
        slice_bytes: most bytes one ``cudaHostRegister`` call covers.
        fallback: on failure, return ``None`` (the caller copies into pinned memory) instead of raising.
        cudart: returns the runtime binding (for tests).

    Raises:
        ValueError: ``tensor`` is not a contiguous CPU tensor, or ``slice_bytes < 1``.
        ConfigError: a registration failed and ``fallback`` is false.
    """
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        raise ValueError(f"pin_in_place needs a contiguous CPU tensor, got one on {tensor.device}"
                         + ("" if tensor.is_contiguous() else ", not contiguous"))
    if slice_bytes < 1:
        raise ValueError(f"slice_bytes must be >= 1, got {slice_bytes}")
    rt = cudart()
    base, total = tensor.data_ptr(), tensor.numel() * tensor.element_size()
    ptrs: list[int] = []
    for off in range(0, total, slice_bytes):
        size = min(slice_bytes, total - off)
        code = _code(rt.cudaHostRegister(base + off, size, HOST_REGISTER_FLAGS))
        if code != 0:
            _unregister(rt, ptrs, tensor)
            if fallback:
                return None
            raise ConfigError(f"could not pin {size} bytes of a {total}-byte host tensor in place "
                              f"(cudaHostRegister error {code}); free host memory or raise the locked-memory "
                              "limit (ulimit -l)")
        ptrs.append(base + off)
    return PinnedRegion(tensor, ptrs, rt)


def pinned_host(tensor: Tensor, *, cudart: Callable[[], Any] = _cudart) -> tuple[Tensor, PinnedRegion | None]:
    """``tensor`` pinned for the GPU: registered in place when CUDA allows it (returned with its region, which
    must be kept), else a pinned copy (region ``None``)."""
    t = tensor.contiguous()
    region = pin_in_place(t, fallback=True, cudart=cudart)
    return (t, region) if region is not None else (t.pin_memory(), None)
