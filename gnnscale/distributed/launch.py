"""``gnnscale train --engine distributed --ranks R`` and ``gnnscale.launch(..., ranks=R)``: R ranks on this machine
through torch's launcher API (the elastic agent torchrun runs), without a separate ``torchrun`` command. Both go
through :func:`run_ranks`; each passes the function its ranks run (the CLI's ``main``, the API's rank function).

The agent starts the ranks with torch's variables set (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ...), hosts the
job's store, and stops the others when one fails. Rank 0 prints and writes the metrics; the others are silent
except for their own failures. Here the failure the agent saw first becomes one ``error:`` line naming its rank.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from gnnscale.distributed.comm import exit_rank
from gnnscale.distributed.job import LAUNCHED_BY, PEER_FAILED, PEER_GRACE_S

_QUIET_LOGGERS = ("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing",
                  "torch.distributed.run")


def _worker(entry: Callable[[Any], int], argv: Any) -> None:
    """One rank: ``entry(argv)``: the ``gnnscale`` command with the same arguments, or the API's rank function with
    its job."""
    try:
        code = entry(argv)
    except Exception:
        traceback.print_exc()  # a bug keeps its traceback (the launcher would keep it to itself)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # at once: the launcher names the rank that ended first
    if code == PEER_FAILED:
        time.sleep(PEER_GRACE_S)  # let the rank that failed end first, so that the launcher names it
    exit_rank(code)


def _describe(exitcode: int) -> str:
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit status {exitcode}"


_HANDLED = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
"""The signals torch's agent takes over (and leaves so): given back to the caller's handlers after a job."""


def run_ranks(entry: Callable[[Any], int], argv: Any, ranks: int, say: Callable[[str], None] | None = None) -> int:
    """Run ``entry(argv)`` (a module-level function, which the ranks import by name, returning an exit status: the
    CLI's ``main`` with its argv, or :func:`gnnscale.launcher.run_rank` with its job) as ``ranks`` ranks of one
    job on this machine; the job's exit status. ``say``: where the launcher's ``error:`` line goes (stderr)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    for name in [*logging.root.manager.loggerDict, *_QUIET_LOGGERS]:  # elastic sets each logger's own level
        if name.startswith(_QUIET_LOGGERS):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    os.environ[LAUNCHED_BY] = "1"
    # a rank that ends at once (exit_rank) leaves the launcher's semaphores to the resource tracker, which would
    # warn about them at exit; it takes this interpreter's -W options
    sys.warnoptions.append("ignore:resource_tracker:UserWarning")
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # what torchrun sets; said here, so it does not warn
    # loopback only: the job's stores and the ranks' connections take no connection from another machine
    rdzv_store = _loopback_store()
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=ranks, rdzv_backend="c10d",
                          rdzv_endpoint=f"{LOOPBACK}:{rdzv_store.port}", rdzv_configs={"is_host": False},
                          local_addr=LOOPBACK, run_id=f"gnnscale-{os.getpid()}", max_restarts=0,
                          monitor_interval=0.1)
    set_here = {k: v for k, v in _RANK_ENV.items() if k not in os.environ}
    os.environ.update(set_here)  # the ranks inherit them
    handler = _rendezvous_handler_class()
    original = handler.__dict__.get("_create_tcp_store_server") if handler is not None else None
    tell = say if say is not None else (lambda line: print(line, file=sys.stderr))
    signals = [getattr(signal, n) for n in _HANDLED if hasattr(signal, n)]
    handlers = [(s, signal.getsignal(s)) for s in signals] if threading.current_thread() is threading.main_thread() \
        else []
    if original is not None:
        handler._create_tcp_store_server = lambda self, addr, port: _loopback_store()  # type: ignore[union-attr]
    try:
        elastic_launch(config, _worker)(entry, argv)
    except SignalException as exc:  # Ctrl-C or SIGTERM to this process: the agent has stopped the ranks
        if exc.sigval == signal.SIGINT:
            tell("error: interrupted")
            return 130
        tell("error: terminated")
        return 128 + int(exc.sigval)
    except ChildFailedError as exc:
        codes = {rank: f.exitcode for rank, f in exc.failures.items()}
        if all(c == 2 for c in codes.values()):
            return 2  # bad input: rank 0 said what
        # the first rank to fail on its own: not one that stopped because a peer failed (PEER_FAILED), nor one
        # the launcher stopped (SIGTERM)
        own = {r: f for r, f in exc.failures.items() if f.exitcode not in (PEER_FAILED, -signal.SIGTERM)}
        if not own:  # every failed rank stopped because of a peer, which the launcher stopped before it ended
            tell(f"error: the job of {ranks} ranks stopped: rank(s) {', '.join(map(str, sorted(codes)))} stopped "
                 "because another rank failed (their lines above name it)")
            return 1
        rank, first = min(own.items(), key=lambda kv: kv[1].timestamp)
        others = sorted(r for r in own if r != rank)
        also = f"; rank(s) {', '.join(map(str, others))} failed on their own too" if others else ""
        tell(f"error: rank {rank} of {ranks} failed ({_describe(first.exitcode)}); the job stopped{also}")
        return 1
    finally:
        os.environ.pop(LAUNCHED_BY, None)
        for k in set_here:
            os.environ.pop(k, None)
        if original is not None:
            handler._create_tcp_store_server = original  # type: ignore[union-attr]
        for s, h in handlers:  # a library call leaves the caller's Ctrl-C as it was
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        del rdzv_store
    return 0


LOOPBACK = "127.0.0.1"
_RANK_ENV = {"GLOO_SOCKET_IFNAME": "lo"} if sys.platform.startswith("linux") else {"GLOO_SOCKET_IFNAME": "lo0"}
"""The ranks' gloo connections listen on the loopback interface only (a user's own setting is kept)."""


def _loopback_store() -> Any:
    """A job store (torch's ``TCPStore``) that listens on 127.0.0.1 only: torch's own store listens on every
    interface, so the socket is bound here and handed over (``master_listen_fd``)."""
    import socket

    from torch.distributed import TCPStore

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((LOOPBACK, 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    return TCPStore(LOOPBACK, port, is_master=True, multi_tenant=True, wait_for_workers=False,
                    master_listen_fd=sock.detach())


def _rendezvous_handler_class() -> Any:
    """torch's c10d rendezvous handler, whose store for the ranks (the one ``MASTER_ADDR`` names) is made by
    ``_create_tcp_store_server``: replaced during a ``--ranks`` job by :func:`_loopback_store`. ``None`` where a
    torch version has no such method (its store then listens as torch makes it)."""
    try:
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler
    except ImportError:
        return None
    return DynamicRendezvousHandler if "_create_tcp_store_server" in DynamicRendezvousHandler.__dict__ else None
