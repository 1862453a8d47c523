"""The tensors :func:`gnnscale.graph.io.open_dir` memory-maps, and the files they map: :func:`register_mapped`
records each (a weak reference, the tensor's version counter, the file's identity), :func:`mapped_file` finds the
file of exactly that tensor again on any OS (not a copy, a slice, a view, a tensor written to since, or a file
replaced since), so the disk tier can read rows from the file instead of the mapping."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import weakref
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["MappedFile", "mapped_file", "register_mapped", "release_pages"]


@dataclass(frozen=True)
class MappedFile:
    """The ``.npy`` file a tensor of :func:`~gnnscale.graph.io.open_dir` maps, as it was then: ``offset`` of its
    data, the ``dtype`` it was mapped as (``bfloat16`` for a bf16 directory's ``uint16`` x.npy), and ``stat`` =
    ``(st_dev, st_ino, st_size, st_mtime_ns)`` (a file replaced or rewritten since is not it)."""

    path: Path
    offset: int
    dtype: torch.dtype
    stat: tuple[int, int, int, int]


# id(tensor) -> (its file, a weak reference to it, its version counter when mapped); removed when the tensor is
# freed, and a lookup checks that the referent *is* the tensor asked about (a later tensor may reuse the id).
_MAPPED: dict[int, tuple[MappedFile, weakref.ref[torch.Tensor], int]] = {}


def _file_stat(path: Path) -> tuple[int, int, int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def register_mapped(t: torch.Tensor, path: Path, offset: int) -> None:
    key, ref = id(t), weakref.ref(t)
    _MAPPED[key] = (MappedFile(path.resolve(), offset, t.dtype, _file_stat(path)), ref, t._version)
    weakref.finalize(t, _forget_mapped, key, ref)


def _forget_mapped(key: int, ref: weakref.ref[torch.Tensor]) -> None:
    entry = _MAPPED.get(key)
    if entry is not None and entry[1] is ref:  # not the entry of a later tensor with the same id
        del _MAPPED[key]


def mapped_file(t: torch.Tensor) -> MappedFile | None:
    """The file whose whole array ``t`` is, as :func:`~gnnscale.graph.io.open_dir` mapped it: ``t`` itself (not a
    copy, a slice or a view), not written to since (the mapping is copy-on-write) and the file unchanged; else
    ``None``."""
    entry = _MAPPED.get(id(t))
    if entry is None or entry[1]() is not t or t._version != entry[2]:
        return None
    try:
        return entry[0] if _file_stat(entry[0].path) == entry[0].stat else None
    except OSError:
        return None


_MADV_DONTNEED = 4
_libc: ctypes.CDLL | None = None


def release_pages(t: torch.Tensor, start: int = 0, nbytes: int | None = None) -> bool:
    """Drop the resident pages of bytes ``[start, start + nbytes)`` of the file-backed tensor ``t`` from the
    process (``madvise(MADV_DONTNEED)``): they stay in the kernel's page cache (a shared map's written pages are
    written back to its file) and are read again on the next access, but stop counting in the process's resident
    set (``VmRSS``/``VmHWM``). Only for a mapping of a file that nobody writes through a private copy: a private
    map's written pages would be lost (the graph's arrays are never written; spill files are shared maps). Linux
    only; ``False`` where it did nothing."""
    global _libc
    if not t.is_cpu or t.numel() == 0 or not hasattr(os, "sysconf"):
        return False
    if _libc is None:
        name = ctypes.util.find_library("c")
        if name is None:
            return False
        _libc = ctypes.CDLL(name, use_errno=True)
    page = os.sysconf("SC_PAGE_SIZE")
    total = t.numel() * t.element_size()
    lo = t.data_ptr() + start
    hi = t.data_ptr() + (total if nbytes is None else min(total, start + nbytes))
    lo = (lo + page - 1) // page * page  # whole pages inside the range only: never a neighbour's page
    hi = hi // page * page
    if hi <= lo:
        return False
    return _libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), _MADV_DONTNEED) == 0
