"""The hybrid engine (HyScale-GNN): CPU + accelerator trainers on unequal shares of every global batch, the
four-stage pipeline, dynamic resource management, the performance model's pieces, the counters, bad input.

On a machine without a GPU, ``cpu:1``, ``cpu:2`` stand in for accelerators (they take the transfer stage and
Algorithm 1's ``Accel`` stage). Where a test needs DRM to decide something specific it sets the stages' measured
times (a stage's work still runs; only the seconds it reports are replaced), so the decision does not depend on
how busy the machine is.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from gnnscale.cli import main
from gnnscale.config import TrainConfig
from gnnscale.engines.core.pipeline import Pipeline
from gnnscale.engines.core.replicas import Replicas
from gnnscale.engines.sampled.hybrid import HybridEngine, _Iteration
from gnnscale.engines.sampled.minibatch import MiniBatchEngine
from gnnscale.engines.sampled.stages import Propagated
from gnnscale.errors import ConfigError
from gnnscale.graph.datasets import load_dataset
from gnnscale.graph.generators import csbm
from gnnscale.graph.graph import Graph
from gnnscale.nn import build_model
from gnnscale.plan.hybrid import (
    BatchShape,
    DeviceRates,
    HybridModel,
    SamplingTable,
    Threads,
    TrainerModel,
    check_threads,
    default_threads,
    device_rates,
    fit_cost,
    measure_sampling,
    rebalance,
    t_execution,
    t_load,
    t_sync,
    t_trainer,
    t_trans,
)
from gnnscale.sample import CSRTopology
from gnnscale.testing import need_file
from gnnscale.train import train

CPU = torch.device("cpu")
WAIT = 30.0
"""Seconds a handshake may take before the test fails (instead of hanging); a working pipeline needs ms."""
STAGE_TIMES = ("sc_s", "sa_s", "load_s", "tran_s", "tc_s", "ta_s", "sync_s")
AHEAD = 3
"""Iterations the hybrid pipeline holds beyond the one training: three stages (sampling, loading, transfer), each
holding one iteration until the next stage takes it (a hand-over, Figure 7's depth)."""


def _config(**kw: Any) -> TrainConfig:
    base: dict[str, Any] = dict(model="sage", layers=2, hidden=16, heads=2, dropout=0.5, fanouts=(4, 3), seed=2,
                                batch_size=4096, epochs=1)
    return TrainConfig(**{**base, **kw})


def _build(g: Graph, cls: type[MiniBatchEngine], **kw: Any) -> Any:
    cfg = _config(**kw)
    assert g.num_classes is not None
    model = build_model(cfg.model, g.num_features, cfg.hidden, g.num_classes, layers=cfg.layers, dropout=cfg.dropout,
                        heads=cfg.heads, seed=cfg.seed)
    return cls(g, model, cfg, CPU)


def _hybrid(g: Graph, devices: tuple[str, ...] = ("cpu", "cpu:1"), **kw: Any) -> HybridEngine:
    return _build(g, HybridEngine, engine="hybrid", devices=devices, **kw)


def _minibatch(g: Graph, **kw: Any) -> MiniBatchEngine:
    return _build(g, MiniBatchEngine, engine="minibatch", **kw)


def _first_step(eng: MiniBatchEngine) -> tuple[dict[str, Any], list[torch.Tensor]]:
    """Epoch 1's record and the master's gradients at its first optimiser step."""
    grads: list[torch.Tensor] = []
    step = eng.optimizer.step

    def capture(*a: Any, **k: Any) -> Any:
        if not grads:
            grads.extend(p.grad.clone() for p in eng.model.parameters())  # type: ignore[union-attr]
        return step(*a, **k)

    eng.optimizer.step = capture  # type: ignore[method-assign]
    return eng.train_epoch(1), grads


def _cut_sizes(total: int, split: list[float]) -> list[int]:
    """Seeds per trainer of a batch of ``total`` under ``split``: trainer g takes [round(n c_{g-1}), round(n c_g))."""
    bounds = [0] + [round(total * c) for c in torch.cumsum(torch.tensor(split, dtype=torch.float64), 0).tolist()]
    bounds[-1] = total
    return [b - a for a, b in zip(bounds, bounds[1:], strict=False)]


def _force_times(eng: HybridEngine, per_seed: list[float], SC: float = 1e-4, Load: float = 1e-4,
                 Tran: float = 1e-4) -> None:
    """Every stage still runs, but reports these seconds: the CPU sampler ``SC``, the loader ``Load``, every
    transfer ``Tran``, trainer ``g`` ``per_seed[g]`` per seed of its share."""
    sample, load, transfer, propagate = eng._sample, eng._load, eng._transfer, eng._propagate

    def _sample(it: _Iteration, key: int) -> _Iteration:
        it = sample(it, key)
        it.times["SC"], it.times["SA"] = SC, 0.0
        return it

    def _load(it: _Iteration) -> _Iteration:
        it = load(it)
        it.times["Load"] = Load
        return it

    def _transfer(it: _Iteration) -> _Iteration:
        it = transfer(it)
        it.times["Tran"] = Tran
        it.transfer_s = [0.0 if g == eng.cpu_index else Tran for g in range(len(eng.devices))]
        return it

    def _propagate(g: int, it: _Iteration, se: tuple[int, int]) -> Propagated:
        seconds = per_seed[g] * it.parts[g].numel()
        return Propagated(seconds, propagate(g, it, se).loss, seconds)

    eng._sample, eng._load, eng._transfer = _sample, _load, _transfer  # type: ignore[method-assign]
    eng._propagate = _propagate  # type: ignore[method-assign]


# ------------------------------------------------------------------------------------------------ exactness


@pytest.mark.parametrize("model", ["sage", "gcn", "gat"])
@pytest.mark.parametrize(("devices", "shares"), [(("cpu", "cpu:1"), (0.3, 0.7)),
                                                 (("cpu", "cpu:1", "cpu:2"), (0.2, 0.3, 0.5))])
def test_one_iteration_equals_the_minibatch_engines_step_on_the_whole_batch(
        model: str, devices: tuple[str, ...], shares: tuple[float, ...]) -> None:
    """The issue's acceptance point: one hybrid iteration over 2 and 3 trainers on a fixed unequal split gives the
    single trainer's loss and gradients on the same global batch (one batch: the whole training set)."""
    g = csbm(nodes=400, features=12, avg_degree=10, seed=5)
    n = int(g.train_mask.sum())  # type: ignore[union-attr]
    ref, ref_grads = _first_step(_minibatch(g, model=model))
    eng = _hybrid(g, devices, model=model, drm="off", shares=shares)
    rec, grads = _first_step(eng)
    assert rec["batches"] == ref["batches"] == 1
    assert rec["loss"] == pytest.approx(ref["loss"], rel=1e-5)
    for a, b in zip(ref_grads, grads, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
    # every trainer took its share (so the sum above really was over several trainers)
    assert rec["trainer_seeds"] == _cut_sizes(n, list(shares)) and min(rec["trainer_seeds"]) > 0
    assert rec["split"] == list(shares)
    # the comparison sees a missing synchroniser: the master's share alone is not the batch's gradient
    broken = _hybrid(g, devices, model=model, drm="off", shares=shares)
    broken.replicas.reduce = lambda: None  # type: ignore[method-assign]
    _, partial = _first_step(broken)
    assert any(not torch.allclose(a, b, rtol=1e-4, atol=1e-4) for a, b in zip(ref_grads, partial, strict=True))


@pytest.mark.parametrize(("devices", "shares"), [(("cpu",), (1.0,)), (("cpu", "cpu:1"), (0.3, 0.7)),
                                                 (("cpu", "cpu:1", "cpu:2"), (0.5, 0.125, 0.375))])
def test_a_whole_run_with_drm_off_equals_the_minibatch_engines(devices: tuple[str, ...],
                                                               shares: tuple[float, ...]) -> None:
    g = csbm(nodes=1200, features=12, avg_degree=10, seed=5)
    kw: dict[str, Any] = dict(batch_size=32, epochs=3)
    ref = train(g, _config(engine="minibatch", **kw), "cpu").history
    got = train(g, _config(engine="hybrid", devices=devices, drm="off", shares=shares, **kw), "cpu").history
    assert [r["batches"] for r in got] == [r["batches"] for r in ref] == [4, 4, 4]
    assert [r["loss"] for r in got] == pytest.approx([r["loss"] for r in ref], rel=1e-5)
    assert all(r["split"] == list(shares) and r["drm_work_moves"] == 0 for r in got)


def test_an_accelerator_sampling_its_own_share_trains_the_same_and_moves_no_topology() -> None:
    """The GPU sampler's path (SA), run by a CPU stand-in: the accelerator samples its share itself, so the
    losses stay the mini-batch engine's, SA is timed, and only its features cross to it (no topology bytes)."""
    g = csbm(nodes=600, features=12, avg_degree=8, seed=5)
    kw: dict[str, Any] = dict(batch_size=64, shares=(0.4, 0.6), drm="off")
    ref = _minibatch(g, batch_size=64)
    ref_loss = ref.train_epoch(1)["loss"]
    by_sampler = {}
    for on_gpu in (False, True):
        eng = _hybrid(g, **kw)
        eng.gpu_sampler = [False, on_gpu]
        moved = []
        transfer = eng._transfer

        def spy(it: Any, transfer: Any = transfer, moved: list[int] = moved) -> Any:
            x = it.x[1]
            moved.append(x.numel() * x.element_size())
            return transfer(it)

        eng._transfer = spy  # type: ignore[method-assign]
        rec = eng.train_epoch(1)
        assert rec["loss"] == pytest.approx(ref_loss, rel=1e-5)
        by_sampler[on_gpu] = rec
        if on_gpu:
            assert rec["gpu_sampled"] == [1] and rec["sa_s"] > 0
            assert rec["accel_bytes"] == [sum(moved)]  # features only: the blocks were made where they train
        else:
            assert rec["gpu_sampled"] == [] and rec["sa_s"] == 0 and rec["accel_bytes"][0] > sum(moved)
    assert by_sampler[True]["trainer_sampled_edges"] == by_sampler[False]["trainer_sampled_edges"]


def test_drm_changes_the_split_between_iterations_and_the_losses_stay_the_minibatch_engines() -> None:
    """Keyed sampling makes any split exact: the split DRM moves mid-epoch changes nothing that is learned."""
    g = csbm(nodes=1200, features=12, avg_degree=10, seed=5)
    kw: dict[str, Any] = dict(batch_size=16, epochs=3)
    ref = train(g, _config(engine="minibatch", **kw), "cpu").history
    engines: list[HybridEngine] = []

    def start(eng: Any, *_: Any) -> None:
        _force_times(eng, per_seed=[1e-4, 1e-3])  # the accelerator 10x slower per seed: DRM must move seeds
        engines.append(eng)

    got = train(g, _config(engine="hybrid", devices=("cpu", "cpu:1"), drm="on", shares=(0.5, 0.5), **kw), "cpu",
                on_start=start).history
    eng = engines[0]
    assert sum(r["drm_work_moves"] for r in got) >= 1
    assert got[-1]["split"][0] > 0.8  # moved a long way towards the faster trainer (10/11 of the seeds)
    assert got[-1]["trainer_seeds"][0] > 0.8 * 120  # the last epoch trained on it
    assert any(d["applied"] for d in eng.drm_log)
    assert [r["loss"] for r in got] == pytest.approx([r["loss"] for r in ref], rel=1e-5)


# ------------------------------------------------------------------------------------------------ DRM


@pytest.mark.parametrize("slow", [0, 1], ids=["slow-cpu-trainer", "slow-accelerator"])
def test_drm_moves_seeds_from_a_slow_trainer_to_the_other(slow: int) -> None:
    """``slowdown[slow] = 4``: that trainer's propagation takes 4x as long (it sleeps the difference). DRM moves
    seeds to the other trainer: the slow one's share falls, and the next epoch's seeds follow."""
    g = csbm(nodes=4000, features=64, avg_degree=10, seed=5)
    eng = _hybrid(g, hidden=128, batch_size=40, drm="on", shares=(0.5, 0.5))
    eng.slowdown[slow] = 4.0
    first = eng.train_epoch(1)
    second = eng.train_epoch(2)
    fast = 1 - slow
    assert first["drm_work_moves"] + second["drm_work_moves"] >= 1, eng.drm_log
    assert eng.split[slow] < 0.5, eng.drm_log
    assert second["trainer_seeds"][slow] < second["trainer_seeds"][fast], (second, eng.drm_log)


def test_a_cpu_trainer_bottleneck_with_no_thread_to_give_moves_seeds() -> None:
    """The CPU trainer is the bottleneck and feature loading the fastest stage: Algorithm 1 says move a loader
    thread to the trainer. With one loader thread there is none to move; the trainer's seeds go to the
    accelerator instead, in proportion to the measured speeds (4x per seed -> 0.2 : 0.8)."""
    g = csbm(nodes=1200, features=12, avg_degree=10, seed=5)
    eng = _hybrid(g, batch_size=40, drm="on", shares=(0.5, 0.5), threads=(1, 1, 1))
    _force_times(eng, per_seed=[4e-4, 1e-4], SC=2e-4, Load=1e-4, Tran=1e-4)
    rec = eng.train_epoch(1)
    assert rec["drm_work_moves"] >= 1, eng.drm_log
    assert rec["threads"] == [1, 1, 1]
    assert eng.split == pytest.approx([0.2, 0.8], abs=0.03), eng.drm_log


def _spy_iterations(eng: HybridEngine, made: list[tuple[int, int, list[int], int]],
                    cond: threading.Condition) -> None:
    """Record each iteration as the sampler takes it: index, DRM version, seeds per trainer, batch size."""
    real = eng._iterations

    def iterations(batches: list[torch.Tensor]) -> Iterator[_Iteration]:
        for it in real(batches):
            with cond:
                made.append((it.index, it.version, [int(p.numel()) for p in it.parts], it.total))
                cond.notify_all()
            yield it

    eng._iterations = iterations  # type: ignore[method-assign]


def _splits_by_version(eng: HybridEngine) -> list[list[float]]:
    """The split under each DRM version: the initial one, then the one after each carried-out decision."""
    return [list(eng.initial_split)] + [d["split"] for d in eng.drm_log if d["applied"]]


def test_drm_decides_again_only_on_an_iteration_sampled_under_its_last_decision() -> None:
    """The consumer holds every decision until the sampler has run the whole pipeline ahead (AHEAD iterations
    already cut under the old split). The accelerator is reported 100x slower, so every iteration DRM looks at
    asks to move seeds; those cut before the last decision must be skipped: carried-out decisions are more than
    AHEAD iterations apart, and each one's iteration was cut under the split of the decision before."""
    g = csbm(nodes=1600, features=12, avg_degree=10, seed=5)
    eng = _hybrid(g, batch_size=8, drm="on", shares=(0.5, 0.5))
    _force_times(eng, per_seed=[1e-4, 1e-2])
    made: list[tuple[int, int, list[int], int]] = []
    cond = threading.Condition()
    _spy_iterations(eng, made, cond)
    n_iters = -(-int(g.train_mask.sum()) // 8)  # type: ignore[union-attr]
    real_drm = eng._drm
    full: list[bool] = []

    def drm(it: _Iteration, times: list[float]) -> Any:
        need = min(it.index + AHEAD + 1, n_iters)
        with cond:
            full.append(all(full) and cond.wait_for(lambda: len(made) >= need, timeout=WAIT))  # one wait runs out
        return real_drm(it, times)

    eng._drm = drm  # type: ignore[method-assign]
    rec = eng.train_epoch(1)
    assert all(full), "the pipeline did not run AHEAD iterations ahead of training"
    assert rec["batches"] == n_iters == 20
    carried = [d["iteration"] for d in eng.drm_log if d["applied"]]
    assert len(carried) >= 2, eng.drm_log
    assert all(b - a > AHEAD for a, b in zip(carried, carried[1:], strict=False)), carried
    splits = _splits_by_version(eng)
    for index, version, sizes, total in made:
        assert sizes == _cut_sizes(total, splits[version]), (index, version, sizes, splits)
    versions = {index: version for index, version, _, _ in made}
    for k, i in enumerate(carried):
        assert versions[i] == k, (i, versions[i], k)  # decision k looked at an iteration cut under decision k-1


def test_an_iterations_version_names_the_split_it_was_cut_under() -> None:
    """The sampler thread can be descheduled between reading the split and reading the version (any bytecode
    boundary). Here it is held there, inside ``_cut``, until DRM has carried out its first decision."""
    g = csbm(nodes=1600, features=12, avg_degree=10, seed=5)
    eng = _hybrid(g, batch_size=8, drm="on", shares=(0.5, 0.5))
    _force_times(eng, per_seed=[1e-4, 1e-2])
    made: list[tuple[int, int, list[int], int]] = []
    cond = threading.Condition()
    _spy_iterations(eng, made, cond)
    decided = threading.Event()
    real_apply, real_cut = eng._apply, eng._cut
    calls: list[int] = []

    def apply(*a: Any, **k: Any) -> Any:
        done = real_apply(*a, **k)
        if done:
            decided.set()
        return done

    def cut(batch: torch.Tensor, split: list[float]) -> list[torch.Tensor]:
        calls.append(1)
        if len(calls) == 3:  # iteration 2: its split is read; the first decision comes on iteration 1
            assert decided.wait(WAIT)
        return real_cut(batch, split)

    eng._apply, eng._cut = apply, cut  # type: ignore[method-assign]
    eng.train_epoch(1)
    splits = _splits_by_version(eng)
    for index, version, sizes, total in made:
        assert sizes == _cut_sizes(total, splits[version]), (index, version, sizes, splits)


def test_drm_off_keeps_the_split_and_decides_nothing() -> None:
    g = csbm(nodes=1200, features=12, avg_degree=10, seed=5)
    eng = _hybrid(g, batch_size=16, drm="off", shares=(0.5, 0.5))
    _force_times(eng, per_seed=[1e-3, 1e-4])
    rec = eng.train_epoch(1)
    assert eng.split == [0.5, 0.5] and eng.drm_log == [] and rec["drm_work_moves"] == rec["drm_thread_moves"] == 0


def test_the_drm_split_carries_over_a_resume(tmp_path: Path) -> None:
    g = csbm(nodes=1200, features=12, avg_degree=10, seed=5)
    cfg = _config(engine="hybrid", devices=("cpu", "cpu:1"), drm="on", shares=(0.5, 0.5), batch_size=16)
    first = train(g, cfg, "cpu", checkpoint=tmp_path,
                  on_start=lambda eng, *_: _force_times(eng, per_seed=[1e-4, 1e-3])).history
    assert first[-1]["split"][0] > 0.8
    again = train(g, TrainConfig(**{**cfg.__dict__, "epochs": 2, "drm": "off"}), "cpu", checkpoint=tmp_path,
                  resume=True).history
    assert again[-1]["epoch"] == 2
    assert again[-1]["split"] == first[-1]["split"]  # not the shares the resumed config starts from


# ------------------------------------------------------------------------------------------------ pipeline


@pytest.mark.parametrize("handoff", [False, True])
def test_pipeline_outputs_every_item_in_order(handoff: bool) -> None:
    stages = [("a", lambda x: x * 2), ("b", lambda x: x + 1), ("c", lambda x: (x, threading.current_thread().name))]
    with Pipeline(iter(range(50)), stages, depth=2, handoff=handoff) as pipe:
        out = list(pipe)
    assert [x for x, _ in out] == [2 * i + 1 for i in range(50)]
    assert {name for _, name in out} == {"gnnscale-c"}  # the last stage ran on its own thread
    with pytest.raises(ValueError, match="depth"):
        Pipeline([], stages, depth=0)


def test_pipeline_stages_work_on_different_items_at_the_same_time() -> None:
    """A handshake, not a timing: stage b holds item 0 until stage a has started item 1, and stage a holds item 1
    until stage b has started item 0. Stages run one after the other never get there; each wait then runs out."""
    b_on_0, a_on_1 = threading.Event(), threading.Event()
    saw: dict[str, bool] = {}

    def a(i: int) -> int:
        if i == 1:
            a_on_1.set()
            saw["a on 1 saw b on 0"] = b_on_0.wait(WAIT)
        return i

    def b(i: int) -> int:
        if i == 0:
            b_on_0.set()
            saw["b on 0 saw a on 1"] = a_on_1.wait(WAIT)
        return i

    with Pipeline(range(4), [("a", a), ("b", b)]) as pipe:
        assert list(pipe) == [0, 1, 2, 3]
    assert saw == {"a on 1 saw b on 0": True, "b on 0 saw a on 1": True}


@pytest.mark.parametrize("handoff", [False, True])
def test_pipeline_prefetches_two_items_while_the_consumer_holds_one(handoff: bool) -> None:
    """Two-stage prefetching: while the consumer holds item 0, the last stage works on item 1 and the one before
    it on item 2 (and nothing is asked of the consumer to get there)."""
    started = {("a", 2): threading.Event(), ("b", 1): threading.Event()}

    def stage(name: str) -> Callable[[int], int]:
        def fn(i: int) -> int:
            if (name, i) in started:
                started[(name, i)].set()
            return i
        return fn

    with Pipeline(range(10), [("a", stage("a")), ("b", stage("b"))], depth=1, handoff=handoff) as pipe:
        items = iter(pipe)
        assert next(items) == 0
        assert started[("b", 1)].wait(WAIT) and started[("a", 2)].wait(WAIT)


@pytest.mark.parametrize(("handoff", "want"), [(False, {"a": 6, "b": 4, "c": 2}), (True, {"a": 3, "b": 2, "c": 1})])
def test_pipeline_lookahead_is_bounded_and_close_stops_blocked_stages(handoff: bool, want: dict[str, int]) -> None:
    """Depth 1, three stages, a consumer that never takes item 0: the stages fill up and stop. Without hand-over
    each stage downstream holds one item in its queue and one finished in hand: stage k has run on 2 (N - k + 1)
    items and the source was asked for 2 N = 6, no more. With hand-over a stage takes its next input only once its
    last output was taken: one item per stage, N = 3 from the source. close() then returns and every stage thread
    has ended."""
    pulls: list[int] = []
    calls = {"a": 0, "b": 0, "c": 0}
    reached = {k: threading.Event() for k in calls}

    def source() -> Iterator[int]:
        for i in range(100):
            pulls.append(i)
            yield i

    def stage(name: str) -> Callable[[int], int]:
        def fn(i: int) -> int:
            calls[name] += 1
            if calls[name] >= want[name]:
                reached[name].set()
            return i
        return fn

    pipe = Pipeline(source(), [(k, stage(k)) for k in calls], depth=1, handoff=handoff)
    try:
        assert all(reached[k].wait(WAIT) for k in calls), calls
        # a fixed point: nothing downstream is taken, so no stage can take another input
        assert calls == want and len(pulls) == want["a"], (calls, pulls)
    finally:
        closer = threading.Thread(target=pipe.close)
        closer.start()
        closer.join(WAIT)
    assert not closer.is_alive(), "close() did not return while the stages were blocked on full queues"
    assert not any(th.is_alive() for th in pipe.threads)


def test_an_exception_in_a_stage_or_the_source_reaches_the_consumer() -> None:
    def fail_on_3(i: int) -> int:
        if i == 3:
            raise KeyError("stage b broke on item 3")
        return i

    got: list[int] = []
    with pytest.raises(KeyError, match="stage b broke"):
        with Pipeline(range(10), [("a", lambda i: i), ("b", fail_on_3), ("c", lambda i: i)]) as pipe:
            for x in pipe:
                got.append(x)
    assert got == [0, 1, 2]
    assert not any(th.is_alive() for th in pipe.threads)

    def source() -> Iterator[int]:
        yield 0
        raise OSError("source broke")

    got.clear()
    with pytest.raises(OSError, match="source broke"):
        with Pipeline(source(), [("a", lambda i: i), ("b", lambda i: i)]) as pipe2:
            for x in pipe2:
                got.append(x)
    assert got == [0]


def test_the_engine_trains_iteration_i_while_i_plus_1_transfers_and_i_plus_2_loads() -> None:
    """The hybrid engine's two-stage prefetching, by handshake: the CPU trainer's propagation of iteration 0 waits
    until the transfer stage has started iteration 1 and the loader iteration 2."""
    g = csbm(nodes=1200, features=12, avg_degree=10, seed=5)
    eng = _hybrid(g, batch_size=16, drm="off", shares=(0.5, 0.5))
    started = {("transfer", 1): threading.Event(), ("load", 2): threading.Event()}
    real_load, real_transfer, real_propagate = eng._load, eng._transfer, eng._propagate

    def load(it: _Iteration) -> _Iteration:
        if ("load", it.index) in started:
            started[("load", it.index)].set()
        return real_load(it)

    def transfer(it: _Iteration) -> _Iteration:
        if ("transfer", it.index) in started:
            started[("transfer", it.index)].set()
        return real_transfer(it)

    overlapped: list[bool] = []

    def propagate(g_: int, it: _Iteration, se: tuple[int, int]) -> Any:
        if it.index == 0 and g_ == eng.cpu_index:
            overlapped.append(all(e.wait(WAIT) for e in started.values()))
        return real_propagate(g_, it, se)

    eng._load, eng._transfer, eng._propagate = load, transfer, propagate  # type: ignore[method-assign]
    eng.train_epoch(1)
    assert overlapped == [True], "iterations 1 and 2 were not in transfer and loading while iteration 0 trained"


# ------------------------------------------------------------------------------------------------ rebalance


def test_rebalance_equalises_the_trainers_times() -> None:
    assert rebalance([.5, .5], [3.0, 1.0], [50, 50], min_share=0.0, tolerance=0.05) == pytest.approx([.25, .75])
    # per seed: trainer 0 takes 3/50, trainer 1 1/50 s -> under the new split both take the same time
    new = rebalance([.2, .3, .5], [1.0, 3.0, 2.0], [20, 30, 50], min_share=0.0, tolerance=0.05)
    assert new is not None and sum(new) == pytest.approx(1.0)
    per_seed = [1.0 / 20, 3.0 / 30, 2.0 / 50]
    times = [s * p for s, p in zip(new, per_seed, strict=True)]
    assert max(times) == pytest.approx(min(times))


def test_rebalance_splits_by_the_given_cost_models() -> None:
    """Fitted cost models replace this iteration's seconds per seed: equal times now, yet trainer 1 is known to
    be 3x faster; a trainer without a model uses this iteration's; a fixed part shifts the balance."""
    assert rebalance([.5, .5], [1.0, 1.0], [50, 50], min_share=0.0, tolerance=0.05,
                     costs=[(0.0, 0.1), (0.0, 1 / 30)]) == pytest.approx([.25, .75])
    assert rebalance([.5, .5], [1.0, 3.0], [50, 50], min_share=0.0, tolerance=0.05,
                     costs=[None, (0.0, 9 / 50)]) == pytest.approx([.9, .1])
    assert rebalance([.25, .75], [1.0, 1.0], [25, 75], min_share=0.0, tolerance=0.05,
                     costs=[(0.0, 1 / 25), (0.0, 1 / 75)]) is None
    # trainer 0: 0.5 s + 0.01 s/seed, trainer 1: 0.02 s/seed; 100 seeds: 0.5 + 0.01 n = 0.02 (100 - n) -> n = 50
    new = rebalance([.8, .2], [1.3, 0.4], [80, 20], min_share=0.0, tolerance=0.05,
                    costs=[(0.5, 0.01), (0.0, 0.02)])
    assert new == pytest.approx([.5, .5])


def test_fit_cost_separates_the_fixed_part_from_the_part_per_seed() -> None:
    assert fit_cost([(10, 1.2), (20, 1.4), (40, 1.8)]) == pytest.approx((1.0, 0.02))
    assert fit_cost([(50, 1.0), (52, 1.1)]) == pytest.approx((0.0, 2.1 / 102))  # seeds hardly vary: through zero
    assert fit_cost([(50, 1.0), (140, 1.9)]) == pytest.approx((0.0, 2.9 / 190))  # under COST_SPREAD apart
    assert fit_cost([(10, 2.0), (40, 1.0)]) == pytest.approx((0.0, 3.0 / 50))  # a negative slope is no cost
    assert fit_cost([]) is None


def test_rebalance_leaves_times_within_the_tolerance_alone() -> None:
    assert rebalance([.5, .5], [1.0, 1.04], [50, 50], min_share=0.0, tolerance=0.05) is None
    assert rebalance([.5, .5], [1.0, 1.06], [50, 50], min_share=0.0, tolerance=0.05) is not None
    assert rebalance([1.0], [1.0], [50], min_share=0.0, tolerance=0.05) is None  # nothing to balance against


def test_rebalance_keeps_the_share_of_a_trainer_without_seeds() -> None:
    new = rebalance([.2, .3, .5], [0.0, 2.0, 1.0], [0, 30, 50], min_share=0.0, tolerance=0.05)
    assert new is not None
    speed = [30 / 2.0, 50 / 1.0]
    assert new == pytest.approx([.2, .8 * speed[0] / sum(speed), .8 * speed[1] / sum(speed)])
    assert sum(new) == pytest.approx(1.0)


def test_rebalance_floor_is_respected_in_its_direction() -> None:
    new = rebalance([.5, .5], [100.0, 1.0], [50, 50], min_share=0.1, tolerance=0.05)
    assert new is not None and sum(new) == pytest.approx(1.0)
    assert new[0] < 0.2 and new[1] > 0.8  # the slow trainer keeps little, not nothing


def test_rebalance_never_goes_below_min_share() -> None:
    new = rebalance([.5, .5], [100.0, 1.0], [50, 50], min_share=0.1, tolerance=0.05)
    assert new is not None and min(new) >= 0.1 - 1e-12 and sum(new) == pytest.approx(1.0)


# ------------------------------------------------------------------------------------------------ threads


def test_threads_move_between_the_cpu_stages_only() -> None:
    t = Threads(2, 3, 4)
    assert t.move("SC", "TC") == Threads(1, 3, 5)
    assert t.move("Load", "SC") == Threads(3, 2, 4)
    assert t.move("TC", "Load") == Threads(2, 4, 3)
    assert Threads(1, 3, 4).move("SC", "TC") is None  # never below one thread
    for src, dst in [("Accel", "TC"), ("TC", "Accel"), ("SA", "SC"), ("SC", "SA"), ("TC", "TC")]:
        assert t.move(src, dst) is None, (src, dst)
    assert t.as_tuple() == (2, 3, 4)  # moves return new assignments


def test_default_threads_use_the_cores_and_pass_their_own_check() -> None:
    assert default_threads(2) == Threads(1, 1, 1)
    assert sum(default_threads(16).as_tuple()) == 16 and default_threads(16).trainer == 8
    for cores in range(1, 65):
        t = default_threads(cores)
        assert min(t.as_tuple()) >= 1 and sum(t.as_tuple()) == max(cores, 3), cores
        assert check_threads(t.as_tuple(), cores) is None, cores


def test_check_threads_refuses_what_the_cores_cannot_run() -> None:
    assert check_threads((1, 1, 1), 2) is None and check_threads((1, 1, 1), 1) is None
    assert check_threads((4, 4, 8), 16) is None
    assert "more than" in (check_threads((3, 1, 1), 2) or "")  # one count above the cores
    assert "more than" in (check_threads((2, 1, 1), 2) or "")  # 4 threads on 2 cores: above max(cores, 3)
    assert "more than" in (check_threads((8, 8, 1), 16) or "")
    assert ">= 1" in (check_threads((0, 1, 1), 4) or "")
    assert "three counts" in (check_threads((1, 1), 4) or "")
    assert "three counts" in (check_threads((1, 1, 1, 1), 4) or "")


# ------------------------------------------------------------------------------------------------ the model

DIMS = (10, 8, 4)
SHAPES = (BatchShape(DIMS, edges=(100, 20), vertices=(40, 10), input_vertices=120),
          BatchShape(DIMS, edges=(180, 40), vertices=(80, 20), input_vertices=200),
          BatchShape(DIMS, edges=(340, 80), vertices=(160, 40), input_vertices=360))
TABLE = SamplingTable(sizes=(10, 20, 40), threads=(1, 2, 4),
                      seconds=((1.0, 2.0, 4.0), (0.6, 1.0, 2.0), (0.4, 0.6, 1.2)), shapes=SHAPES)


def test_sampling_table_interpolates_between_measured_sizes() -> None:
    assert TABLE.predict(0, 1) == 0.0
    assert TABLE.predict(5, 1) == pytest.approx(0.5)  # below the smallest: through zero
    assert TABLE.predict(10, 1) == pytest.approx(1.0)
    assert TABLE.predict(15, 1) == pytest.approx(1.5)  # linear between 10 and 20
    assert TABLE.predict(30, 1) == pytest.approx(3.0)
    assert TABLE.predict(80, 1) == pytest.approx(8.0)  # above the largest: proportional
    # the row of the largest measured thread count not above the request
    assert TABLE.predict(30, 2) == pytest.approx(1.5)
    assert TABLE.predict(30, 3) == pytest.approx(1.5)
    assert TABLE.predict(30, 4) == pytest.approx(0.9)
    assert TABLE.predict(30, 64) == pytest.approx(0.9)


def test_sampling_table_shape_interpolates_every_count() -> None:
    assert TABLE.shape(20, DIMS) == SHAPES[1]
    assert TABLE.shape(30, DIMS) == BatchShape(DIMS, edges=(260, 60), vertices=(120, 30), input_vertices=280)
    assert TABLE.shape(5, DIMS) == BatchShape(DIMS, edges=(50, 10), vertices=(20, 5), input_vertices=60)
    assert TABLE.shape(80, DIMS) == BatchShape(DIMS, edges=(680, 160), vertices=(320, 80), input_vertices=720)


CPU_RATES = DeviceRates(gather=1e9, aggregate=2e9, macs=1e10, link=5e9, per_thread=True)


def _model(accel: DeviceRates, cores: int = 64) -> HybridModel:
    return HybridModel(dims=DIMS, cpu_sampling=TABLE, gpu_sampling=None, rates=[CPU_RATES, accel], cpu_index=0,
                       gpu_sampled=[False, False], cores=cores)


def test_stage_times_by_hand() -> None:
    accel = DeviceRates(gather=1e9, aggregate=6e9, macs=3e10, link=2e8, per_thread=False)
    m = _model(accel)
    threads = Threads(2, 2, 4)
    t = m.stage_times(40, [0.25, 0.75], threads)  # 10 and 30 seeds
    s0, s1 = SHAPES[0], TABLE.shape(30, DIMS)
    assert t["SC"] == pytest.approx(TABLE.predict(40, 2))  # both shares on the CPU sampler, 2 threads
    assert t["SA"] == 0.0
    assert t["Load"] == pytest.approx(t_load([s0, s1], 1e9 * 2))  # 2 loader threads
    assert t["Tran"] == pytest.approx(t_trans(s1, 2e8))
    assert t["TC"] == pytest.approx(t_trainer(s0, TrainerModel(2e9 * 4, 1e10 * 4)))  # 4 trainer threads
    assert t["TA"] == pytest.approx(t_trainer(s1, TrainerModel(6e9, 3e10)))
    assert t["sync"] == pytest.approx(t_sync(DIMS, 2e8))
    prop = max(t["TC"], t["TA"]) + t["sync"]
    assert t["iteration"] == pytest.approx(t_execution(t["SC"], t["Load"], t["Tran"], prop))  # 64 cores: no cap
    # Eq. 6 per full batch, the remainder's own, and the pipeline filled once
    rest = m.stage_times(20, [0.25, 0.75], threads)
    fill = t["SC"] + t["Load"] + t["Tran"]
    assert m.epoch_time(100, 40, [0.25, 0.75], threads) == pytest.approx(2 * t["iteration"] + rest["iteration"]
                                                                         + fill)
    assert m.epoch_time(80, 40, [0.25, 0.75], threads) == pytest.approx(2 * t["iteration"] + fill)


def test_initial_split_is_in_proportion_to_the_trainers_speeds() -> None:
    threads = Threads(1, 1, 1)
    three_x = DeviceRates(gather=1e9, aggregate=6e9, macs=3e10, link=1e15, per_thread=False)
    assert _model(three_x).initial_split(40, threads) == pytest.approx([0.25, 0.75])
    # the accelerator's time bundles its transfer: a link that takes 3x the CPU trainer's time sets its share
    cpu_time = t_trainer(SHAPES[2], TrainerModel(2e9, 1e10))
    slow_link = DeviceRates(gather=1e9, aggregate=6e9, macs=3e10,
                            link=SHAPES[2].input_vertices * DIMS[0] * 4 / (3 * cpu_time), per_thread=False)
    assert _model(slow_link).initial_split(40, threads) == pytest.approx([0.75, 0.25])
    # two CPU trainer threads make the CPU twice as fast
    assert _model(three_x).initial_split(40, Threads(1, 1, 2)) == pytest.approx([0.4, 0.6])


def test_calibration_scales_equation_10_to_the_measured_pass() -> None:
    """A trainer measured at twice its Eq. 10 time predicts twice Eq. 10 on any batch; the initial split follows."""
    threads = Threads(1, 1, 1)
    three_x = DeviceRates(gather=1e9, aggregate=6e9, macs=3e10, link=1e15, per_thread=False)
    m = _model(three_x)
    cpu, accel = TrainerModel(2e9, 1e10), TrainerModel(6e9, 3e10)
    m.calibrate([2 * t_trainer(SHAPES[1], cpu), 0.5 * t_trainer(SHAPES[1], accel)], [SHAPES[1], SHAPES[1]], threads)
    assert m.trainer_time(0, SHAPES[2], threads) == pytest.approx(2 * t_trainer(SHAPES[2], cpu))
    assert m.trainer_time(1, SHAPES[0], threads) == pytest.approx(0.5 * t_trainer(SHAPES[0], accel))
    t = m.stage_times(40, [0.25, 0.75], threads)
    assert t["TC"] == pytest.approx(2 * t_trainer(SHAPES[0], cpu))
    assert t["TA"] == pytest.approx(0.5 * t_trainer(TABLE.shape(30, DIMS), accel))
    # Eq. 10 says 3x; calibrated, the accelerator is 3 x 2 / 0.5 = 12x faster
    assert m.initial_split(40, threads) == pytest.approx([1 / 13, 12 / 13])


def test_measured_sampling_table_and_cached_device_rates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    g = csbm(nodes=1000, features=8, avg_degree=8, seed=3)
    topo = CSRTopology.from_graph(g)
    ids = torch.nonzero(g.train_mask).view(-1)  # type: ignore[arg-type]
    table = measure_sampling(topo, ids, (4, 3), (8, 16, 5), 40, max_threads=4)
    assert table.sizes == (10, 20, 40) and table.threads == (1, 2, 4)
    assert len(table.seconds) == 3 and all(len(r) == 3 and min(r) > 0 for r in table.seconds)
    assert [s.vertices[-1] for s in table.shapes] == [10, 20, 40]  # the seeds are the last layer's vertices
    assert table.shapes[0].input_vertices < table.shapes[1].input_vertices < table.shapes[2].input_vertices
    # measured once per machine: a cached entry is what device_rates returns
    monkeypatch.setenv("GNNSCALE_CACHE_DIR", str(tmp_path))
    first = device_rates(CPU)
    assert (tmp_path / "throughput.json").exists()
    import json

    saved = json.loads((tmp_path / "throughput.json").read_text())
    key = next(k for k in saved if k.startswith("hybrid:"))
    saved[key] = {"gather": 1.0, "aggregate": 2.0, "macs": 3.0, "link": 4.0}
    (tmp_path / "throughput.json").write_text(json.dumps(saved))
    again = device_rates(CPU)
    assert (again.gather, again.aggregate, again.macs) == (1.0, 2.0, 3.0) and again.per_thread
    assert first.gather > 1.0


# ------------------------------------------------------------------------------------------------ counters


def test_counters_bytes_seeds_stage_times_and_mteps() -> None:
    g = csbm(nodes=1200, features=12, avg_degree=10, seed=5)
    shares = (0.2, 0.3, 0.5)
    eng = _hybrid(g, ("cpu", "cpu:1", "cpu:2"), batch_size=32, drm="off", shares=shares)
    F = g.num_features
    G = 3
    expected_bytes, edges, seeds = [0] * G, [0] * G, [0] * G
    real = eng._transfer

    def transfer(it: _Iteration) -> _Iteration:
        for t in range(G):
            seeds[t] += _cut_sizes(it.total, list(shares))[t]
            edges[t] += sum(b.num_edges for b in it.blocks[t])
            if t != eng.cpu_index:  # input rows x width x 4 bytes, and the topology the CPU sampled for it
                expected_bytes[t] += it.blocks[t][0].num_src * F * 4 + sum(b.nbytes() for b in it.blocks[t])
        return real(it)

    eng._transfer = transfer  # type: ignore[method-assign]
    n = int(g.train_mask.sum())  # type: ignore[union-attr]
    for epoch in (1, 2):
        expected_bytes[:], edges[:], seeds[:] = [0] * G, [0] * G, [0] * G
        rec = eng.train_epoch(epoch)
        assert rec["accel_bytes"] == expected_bytes[1:] and min(rec["accel_bytes"]) > 0
        assert rec["trainer_seeds"] == seeds and sum(rec["trainer_seeds"]) == n
        assert rec["trainer_sampled_edges"] == edges and rec["sampled_edges"] == sum(edges)
        assert rec["batches"] == -(-n // 32) and rec["trainers"] == G
        for k in STAGE_TIMES:
            assert rec[k] >= 0, k
        assert rec["sa_s"] == 0.0  # no GPU sampler
        assert rec["tc_s"] == pytest.approx(rec["trainer_s"][0])
        # per iteration the slowest accelerator: between the slower one's sum and both sums together
        assert max(rec["trainer_s"][1:]) - 1e-9 <= rec["ta_s"] <= sum(rec["trainer_s"][1:]) + 1e-9
        assert rec["mteps"] == pytest.approx(rec["sampled_edges"] / eng.measured["epoch_s"] / 1e6, rel=1e-9)
        assert rec["gpu_sampled"] == [] and rec["split"] == list(shares)
    report = eng.report()
    assert set(report["predicted"]) <= set(report["measured"]) | {"iteration"}
    assert all(v >= 0 for v in report["predicted"].values()) and all(v >= 0 for v in report["measured"].values())
    assert "DRM off" in eng.describe() and "--shares" in eng.describe()


def test_replicas_with_a_master_that_is_not_the_first_device() -> None:
    g = csbm(nodes=200, features=6, avg_degree=5, seed=1)
    assert g.num_classes is not None
    model = build_model("sage", g.num_features, 8, g.num_classes, layers=2, dropout=0.0, heads=1, seed=0)
    reps = Replicas(model, [CPU, CPU, CPU], master=1)
    assert reps.models[1] is model and reps.models[0] is not model and reps.models[2] is not model
    for k, m in enumerate(reps.models):
        for p in m.parameters():
            p.grad = torch.full_like(p, float(k + 1))
    reps.reduce()
    assert all(torch.equal(p.grad, torch.full_like(p, 6.0)) for p in model.parameters())  # type: ignore[arg-type]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    reps.sync()
    for m in (reps.models[0], reps.models[2]):
        for p, q in zip(model.parameters(), m.parameters(), strict=True):
            assert torch.equal(p, q) and q.grad is None


# ------------------------------------------------------------------------------------------------ evaluation


@pytest.mark.parametrize("eval_fanouts", [None, (3, 2)])
def test_evaluation_equals_the_minibatch_engines_for_the_same_weights(eval_fanouts: tuple[int, ...] | None) -> None:
    g = csbm(nodes=1200, features=12, avg_degree=10, seed=5)
    hy = _hybrid(g, batch_size=32, drm="off", shares=(0.3, 0.7), eval_fanouts=eval_fanouts)
    mb = _minibatch(g, batch_size=32, eval_fanouts=eval_fanouts)
    untrained = hy.evaluate()
    hy.train_epoch(1)
    hy.train_epoch(2)
    mb.model.load_state_dict(hy.model.state_dict())
    got, want = hy.evaluate(), mb.evaluate()
    assert got == want
    assert got != untrained  # the weights changed, and evaluation saw it
    if eval_fanouts is None:
        torch.testing.assert_close(hy._layerwise(), mb._layerwise(), rtol=1e-5, atol=1e-6)
        assert torch.equal(hy.predict(), mb.predict())


# ------------------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize(("kw", "message"), [
    (dict(devices=("cuda:0", "cuda:1")), "has no CPU"),
    (dict(devices=("cpu", "cpu")), "more than once"),
    (dict(devices=("cpu", "cpu:0")), "more than once"),
    (dict(devices=("cpu:1", "CPU", "cpu:1")), "more than once"),
    (dict(devices=("cpu", "cpu:1"), shares=(1.5, -0.5)), "must each lie in \\(0, 1\\)"),
    (dict(devices=("cpu", "cpu:1"), shares=(0.0, 1.0)), "must each lie in \\(0, 1\\)"),
    (dict(devices=("cpu", "cpu:1"), shares=(0.5, 0.6)), "must sum to 1"),
    (dict(devices=("cpu", "cpu:1"), shares=(0.2, 0.3, 0.5)), "3 fraction\\(s\\) for 2 device"),
    (dict(threads=((os.cpu_count() or 1) + 1, 1, 1)), "more than this machine's"),
    (dict(threads=(1, 1)), "three counts"),
    (dict(threads=(1, 1, 1, 1)), "three counts"),
    (dict(threads=(0, 1, 1)), ">= 1"),
    (dict(drm="maybe"), "unknown --drm"),
])
def test_bad_hybrid_config_is_refused(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TrainConfig(engine="hybrid", **kw)


def test_thread_sum_is_checked_against_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    TrainConfig(engine="hybrid", threads=(1, 1, 1))  # three threads share two cores: allowed
    with pytest.raises(ConfigError, match="at most 3"):
        TrainConfig(engine="hybrid", threads=(2, 1, 1))
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    TrainConfig(engine="hybrid", threads=(4, 4, 8))
    with pytest.raises(ConfigError, match="at most 16"):
        TrainConfig(engine="hybrid", threads=(8, 8, 1))


SMALL = "csbm:nodes=300,features=8"


def _cli_cases(m: str) -> dict[str, list[str]]:
    cores = os.cpu_count() or 1
    base = ["train", "--dataset", SMALL, "--engine", "hybrid", "--metrics", m]
    return {
        "accelerators without a CPU": [*base, "--devices", "cuda:0,cuda:1"],
        "a repeated device": [*base, "--devices", "cpu,cpu"],
        "cpu and cpu:0": [*base, "--devices", "cpu,cpu:0"],
        "a share outside (0, 1)": [*base, "--devices", "cpu,cpu:1", "--shares", "1.5,-0.5"],
        "threads above the cores": [*base, "--threads", f"{cores + 1},1,1"],
        "two thread counts": [*base, "--threads", "1,1"],
        "threads not integers": [*base, "--threads", "a,b,c"],
        "zero threads": [*base, "--threads", "0,1,1"],
        "unknown --drm": [*base, "--drm", "maybe"],
    }


def test_bad_hybrid_cli_input_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m = tmp_path / "metrics.jsonl"
    for what, argv in _cli_cases(str(m)).items():
        code = main(argv)
        out = capsys.readouterr()
        lines = out.err.strip().splitlines()
        assert code == 2, f"{what}: exit {code}, stderr {out.err!r}"
        assert len(lines) == 1 and lines[0].startswith("error: "), f"{what}: {out.err!r}"
        assert "Traceback" not in out.err and not m.exists(), what


def test_bad_hybrid_cli_input_in_a_fresh_process(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "gnnscale.cli", "train", "--dataset", SMALL, "--engine", "hybrid",
                        "--devices", "cpu,cpu:0", "--metrics", str(tmp_path / "m.jsonl")],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1 and "more than once" in r.stderr, r.stderr


def test_cli_hybrid_flags_reach_the_engine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    m = tmp_path / "m.jsonl"
    assert main(["train", "--dataset", "csbm:nodes=600,features=8", "--engine", "hybrid", "--devices", "cpu,cpu:1",
                 "--shares", "0.3,0.7", "--drm", "off", "--threads", "1,1,1", "--batch-size", "20", "--fanouts",
                 "4,3", "--epochs", "1", "--quiet", "--metrics", str(m)]) == 0
    capsys.readouterr()
    rec = json.loads(m.read_text().splitlines()[0])
    assert rec["split"] == [0.3, 0.7] and rec["threads"] == [1, 1, 1] and rec["drm_work_moves"] == 0
    assert rec["batches"] == 3 and rec["trainers"] == 2


# ------------------------------------------------------------------------------------------------ real data


def test_hybrid_accuracy_on_amazon_computers_matches_the_minibatch_engine() -> None:
    """GraphSAGE, batches of 100 (two steps per epoch over 200 labelled vertices), fanouts 15,10, the same seed:
    the hybrid run (cpu + cpu:1, DRM on) learns what the mini-batch engine learns."""
    g = load_dataset(f"npz:{need_file('gnn-benchmark/amazon_electronics_computers.npz')}")
    kw: dict[str, Any] = dict(hidden=64, dropout=0.5, lr=0.01, seed=0, batch_size=100, fanouts=(15, 10))
    epochs = 25
    acc = {}
    for name, eng in (("minibatch", _minibatch(g, **kw)), ("hybrid", _hybrid(g, drm="on", **kw))):
        for epoch in range(1, epochs + 1):
            eng.train_epoch(epoch)
        acc[name] = eng.evaluate()["test_acc"]
    assert acc["minibatch"] > 0.7, acc  # it learned (10 classes)
    assert abs(acc["hybrid"] - acc["minibatch"]) <= 0.01, acc


def test_the_hybrid_engines_training_device_is_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The synchronizer and master model live on the CPU: with or without --devices, even where a GPU would be
    --device auto's pick (CUDA faked present), and wherever the CPU stands in the list."""
    from gnnscale.engines import resolve_devices
    from gnnscale.testing import fake_accelerator

    fake_accelerator(monkeypatch, 1)
    assert resolve_devices(_config(engine="hybrid"), "auto") == torch.device("cpu")
    assert resolve_devices(_config(engine="minibatch"), "auto") == torch.device("cuda")
    assert resolve_devices(_config(engine="hybrid", devices=("cuda:0", "cpu")), "auto") == torch.device("cpu")
    with pytest.raises(ConfigError, match="--devices"):
        resolve_devices(_config(engine="hybrid"), "cuda:0")
