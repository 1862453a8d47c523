"""The hybrid engine's mechanisms, counted (a mutation review's findings): the pipeline holds at most one
iteration per stage, every seed is sampled once and every input row gathered once, the accelerator trains on what
the transfer stage handed it, the stages run on their thread counts, the stage counters are the slowest
accelerator's and per iteration, the prediction is for the split in force, each term of the performance model
shows in the regime it dominates, and DRM's seed, thread and sampling moves go where Algorithm 1 says.

The engine's helpers (``_hybrid``, ``_force_times``) are ``tests/test_hybrid.py``'s.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from test_hybrid import AHEAD, CPU, CPU_RATES, WAIT, _force_times, _hybrid

import gnnscale.engines.sampled.hybrid as hybrid_mod
import gnnscale.engines.sampled.stages as stages_mod
from gnnscale.engines.sampled.hybrid import COST_SAMPLES, _Iteration
from gnnscale.engines.sampled.stages import Propagated
from gnnscale.graph.generators import csbm
from gnnscale.plan.hybrid import (
    BatchShape,
    Decision,
    DeviceRates,
    HybridModel,
    SamplingTable,
    Threads,
    t_load,
    t_trans,
)

# ------------------------------------------------------------------------------------------------ pipeline


def test_the_engine_pipeline_holds_at_most_one_iteration_per_stage() -> None:
    """Figure 7's depth: while iteration i trains, the sampler has cut at most i + AHEAD (three stages, one
    iteration each). Catches the pipeline without hand-over (deeper lookahead: DRM's decisions land later)."""
    g = csbm(nodes=1200, features=12, avg_degree=10, seed=5)
    eng = _hybrid(g, batch_size=8, drm="off", shares=(0.5, 0.5))
    made: list[int] = []
    cond = threading.Condition()
    real_iterations, real_propagate = eng._iterations, eng._propagate

    def iterations(batches: list[torch.Tensor]) -> Iterator[_Iteration]:
        for it in real_iterations(batches):
            with cond:
                made.append(it.index)
                cond.notify_all()
            yield it

    seen: dict[int, tuple[bool, bool]] = {}

    def propagate(g_: int, it: _Iteration, se: tuple[int, int]) -> Any:
        if it.index in (0, 4) and g_ == eng.cpu_index:
            with cond:
                filled = cond.wait_for(lambda: len(made) >= it.index + AHEAD + 1, timeout=WAIT)
                # the stages run in milliseconds: an over-full pipeline shows up well within this
                overran = cond.wait_for(lambda: len(made) > it.index + AHEAD + 1, timeout=0.5)
            seen[it.index] = (filled, overran)
        return real_propagate(g_, it, se)

    eng._iterations, eng._propagate = iterations, propagate  # type: ignore[method-assign]
    eng.train_epoch(1)
    assert seen == {0: (True, False), 4: (True, False)}, seen


def test_each_iteration_is_sampled_once_and_its_rows_loaded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Count seeds given to the sampler and host rows gathered by the loader: each seed is sampled by exactly one
    sampler (CPU or the accelerator's own), each trainer's input rows are gathered once, in ``loader`` slices."""
    g = csbm(nodes=1200, features=12, avg_degree=10, seed=5)
    eng = _hybrid(g, batch_size=16, drm="off", shares=(0.4, 0.6))
    eng.gpu_sampler = [False, True]  # the accelerator samples its own share
    sampled = [0]
    lock = threading.Lock()
    real_sample_blocks = stages_mod.sample_blocks

    def sample_blocks(topo: Any, seeds: torch.Tensor, *a: Any, **k: Any) -> Any:
        with lock:
            sampled[0] += int(seeds.numel())
        return real_sample_blocks(topo, seeds, *a, **k)

    monkeypatch.setattr(stages_mod, "sample_blocks", sample_blocks)
    gathered = {"rows": 0, "slices": 0}
    real_index_select = torch.index_select

    def index_select(src: torch.Tensor, dim: int, idx: torch.Tensor, *a: Any, **k: Any) -> Any:
        if src is eng.host_x and "out" in k:
            with lock:
                gathered["rows"] += int(idx.numel())
                gathered["slices"] += 1
        return real_index_select(src, dim, idx, *a, **k)

    monkeypatch.setattr(torch, "index_select", index_select)
    want_rows = [0]
    real_propagate = eng._propagate

    def propagate(g_: int, it: _Iteration, se: tuple[int, int]) -> Any:
        with lock:
            want_rows[0] += it.blocks[g_][0].num_src
        return real_propagate(g_, it, se)

    eng._propagate = propagate  # type: ignore[method-assign]
    rec = eng.train_epoch(1)
    n = int(g.train_mask.sum())  # type: ignore[union-attr]
    assert sampled[0] == n  # not a share sampled twice
    assert gathered["rows"] == want_rows[0]  # not loaded twice
    assert gathered["slices"] == eng.threads.loader * len(eng.devices) * rec["batches"]


def test_the_accelerator_trains_on_what_the_transfer_stage_handed_it() -> None:
    """Poison the accelerator's transferred features: its loss must show it (it must not re-read host memory)."""
    g = csbm(nodes=1200, features=12, avg_degree=10, seed=5)
    eng = _hybrid(g, batch_size=32, drm="off", shares=(0.5, 0.5))
    real_transfer = eng._transfer

    def transfer(it: _Iteration) -> _Iteration:
        it = real_transfer(it)
        it.x[1] = torch.full_like(it.x[1], float("nan"))  # type: ignore[arg-type]
        return it

    eng._transfer = transfer  # type: ignore[method-assign]
    assert math.isnan(eng.train_epoch(1)["loss"])


def test_the_stages_run_on_their_thread_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """--threads 2,2,2: the CPU sampler samples two shares at once (a handshake), the loader cuts each trainer's
    rows into two slices, and the CPU trainer runs with two intra-op threads."""
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    g = csbm(nodes=1200, features=12, avg_degree=10, seed=5)
    eng = _hybrid(g, ("cpu", "cpu:1", "cpu:2"), batch_size=32, drm="off", shares=(0.3, 0.3, 0.4),
                  threads=(2, 2, 2))
    barrier = threading.Barrier(2, timeout=10)
    calls = [0]
    lock = threading.Lock()
    real_sample_blocks = stages_mod.sample_blocks

    def sample_blocks(*a: Any, **k: Any) -> Any:
        with lock:
            calls[0] += 1
            first = calls[0] <= 2
        if first:
            barrier.wait()  # two CPU sampler threads at once, or BrokenBarrierError
        return real_sample_blocks(*a, **k)

    monkeypatch.setattr(stages_mod, "sample_blocks", sample_blocks)
    slices = [0]
    real_index_select = torch.index_select

    def index_select(src: torch.Tensor, *a: Any, **k: Any) -> Any:
        if src is eng.host_x and "out" in k:
            with lock:
                slices[0] += 1
        return real_index_select(src, *a, **k)

    monkeypatch.setattr(torch, "index_select", index_select)
    trainer_threads: list[int] = []
    real_propagate = eng._propagate

    def propagate(g_: int, it: _Iteration, se: tuple[int, int]) -> Any:
        out = real_propagate(g_, it, se)
        if g_ == eng.cpu_index:
            trainer_threads.append(torch.get_num_threads())
        return out

    eng._propagate = propagate  # type: ignore[method-assign]
    rec = eng.train_epoch(1)
    assert slices[0] == 2 * 3 * rec["batches"]
    assert set(trainer_threads) == {2}


# ------------------------------------------------------------------------------------------------ counters


def test_stage_counters_are_the_slowest_accelerators_and_averaged_per_iteration() -> None:
    g = csbm(nodes=4000, features=12, avg_degree=10, seed=5)
    eng = _hybrid(g, ("cpu", "cpu:1", "cpu:2"), batch_size=16, drm="off", shares=(0.1, 0.8, 0.1))
    fixed = [1e-3, 3e-3, 2e-3]
    real_transfer, real_propagate = eng._transfer, eng._propagate
    tran: list[tuple[float, float]] = []

    def transfer(it: _Iteration) -> _Iteration:
        it = real_transfer(it)
        tran.append((it.times["Tran"], max(it.transfer_s[1:])))
        return it

    def propagate(g_: int, it: _Iteration, se: tuple[int, int]) -> Any:
        return Propagated(fixed[g_], real_propagate(g_, it, se).loss, fixed[g_])

    eng._transfer, eng._propagate = transfer, propagate  # type: ignore[method-assign]
    rec = eng.train_epoch(1)
    b = rec["batches"]
    assert b >= 20
    assert all(a == m for a, m in tran), tran  # Tran: the slowest accelerator's copy
    assert rec["ta_s"] == pytest.approx(b * 3e-3) and rec["tc_s"] == pytest.approx(b * 1e-3)
    for k, name in (("TA", "ta_s"), ("TC", "tc_s"), ("Tran", "tran_s"), ("Load", "load_s"), ("SC", "sc_s")):
        assert eng.measured[k] == pytest.approx(rec[name] / b), k


def test_the_prediction_is_for_the_split_in_force() -> None:
    g = csbm(nodes=1200, features=12, avg_degree=10, seed=5)
    eng = _hybrid(g, batch_size=16, drm="off", shares=(0.5, 0.5), threads=(1, 1, 1))
    eng.load_state_dict({"split": [0.25, 0.75], "threads": [1, 1, 1], "gpu_sampler": [False, False]})  # a resume
    eng.train_epoch(1)
    n = int(g.train_mask.sum())  # type: ignore[union-attr]
    want = eng.perf.stage_times(16, [0.25, 0.75], Threads(1, 1, 1))
    want["epoch_s"] = eng.perf.epoch_time(n, 16, [0.25, 0.75], Threads(1, 1, 1))
    assert eng.report()["predicted"] == pytest.approx(want)


# ------------------------------------------------------------------------------------------------ the model

DIMS = (10, 8, 4)
SHAPES = (BatchShape(DIMS, edges=(100, 20), vertices=(40, 10), input_vertices=120),
          BatchShape(DIMS, edges=(180, 40), vertices=(80, 20), input_vertices=200),
          BatchShape(DIMS, edges=(340, 80), vertices=(160, 40), input_vertices=360))


def _table(scale: float) -> SamplingTable:
    return SamplingTable(sizes=(10, 20, 40), threads=(1, 2, 4),
                         seconds=tuple(tuple(scale * s for s in row) for row in
                                       ((1.0, 2.0, 4.0), (0.6, 1.0, 2.0), (0.4, 0.6, 1.2))), shapes=SHAPES)


def _model_of(accels: list[DeviceRates], cores: int = 64, sampling: float = 1e-9,
           gpu: list[bool] | None = None, gpu_table: SamplingTable | None = None) -> HybridModel:
    G = 1 + len(accels)
    return HybridModel(dims=DIMS, cpu_sampling=_table(sampling), gpu_sampling=gpu_table, rates=[CPU_RATES, *accels],
                       cpu_index=0, gpu_sampled=gpu or [False] * G, cores=cores)


def test_eq6_is_the_transfer_when_the_link_is_the_bottleneck() -> None:
    fast = DeviceRates(gather=1e9, aggregate=1e15, macs=1e15, link=1e5, per_thread=False)
    t = _model_of([fast]).stage_times(40, [0.25, 0.75], Threads(1, 1, 4))
    assert t["Tran"] > 2 * max(t["SC"], t["Load"], t["TC"] , t["TA"] + t["sync"])  # the case: transfer-bound
    assert t["iteration"] == pytest.approx(t["Tran"])


def test_eq9_adds_the_synchronisation_to_the_slowest_trainer() -> None:
    slow = DeviceRates(gather=1e9, aggregate=1e5, macs=1e6, link=1e6, per_thread=False)
    t = _model_of([slow]).stage_times(40, [0.25, 0.75], Threads(1, 1, 4))
    prop = t["TA"] + t["sync"]
    assert prop > max(t["SC"], t["Load"], t["Tran"], t["TC"]) and t["sync"] > 1e-3 * prop  # propagation-bound
    assert t["iteration"] == pytest.approx(prop)


def test_tran_and_sa_are_the_slowest_accelerators_and_sc_samples_only_the_cpu_sampled_shares() -> None:
    a = DeviceRates(gather=1e9, aggregate=6e9, macs=3e10, link=2e8, per_thread=False)
    b = DeviceRates(gather=1e9, aggregate=6e9, macs=3e10, link=1e8, per_thread=False)
    gpu_table = _table(0.5)
    m = _model_of([a, b], gpu=[False, True, True], gpu_table=gpu_table, sampling=1.0)
    split = [0.25, 0.25, 0.5]  # 10, 10 and 20 seeds of 40
    t = m.stage_times(40, split, Threads(2, 1, 1))
    s = [m.cpu_sampling.shape(x, DIMS) for x in (10, 10, 20)]
    assert t["Tran"] == pytest.approx(max(t_trans(s[1], 2e8), t_trans(s[2], 1e8)))
    assert t["SC"] == pytest.approx(m.cpu_sampling.predict(10, 1))  # the CPU trainer's share only
    assert t["SA"] == pytest.approx(max(gpu_table.predict(10, 1), gpu_table.predict(20, 1)))


def test_the_cpu_stages_cannot_use_more_cores_than_there_are() -> None:
    accel = DeviceRates(gather=1e9, aggregate=1e15, macs=1e15, link=1e15, per_thread=False)
    threads = Threads(1, 4, 1)
    t = _model_of([accel], cores=2).stage_times(40, [0.25, 0.75], threads)
    shapes = [_table(1).shape(10, DIMS), _table(1).shape(30, DIMS)]
    assert t["Load"] == pytest.approx(t_load(shapes, 1e9 * 2))  # four loader threads, two cores
    # the CPU's busy core-seconds over its two cores bound the iteration
    m = _model_of([accel], cores=2)
    base = m.stage_times(40, [0.25, 0.75], Threads(1, 1, 1))
    scale = max(base["Load"], base["TC"]) / base["SC"]  # a sampler as slow as the slower other CPU stage
    m = _model_of([accel], cores=2, sampling=1e-9 * scale)
    t = m.stage_times(40, [0.25, 0.75], Threads(1, 1, 1))
    cpu = (t["SC"] + t["Load"] + t["TC"]) / 2
    assert cpu > max(t["SC"], t["Load"], t["TC"], t["Tran"])
    assert t["iteration"] == pytest.approx(cpu)


class _Clock:
    """A stand-in for the hybrid module's ``time``: wall time runs ``wall`` times as fast as the thread's CPU
    time (a trainer that waited for a shared core), both advancing only when read."""

    def __init__(self, wall: float) -> None:
        self.wall, self.t = wall, 0.0

    def thread_time(self) -> float:
        self.t += 1.0
        return self.t

    def perf_counter(self) -> float:
        return self.wall * self.thread_time()

    @staticmethod
    def sleep(seconds: float) -> None:
        del seconds


def test_a_cpu_trainer_is_calibrated_on_its_own_cpu_time_not_its_wall_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU trainer's wall time counts the cores it waited for, which the model prices apart (the CPU's busy
    core-seconds over the cores): calibrated on it, the sharing counts twice away from the calibration point. The
    trainer reports both; the calibration takes the CPU time, DRM the wall time."""
    g = csbm(nodes=1200, features=12, avg_degree=10, seed=5)
    eng = _hybrid(g, batch_size=32, drm="off", shares=(0.5, 0.5))
    items = iter(eng._iterations([eng.train_ids[:32]]))
    it = eng._transfer(eng._load(eng._sample(next(items), 0)))
    monkeypatch.setattr(hybrid_mod, "time", _Clock(wall=3.0))
    out = [eng._propagate(k, it, (0, 1)) for k in range(2)]
    for p in out:  # CPU devices both ("cpu", "cpu:1"): wall three times the CPU seconds
        assert p.loss is not None and p.own_s > 0 and p.seconds == pytest.approx(3.0 * p.own_s)
    monkeypatch.undo()

    own = [0.5, 2.0]  # the calibration is fed the own seconds (the median over its runs), whatever the wall ones
    real, real_calibrate = eng._propagate, eng.perf.calibrate
    eng._propagate = lambda k, it, se: Propagated(9.0, real(k, it, se).loss, own[k])  # type: ignore[method-assign]
    fed: list[list[float]] = []

    def calibrate(measured: list[float], *a: Any, **k: Any) -> None:
        fed.append(list(measured))
        real_calibrate(measured, *a, **k)

    monkeypatch.setattr(eng.perf, "calibrate", calibrate)
    eng._calibrate()
    assert fed == [own]


# ------------------------------------------------------------------------------------------------ DRM


@pytest.mark.parametrize(("per_seed", "tran"), [([1e-4, 1e-4], 5e-3), ([1e-4, 1.3e-4], 1e-4)],
                         ids=["transfer-bound-accelerator", "thirty-percent-slower-accelerator"])
def test_drm_moves_seeds_off_an_accelerator_whose_transfer_or_training_is_slower(per_seed: list[float],
                                                                                   tran: float) -> None:
    """Algorithm 1 line 1: T_Accel = max(T_Tran, T_TA); equal training but a slow copy is a slow accelerator.
    And a 30% difference is beyond DRM_TOLERANCE (10%): seeds move."""
    g = csbm(nodes=1200, features=12, avg_degree=10, seed=5)
    eng = _hybrid(g, batch_size=16, drm="on", shares=(0.5, 0.5))
    _force_times(eng, per_seed=per_seed, Tran=tran)
    rec = eng.train_epoch(1)
    assert rec["drm_work_moves"] >= 1 and eng.split[0] > 0.55, eng.drm_log
    assert eng.drm_log and min(d["iteration"] for d in eng.drm_log) >= 1  # the warm-up iteration decides nothing
    assert all(len(s) <= COST_SAMPLES for s in eng.samples)


def test_thread_moves_are_applied_and_held_until_an_iteration_sampled_under_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Feature loading is the bottleneck and the CPU sampler the fastest CPU stage: threads go from the sampler to
    the loader, one per decision, and each decision waits for an iteration sampled under the previous one."""
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    g = csbm(nodes=1200, features=12, avg_degree=10, seed=5)
    eng = _hybrid(g, batch_size=8, drm="on", shares=(0.5, 0.5), threads=(3, 1, 1))
    _force_times(eng, per_seed=[1e-4, 1e-4], SC=1e-6, Load=1e-2, Tran=1e-4)
    versions: dict[int, int] = {}
    real_iterations = eng._iterations

    def iterations(batches: list[torch.Tensor]) -> Iterator[_Iteration]:
        for it in real_iterations(batches):
            versions[it.index] = it.version
            yield it

    eng._iterations = iterations  # type: ignore[method-assign]
    rec = eng.train_epoch(1)
    assert rec["threads"] == [1, 3, 1], eng.drm_log
    moves = [d["iteration"] for d in eng.drm_log if d["applied"] == "thread"]
    assert rec["drm_thread_moves"] == len(moves) == 2, eng.drm_log
    assert [versions[i] for i in moves] == [0, 1], (moves, versions)  # decision k saw an iteration cut under k-1


def test_sampling_work_moves_in_the_decided_direction() -> None:
    """SC -> SA puts an accelerator's sampling on its device; SA -> SC back on the CPU sampler (a CUDA device is
    named, never used: only the decision is applied)."""
    g = csbm(nodes=600, features=12, avg_degree=8, seed=5)
    eng = _hybrid(g, batch_size=64, drm="on", shares=(0.5, 0.5))
    eng.devices = [CPU, torch.device("cuda", 0)]
    eng.gpu_sampler = [False, False]
    it = _Iteration(0, 2, [torch.tensor([0]), torch.tensor([1])], eng.version)
    v = eng.version
    assert eng._apply(Decision("work", "SC", "SA", "SC"), it, [1.0, 1.0]) is not None
    assert eng.gpu_sampler == [False, True] and eng.version == v + 1
    assert eng._apply(Decision("work", "SC", "SA", "SC"), it, [1.0, 1.0]) is None  # nothing left to move
    assert eng._apply(Decision("work", "SA", "SC", "SA"), it, [1.0, 1.0]) is not None
    assert eng.gpu_sampler == [False, False] and eng.version == v + 2
