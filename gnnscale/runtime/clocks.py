"""Happens-before on the sim device: stream clocks, and marks of who touched which bytes.

Every stream counts the work issued on it (``seq``). ``clock.seen`` maps each other stream to how much of its work
this one is ordered after: waiting on a stream or on an event raises it (and takes the other's ``seen`` along:
waits are transitive). The host has such a map too (raised by each host synchronisation); a stream issuing new
work first takes it over (:func:`catch_up`: the host issued that work after it waited).

A mark says "stream ``t`` read (or wrote) bytes ``lo..hi`` of a storage as its op ``seq``". Work on stream ``x``
that touches bytes another stream wrote, or writes bytes another stream read, while ``x`` is not ordered after
that mark, is a race: :func:`check` raises :class:`~gnnscale.runtime.errors.StreamOrderError`.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field

from torch import Tensor

from gnnscale.runtime.errors import StreamOrderError
from gnnscale.runtime.pool import LOCK, span

__all__ = ["Clock", "catch_up", "check", "host_saw", "mark", "merge"]


class Clock:
    """A stream's place in the order: its own work count and what it is ordered after."""

    def __init__(self, name: str):
        self.name = name
        self.seq = 0
        """Work issued on this stream so far (copies and marks)."""
        self.seen: weakref.WeakKeyDictionary[Clock, int] = weakref.WeakKeyDictionary()
        """Each other stream -> how much of its work this one is ordered after."""

    def __str__(self) -> str:
        return self.name

    def vector(self) -> dict[Clock, int]:
        """Everything this stream's work so far is ordered after, itself included (what an event captures)."""
        vec = dict(self.seen)
        vec[self] = self.seq
        return vec


@dataclass(eq=False)
class _Mark:
    lo: int
    hi: int
    clock: Clock
    seq: int
    write: bool


@dataclass(eq=False)
class _Buf:
    marks: list[_Mark] = field(default_factory=list)


_BUFS: dict[int, _Buf] = {}  # storage key -> its marks; dropped with the storage
_HOST: weakref.WeakKeyDictionary[Clock, int] = weakref.WeakKeyDictionary()  # what the host has waited for


def merge(clock: Clock, vec: Mapping[Clock, int]) -> None:
    """``clock`` is now ordered after ``vec`` too (call with the sim lock held)."""
    for s, n in vec.items():
        if s is not clock and clock.seen.get(s, 0) < n:
            clock.seen[s] = n


def _drop(key: int) -> None:
    with LOCK:
        _BUFS.pop(key, None)


def _ordered(x: Clock, m: _Mark) -> bool:
    return m.clock is x or x.seen.get(m.clock, 0) >= m.seq


def catch_up(x: Clock) -> None:
    """``x`` is about to get new work: it comes after everything the host has waited for."""
    merge(x, _HOST)


def host_saw(vec: Mapping[Clock, int]) -> None:
    """The host has waited for ``vec``: remember it, and drop the marks every later issue is ordered after."""
    for s, n in vec.items():
        if _HOST.get(s, 0) < n:
            _HOST[s] = n
    for buf in list(_BUFS.values()):
        buf.marks = [m for m in buf.marks if _HOST.get(m.clock, 0) < m.seq]


def check(x: Clock, t: Tensor, write: bool, what: str) -> None:
    """Raise StreamOrderError if ``what`` on ``x`` touching ``t`` (writing it when ``write``) races with another
    stream's marked use of those bytes."""
    sp = span(t)
    buf = _BUFS.get(sp[0]) if sp is not None else None
    if sp is None or buf is None:
        return
    _, lo, hi = sp
    for m in buf.marks:
        if m.lo < hi and lo < m.hi and (m.write or write) and not _ordered(x, m):
            did = "wrote" if m.write else "may still read"
            raise StreamOrderError(
                f"{what} on {x} {'writes' if write else 'reads'} bytes {lo}..{hi} of a buffer that {m.clock} "
                f"{did} (its op {m.seq}), and {x} has not waited for {m.clock} since: call "
                f"wait_stream({x}, {m.clock}) or wait on an event recorded on {m.clock} after that use")


def mark(x: Clock, t: Tensor, write: bool) -> None:
    """Record that ``x`` reads (or writes) ``t``'s bytes as its next op. Marks that ``x`` is ordered after and
    whose bytes this one covers are dropped: whoever is ordered after this mark is ordered after them."""
    sp = span(t)
    if sp is None:
        return
    key, lo, hi = sp
    buf = _BUFS.get(key)
    if buf is None:
        buf = _BUFS[key] = _Buf()
        fin = weakref.finalize(t.untyped_storage(), _drop, key)
        fin.atexit = False
    x.seq += 1
    buf.marks = [m for m in buf.marks if not (
        lo <= m.lo and m.hi <= hi and _ordered(x, m) and (write or (not m.write and m.clock is x)))]
    buf.marks.append(_Mark(lo, hi, x, x.seq, write))
