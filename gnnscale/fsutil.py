"""Files gnnscale writes atomically (a temporary sibling renamed into place) get the permissions a plain
``open()`` or ``mkdir`` would give them under the process's umask -- ``tempfile`` creates them 0600 / 0700.

Every output path a command takes (``--save-model``, ``--checkpoint``, ``--metrics``, ``--out``) is checked
before any work by :func:`check_output` and written through :func:`write_output`, which creates missing folders
and keeps the work on a fallback path when the write fails late."""

from __future__ import annotations

import fcntl
import os
import re
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


_TMP_SUFFIX = ".tmp"
_LEGACY_TMP = re.compile(r"[a-z0-9_]{8}")
"""The random part of the temporaries gnnscale wrote before they carried their writer's pid (``tempfile``'s)."""


def _temp_prefix(path: Path, pid: int | None = None) -> str:
    return f".{path.name}.gnnscale-{os.getpid() if pid is None else pid}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: a process of another user has the pid
        return True
    return True


def stale_temporaries(path: str | os.PathLike[str]) -> list[Path]:
    """The temporaries of :func:`atomic_file` for ``path`` that no running writer owns: ``.NAME.gnnscale-PID-*.tmp``
    of a process that is gone (killed mid-write), and ``.NAME.XXXXXXXX.tmp`` of gnnscale versions before the pid
    was in the name. Another program's files, and the temporary of a writer still running, are not among them."""
    path = Path(path)
    lead = f".{path.name}."
    out = []
    try:
        names = [e.name for e in os.scandir(path.parent)]
    except OSError:
        return []
    for name in names:
        if not (name.startswith(lead) and name.endswith(_TMP_SUFFIX)):
            continue
        middle = name[len(lead) : -len(_TMP_SUFFIX)]
        mine = re.fullmatch(r"gnnscale-(\d+)-[a-z0-9_]+", middle)
        if (mine is not None and not _alive(int(mine.group(1)))) or _LEGACY_TMP.fullmatch(middle):
            out.append(path.parent / name)
    return out


@contextmanager
def atomic_file(path: str | os.PathLike[str], *, durable: bool = False) -> Iterator[BinaryIO]:
    """Write ``path`` through a hidden temporary sibling (``.NAME.gnnscale-PID-XXXX.tmp``) that is renamed onto it
    when the ``with`` body ends, so ``path`` holds the old content or the new, never part of one (and nothing is
    left when the body fails). The file gets the umask's permissions. ``durable``: fsync the file before the rename
    and the folder after (a checkpoint must survive a power cut). Temporaries a killed writer left for ``path``
    (:func:`stale_temporaries`) are removed first, which also gives their space back to this write."""
    path = Path(path)
    for stale in stale_temporaries(path):
        stale.unlink(missing_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=_TMP_SUFFIX, dir=path.parent)
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


def write_all(fd: int, data: bytes) -> None:
    """All of ``data`` to the file descriptor ``fd`` (``os.write`` may write part of it); an ``OSError`` (a full
    disk: ``ENOSPC``) leaves what was written so far."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


# ------------------------------------------------------------------------------------------------ locks
LOCK_OWNER = "GNNSCALE_LOCK_OWNER"
"""Set in the ranks of a job started by ``--ranks`` or ``gnnscale.launch``: the pid of the process that started
them, which holds the job's output locks (a rank finds them held by it, and goes on)."""


class OutputLock:
    """An exclusive ``fcntl.flock`` on ``.NAME.lock`` beside an output, holding the pid of the process that took it.
    The kernel lets it go when the process ends, however it ends (SIGKILL too); :meth:`release` also removes the
    file, and the folders made for it when they are empty."""

    def __init__(self, path: Path, fd: int | None, made: list[Path]):
        self.path, self.fd, self.made = path, fd, made

    def release(self) -> None:
        if self.fd is None:
            return
        self.path.unlink(missing_ok=True)  # while held: a run waiting on the old file sees it replaced (lock_output)
        os.close(self.fd)
        self.fd = None
        for folder in self.made:
            try:
                folder.rmdir()
            except OSError:
                break

    def __enter__(self) -> OutputLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_path(path: str | os.PathLike[str]) -> Path:
    """The lock file of the output ``path``: ``.NAME.lock`` in its folder."""
    p = Path(path)
    return p.parent / f".{p.name}.lock"


def lock_output(path: str | os.PathLike[str], flag: str, shown: str | os.PathLike[str] | None = None) -> OutputLock:
    """Take the lock of the output ``path`` (:class:`OutputLock`) for this run, or refuse in one
    :class:`ConfigError` naming the run that holds it (its pid): two runs writing one checkpoint or metrics file
    would tear it. A lock held by the process that started this rank's job (:data:`LOCK_OWNER`) is this job's.
    ``shown``: the path the error names (the ``--checkpoint`` folder of ``DIR/checkpoint.pt``)."""
    p = Path(path)
    target = lock_path(p)
    made = []
    above = target.parent
    while not above.exists():
        made.append(above)
        above = above.parent
    shown = shown or p
    while True:
        try:
            for folder in reversed(made):
                folder.mkdir(exist_ok=True)
            fd = os.open(target, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            raise ConfigError(f"{flag} {shown}: cannot create its lock file {target} ({exc.strerror or exc})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            if holder and holder == os.environ.get(LOCK_OWNER):
                return OutputLock(target, None, [])
            who = f"pid {holder}" if holder.isdigit() else "its pid unknown"
            raise ConfigError(f"{flag} {shown} is in use by another gnnscale run ({who}); wait for it to end, or "
                              "give another path") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(target).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the run that held it removed it as we waited: lock the new file
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return OutputLock(target, fd, made)


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
