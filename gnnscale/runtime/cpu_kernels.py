"""Fused host (CPU) kernels, compiled by numba where it is installed (a dependency; where it cannot be imported the
callers keep their torch formulation, which gives the same bits).

* :func:`hashed_scale`: keyed dropout's masked scale. The torch formulation makes six passes over ``[rows, F]``
  (hash XOR, multiply, compare, mask to float, multiply, divide) and saves a ``[rows, F]`` mask for backward; the
  kernel makes one pass, reading ``x`` and writing the result, and backward runs it again on the gradient (the mask
  is a pure function of the row and column hashes, so nothing ``[rows, F]`` is kept).
* :func:`add_rows`: ``host[rows] += src`` row by row in one pass. Torch's CPU ``index_add_`` dispatches one
  vectorised add per row, which dominates for the narrow rows a chunked engine accumulates (2-8x slower).

Kernels are compiled on first use in a process (about half a second each; nothing is cached on disk, so nothing is
loaded from a file), and only for tensors of at least :data:`MIN_ELEMENTS` elements: smaller ones take the torch
path. They run serially with the GIL released (several worker threads may call them), and read and write only the
tensors they are given, within bounds checked before they run (numba checks none itself).
"""

from __future__ import annotations

import functools
import importlib
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from gnnscale.runtime.simdevice import owner

MIN_ELEMENTS = 1 << 20
"""Tensors with fewer elements take the torch path, where a call costs a millisecond or less: the kernels pay
for their compile (about half a second in each process) on graphs of tens of thousands of vertices and up. Tests
set it to 0 to run the kernels on small inputs."""

FIB32 = -1640531527
"""0x9E3779B9 (the golden-ratio multiplier of keyed dropout's hash) as a signed int32."""

_FLOATS = (torch.float32, torch.float64)


@functools.cache
def _kernels() -> Any:
    """The compiled kernels (a namespace), or ``None`` where numba cannot be imported."""
    try:
        numba = importlib.import_module("numba")
        np = importlib.import_module("numpy")
    except ImportError:
        return None

    @numba.njit(nogil=True, cache=False)  # type: ignore[untyped-decorator]
    def masked_scale(x: Any, hr: Any, hc: Any, threshold: int, q: Any, out: Any) -> None:
        rows, cols = x.shape
        for i in range(rows):
            h = np.int64(hr[i])
            for j in range(cols):
                # int32 multiplication wrapping modulo 2^32, as torch's int32 ``mul_`` does
                u = np.int32((h ^ np.int64(hc[j])) * np.int64(FIB32))
                v = x[i, j]
                # keep: v / q; drop: v * 0 / q (+-0, NaN for an infinite v), as torch's mask product gives
                out[i, j] = (v if u >= threshold else v * 0) / q

    @numba.njit(nogil=True, cache=False)  # type: ignore[untyped-decorator]
    def add_rows(host: Any, rows: Any, src: Any) -> None:
        cols = src.shape[1]
        for i in range(rows.shape[0]):
            r = rows[i]
            for j in range(cols):
                host[r, j] += src[i, j]

    return SimpleNamespace(masked_scale=masked_scale, add_rows=add_rows)


def available() -> bool:
    """Whether the fused kernels can run here (numba imports)."""
    return _kernels() is not None


def _takes(*ts: Tensor) -> bool:
    """Plain CPU float matrices, the last of at least :data:`MIN_ELEMENTS` elements, where numba imports. Not a
    sim device's tensors: the sim device checks every access of its tensors through torch's dispatch (a read
    before its copy was waited for, a race between streams), which a kernel reading memory directly would skip."""
    return (all(t.device.type == "cpu" and t.dtype in _FLOATS and t.dim() == 2 for t in ts)
            and ts[-1].numel() >= MIN_ELEMENTS and available() and all(owner(t) is None for t in ts))


def dropout_applies(x: Tensor) -> bool:
    """Whether :func:`hashed_scale` takes ``x``: a CPU float32/float64 ``[rows, F]`` tensor of at least
    :data:`MIN_ELEMENTS` elements, where numba imports."""
    return _takes(x)


def hashed_scale(x: Tensor, row_hash: Tensor, col_hash: Tensor, threshold: int, p: float) -> Tensor:
    """``x * keep / (1 - p)`` in one pass, ``keep[i, j] = int32((row_hash[i] ^ col_hash[j]) * FIB) >= threshold``
    (:func:`gnnscale.nn.ops.keep_mask`'s test on its int32 hashes): bitwise what the torch formulation gives.
    ``x`` must satisfy :func:`dropout_applies`."""
    if row_hash.shape != (x.shape[0],) or col_hash.shape != (x.shape[1],):
        raise ValueError(f"hashes {tuple(row_hash.shape)} and {tuple(col_hash.shape)} do not match x "
                         f"{tuple(x.shape)}")
    x = x.detach().contiguous()
    out = torch.empty_like(x)
    q = x.new_tensor(1.0 - p).numpy()[()]  # the divisor in x's dtype, as torch's scalar division rounds it
    _kernels().masked_scale(x.numpy(), row_hash.numpy(), col_hash.numpy(), threshold, q, out.numpy())
    return out


def add_rows_applies(host: Tensor, rows: Tensor, src: Tensor) -> bool:
    """Whether :func:`add_rows` takes them: CPU float tensors of one dtype, ``host`` contiguous, int64 ``rows``,
    ``src`` of at least :data:`MIN_ELEMENTS` elements, where numba imports."""
    return (_takes(host, src) and host.dtype == src.dtype and host.is_contiguous() and rows.dtype == torch.int64
            and rows.device.type == "cpu")


def add_rows(host: Tensor, rows: Tensor, src: Tensor) -> None:
    """``host[rows] += src`` in one pass, in ``rows``' order (repeats add in turn, as ``index_add_`` does on the
    CPU: the same bits). Checks ``rows`` lie in ``host`` (``IndexError``) before touching it."""
    if src.shape != (rows.numel(), host.shape[1]):
        raise ValueError(f"src {tuple(src.shape)} does not match rows [{rows.numel()}] x F={host.shape[1]}")
    if rows.numel():
        lo, hi = torch.aminmax(rows)
        if int(lo) < 0 or int(hi) >= host.shape[0]:
            raise IndexError(f"row ids in [{int(lo)}, {int(hi)}] outside a table of {host.shape[0]} rows")
    _kernels().add_rows(host.numpy(), rows.contiguous().numpy(), src.detach().contiguous().numpy())
