"""What several commands share: the metrics file, number lists, printing an accuracy, and a failed write."""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gnnscale.errors import ConfigError
from gnnscale.fsutil import (
    OutputLock,
    atomic_file,
    check_output,
    fallback_paths,
    lock_output,
    make_parents,
    write_all,
)
from gnnscale.notes import warn


class _MetricsWriter:
    """JSON Lines to FILE, one record per finished epoch, written as it comes (an interrupted or failed run keeps
    the epochs it finished; the summary record comes last, only when training ends). FILE is created at the first
    record, so bad input that stops a run before its first epoch leaves nothing behind.

    The writer holds FILE's lock (:func:`gnnscale.fsutil.lock_output`) from now until :meth:`close`, so a second
    run on the same FILE is refused instead of tearing its lines. A write that fails (a full disk) does not stop
    training: one warning says so, the records are kept, and each later record tries again (from the last whole
    record: a torn line is cut); at :meth:`close` the records still unwritten go to FILE if it can take them now,
    else to a copy in the working or temporary folder, and a warning says where."""

    def __init__(self, path: str):
        self.path = check_output(path, "--metrics")
        self.lock: OutputLock | None = lock_output(self.path, "--metrics")
        self.fd: int | None = None
        self.lines: list[bytes] = []  # every record so far
        self.good = 0  # bytes of FILE that are whole records
        self.done = 0  # records among them
        self.failed = False

    def write(self, record: dict[str, Any]) -> None:
        self.lines.append((json.dumps(_finite(record), allow_nan=False) + "\n").encode())
        self._catch_up()

    def _catch_up(self) -> bool:
        """Write the records FILE lacks; whether it has them all now."""
        try:
            if self.fd is None:
                self.fd = os.open(make_parents(self.path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
            if self.failed:  # cut what a failed write left of a line
                os.ftruncate(self.fd, self.good)
            data = b"".join(self.lines[self.done :])
            os.lseek(self.fd, self.good, os.SEEK_SET)
            write_all(self.fd, data)
        except OSError as exc:
            if not self.failed:
                warn(f"could not write --metrics {self.path} ({exc.strerror or exc}): training goes on; its records "
                     "are kept and written when the disk takes them")
            self.failed = True
            return False
        self.good += len(data)
        self.done = len(self.lines)
        return True

    def close(self) -> None:
        try:
            if self.failed and not self._catch_up():
                self._copy_elsewhere()
            if self.fd is not None:
                os.close(self.fd)
                self.fd = None
        finally:
            if self.lock is not None:
                self.lock.release()
                self.lock = None

    def _copy_elsewhere(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, self.good)  # FILE keeps its whole records only
        data = b"".join(self.lines)
        for alt in fallback_paths(self.path):
            try:
                with atomic_file(alt) as fh:
                    fh.write(data)
            except OSError:
                continue
            warn(f"--metrics {self.path} holds the first {self.done} of {len(self.lines)} records (the disk was "
                 f"full); all {len(self.lines)} are in {alt}")
            return
        warn(f"--metrics {self.path} holds the first {self.done} of {len(self.lines)} records; the others could not "
             "be written anywhere (the disk was full)")


def _finite(v: Any) -> Any:
    """``v`` with NaN and infinities as ``None`` (JSON has no NaN: ``JSON.parse`` and strict parsers reject it)."""
    if isinstance(v, float):
        return v if v == v and v not in (float("inf"), float("-inf")) else None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


def _fmt(v: float | None) -> str:
    return "  n/a " if v is None else f"{v:.4f}"


def _device_list(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    items = tuple(d.strip() for d in text.split(","))
    if not all(items):
        raise ConfigError(f"--devices {text!r}: give a comma-separated list such as cuda:0,cuda:1")
    return items


def _num_list(flag: str, text: str | None, kind: type[float] | type[int], example: str) -> Any:
    """``a,b,c`` as a tuple of ``kind``; ``None`` stays ``None``; anything else is one error naming the flag."""
    if text is None:
        return None
    what = "integers" if kind is int else "numbers"
    try:
        values = tuple(kind(v) for v in text.split(","))
    except ValueError:
        raise ConfigError(f"{flag} {text!r}: give comma-separated {what} such as {example}") from None
    if kind is int and any(abs(v) >= 2**63 for v in values):
        raise ConfigError(f"{flag} {text!r}: a number is out of range (int64); give {what} such as {example}")
    return values


def writes_folder(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``command`` (one that writes the folder ``args.out`` through ``graph.io.partial_dir``, which removes the
    partial folder on any failure) with an ``OSError`` on its way -- a full disk: ``No space left on device``, or
    numpy's ``N requested and M written`` -- said as one ConfigError line, not a traceback; the folders it created
    above ``args.out`` are removed too."""

    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        out = Path(args.out).absolute()
        missing = [p for p in out.parents if not p.exists()]  # folders the command may create above the output
        try:
            return command(args)
        except BrokenPipeError:
            raise  # stdout closed under the final line (| head): main() ends quietly
        except OSError as exc:
            for folder in missing:  # deepest first; only those still empty
                with contextlib.suppress(OSError):
                    folder.rmdir()
            where = f"{exc.filename}: " if exc.filename else ""
            why = exc.strerror or f"{exc} (a short write: is the disk full?)"
            raise ConfigError(f"{args.command} --out {args.out}: {where}{why}; the partial output was removed, "
                              "nothing was written there") from None

    return run
