"""One rank's view of a torch.distributed job: the process group, the collectives gnnscale uses (each with the
job's timeout), what they moved, and -- when a peer dies -- which one.

The process group comes from torchrun's environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ...), or from
``gnnscale train --ranks R``, which starts the ranks through torch's launcher API and sets the same variables.
Backends: gloo on CPU, NCCL between GPUs.

Failures. A rank that dies closes its sockets, so its peers' next collective fails at once; one that hangs is
caught by the timeout. Either way the survivors raise :class:`RankFailure` naming the rank: every rank keeps a
heartbeat in the job's store (a counter it raises every :data:`HEARTBEAT_S` seconds from a thread), and a rank
that raised records its error there before it exits. A survivor names the ranks whose error it finds, or whose
heartbeat stopped.

Emulated network (validation of ``gnnscale plan --machines``): ``GNNSCALE_EMULATE_NETWORK="1Gbit,latency=100us"``
paces the comm layer's sends (no network namespace; the traffic stays on loopback): every collective takes at
least ``latency x messages + bytes / bandwidth`` (:class:`Pacer`), sleeping the difference.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from gnnscale import runtime as rt
from gnnscale.distributed.job import launched
from gnnscale.errors import ConfigError, RankFailure
from gnnscale.units import parse_network

_CURRENT: list[Comm] = []
"""The comm of this process's job, once set up (the CLI names failed peers through it)."""


def current() -> Comm | None:
    """This process's :class:`Comm`, or ``None`` outside a distributed job."""
    return _CURRENT[-1] if _CURRENT else None


def exit_rank(code: int) -> None:
    """End the process with ``code``. A rank of a failed job ends at once (``os._exit``, after flushing its
    output): tearing down a process group whose peer is gone can abort the process from a C++ thread, and the
    launcher would report that abort instead of the rank that failed first."""
    if code and current() is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)

HEARTBEAT_S = 0.25
"""Seconds between a rank's heartbeats."""
SILENT_S = 2.0
"""A rank whose heartbeat did not move for this long is named as stopped."""
SETUP_TIMEOUT = timedelta(hours=2)
"""How long ranks wait for each other while the job is set up (rank 0 may be partitioning a large graph)."""
_KEY = "gnnscale"
EMULATE_ENV = "GNNSCALE_EMULATE_NETWORK"
"""Environment variable naming an emulated network (``1Gbit,latency=100us``): :class:`Pacer`."""


def ring_rounds(world: int) -> int:
    """Messages in turn of a ring all-reduce over ``world`` ranks (reduce-scatter, then all-gather)."""
    return 2 * (world - 1)


def ring_bytes(nbytes: float, world: int) -> float:
    """Bytes each rank sends (and receives) in a ring all-reduce of ``nbytes``."""
    return 2 * (world - 1) / world * nbytes if world > 1 else 0.0


@dataclass
class Pacer:
    """An emulated network for the comm layer: each collective lasts at least ``latency x rounds + bytes /
    rate`` (``rounds``: the messages it sends in turn; ``bytes``: the larger of what this rank sent and
    received), sleeping what the real one did not take. ``clock`` and ``sleep`` are injectable (tests)."""

    rate: float
    latency: float = 0.0
    clock: Callable[[], float] = time.perf_counter
    sleep: Callable[[float], None] = time.sleep
    slept: float = 0.0

    @classmethod
    def from_env(cls) -> Pacer | None:
        spec = os.environ.get(EMULATE_ENV)
        if not spec:
            return None
        rate, latency = parse_network(spec, EMULATE_ENV)
        return cls(rate, latency or 0.0)

    def target(self, nbytes: float, rounds: int) -> float:
        return self.latency * rounds + nbytes / self.rate

    def finish(self, start: float, nbytes: float, rounds: int) -> None:
        """A collective that began at ``start`` (``clock()``) is over: wait out the emulated network's time."""
        left = self.target(nbytes, rounds) - (self.clock() - start)
        if left > 0:
            self.slept += left
            self.sleep(left)



