"""Happens-before on the sim device: stream clocks, and marks of who touched which bytes.

Every stream counts the work issued on it (``seq``). ``clock.seen`` maps each other stream to how much of its work
this one is ordered after: waiting on a stream or on an event raises it (and takes the other's ``seen`` along:
waits are transitive). The host has such a map too (raised by each host synchronisation); a stream issuing new
work first takes it over (:func:`catch_up`: the host issued that work after it waited).

A mark says "stream ``t`` read (or wrote) bytes ``lo..hi`` of a storage as its op ``seq``". Work on stream ``x``
that touches bytes another stream wrote, or writes bytes another stream read, while ``x`` is not ordered after
that mark, is a race: :func:`check` raises :class:`~gnnscale.runtime.errors.StreamOrderError`.

Freed memory, as CUDA's caching allocator reuses it. A storage belongs to the stream it was allocated on
(:func:`allocated`); when it is freed its bytes go back to that stream at once, unless another stream's use was
declared with ``record_stream`` (:func:`recorded`: the allocator then keeps them until that stream's work is done).
A storage freed while another stream of its device may still use it undeclared (a mark the owner is not ordered
after and the host has not waited for) leaves a debt on its owner; the owner's next allocation (:func:`check_reuse`)
raises StreamOrderError unless it waited for that use since (or the host did): the allocator could hand it those
bytes.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field

from torch import Tensor

from gnnscale.runtime.errors import StreamOrderError
from gnnscale.runtime.pool import LOCK, span

__all__ = ["Clock", "allocated", "catch_up", "check", "check_host_read", "check_reuse", "host_saw", "mark", "merge",
           "recorded"]


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
    local: bool = True  # False: an op of another device's scope, on its own stream there (not this pool's user)


@dataclass(eq=False)
class _Buf:
    marks: list[_Mark] = field(default_factory=list)
    owner: Clock | None = None  # the stream the storage was allocated on (None: not a pool allocation)
    recorded: weakref.WeakSet[Clock] = field(default_factory=weakref.WeakSet)  # streams named by record_stream
    nbytes: int = 0


@dataclass(eq=False)
class _Debt:
    """Bytes freed back to ``owner`` while ``user`` may still use them (its op ``seq``), undeclared."""

    user: weakref.ref[Clock]
    seq: int
    nbytes: int


_BUFS: dict[int, _Buf] = {}  # storage key -> its marks; dropped with the storage
_DEBTS: weakref.WeakKeyDictionary[Clock, list[_Debt]] = weakref.WeakKeyDictionary()  # owner -> freed too early
_HOST: weakref.WeakKeyDictionary[Clock, int] = weakref.WeakKeyDictionary()  # what the host has waited for


def merge(clock: Clock, vec: Mapping[Clock, int]) -> None:
    """``clock`` is now ordered after ``vec`` too (call with the sim lock held)."""
    for s, n in vec.items():
        if s is not clock and clock.seen.get(s, 0) < n:
            clock.seen[s] = n


def _drop(key: int) -> None:
    with LOCK:
        buf = _BUFS.pop(key, None)
        owner = buf.owner if buf is not None else None
        if buf is None or owner is None:
            return
        for m in buf.marks:
            if m.local and m.clock is not owner and _same_pool(m.clock, owner) and m.clock not in buf.recorded \
                    and not _ordered(owner, m) and _HOST.get(m.clock, 0) < m.seq:
                _DEBTS.setdefault(owner, []).append(_Debt(weakref.ref(m.clock), m.seq, buf.nbytes))


def _same_pool(a: Clock, b: Clock) -> bool:
    """Whether two streams allocate from one pool (one device). A copy between devices is ordered with both
    devices' streams (CUDA issues it on the source device's stream), so another device's use leaves no debt."""
    return getattr(a, "device", None) is getattr(b, "device", None)


def _buf(t: Tensor, key: int) -> _Buf:
    buf = _BUFS.get(key)
    if buf is None:
        buf = _BUFS[key] = _Buf()
        fin = weakref.finalize(t.untyped_storage(), _drop, key)
        fin.atexit = False
    return buf


def allocated(x: Clock, t: Tensor) -> None:
    """``t``'s storage was just allocated on stream ``x`` (call with the sim lock held)."""
    sp = span(t)
    if sp is not None:
        buf = _buf(t, sp[0])
        buf.owner, buf.nbytes = x, t.untyped_storage().nbytes()


def recorded(x: Clock, t: Tensor) -> None:
    """``record_stream(t, x)``: freeing ``t``'s storage waits for ``x``'s work on it (call with the lock held)."""
    sp = span(t)
    if sp is not None:
        _buf(t, sp[0]).recorded.add(x)


def check_reuse(x: Clock, what: str) -> None:
    """Raise StreamOrderError if an allocation on ``x`` could get bytes freed while another stream may still use
    them (see the module docstring); debts ``x`` or the host has waited past are settled."""
    debts = _DEBTS.get(x)
    if not debts:
        return
    live = []
    for d in debts:
        user = d.user()
        if user is not None and x.seen.get(user, 0) < d.seq and _HOST.get(user, 0) < d.seq:
            live.append((d, user))
    _DEBTS[x] = [d for d, _ in live[1:]]
    if live:
        d, user = live[0]
        raise StreamOrderError(
            f"{what} on {x} may reuse {d.nbytes} bytes freed while {user} may still use them (its op {d.seq}): they "
            f"were allocated on {x} and used on {user} without record_stream(tensor, {user}), and {x} has not "
            f"waited for {user} since: call record_stream, or keep the tensor until {x} waits for {user}")


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


def check_host_read(x: Clock, t: Tensor, what: str) -> None:
    """Raise StreamOrderError if the host reading ``t``, a value computed on stream ``x``, has not waited for all
    the work issued on ``x`` so far, or for another stream's write of ``t``'s bytes (call with the lock held)."""
    if _HOST.get(x, 0) < x.seq:
        raise StreamOrderError(
            f"{what} of a value computed on {x}, and the host has not waited for {x} since its op "
            f"{_HOST.get(x, 0)} (it is at op {x.seq}): call synchronize({x}) first")
    sp = span(t)
    buf = _BUFS.get(sp[0]) if sp is not None else None
    if sp is None or buf is None:
        return
    for m in buf.marks:
        if m.lo < sp[2] and sp[1] < m.hi and m.write and _HOST.get(m.clock, 0) < m.seq:
            raise StreamOrderError(
                f"{what} reads bytes {sp[1]}..{sp[2]} of a buffer that {m.clock} wrote (its op {m.seq}), and the host "
                f"has not waited for {m.clock} since: call synchronize({m.clock}) first")


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


def mark(x: Clock, t: Tensor, write: bool, local: bool = True) -> None:
    """Record that ``x`` reads (or writes) ``t``'s bytes as its next op (``local=False``: an op issued in another
    device's scope, which a GPU runs on that device's stream: it leaves no debt when ``t`` is freed). Marks that
    ``x`` is ordered after and whose bytes this one covers are dropped: whoever is ordered after this mark is
    ordered after them."""
    sp = span(t)
    if sp is None:
        return
    key, lo, hi = sp
    buf = _buf(t, key)
    x.seq += 1
    buf.marks = [m for m in buf.marks if not (
        lo <= m.lo and m.hi <= hi and _ordered(x, m) and (write or (not m.write and m.clock is x)))]
    buf.marks.append(_Mark(lo, hi, x, x.seq, write, local))
