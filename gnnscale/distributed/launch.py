"""``gnnscale train --engine distributed --ranks R``: R ranks on this machine through torch's launcher API (the
elastic agent torchrun runs), without a separate ``torchrun`` command.

The agent starts the ranks with torch's variables set (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ...), hosts the
job's store, and stops the others when one fails. Rank 0 prints and writes the metrics; the others are silent
except for their own failures. Here the failure the agent saw first becomes one ``error:`` line naming its rank.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable

from gnnscale.distributed.comm import exit_rank
from gnnscale.distributed.job import LAUNCHED_BY, PEER_FAILED, PEER_GRACE_S

_QUIET_LOGGERS = ("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing",
                  "torch.distributed.run")


def _worker(entry: Callable[[list[str]], int], argv: list[str]) -> None:
    """One rank: ``entry(argv)``, the ``gnnscale`` command with the same arguments."""
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


def run_ranks(entry: Callable[[list[str]], int], argv: list[str], ranks: int) -> int:
    """Run ``entry(argv)`` (the CLI's main, a module-level function: the ranks import it by name) as ``ranks``
    ranks of one job on this machine; the job's exit status."""
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
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=ranks, rdzv_backend="c10d",
                          rdzv_endpoint="127.0.0.1:0", run_id=f"gnnscale-{os.getpid()}", max_restarts=0,
                          monitor_interval=0.1)
    try:
        elastic_launch(config, _worker)(entry, argv)
    except SignalException as exc:  # Ctrl-C or SIGTERM to this process: the agent has stopped the ranks
        if exc.sigval == signal.SIGINT:
            print("error: interrupted", file=sys.stderr)
            return 130
        print("error: terminated", file=sys.stderr)
        return 128 + int(exc.sigval)
    except ChildFailedError as exc:
        codes = {rank: f.exitcode for rank, f in exc.failures.items()}
        if all(c == 2 for c in codes.values()):
            return 2  # bad input: rank 0 said what
        # the first rank to fail on its own: not one that stopped because a peer failed (PEER_FAILED), nor one
        # the launcher stopped (SIGTERM)
        own = {r: f for r, f in exc.failures.items() if f.exitcode not in (PEER_FAILED, -signal.SIGTERM)}
        if not own:  # every failed rank stopped because of a peer, which the launcher stopped before it ended
            print(f"error: the job of {ranks} ranks stopped: rank(s) {', '.join(map(str, sorted(codes)))} stopped "
                  "because another rank failed (their lines above name it)", file=sys.stderr)
            return 1
        rank, first = min(own.items(), key=lambda kv: kv[1].timestamp)
        others = sorted(r for r in own if r != rank)
        also = f"; rank(s) {', '.join(map(str, others))} failed on their own too" if others else ""
        print(f"error: rank {rank} of {ranks} failed ({_describe(first.exitcode)}); the job stopped{also}",
              file=sys.stderr)
        return 1
    finally:
        os.environ.pop(LAUNCHED_BY, None)
    return 0
