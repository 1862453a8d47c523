"""Files gnnscale writes atomically (a temporary sibling renamed into place) get the permissions a plain
``open()`` or ``mkdir`` would give them under the process's umask -- ``tempfile`` creates them 0600 / 0700."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


def current_umask() -> int:
    """The process's umask, read from ``/proc`` where it can be (setting it to read it races with threads)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def honour_umask(path: Path | str) -> None:
    """Give ``path`` (a file, or a directory and everything in it) the mode the umask allows: 0666 / 0777 minus
    the umask, as if created without ``tempfile``."""
    mask = current_umask()
    path = Path(path)
    if path.is_dir():
        os.chmod(path, 0o777 & ~mask)
        for child in path.rglob("*"):
            os.chmod(child, (0o777 if child.is_dir() else 0o666) & ~mask)
    else:
        os.chmod(path, 0o666 & ~mask)


@contextmanager
def atomic_file(path: str | os.PathLike[str], *, durable: bool = False) -> Iterator[BinaryIO]:
    """Write ``path`` through a hidden temporary sibling that is renamed onto it when the ``with`` body ends, so
    ``path`` holds the old content or the new, never part of one (and nothing is left when the body fails). The
    file gets the umask's permissions. ``durable``: fsync the file before the rename and the folder after (a
    checkpoint must survive a power cut); temporaries a killed writer left beside ``path`` are removed then."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        honour_umask(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        try:
            dfd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError:
            pass
        for stale in path.parent.glob(f".{path.name}.*.tmp"):
            stale.unlink(missing_ok=True)
