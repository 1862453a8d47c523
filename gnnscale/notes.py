"""One-line notes and warnings on stderr: what a reader did to the data (symmetrised it, removed self-loops, ignored
a column) or suspects about it. Each is a single ``note: ...`` or ``warning: ...`` line written in one call, so
the lines of ranks sharing a terminal do not interleave. Bad input is an error instead (:mod:`gnnscale.errors`).
"""

from __future__ import annotations

import sys


def _line(kind: str, text: str) -> None:
    line = f"{kind}: " + " ".join(text.split()) + "\n"  # one line, whatever the text holds
    sys.stderr.write(line)
    sys.stderr.flush()


def note(text: str) -> None:
    """Say on stderr what was done to the data (``note: ...``)."""
    _line("note", text)


def warn(text: str) -> None:
    """Say on stderr what looks wrong but is not an error (``warning: ...``)."""
    _line("warning", text)
