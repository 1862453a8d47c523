"""Progress and timing of the steps before training: load, partition, chunking, planning, engine set-up; and
:func:`timed`, which adds a step's time to a part of the run's wall time without showing it.

Every step runs inside :func:`stage`, which records its wall time in a ``timings`` dict (reported in the run's
summary record) and, when progress display is on (the CLI turns it on for a terminal), shows a tqdm line with
the elapsed time while the step runs, so a user waiting on METIS for a large graph sees which step is running.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

_state = {"enabled": False}


def enable(flag: bool = True) -> None:
    """Show progress lines on stderr (off by default: a library call prints nothing)."""
    _state["enabled"] = flag


def enabled() -> bool:
    return _state["enabled"]


@contextmanager
def timed(key: str, into: dict[str, float]) -> Iterator[None]:
    """Add the ``with`` body's wall time to ``into[key]``, showing nothing (the training loop's parts of the wall
    time: evaluation, checkpoints)."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        into[key] = into.get(key, 0.0) + time.perf_counter() - t0


@contextmanager
def stage(name: str, timings: dict[str, float] | None = None) -> Iterator[None]:
    """Time the ``with`` body as step ``name`` (added to ``timings[name + "_s"]``), showing it while it runs."""
    t0 = time.perf_counter()
    bar, stop = None, threading.Event()
    if _state["enabled"]:
        from tqdm import tqdm

        bar = tqdm(total=None, desc=name, bar_format="{desc}: {elapsed}", file=sys.stderr, leave=False)

        def tick() -> None:  # tqdm redraws only on updates: refresh the elapsed time twice a second
            while not stop.wait(0.5):
                bar.refresh()

        threading.Thread(target=tick, daemon=True, name="gnnscale-progress").start()
    try:
        yield
    finally:
        seconds = time.perf_counter() - t0
        if timings is not None:
            timings[f"{name}_s"] = timings.get(f"{name}_s", 0.0) + seconds
        if bar is not None:
            stop.set()
            bar.close()
            print(f"{name}: {seconds:.1f}s", file=sys.stderr)
