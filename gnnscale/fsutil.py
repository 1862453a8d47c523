"""Files gnnscale writes atomically (a temporary sibling renamed into place) get the permissions a plain
``open()`` or ``mkdir`` would give them under the process's umask -- ``tempfile`` creates them 0600 / 0700."""

from __future__ import annotations

import os
from pathlib import Path


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
