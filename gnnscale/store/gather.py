"""Host-side row I/O for offload engines: copy selected rows of a host tensor to the compute device, and back.

An offload engine (HongTu style) keeps every vertex's rows in host memory and streams each chunk's neighbour rows to
the GPU. :func:`gather_rows` has two interchangeable paths:

* ``"index_select"``: the CPU gathers the rows into a pinned staging buffer, then one asynchronous bulk copy moves
  them to the device. Works everywhere; costs CPU memory bandwidth and a staging buffer.
* ``"uva"``: a Triton kernel on the GPU reads the pinned host rows directly over PCIe / NVLink-C2C (zero-copy,
  unified virtual addressing) and writes the output. No staging buffer, no CPU work; rows must be sorted for speed.

How the ``"uva"`` path hands host memory to Triton: the pinned CPU tensor itself is passed as a pointer argument.
Triton's CUDA launcher (``triton/backends/nvidia/driver.py``, ``getPointer``, Triton 3.6) takes ``data_ptr()`` and
asks ``cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_DEVICE_POINTER)`` for the address the device must use; that call
succeeds for page-locked host memory (``cudaHostAlloc``, which ``pin_memory()`` uses; mapped into the device's address
space under UVA, where the device address equals the host address) and fails with "Pointer argument cannot be
accessed from Triton (cpu tensor?)" for pageable memory. Triton accepts pinned memory this way since
triton-lang/triton#1197. No wrapper object or ``cudaHostGetDevicePointer`` is needed, and the interpreter
(``TRITON_INTERPRET=1``) gets plain tensors, which it requires: it reaches arguments through ``untyped_storage()``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor

from gnnscale import runtime as rt
from gnnscale.errors import ConfigError
from gnnscale.runtime import cpu_kernels

GATHER_METHODS = ("index_select", "uva")

# Elements one Triton program moves: BLOCK_R rows x BLOCK_F columns (4096 float32 = 16 KiB of reads in flight per
# program, to hide PCIe latency). An untuned starting point: time others with
# `python -m benchmarks gather --uva-configs`.
_UVA_TILE = 4096
_UVA_MAX_BLOCK_F = 256
_UVA_MAX_BLOCK_R = 512


@functools.cache
def triton_available() -> bool:
    """Whether ``triton`` imports. Probed on first call only; gnnscale never imports triton at import time."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:  # ImportError, or a broken install failing at import
        return False
    return True


