"""A chain of pipeline stages on threads joined by bounded queues (HyScale-GNN §III-B, Figure 7).

``Pipeline(items, [("sample", f), ("load", g), ("transfer", h)], depth=1)`` runs each stage on its own thread: stage
``k`` takes what stage ``k - 1`` produced, applies its function, and hands the result on through a queue of
``depth`` items, so while the consumer works on item ``i``, the last stage holds ``i + 1`` and the one before it
``i + 2``: the two-stage prefetching of HyScale-GNN (feature loading of batch ``i + 2`` and data transfer of batch
``i + 1`` overlap the training of batch ``i``). A stage works on its next item only once the one it handed on has
been taken; with ``handoff=True`` it also takes its next input only then (a hand-over: each stage holds one item,
so the consumer is at most one item per stage ahead, Figure 7's depth). An exception in a stage reaches the
consumer; closing the pipeline (or leaving a ``with`` block) stops every thread, even one blocked on a full
queue.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

_END = object()
_POLL_S = 0.05
"""How often a blocked stage looks at the stop flag."""


class _Failure:
    def __init__(self, exc: BaseException):
        self.exc = exc


class Pipeline:
    """Iterate to get the last stage's outputs, in order."""

    def __init__(self, items: Iterable[Any], stages: list[tuple[str, Callable[[Any], Any]]], depth: int = 1,
                 handoff: bool = False):
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.stop = threading.Event()
        self.handoff = handoff
        self.queues: list[queue.Queue[Any]] = [queue.Queue(maxsize=depth) for _ in stages]
        self.threads = []
        for k, (name, fn) in enumerate(stages):
            source: Iterator[Any] = iter(items) if k == 0 else self._drain(self.queues[k - 1])
            th = threading.Thread(target=self._run, args=(source, fn, self.queues[k]), daemon=True,
                                  name=f"gnnscale-{name}")
            self.threads.append(th)
        for th in self.threads:
            th.start()

    def _put(self, q: queue.Queue[Any], item: Any) -> bool:
        while not self.stop.is_set():
            try:
                q.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _handed_over(self, q: queue.Queue[Any]) -> bool:
        """Wait until the item just put into ``q`` is taken (or the pipeline stops): a stage holds one item at a
        time, so the consumer's lookahead is one item per stage."""
        with q.all_tasks_done:
            while q.unfinished_tasks and not self.stop.is_set():
                q.all_tasks_done.wait(_POLL_S)
        return not self.stop.is_set()

    def _drain(self, q: queue.Queue[Any]) -> Iterator[Any]:
        """The items of an upstream queue until its end (a failure upstream is passed on as it is)."""
        while not self.stop.is_set():
            try:
                item = q.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            q.task_done()
            if item is _END:
                return
            yield item

    def _run(self, source: Iterator[Any], fn: Callable[[Any], Any], out: queue.Queue[Any]) -> None:
        try:
            for item in source:
                if self.stop.is_set():
                    return
                if not self._put(out, item if isinstance(item, _Failure) else fn(item)):
                    return
                if self.handoff and not self._handed_over(out):
                    return
            self._put(out, _END)
        except BaseException as exc:  # handed to the consumer, which raises it
            self._put(out, _Failure(exc))

    def __iter__(self) -> Iterator[Any]:
        last = self.queues[-1]
        while True:
            item = last.get()
            last.task_done()
            if item is _END:
                return
            if isinstance(item, _Failure):
                raise item.exc
            yield item

    def close(self) -> None:
        """Stop every stage and wait for its thread."""
        self.stop.set()
        for th in self.threads:
            th.join()

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
