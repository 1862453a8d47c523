"""The ``gnnscale`` command's entry point: run one command; bad input of any kind is exit status 2 and one
``error: ...`` line on stderr; signals and failed ranks end the run as they should."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from gnnscale.cli.data_cmd import cmd_convert, cmd_info, cmd_predict, cmd_report
from gnnscale.cli.parser import USAGE_ERROR, build_parser, join_negative_lists
from gnnscale.cli.partition_cmd import cmd_partition, cmd_plan
from gnnscale.cli.train_cmd import cmd_train
from gnnscale.distributed.comm import current as current_comm
from gnnscale.distributed.job import LAUNCHED_BY, PEER_FAILED
from gnnscale.errors import GnnscaleError, RankFailure

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "train": cmd_train, "partition": cmd_partition, "plan": cmd_plan, "info": cmd_info, "predict": cmd_predict,
    "report": cmd_report, "convert": cmd_convert,
}
"""Each sub-command's function (the parser sets ``args.command``)."""


class _Terminated(BaseException):
    """SIGTERM, raised in the main thread so that ``finally`` blocks remove half-written files."""


_SIGNALLED: dict[str, int] = {}
"""The signal that ended the run, set before its exception is raised: C extensions that run Python callbacks
(pymetis) turn any exception into their own RuntimeError, and the run must still end as the signal says."""


def _on_sigterm(signum: int, frame: Any) -> None:
    _SIGNALLED["signal"] = signum
    raise _Terminated()


def _on_sigint(signum: int, frame: Any) -> None:
    _SIGNALLED["signal"] = signum
    raise KeyboardInterrupt


def _line(text: str) -> None:
    """One line to stderr in one write (the ranks of a job share the terminal: lines must not interleave)."""
    sys.stderr.flush()
    os.write(sys.stderr.fileno(), (text + "\n").encode())


def _rank_error(msg: str) -> None:
    """In a distributed job, leave this rank's error where its peers look when it is gone."""
    comm = current_comm()
    if comm is not None:
        comm.record_error(msg)


def _quiet_rank() -> bool:
    """A rank other than 0 started by ``--ranks``: bad input is found by every rank alike, and rank 0 says it."""
    return bool(os.environ.get(LAUNCHED_BY)) and os.environ.get("RANK", "0") != "0"


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gnnscale`` command; returns the exit status."""
    previous = None
    _SIGNALLED.clear()
    if threading.current_thread() is threading.main_thread():
        previous = (signal.signal(signal.SIGTERM, _on_sigterm), signal.signal(signal.SIGINT, _on_sigint))
    try:
        args = build_parser().parse_args(join_negative_lists(sys.argv[1:] if argv is None else argv))
        args.argv = list(sys.argv[1:] if argv is None else argv)
        args.entry = main  # what the ranks of a --ranks job run
        return int(COMMANDS[args.command](args))
    except GnnscaleError as exc:
        msg = " ".join(str(exc).split())
        _rank_error(msg)
        if not _quiet_rank():
            print(f"error: {msg}", file=sys.stderr)
        return USAGE_ERROR
    except RankFailure as exc:
        _line(f"error: {exc}")
        return PEER_FAILED
    except KeyboardInterrupt:
        if not os.environ.get(LAUNCHED_BY):  # under --ranks the launcher says it, once
            print("error: interrupted", file=sys.stderr)
        return 130
    except _Terminated:
        comm = current_comm()
        if comm is not None:  # a launcher stopping this rank because another failed: name that one
            _line(f"error: {comm.failure('stopped by the launcher')}")
        else:
            print("error: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    except BrokenPipeError:
        # the reader went away (gnnscale info ... | head): stop quietly, as Unix tools do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except Exception as exc:
        signum = _SIGNALLED.get("signal")
        if signum is None:
            _rank_error(f"{type(exc).__name__}: {exc}")
            raise
        # a signal's exception, rewrapped by an extension module on its way up
        print(f"error: {'interrupted' if signum == signal.SIGINT else 'terminated'}", file=sys.stderr)
        return 128 + signum
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous[0])
            signal.signal(signal.SIGINT, previous[1])


if __name__ == "__main__":
    sys.exit(main())