def _interpret() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET``, read by ``triton.jit``)."""
    if not triton_available():
        return False
    from triton import knobs  # parses TRITON_INTERPRET exactly as triton.jit does

    return bool(knobs.runtime.interpret)


def default_gather_method(device: rt.Device | str) -> str:
    """``"uva"`` on CUDA when triton is importable, else ``"index_select"`` (the CPU, the sim device)."""
    if rt.needs_pinning(torch.device(device) if isinstance(device, str) else device) and triton_available():
        return "uva"
    return "index_select"


@functools.cache
def _uva_kernel(interpret: bool) -> Any:
    """Build the Triton gather kernel (cached per interpreter mode: ``triton.jit`` reads it at definition)."""
    del interpret  # only part of the cache key
    import triton
    import triton.language as tl

    @triton.jit
    def gather_rows_kernel(
        host_ptr,  # [N, F] host rows (pinned CPU memory on CUDA)
        rows_ptr,  # [R] int64 row ids, on the compute device
        out_ptr,  # [>= R, F] on the compute device
        num_rows,
        num_features,
        host_stride,
        out_stride,
        BLOCK_R: tl.constexpr,
        BLOCK_F: tl.constexpr,
    ):
        # Row offsets in int64: row_id * host_stride exceeds 2^31 for large host tensors.
        r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)  # [BLOCK_R]
        c = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)  # [BLOCK_F]
        r_ok = r < num_rows
        src = tl.load(rows_ptr + r, mask=r_ok, other=0).to(tl.int64)  # [BLOCK_R]
        mask = r_ok[:, None] & (c < num_features)[None, :]  # [BLOCK_R, BLOCK_F]; masks the column tail
        # Feature dim innermost and contiguous: each row is one run of BLOCK_F consecutive elements, so the loads
        # coalesce into full PCIe read requests (and sorted ids make neighbouring rows adjacent in host memory).
        vals = tl.load(host_ptr + src[:, None] * host_stride + c[None, :], mask=mask)
        tl.store(out_ptr + r[:, None] * out_stride + c[None, :], vals, mask=mask)

    return gather_rows_kernel


def _uva_blocks(num_features: int) -> tuple[int, int]:
    """``(BLOCK_R, BLOCK_F)`` for a feature width: whole rows up to 256 columns, about ``_UVA_TILE`` elements."""
    block_f = min(1 << max(num_features - 1, 0).bit_length(), _UVA_MAX_BLOCK_F)
    block_r = max(1, min(_UVA_TILE // block_f, _UVA_MAX_BLOCK_R))
    return block_r, block_f


def _gather_uva(host: Tensor, rows: Tensor, out: Tensor, block_r: int | None = None, block_f: int | None = None,
                num_warps: int = 4) -> None:
    """Launch the zero-copy kernel: ``out[:len(rows)] = host[rows]`` (``block_*`` override the defaults)."""
    num_rows, num_features = rows.numel(), host.shape[1]
    default_r, default_f = _uva_blocks(num_features)
    block_r, block_f = block_r or default_r, block_f or default_f
    kernel = _uva_kernel(_interpret())
    grid = ((num_rows + block_r - 1) // block_r, (num_features + block_f - 1) // block_f)
    args = (host, rows, out, num_rows, num_features, host.stride(0), out.stride(0))
    if rt.is_accelerator(out.device):
        # Triton launches on torch's current device and stream; make that out's device. The launcher translates
        # host.data_ptr() with cuPointerGetAttribute (see the module docstring), which needs this device's context.
        # TO VERIFY ON A GPU (only the interpreter path is tested on CPU-only machines): that this launch accepts the
        # pinned CPU tensor (no "cannot be accessed from Triton" error), that the result equals host[rows], and
        # that it is asynchronous on the current stream (`python -m benchmarks gather` checks the first two bit for
        # bit).
        with rt.on_device(out.device):
            kernel[grid](*args, BLOCK_R=block_r, BLOCK_F=block_f, num_warps=num_warps)
    else:  # Triton interpreter: every tensor on the CPU
        kernel[grid](*args, BLOCK_R=block_r, BLOCK_F=block_f)


def _check(host: Tensor, rows: Tensor, out: Tensor, method: str) -> None:
    """Validate shapes, dtypes and devices; raise ValueError (caller bugs) or ConfigError (method choice)."""
    if method not in GATHER_METHODS:
        raise ConfigError(f"unknown gather method {method!r}; expected one of {', '.join(GATHER_METHODS)}")
    if host.dim() != 2 or out.dim() != 2 or rows.dim() != 1:
        raise ValueError(f"expected host [N, F], rows [R], out [>= R, F]; got {tuple(host.shape)}, "
                         f"{tuple(rows.shape)}, {tuple(out.shape)}")
    if host.shape[1] != out.shape[1] or host.dtype != out.dtype:
        raise ValueError(f"host {tuple(host.shape)} {host.dtype} and out {tuple(out.shape)} {out.dtype} differ in "
                         "feature width or dtype")
    if out.shape[0] < rows.numel():
        raise ValueError(f"out holds {out.shape[0]} rows, {rows.numel()} requested")
    if rows.dtype != torch.int64:
        raise ValueError(f"rows must be int64, got {rows.dtype}")
    if host.device.type != "cpu" or not host.is_contiguous():
        raise ValueError(f"host must be a contiguous CPU tensor, got device {host.device}")
    if out.shape[1] > 1 and out.stride(1) != 1:
        raise ValueError("out's feature dim must be contiguous (stride 1)")


def gather_rows(host: Tensor, rows: Tensor, out: Tensor, *, method: str = "index_select",
                staging: Tensor | None = None) -> Tensor:
    """Copy ``host[rows]`` into the first ``len(rows)`` rows of ``out``; returns that view of ``out``.

    Args:
        host: ``[N, F]`` contiguous CPU tensor; pinned when ``out`` is on CUDA (required by ``"uva"``, and what
            makes the ``"index_select"`` copy asynchronous).
        rows: ``[R]`` int64 row ids, sorted ascending (sequential host reads make ``"uva"`` about 3x faster;
            both paths are correct for any order). On the CPU for ``"index_select"``, on ``out.device`` for
            ``"uva"``.
        out: ``[>= R, F]`` on the compute device (the CPU, a GPU or a sim device), same dtype as ``host``; its
            rows are contiguous.
        method: ``"index_select"``: on the CPU ``torch.index_select`` writes ``out`` directly; on an accelerator
            the CPU gathers into ``staging`` and ``out`` is filled by an asynchronous copy on the current stream
            of ``out``'s device (:func:`gnnscale.runtime.copy_async`). ``"uva"``: a Triton kernel on
            ``out.device`` reads the pinned host rows directly (zero-copy); on the CPU only under
            ``TRITON_INTERPRET=1``; never on a sim device. On an accelerator both methods are asynchronous,
            enqueued on the current stream of ``out``'s device: wait for it before reading ``out`` elsewhere.
        staging: ``[>= R, F]`` CPU buffer (pinned on CUDA), same dtype; required by ``"index_select"`` on an
            accelerator. The caller must not overwrite it before the copy reading it has finished (record an event
            after this call, and synchronise on it before the buffer's next use).

    Returns:
        ``out[:R]``.

    Raises:
        ConfigError: unknown ``method``; ``"uva"`` without triton, on a sim device, or on the CPU outside the
            Triton interpreter.
        ValueError: inconsistent shapes, dtypes or devices.
    """
    _check(host, rows, out, method)
    n = rows.numel()
    dst = out[:n]  # [R, F]
    dev = rt.device_of(out)
    if method == "index_select":
        if rows.device.type != "cpu" or rt.is_accelerator(rt.device_of(rows)):
            raise ValueError(f"'index_select' needs rows on the CPU, got {rt.device_of(rows)}")
        if not rt.is_accelerator(dev):
            torch.index_select(host, 0, rows, out=dst)
            return dst
        if staging is None:
            raise ValueError(f"'index_select' into a tensor on {dev} needs a (pinned) CPU staging buffer")
        if (staging.device.type != "cpu" or staging.dtype != host.dtype or staging.dim() != 2
                or staging.shape[0] < n or staging.shape[1] != host.shape[1]):
            raise ValueError(f"staging must be a CPU {host.dtype} tensor [>= {n}, {host.shape[1]}], got "
                             f"{tuple(staging.shape)} {staging.dtype} on {staging.device}")
        buf = staging[:n]  # [R, F]
        torch.index_select(host, 0, rows, out=buf)
        rt.copy_async(dst, buf)  # on the current stream of out's device
        return dst
    # method == "uva"
    if not triton_available():
        raise ConfigError("gather method 'uva' needs triton (pip install triton); use 'index_select'")
    if rt.is_sim(dev):
        raise ConfigError(f"gather method 'uva' reads pinned host memory from a real GPU; out is on {dev}: use "
                          "'index_select'")
    if rows.device != out.device:
        raise ValueError(f"'uva' needs rows on out's device {out.device}, got {rows.device}")
    if rt.is_accelerator(dev):
        if not host.is_pinned():
            raise ValueError("'uva' reads host memory from the GPU: host must be pinned (host.pin_memory())")
    elif not _interpret():
        raise ConfigError("gather method 'uva' runs on CUDA (or on the CPU under TRITON_INTERPRET=1); "
                          f"out is on {out.device}")
    if n > 0 and host.shape[1] > 0:
        _gather_uva(host, rows.contiguous(), out)
    return dst


def scatter_add_rows(host: Tensor, rows: Tensor, src: Tensor) -> None:
    """Accumulate ``src`` into host rows in place: ``host[rows] += src``.

    Args:
        host: ``[N, F]`` CPU tensor, updated in place.
        rows: ``[R]`` int64 CPU row ids, unique and sorted ascending.
        src: ``[R, F]`` CPU tensor, same dtype as ``host`` (copy device results to the host first).

    Large float rows are added by a fused kernel (:func:`gnnscale.runtime.cpu_kernels.add_rows`: one pass, the
    same bits as ``index_add_``, whose CPU form dispatches one add per row).
    """
    if src.shape != (rows.numel(), host.shape[1]):
        raise ValueError(f"src {tuple(src.shape)} does not match rows [{rows.numel()}] x F={host.shape[1]}")
    if cpu_kernels.add_rows_applies(host, rows, src):
        cpu_kernels.add_rows(host, rows, src)
        return
    host.index_add_(0, rows, src)


class HostRowReader:
    """Reads rows of host tables onto one device, for every table a reader reads (one staging buffer for all).

    On the CPU: an index. On an accelerator (a GPU, a sim device): the zero-copy ``"uva"`` gather (a real GPU
    only), or a CPU gather into a staging buffer (pinned on CUDA; allocated once, grown when a request needs more,
    reused) and an asynchronous copy on the reading device's current stream (:func:`gather_rows`). Row ids on the
    device are read on the host first (:func:`gnnscale.runtime.to_host`, blocking: one sync on that stream), and
    before the staging buffer is overwritten the host waits for the event recorded after the copy that last read
    it (one sync per read from the second on): the host is that buffer's producer, the copy on the stream its
    consumer. Under ``TRITON_INTERPRET=1`` the ``"uva"`` kernel also runs on the CPU.

    A read's rows are ready for the stream that was current on the device when it was made.

    Args:
        device: where the rows go.
        method: ``"index_select"`` or ``"uva"`` (:data:`GATHER_METHODS`).
    """

    def __init__(self, device: rt.Device | str, method: str = "index_select"):
        if method not in GATHER_METHODS:
            raise ConfigError(f"unknown gather method {method!r}; expected one of {', '.join(GATHER_METHODS)}")
        self.device: rt.Device = torch.device(device) if isinstance(device, str) else device
        self.method = method
        self.staging_allocs = 0
        """Staging buffers allocated so far (the CPU-gather path on an accelerator; reused, so this stays
        small)."""
        self._staging: Tensor | None = None
        self._staging_done: rt.Event | None = None

    def host_rows(self, host: Tensor, rows: Tensor) -> Tensor:
        """``host[rows]`` on this reader's device with this reader's method (see :meth:`read`)."""
        return self.read(host, rows, self.method)

    def read(self, host: Tensor, rows: Tensor, method: str) -> Tensor:
        """``host[rows]`` (``[R, w]`` contiguous host table; ``rows`` int64, best ascending, on this reader's
        device, or the CPU) as a new ``[len(rows), w]`` tensor on this reader's device, ready for its current
        stream."""
        dev = self.device
        on_device = rt.is_accelerator(rt.device_of(rows)) or rows.device.type != "cpu"
        if not rt.is_accelerator(dev) and method == "index_select":
            return host.index_select(0, rt.to_host(rows, blocking=True) if on_device else rows)
        n, w = rows.numel(), host.shape[1]
        out = rt.empty((n, w), dtype=host.dtype, device=dev)
        if method == "uva":
            return gather_rows(host, rt.to_device(rows, dev), out, method="uva")
        stream = rt.current_stream(dev)
        ids = rt.to_host(rows, stream=stream, blocking=True) if on_device else rows  # the host reads the ids
        need = n * w * host.element_size()
        rt.synchronize(self._staging_done)  # the copy that last read the staging buffer is done with it
        if self._staging is None or self._staging.numel() < need:
            self._staging = rt.pinned_empty((max(need, 1 << 20),), dtype=torch.uint8, device=dev)
            self.staging_allocs += 1
        staging = self._staging[:need].view(host.dtype).view(n, w)
        gather_rows(host, ids, out, method="index_select", staging=staging)
        self._staging_done = rt.record_event(stream)
        return out