@dataclass
class Comm:
    """This rank's process group and counters of what its collectives moved."""

    rank: int
    world: int
    device: torch.device
    timeout: timedelta
    counters: dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        ("collectives", "exchanges", "migrations", "sent_bytes", "received_bytes"), 0.0))
    _heartbeat: threading.Thread | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    pacer: Pacer | None = None
    """The emulated network (``$GNNSCALE_EMULATE_NETWORK``), or ``None``."""

    @classmethod
    def setup(cls, device: rt.Device, timeout_s: float) -> Comm:
        """Join the job from torch's environment (or the process group already made by the caller); a sim device's
        collectives run on the host (gloo), where its tensors are."""
        device = rt.torch_device(device)
        timeout = timedelta(seconds=timeout_s)
        if not dist.is_available():
            raise ConfigError("--engine distributed: this torch build has no torch.distributed")
        if not dist.is_initialized():
            if not launched():
                raise ConfigError("--engine distributed runs as a job of ranks: start it with torchrun "
                                  "(torchrun --nproc-per-node R -m gnnscale train --engine distributed ...) or give "
                                  "--ranks R to start R ranks on this machine")
            backend = "nccl" if device.type == "cuda" else "gloo"
            dist.init_process_group(backend, timeout=timeout)
        comm = cls(dist.get_rank(), dist.get_world_size(), device, timeout, pacer=Pacer.from_env())
        for old in _CURRENT:  # an earlier engine of this process, on the same group: the new one beats for it
            old.stop_heartbeat()
        _CURRENT.clear()
        comm.start_heartbeat()
        _CURRENT.append(comm)
        return comm

    # ------------------------------------------------------------------------------------------- liveness
    def _store(self) -> Any:
        return dist.distributed_c10d._get_default_store()

    def start_heartbeat(self) -> None:
        """Raise this rank's heartbeat counter in the store every :data:`HEARTBEAT_S` s (a daemon thread)."""
        try:
            store = self._store()
        except Exception:  # noqa: BLE001 -- a group without a store: no heartbeat, failures named less precisely
            return

        def beat() -> None:
            n = 0
            while not self._stop.wait(HEARTBEAT_S):
                n += 1
                try:
                    store.set(f"{_KEY}/beat/{self.rank}", str(n))
                except Exception:  # noqa: BLE001 -- the store went away: the job is ending
                    return

        self._heartbeat = threading.Thread(target=beat, name=f"gnnscale-heartbeat-{self.rank}", daemon=True)
        self._heartbeat.start()

    def stop_heartbeat(self) -> None:
        """Stop the heartbeat thread (and wait for it, so that it never writes to a store being torn down)."""
        self._stop.set()
        if self._heartbeat is not None and self._heartbeat is not threading.current_thread():
            self._heartbeat.join(timeout=2 * HEARTBEAT_S + 1.0)

    def record_error(self, message: str) -> None:
        """Leave this rank's error in the store for its peers to name (best effort)."""
        with contextlib.suppress(Exception):
            self._store().set(f"{_KEY}/error/{self.rank}", message[:500])

    def failed_ranks(self, wait_s: float = SILENT_S) -> list[str]:
        """Which peers failed: those that left an error, then those whose heartbeat stood still for ``wait_s``
        seconds. Each entry is ``"rank K: why"``."""
        try:
            store = self._store()
        except Exception:  # noqa: BLE001
            return []
        peers = [r for r in range(self.world) if r != self.rank]

        def read(key: str) -> str | None:
            try:
                if store.check([key]):
                    return bytes(store.get(key)).decode()
            except Exception:  # noqa: BLE001 -- the store itself is gone (its host died)
                return None
            return None

        out = [f"rank {r}: {msg}" for r in peers if (msg := read(f"{_KEY}/error/{r}")) is not None]
        if out:
            return out
        before = {r: read(f"{_KEY}/beat/{r}") for r in peers}
        deadline = time.monotonic() + wait_s
        moving: set[int] = set()
        while time.monotonic() < deadline and len(moving) < len(peers):
            time.sleep(HEARTBEAT_S)
            moving |= {r for r in peers if r not in moving and read(f"{_KEY}/beat/{r}") != before[r]}
        out = [f"rank {r}: {msg}" for r in peers if (msg := read(f"{_KEY}/error/{r}")) is not None]
        return out or [f"rank {r} stopped responding (it died, was killed or hangs)" for r in peers
                       if r not in moving]

    @contextlib.contextmanager
    def guard(self, what: str) -> Iterator[None]:
        """Run collectives; a failure becomes one :class:`RankFailure` naming the failed rank(s)."""
        try:
            yield
        except RankFailure:
            raise
        except (RuntimeError, dist.DistError) as exc:  # gloo/NCCL errors, timeouts, closed connections
            raise self.failure(f"during {what}", exc) from None

    def failure(self, what: str, exc: BaseException | None = None) -> RankFailure:
        who = self.failed_ranks()
        detail = "; ".join(who) if who else (str(exc).splitlines()[0][:200] if exc is not None else "unknown")
        return RankFailure(f"rank {self.rank} stops: {detail} ({what})")

    def close(self) -> None:
        """Stop the heartbeat and leave the process group."""
        self.stop_heartbeat()
        if self in _CURRENT:
            _CURRENT.remove(self)
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()

    # ----------------------------------------------------------------------------------------- collectives
    def _start(self) -> float:
        return self.pacer.clock() if self.pacer is not None else 0.0

    def _count(self, sent: int, received: int, start: float = 0.0, rounds: int | None = None,
               paced: float | None = None) -> None:
        """Count a collective; with an emulated network, pace it from ``start``: ``rounds`` messages in turn
        (default ``world - 1``: one to each peer) and ``paced`` bytes (default the larger of sent and received)."""
        self.counters["collectives"] += 1
        self.counters["sent_bytes"] += sent
        self.counters["received_bytes"] += received
        if self.pacer is not None and self.world > 1:
            self.pacer.finish(start, max(sent, received) if paced is None else paced,
                              self.world - 1 if rounds is None else rounds)

    @contextlib.contextmanager
    def _on_device(self, t: Tensor) -> Iterator[Tensor]:
        """``t`` where the backend wants it (NCCL: on this rank's GPU), copied back after the collective."""
        if t.device == self.device or dist.get_backend() == "gloo":
            yield t
            return
        moved = t.to(self.device)
        yield moved
        t.copy_(moved)

    def all_reduce(self, t: Tensor, op: str = "sum", what: str = "all-reduce") -> Tensor:
        """``t`` reduced over ranks in place (``sum`` or ``max``; paced as a ring)."""
        start = self._start()
        with self.guard(what), self._on_device(t) as on:
            dist.all_reduce(on, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
        nbytes = t.numel() * t.element_size()
        self._count(nbytes, nbytes, start, ring_rounds(self.world), ring_bytes(nbytes, self.world))
        return t

    def broadcast(self, t: Tensor, src: int = 0, what: str = "broadcast") -> Tensor:
        start = self._start()
        with self.guard(what), self._on_device(t) as on:
            dist.broadcast(on, src)
        nbytes = t.numel() * t.element_size()
        self._count(nbytes if self.rank == src else 0, 0 if self.rank == src else nbytes, start)
        return t

    def broadcast_object(self, obj: Any, src: int = 0, what: str = "broadcast") -> Any:
        box = [obj]
        with self.guard(what):
            dist.broadcast_object_list(box, src)
        self._count(0, 0)
        return box[0]

    def barrier(self, what: str, timeout: timedelta | None = None) -> None:
        """Wait for every rank (gloo: a monitored barrier, which names a rank that does not come)."""
        with self.guard(what):
            if dist.get_backend() == "gloo":
                dist.monitored_barrier(timeout=timeout or self.timeout, wait_all_ranks=True)
            else:
                dist.barrier()

    def all_to_all(self, send: Tensor, send_counts: list[int], recv_counts: list[int], what: str) -> Tensor:
        """Variable-size all-to-all of the rows of ``send`` (grouped by destination rank)."""
        width = 1
        for d in send.shape[1:]:
            width *= d
        out = torch.empty((sum(recv_counts), *send.shape[1:]), dtype=send.dtype, device=send.device)
        start = self._start()
        with self.guard(what):
            dist.all_to_all_single(out.view(-1), send.reshape(-1), [c * width for c in recv_counts],
                                   [c * width for c in send_counts])
        el = send.element_size() * width
        self._count(el * (sum(send_counts) - send_counts[self.rank]), el * (sum(recv_counts) - recv_counts[self.rank]),
                    start)
        return out

    def all_to_all_counts(self, send_counts: list[int], what: str) -> list[int]:
        """How many rows each peer will send this rank, given how many it sends each (``send_counts[r]``)."""
        send = torch.tensor(send_counts, dtype=torch.int64, device=self.device)
        recv = torch.empty_like(send)
        start = self._start()
        with self.guard(what):
            dist.all_to_all_single(recv, send)
        self._count(8 * (self.world - 1), 8 * (self.world - 1), start)
        return [int(v) for v in recv.tolist()]

    def exchange(self, ids: Tensor, owner: Tensor, serve: Callable[[Tensor], Tensor], width: int,
                 dtype: torch.dtype, what: str = "feature fetch") -> Tensor:
        """Rows of ``ids`` (``[k]``, de-duplicated, none owned by this rank) from their owners, in ``ids``'
        order: one batched request per peer (the ids), one batched reply (the rows). Every rank must call it
        together, with or without ids. ``serve(req)`` gives this rank's rows of the ids its peers asked for."""
        self.counters["exchanges"] += 1
        dev = self.device
        ids = ids.cpu()
        dest = owner[ids].to(dev)
        ids = ids.to(dev)
        order = torch.argsort(dest, stable=True)
        send_counts = torch.bincount(dest, minlength=self.world)
        recv_counts = torch.empty_like(send_counts)
        start = self._start()
        with self.guard(what):
            dist.all_to_all_single(recv_counts, send_counts)
        self._count(8 * (self.world - 1), 8 * (self.world - 1), start)
        sc, rc = send_counts.tolist(), recv_counts.tolist()
        req = self.all_to_all(ids[order], sc, rc, what)
        rows = serve(req).to(dev, dtype)
        back = self.all_to_all(rows.reshape(-1, width), rc, sc, what)
        out = torch.empty((ids.numel(), width), dtype=dtype, device=dev)
        out[order] = back
        return out

    def send_recv(self, send: Tensor, to: int, recv: Tensor, frm: int, what: str = "model migration") -> None:
        """Send ``send`` to rank ``to`` while receiving ``recv`` from rank ``frm`` (point to point)."""
        self.counters["migrations"] += 1
        ops = [dist.P2POp(dist.isend, send, to), dist.P2POp(dist.irecv, recv, frm)]
        start = self._start()
        with self.guard(what):
            for req in dist.batch_isend_irecv(ops):
                req.wait()
        self._count(send.numel() * send.element_size(), recv.numel() * recv.element_size(), start, 1)
