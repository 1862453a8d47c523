"""Checks on what a file says before any library sees it: index arrays and shapes of sparse matrices (CSR and COO
parts), array lengths and dense sizes.

numpy's and scipy's C routines (``csr_todense``, ``expandptr``, ``tocoo``) trust their index arrays: a row pointer
that runs backwards or a column index past the shape writes outside a buffer (a crash, or silently wrong values).
Every reader passes a file's arrays through here first; each check raises one :class:`DatasetError` naming the
file, the part and what is wrong.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from gnnscale.errors import DatasetError

__all__ = ["available_memory", "check_coo", "check_csr", "check_dense_size", "check_index", "check_shape",
           "index_array"]


def check_shape(shape: Any, where: str, what: str = "shape", ndim: int = 2) -> tuple[int, ...]:
    """``shape`` as a tuple of ``ndim`` non-negative Python ints (from a list, tuple or integer array); anything
    else (floats, negatives, another length) is a DatasetError ``WHERE: WHAT ...``."""
    arr = np.asarray(shape, dtype=object) if isinstance(shape, tuple) else np.asarray(shape)
    if arr.ndim != 1 or arr.shape[0] != ndim:
        raise DatasetError(f"{where}: {what} {_show(shape)} is not {ndim} sizes")
    out = []
    for v in arr.tolist():
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise DatasetError(f"{where}: {what} {_show(shape)} must hold non-negative integers")
        out.append(int(v))
    return tuple(out)


def index_array(a: Any, where: str, what: str) -> np.ndarray:
    """``a`` as given when it is a 1-D integer numpy array; a DatasetError ``WHERE: WHAT ...`` for anything else
    (floats, objects, several dimensions)."""
    if not isinstance(a, np.ndarray):
        raise DatasetError(f"{where}: {what}: expected an integer array, found {type(a).__name__}")
    if a.dtype.kind not in "iu" or a.ndim != 1:
        raise DatasetError(f"{where}: {what}: expected a 1-D integer array, found {a.dtype}{list(a.shape)}")
    return a


def check_index(idx: Any, bound: int, where: str, what: str = "index") -> np.ndarray:
    """``idx``: a 1-D integer array with every value in ``[0, bound)``; returned as given. The error names
    ``where``, ``what`` and the first value out of range."""
    idx = index_array(idx, where, what)
    if idx.size:
        lo, hi = int(idx.min()), int(idx.max())
        if lo < 0 or hi >= bound:
            bad = lo if lo < 0 else hi
            raise DatasetError(f"{where}: {what} {bad:,} is out of range (0..{bound - 1:,})")
    return idx


def check_csr(indptr: Any, indices: Any, shape: Any, where: str, data: Any = None, part: str = "",
              finite: bool = False) -> tuple[int, int]:
    """The parts of a CSR matrix as a file gives them: ``indptr`` of ``rows + 1`` integers from 0, non-decreasing,
    ending at ``len(indices)``; ``indices`` integers in ``[0, cols)``; ``data`` (when given) one value per entry,
    each finite with ``finite`` (features). Returns ``(rows, cols)``; a DatasetError naming ``where`` (the file),
    ``part`` (which matrix of it, e.g. ``attr``) and the first broken rule otherwise."""
    p = f"{part} " if part else ""
    rows, cols = check_shape(shape, where, f"{p}shape")
    ip = index_array(indptr, where, f"{p}indptr")
    ind = index_array(indices, where, f"{p}indices")
    if ip.shape[0] != rows + 1:
        raise DatasetError(f"{where}: {p}indptr has {ip.shape[0]:,} entries for {rows:,} rows (expected "
                           f"{rows + 1:,})")
    if int(ip[0]) != 0 or int(ip[-1]) != ind.shape[0]:
        raise DatasetError(f"{where}: {p}indptr runs {int(ip[0]):,}..{int(ip[-1]):,}; it must run from 0 to the "
                           f"number of entries, {ind.shape[0]:,}")
    if rows > 1 and bool((ip[1:] < ip[:-1]).any()):
        row = int(np.flatnonzero(ip[1:] < ip[:-1])[0])
        raise DatasetError(f"{where}: {p}indptr decreases after row {row:,} ({int(ip[row]):,} -> "
                           f"{int(ip[row + 1]):,}); a row pointer must be non-decreasing")
    check_index(ind, cols, where, f"{p}column index")
    _check_data(data, ind.shape[0], where, p)
    if finite and data is not None and data.dtype.kind == "f" and not bool(np.isfinite(data).all()):
        raise DatasetError(f"{where}: {p}values contain NaN or inf, the first at entry "
                           f"{int(np.flatnonzero(~np.isfinite(data))[0]):,}")
    return rows, cols


def check_coo(row: Any, col: Any, shape: Any, where: str, data: Any = None, part: str = "") -> tuple[int, int]:
    """The parts of a COO matrix: ``row`` and ``col`` integer arrays of one length, within ``shape``; ``data`` one
    value per entry. Returns ``(rows, cols)``."""
    p = f"{part} " if part else ""
    rows, cols = check_shape(shape, where, f"{p}shape")
    r = check_index(row, rows, where, f"{p}row index")
    c = check_index(col, cols, where, f"{p}column index")
    if r.shape != c.shape:
        raise DatasetError(f"{where}: {p}{r.shape[0]:,} row indices but {c.shape[0]:,} column indices")
    _check_data(data, r.shape[0], where, p)
    return rows, cols


def _check_data(data: Any, nnz: int, where: str, p: str) -> None:
    if data is None:
        return
    if not isinstance(data, np.ndarray) or data.dtype.kind not in "biuf" or data.shape != (nnz,):
        found = f"{data.dtype}{list(data.shape)}" if isinstance(data, np.ndarray) else type(data).__name__
        raise DatasetError(f"{where}: {p}data: expected {nnz:,} numeric values (one per entry), found {found}")


def check_dense_size(rows: int, cols: int, itemsize: int, where: str, copies: int = 3) -> None:
    """A dense ``rows x cols`` matrix whose ``copies`` (a reader densifies, converts and normalises) cannot fit in
    the memory this machine has available is one DatasetError: not an allocator traceback, nor a process the
    kernel kills when the pages are touched."""
    need = rows * cols * itemsize
    have = available_memory()
    if have is not None and need * copies > have:
        raise DatasetError(f"{where}: a dense {rows:,} x {cols:,} matrix needs {need / 2**30:,.1f} GiB ({copies} "
                           f"copies while it is read), more than this machine has available "
                           f"({have / 2**30:,.1f} GiB)")


def available_memory() -> int | None:
    """Bytes of memory available for new allocations (Linux's ``MemAvailable``, else the physical memory);
    ``None`` where neither is known."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _show(v: Any) -> str:
    text = repr(v.tolist() if isinstance(v, np.ndarray) else v)
    return text if len(text) <= 60 else text[:57] + "..."
