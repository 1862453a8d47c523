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

LAUNCHED_BY = "GNNSCALE_LAUNCHER"
"""Set in the ranks ``--ranks`` starts: bad-input errors every rank finds are printed by rank 0 only."""
_QUIET_LOGGERS = ("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing",
                  "torch.distributed.run")


def launched() -> bool:
    """Whether this process is a rank of a launched job (torchrun, or ``--ranks``): torch's variables are set."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def _worker(argv: list[str]) -> None:
    """One rank: the ``gnnscale`` command with the same arguments."""
    import traceback

    from gnnscale.cli import main

    try:
        code = main(argv)
    except Exception:
        traceback.print_exc()  # a bug keeps its traceback (the launcher would keep it to itself)
        sys.stderr.flush()
        raise
    if code:
        sys.exit(code)


def _describe(exitcode: int) -> str:
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit status {exitcode}"


def run_ranks(argv: list[str], ranks: int) -> int:
    """Run ``gnnscale <argv>`` as ``ranks`` ranks of one job on this machine; the job's exit status."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    os.environ[LAUNCHED_BY] = "1"
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # what torchrun sets; said here, so it does not warn
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=ranks, rdzv_backend="c10d",
                          rdzv_endpoint="127.0.0.1:0", run_id=f"gnnscale-{os.getpid()}", max_restarts=0,
                          monitor_interval=0.1)
    try:
        elastic_launch(config, _worker)(argv)
    except ChildFailedError as exc:
        codes = {rank: f.exitcode for rank, f in exc.failures.items()}
        if all(c == 2 for c in codes.values()):
            return 2  # bad input: rank 0 said what
        rank, first = exc.get_first_failure()
        others = sorted(r for r in codes if r != rank)
        also = f"; rank(s) {', '.join(map(str, others))} failed too" if others else ""
        print(f"error: rank {rank} of {ranks} failed ({_describe(first.exitcode)}); the job stopped{also}",
              file=sys.stderr)
        return 1
    finally:
        os.environ.pop(LAUNCHED_BY, None)
    return 0
