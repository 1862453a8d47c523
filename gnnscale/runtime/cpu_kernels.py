"""Fused host (CPU) kernels, compiled by numba where it is installed (a dependency; where it cannot be imported the
callers keep their torch formulation, which gives the same bits).

* :func:`hashed_scale`: keyed dropout's masked scale. The torch formulation makes six passes over ``[rows, F]``
  (hash XOR, multiply, compare, mask to float, multiply, divide) and saves a ``[rows, F]`` mask for backward; the
  kernel makes one pass, reading ``x`` and writing the result, and backward runs it again on the gradient (the mask
  is a pure function of the row and column hashes, so nothing ``[rows, F]`` is kept).
* :func:`csr_mm`: a CSR matrix times dense rows (the sparse aggregations on the CPU at one torch thread): each
  output row the sum of its entries in order, with the rows it gathers prefetched a few entries ahead. The rows
  a graph's product gathers are random accesses that miss the caches; MKL's CSR kernel (torch's) waits on each,
  this loop has the next ones in flight: 1.8-2.3x faster for 64-wide rows at 100K-800K vertices, even with it
  for 16-wide ones.
* :func:`csr_mm_add`: ``host[rows] += adj @ x`` with each row added as it is summed (a chunk's transposed
  product into its source rows' host gradients), taken by the work (entries times width), not by ``x``'s size;
  rows of at most :data:`NARROW` elements run loops compiled for their width (unrolled), the host row it adds
  into prefetched a few rows ahead.
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

M31 = 0x7FFFFFFF
MIX = 0x45D9F3B
"""Keyed dropout's 31-bit hash (:func:`gnnscale.nn.ops.keep_mask`): two multiply-xorshift rounds by this (< 2^27:
a product with a 31-bit value stays below 2^58, no int64 overflow), of ``((id ^ (id >> 31)) & M31) ^ key`` for a
row and of ``((j * COLUMN) & M31) ^ column_key`` for column ``j``."""
COLUMN = 0x9E3779B1

_FLOATS = (torch.float32, torch.float64)

NARROW = 16
"""Rows of at most this many elements get a :func:`csr_mm_add` compiled for their width (each width once per
process, on first use): a loop over a handful of elements whose count is known only at run time costs more than
its arithmetic (5-wide rows: 2.5x slower than the width's own loop). :func:`csr_mm` keeps its one loop for any
width: a second compiled set costs every process resident memory and was no faster (GAT at 800K vertices, whose
16- and 5-wide products would take two: 5.0-5.5 against 4.7-4.8 GiB peak, measured with freed blocks retained,
whose fragmentation alone moves that peak by as much: benchmarks/HISTORY.md)."""

PREFETCH_AHEAD = 8
"""How many entries ahead :func:`csr_mm` prefetches the row an entry gathers (8: measured best of 8, 16 and 32 on
csbm graphs of 100K-800K vertices; farther ahead evicts rows before their use)."""

HOST_AHEAD = 4
"""How many rows ahead :func:`csr_mm_add` prefetches the host row it adds into (2, 4 and 8 were even; none took a
third longer: a chunk's transposed product adds into most rows of a table larger than the caches)."""


@functools.cache
def _kernels() -> Any:
    """The compiled kernels (a namespace), or ``None`` where numba cannot be imported."""
    try:
        numba = importlib.import_module("numba")
        np = importlib.import_module("numpy")
    except ImportError:
        return None

    @numba.njit(nogil=True, cache=False, inline="always")  # type: ignore[untyped-decorator]
    def mix31(h: int) -> int:
        h = (((h >> 16) ^ h) * MIX) & M31
        h = (((h >> 16) ^ h) * MIX) & M31
        return (h >> 16) ^ h

    @numba.njit(nogil=True, cache=False)  # type: ignore[untyped-decorator]
    def masked_scale(x: Any, ids: Any, key: int, column_key: int, threshold: int, q: Any, out: Any) -> None:
        rows, cols = x.shape
        hc = np.empty(cols, dtype=np.int64)  # the column hashes, top bit flipped (see keep_mask)
        for j in range(cols):
            hc[j] = np.int64(np.int32(mix31(((np.int64(j) * COLUMN) & M31) ^ column_key)) ^ np.int32(-(1 << 31)))
        for i in range(rows):
            r = np.int64(ids[i])
            h = mix31(((r ^ (r >> 31)) & M31) ^ key)
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


def _csr_kernels(width: int) -> Any:
    """The CSR kernels for rows of ``width`` elements: compiled for that width when it is at most
    :data:`NARROW` (their loops unrolled), else the ones for any width (``None`` where numba cannot be
    imported)."""
    return _build_csr_kernels(width if width <= NARROW else 0)


@functools.cache
def _build_csr_kernels(width: int) -> Any:
    """:func:`csr_mm`'s and :func:`csr_mm_add`'s loops for rows of ``width`` elements (0: any width, read from
    the operand)."""
    try:
        numba = importlib.import_module("numba")
        np = importlib.import_module("numpy")
    except ImportError:
        return None
    prefetch = _prefetch_intrinsic()

    @numba.njit(nogil=True, cache=False, inline="always")  # type: ignore[untyped-decorator]
    def row_sum(indptr: Any, indices: Any, values: Any, x: Any, flat: Any, cols: int, i: int, acc: Any,
                ahead: int, line: int) -> int:
        """``acc[:] =`` row ``i`` of the CSR matrix times ``x`` (``cols`` wide), its entries summed in order from
        zero, the row ``ahead`` entries on prefetched (each cache line); returns how many entries (or 1 for the row
        itself) lie outside ``x`` or the entries: skipped, never read."""
        n, nnz, bad = x.shape[0], indices.shape[0], 0
        for j in range(cols):
            acc[j] = 0
        start, stop = indptr[i], indptr[i + 1]
        if start < 0 or stop < start or stop > nnz:
            return 1
        for k in range(start, stop):
            if k + ahead < nnz:  # the entry ``ahead`` on, in this row or a later one
                nxt = indices[k + ahead]
                if 0 <= nxt < n:
                    for q in range(0, cols, line):
                        prefetch(flat, nxt * cols + q)
            c, v = indices[k], values[k]
            if c < 0 or c >= n:
                bad += 1
                continue
            for j in range(cols):
                acc[j] += v * x[c, j]
        return bad

    @numba.njit(nogil=True, cache=False)  # type: ignore[untyped-decorator]
    def csr_mm(indptr: Any, indices: Any, values: Any, x: Any, out: Any, ahead: int, line: int) -> int:
        cols = width if width else x.shape[1]  # a constant the loops unroll by, when given
        flat, bad = x.reshape(-1), 0
        for i in range(out.shape[0]):
            bad += row_sum(indptr, indices, values, x, flat, cols, i, out[i], ahead, line)
        return bad

    @numba.njit(nogil=True, cache=False)  # type: ignore[untyped-decorator]
    def csr_mm_add(indptr: Any, indices: Any, values: Any, x: Any, host: Any, rows: Any, ahead: int,
                   line: int) -> int:
        cols = width if width else x.shape[1]
        flat, host_flat, bad, m = x.reshape(-1), host.reshape(-1), 0, rows.shape[0]
        acc = np.empty(cols, dtype=x.dtype)
        for i in range(m):
            if i + HOST_AHEAD < m:  # the host row a few rows on, which the add reads and writes
                for q in range(0, cols, line):
                    prefetch(host_flat, rows[i + HOST_AHEAD] * cols + q)
            bad += row_sum(indptr, indices, values, x, flat, cols, i, acc, ahead, line)
            r = rows[i]
            for j in range(cols):
                host[r, j] += acc[j]
        return bad

    return SimpleNamespace(csr_mm=csr_mm, csr_mm_add=csr_mm_add)


def _prefetch_intrinsic() -> Any:
    """``prefetch(array, i)``: LLVM's ``llvm.prefetch`` of ``array[i]``'s cache line (a read, kept in every cache
    level), compiled into the numba function that calls it; a hint, a no-op where the target has none."""
    numba_ext = importlib.import_module("numba.extending")
    types = importlib.import_module("numba.core.types")
    ir = importlib.import_module("llvmlite.ir")

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        array = context.make_array(signature.args[0])(context, builder, args[0])
        byte_ptr = ir.IntType(8).as_pointer()
        address = builder.bitcast(builder.gep(array.data, [args[1]]), byte_ptr)
        i32 = ir.IntType(32)
        fn = builder.module.declare_intrinsic("llvm.prefetch", fnty=ir.FunctionType(
            ir.VoidType(), [byte_ptr, i32, i32, i32]))
        builder.call(fn, [address, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])  # read, L1, data
        return context.get_dummy_value()

    def prefetch(typingctx: Any, array: Any, index: Any) -> Any:
        return types.void(array, index), codegen

    return numba_ext.intrinsic(prefetch)


def available() -> bool:
    """Whether the fused kernels can run here (numba imports)."""
    return _kernels() is not None


def _takes(*ts: Tensor, elements: int | None = None) -> bool:
    """Plain CPU float matrices, the last of at least :data:`MIN_ELEMENTS` elements (or ``elements``, the work
    when given), where numba imports. Not a sim device's tensors: the sim device checks every access of its
    tensors through torch's dispatch (a read before its copy was waited for, a race between streams), which a
    kernel reading memory directly would skip."""
    work = ts[-1].numel() if elements is None else elements
    return (all(t.device.type == "cpu" and t.dtype in _FLOATS and t.dim() == 2 for t in ts)
            and work >= MIN_ELEMENTS and available() and all(owner(t) is None for t in ts))


def dropout_applies(x: Tensor) -> bool:
    """Whether :func:`hashed_scale` takes ``x``: a CPU float32/float64 ``[rows, F]`` tensor of at least
    :data:`MIN_ELEMENTS` elements, where numba imports."""
    return _takes(x)


def hashed_scale(x: Tensor, row_ids: Tensor, key: int, column_key: int, threshold: int, p: float,
                 out: Tensor | None = None) -> Tensor:
    """``x * keep / (1 - p)`` in one pass, ``keep[i, j] = int32((row_hash[i] ^ col_hash[j]) * FIB) >= threshold``
    (:func:`gnnscale.nn.ops.keep_mask`'s test), the row and column hashes made from the rows' ids, ``key`` and
    ``column_key`` as :func:`~gnnscale.nn.ops.keep_mask` makes them (:data:`MIX`): bitwise what the torch
    formulation gives; written into ``out`` when given (see :func:`_output`). ``x`` must satisfy
    :func:`dropout_applies`."""
    if row_ids.shape != (x.shape[0],) or row_ids.is_floating_point():
        raise ValueError(f"ids {tuple(row_ids.shape)} ({row_ids.dtype}) do not match x {tuple(x.shape)}")
    x = x.detach().contiguous()
    out = _output(out, x.shape, x.dtype)
    q = x.new_tensor(1.0 - p).numpy()[()]  # the divisor in x's dtype, as torch's scalar division rounds it
    _kernels().masked_scale(x.numpy(), row_ids.contiguous().numpy(), key, column_key, threshold, q, out.numpy())
    return out


def _output(out: Tensor | None, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    """A new tensor, or ``out``: a contiguous CPU tensor of that shape and dtype that the kernel writes
    (``ValueError`` otherwise; nothing it reads may share its memory)."""
    if out is None:
        return torch.empty(shape, dtype=dtype)
    if out.shape != shape or out.dtype != dtype or not out.is_contiguous() or out.device.type != "cpu":
        raise ValueError(f"cannot write a {tuple(shape)} {dtype} result into {tuple(out.shape)} {out.dtype}"
                         f"{'' if out.is_contiguous() else ' (not contiguous)'} on {out.device}")
    return out


def csr_mm_applies(adj: Tensor, x: Tensor, elements: int | None = None) -> bool:
    """Whether :func:`csr_mm` takes them: a CPU sparse CSR ``adj`` whose values have ``x``'s dtype and a float
    ``x`` of at least :data:`MIN_ELEMENTS` elements (or ``elements``), where numba imports and torch runs one
    thread; not a sim device's tensors. At several threads MKL's product (torch's) runs on torch's own worker
    threads; a second set of threads for this loop would contend with them (torch's OpenMP workers spin a while
    after every op), and on this repo's 2 cores the two were even (a GCN epoch on csbm 200K: 0.283 against
    0.291 s)."""
    return (torch.get_num_threads() == 1 and adj.layout == torch.sparse_csr and adj.device.type == "cpu"
            and adj.dtype == x.dtype and _takes(x, elements=elements) and owner(adj.values()) is None)


def _csr_operands(adj: Tensor, x: Tensor) -> tuple[tuple[Any, ...], Tensor]:
    """The kernels' arrays for ``adj @ x`` (row pointers, columns, values, ``x``) and ``x`` contiguous, after the
    checks numba does not make: shapes that chain (``ValueError``) and a CSR matrix with one pointer per row and
    one value per entry (``ValueError``; the kernels count the entries and rows that point outside)."""
    if adj.dim() != 2 or x.dim() != 2 or x.shape[0] != adj.shape[1]:
        raise ValueError(f"cannot multiply {tuple(adj.shape)} by {tuple(x.shape)}")
    indptr, indices, values = adj.crow_indices(), adj.col_indices(), adj.values().detach()
    if indptr.numel() != adj.shape[0] + 1 or values.numel() != indices.numel():
        raise ValueError(f"a malformed CSR matrix: {indptr.numel()} row pointers for {adj.shape[0]} rows, "
                         f"{values.numel()} values for {indices.numel()} entries")
    x = x.detach().contiguous()
    return (indptr.numpy(), indices.numpy(), values.numpy(), x.numpy()), x


def _raise_if_bad(bad: int, adj: Tensor, x: Tensor) -> None:
    if bad:
        raise IndexError(f"{bad} entries or rows of a CSR matrix lie outside its {adj.col_indices().numel()} "
                         f"entries or the {x.shape[0]} rows it multiplies")


def _check_rows(rows: Tensor, num_rows: int) -> None:
    """``IndexError`` unless every id of ``rows`` lies in a table of ``num_rows`` rows (numba checks no bounds)."""
    if rows.numel():
        lo, hi = torch.aminmax(rows)
        if int(lo) < 0 or int(hi) >= num_rows:
            raise IndexError(f"row ids in [{int(lo)}, {int(hi)}] outside a table of {num_rows} rows")


def _line(x: Tensor) -> int:
    """Elements of ``x`` per 64-byte cache line (what the kernels prefetch at a time)."""
    return max(64 // x.element_size(), 1)


def csr_mm(adj: Tensor, x: Tensor, out: Tensor | None = None) -> Tensor:
    """``adj @ x`` for a CPU sparse CSR ``adj`` (``[rows, n]``) and dense ``x`` (``[n, F]``): each output row the
    sum, in the row's order, of its entries' values times their rows of ``x``, one multiply and one add each (no
    fused multiply-add). Torch's CSR product on the CPU (MKL's) agrees to rounding; bitwise where MKL fuses no
    multiply-add (this repo's machine). Entries and rows outside ``x`` or ``adj``'s entries raise
    ``IndexError`` (after the product, whose output is then dropped). Written into ``out`` when given (see
    :func:`_output`). ``adj`` and ``x`` must satisfy :func:`csr_mm_applies`."""
    arrays, x = _csr_operands(adj, x)
    out = _output(out, (adj.shape[0], x.shape[1]), x.dtype)
    _raise_if_bad(_csr_kernels(0).csr_mm(*arrays, out.numpy(), PREFETCH_AHEAD, _line(x)), adj, x)
    return out


def csr_mm_add_applies(adj: Tensor, x: Tensor, host: Tensor) -> bool:
    """Whether :func:`csr_mm_add` takes them: :func:`csr_mm_applies` for ``adj`` and ``x`` with a product of at
    least :data:`MIN_ELEMENTS` multiply-adds (entries times width: the torch path then makes the product and adds
    it with ``index_add_``, slower from there even for rows too narrow for :func:`csr_mm`), and ``host`` a
    contiguous CPU float tensor of ``x``'s dtype (not a sim device's)."""
    work = adj.values().numel() * x.shape[-1] if adj.layout == torch.sparse_csr else 0
    return (csr_mm_applies(adj, x, elements=work) and host.device.type == "cpu" and host.dtype == x.dtype
            and host.dim() == 2 and host.is_contiguous() and owner(host) is None)


def csr_mm_add(adj: Tensor, x: Tensor, host: Tensor, rows: Tensor) -> None:
    """``host[rows] += adj @ x`` without the ``[len(rows), F]`` product in memory: each row of the product summed
    as :func:`csr_mm` sums it, then added to its host row (bitwise the product followed by :func:`add_rows`).
    ``rows`` (int64, one per row of ``adj``) must be distinct; they are checked to lie in ``host`` before any
    write (``IndexError``); entries outside ``x`` are skipped, counted, and raise ``IndexError`` after."""
    if rows.shape != (adj.shape[0],) or rows.dtype != torch.int64 or host.shape[1:] != x.shape[1:]:
        raise ValueError(f"cannot add {tuple(adj.shape)} @ {tuple(x.shape)} into {tuple(host.shape)} rows "
                         f"{tuple(rows.shape)} ({rows.dtype})")
    arrays, x = _csr_operands(adj, x)
    _check_rows(rows, host.shape[0])
    kernels = _csr_kernels(x.shape[1])
    bad = kernels.csr_mm_add(*arrays, host.numpy(), rows.contiguous().numpy(), PREFETCH_AHEAD, _line(x))
    _raise_if_bad(bad, adj, x)


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
    _check_rows(rows, host.shape[0])
    _kernels().add_rows(host.numpy(), rows.contiguous().numpy(), src.detach().contiguous().numpy())
