"""Files gnnscale writes atomically (a temporary sibling renamed into place) get the permissions a plain
``open()`` or ``mkdir`` would give them under the process's umask -- ``tempfile`` creates them 0600 / 0700.

Every output path a command takes (``--save-model``, ``--checkpoint``, ``--metrics``, ``--out``) is checked
before any work by :func:`check_output` and written through :func:`write_output`, which creates missing folders
and keeps the work on a fallback path when the write fails late."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from gnnscale.errors import ConfigError


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


# ------------------------------------------------------------------------------------------------ outputs
def check_output(path: str | os.PathLike[str], flag: str, *, folder: bool = False) -> Path:
    """Before any work: ``path`` (a file, or with ``folder`` a folder) can be written. The nearest folder that
    exists above it must be a folder gnnscale can create files in (tried with a hidden temporary file, which is
    removed); folders missing below it are created when the output is written (:func:`write_output`). Anything
    else is one :class:`ConfigError` naming ``flag`` and the path."""
    p = Path(path)
    if not str(path).strip():
        raise ConfigError(f"{flag}: give a path")
    if folder and p.exists() and not p.is_dir():
        raise ConfigError(f"{flag} {p} is a file, not a folder")
    if not folder and p.is_dir():
        raise ConfigError(f"{flag} {p} is a folder; give a file path")
    if not folder and p.exists() and not os.access(p, os.W_OK):
        raise ConfigError(f"{flag} {p}: the file exists and cannot be written")
    above = p.absolute().parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        raise ConfigError(f"{flag} {p}: {above} is a file, not a folder")
    probe_dir = p if folder and p.is_dir() else above
    try:
        fd, probe = tempfile.mkstemp(prefix=".gnnscale-probe.", dir=probe_dir)
    except OSError as exc:
        raise ConfigError(f"{flag} {p}: cannot write in {probe_dir} ({exc.strerror or exc})") from None
    os.close(fd)
    os.unlink(probe)
    return p


def make_parents(path: str | os.PathLike[str]) -> Path:
    """Create the folders above ``path`` that are missing (with the umask's permissions); ``path`` back."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    return p


def fallback_paths(path: str | os.PathLike[str]) -> list[Path]:
    """Where an output that could not be written at ``path`` goes instead: a new file of the same name in the
    working folder, else in the temporary folder (a number added to the name where one exists)."""
    p = Path(path)
    out = []
    for folder in (Path.cwd(), Path(tempfile.gettempdir())):
        alt, k = folder / p.name, 1
        while alt.exists() or alt.absolute() == p.absolute():
            alt, k = folder / f"{p.stem}-{k}{p.suffix}", k + 1
        out.append(alt)
    return out


def write_output(path: str | os.PathLike[str], write: Callable[[Path], object], *, flag: str, what: str) -> Path:
    """``write(path)`` after creating the folders above ``path``. A write that fails (the folder went away, the
    disk is full, the share is read-only) keeps the work: ``write`` runs again on a fallback path
    (:func:`fallback_paths`), and a :class:`ConfigError` says ``could not write PATH (reason); the WHAT is at
    FALLBACK``. Returns the path written."""
    p = Path(path)
    try:
        write(make_parents(p))
        return p
    except OSError as exc:
        reason = exc.strerror or str(exc)
    tried = []
    for alt in fallback_paths(p):
        try:
            write(alt)
        except OSError:
            tried.append(str(alt.parent))
            continue
        raise ConfigError(f"could not write {p} ({flag}: {reason}); the {what} is at {alt}")
    raise ConfigError(f"could not write {p} ({flag}: {reason}), nor a copy of the {what} in {' or '.join(tried)}")


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    """``text`` to ``path`` (UTF-8) atomically, with the umask's permissions."""
    with atomic_file(path) as fh:
        fh.write(text.encode())
    return Path(path)
