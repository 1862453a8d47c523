"""Freed device memory on the sim device, as CUDA's caching allocator reuses it (docs/runtime.md), and the hand-off
between two task-parallel runners on one device that depends on it (issue #46).

A storage belongs to the stream it was allocated on; freed, its bytes go back to that stream at once unless another
stream's use was declared with ``record_stream``. The sim device makes the hazard show every time: the owner's next
allocation raises StreamOrderError while a use it never waited for (nor the host) may still read the freed bytes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

import gnnscale.runtime as rt
from gnnscale import TrainConfig
from gnnscale.engines import InMemoryEngine, TaskParallelEngine
from gnnscale.engines.taskparallel.runner import Runner
from gnnscale.graph.generators import csbm
from gnnscale.graph.graph import Graph
from gnnscale.nn import build_model

REUSE = "may reuse .* freed while"


def _made_on(dev: rt.SimDevice, stream: rt.Stream | None) -> torch.Tensor:
    with rt.use_stream(stream), rt.on_device(dev):
        return torch.ones(4, 4) * 2  # counted on dev, allocated on ``stream``


@pytest.mark.parametrize("order", ["none", "record_stream", "wait_stream", "host_sync", "other_device"])
def test_memory_freed_while_another_stream_reads_it(order: str) -> None:
    """Made on ``side``, read on ``main``, freed, then ``side`` allocates: refused unless ``main``'s use was
    declared (record_stream), ``side`` waited for ``main``, or the host did; a reader on another device (whose
    copies CUDA orders with both devices' streams) leaves no debt."""
    dev, other = rt.SimDevice(0, 1 << 20), rt.SimDevice(1, 1 << 20)
    main, side = rt.new_stream(dev), rt.new_stream(dev)
    t = _made_on(dev, side)
    rt.synchronize(side)
    reader = rt.new_stream(other) if order == "other_device" else main
    with rt.use_stream(reader):
        if order == "other_device":
            got = rt.to_device(t, other)
        else:
            got = t.sum(0)  # main reads t (marked in its scope)
    if order == "record_stream":
        rt.record_stream(t, main)
    del t  # freed here: its bytes go back to ``side``
    if order == "wait_stream":
        rt.wait_stream(side, main)
    elif order == "host_sync":
        rt.synchronize(main)
    if order == "none":
        with pytest.raises(rt.StreamOrderError, match=REUSE):
            _made_on(dev, side)
        assert torch.equal(_made_on(dev, side), torch.full((4, 4), 2.0))  # reported once
        return
    assert torch.equal(_made_on(dev, side), torch.full((4, 4), 2.0))
    rt.synchronize(reader)
    assert torch.equal(got, torch.full((4,), 8.0) if order != "other_device" else torch.full((4, 4), 2.0))


def _in_turn(first: Callable[[], Any], second: Callable[[], Any]) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """``first`` and ``second`` to run on two threads, ``second`` between ``first``'s two halves: ``first``
    returns a function finishing it (run after ``second``), as a device thread's later work would be."""
    handed, done = threading.Event(), threading.Event()

    def a() -> Any:
        try:
            finish = first()
        finally:
            handed.set()  # the other thread goes on, also when ``first`` failed
        assert done.wait(timeout=60), "the other thread never ran"
        return finish()

    def b() -> Any:
        assert handed.wait(timeout=60), "the other thread never ran"
        try:
            return second()
        finally:
            done.set()

    return a, b


@pytest.mark.parametrize("record", [True, False], ids=["record_stream", "record_stream removed"])
def test_a_hand_off_between_two_runners_on_one_device(record: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two task-parallel runners on one sim device (their own threads and work streams): runner 1 receives a tensor
    runner 0 made (``RowMover.receive``: the same tensor, no copy), reads it on its stream and drops it before its
    stream is done; runner 0 then allocates on its stream. The receiver's ``record_stream`` keeps the bytes from
    runner 0's allocator until runner 1's read is done; without it runner 0's allocation could get them while
    runner 1 still reads them, and the sim device raises."""
    if not record:  # the mutant: RowMover.receive's record_stream branch does nothing
        monkeypatch.setattr(rt, "record_stream", lambda t, stream: None)
    dev = rt.SimDevice(0, 1 << 20)
    sender, receiver = Runner(0, dev, None), Runner(1, dev, None)  # type: ignore[arg-type]
    try:
        x = rt.to_device(torch.arange(12.0).reshape(3, 4), dev)
        rt.synchronize(dev)
        made: list[torch.Tensor] = []
        sender.submit("TF", lambda: made.append(x * 2)).result()  # on the sender's work stream

        def read() -> Callable[[], torch.Tensor]:
            got = receiver.receive(made.pop(), sender, "t2t")
            out = got.sum(1)  # issued on the receiver's stream
            del got  # the last reference: freed before the receiver's stream is done
            return lambda: out

        read_op, make_op = _in_turn(read, lambda: x + 1)  # x + 1: the sender's next allocation
        received = receiver.submit("PF", read_op)
        made_next = sender.submit("TF", make_op)
        if not record:
            with pytest.raises(rt.StreamOrderError, match=REUSE):
                made_next.result()
            return
        assert torch.equal(made_next.result(), x + 1)
        assert torch.equal(received.result(), torch.tensor([12.0, 44.0, 76.0]))
        assert receiver.io.moved == {"t2t": 48}  # a hand-off on one device: counted, nothing copied
    finally:
        for r in (sender, receiver):
            r.pool.shutdown(wait=True)


def test_two_task_runners_on_one_sim_device_equal_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """The task-parallel engine with both runners on ``sim:0``: every hand-off between them is the same tensor,
    declared used on the receiver's stream (``RowMover.receive``'s record_stream branch), and the epochs equal the
    in-memory engine's. (Here each handed-over tensor outlives the receiving operation, which ends with a host sync,
    so without the declaration this test fails by its spy only; the test above fails by the hazard itself.)"""
    graph = csbm(nodes=200, features=8, avg_degree=5, classes=3, seed=4)
    cfg = TrainConfig(model="dgcn", layers=2, hidden=8, engine="taskparallel", devices=("sim:0", "sim:0"),
                      subgraphs=2)
    declared: list[rt.Stream | None] = []
    record_stream = rt.record_stream

    def spy(t: torch.Tensor, stream: rt.Stream | None) -> None:
        declared.append(stream)
        record_stream(t, stream)

    monkeypatch.setattr(rt, "record_stream", spy)
    ref = InMemoryEngine(graph, _model(graph, cfg), cfg, torch.device("cpu"))
    eng = TaskParallelEngine(graph, _model(graph, cfg), cfg, rt.sim_device(0))
    try:
        assert [r.device for r in eng.runners] == [rt.sim_device(0)] * 2
        for epoch in (1, 2):
            declared.clear()
            a, b = ref.train_epoch(epoch)["loss"], eng.train_epoch(epoch)["loss"]
            assert b == pytest.approx(a, rel=1e-5)
            streams = {id(r.io.work_stream) for r in eng.runners}
            assert len(declared) > 0 and all(id(s) in streams for s in declared)
    finally:
        eng.close()


def _model(g: Graph, cfg: TrainConfig) -> Any:
    assert g.num_classes is not None
    return build_model(cfg.model, g.num_features, cfg.hidden, g.num_classes, layers=cfg.layers, dropout=cfg.dropout,
                       heads=cfg.heads, seed=cfg.seed)
