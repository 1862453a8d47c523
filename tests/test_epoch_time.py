"""The full-graph engines' epoch-time models (gnnscale.plan.work, gnnscale.plan.fullgraph_time) and --engine auto's
choice by them: each term is counted from the work on a small seeded graph with injected rates, so removing any
term, or pricing it with the wrong rate, fails a test; nothing here depends on this machine's speed."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

import gnnscale.engines as engines
import gnnscale.plan.fullgraph_time as ft
from gnnscale.cli import main
from gnnscale.config import TrainConfig
from gnnscale.engines import InMemoryEngine, OffloadEngine, TaskParallelEngine, select_engine
from gnnscale.graph.datasets import load_dataset
from gnnscale.partition.dedup import Throughput, comm_cost
from gnnscale.plan import rates as rates_mod
from gnnscale.plan.epoch_time import EpochTime
from gnnscale.plan.locality import graph_aggregate_rate
from gnnscale.plan.offload import plan_offload
from gnnscale.plan.rates import Rates
from gnnscale.plan.taskparallel import plan_taskparallel
from gnnscale.plan.work import compute_terms, input_dropout_s, layer_work

CPU = torch.device("cpu")
RATES = Rates(gather=2e9, copy=1e9, aggregate=((16, 1e8), (64, 5e7), (256, 2e7)), flops=1e10, memory=4e9,
              disk=1e8, machine="test", measured="", versions="", threads=1)


@pytest.fixture(scope="module")
def graph():  # type: ignore[no-untyped-def]
    return load_dataset("csbm:nodes=600,features=32,classes=4", seed=0)


@pytest.fixture
def fixed(monkeypatch: pytest.MonkeyPatch) -> Rates:
    """The planner (engines.assess, select_engine) prices with RATES."""
    monkeypatch.setattr(engines, "rates", lambda device, recalibrate=False: RATES)
    return RATES


def test_layer_work_counts_edges_widths_and_weights(graph) -> None:  # type: ignore[no-untyped-def]
    cfg = TrainConfig(model="gcn", hidden=16, layers=2)
    work = layer_work(graph, cfg)
    E = graph.num_edges + graph.num_nodes
    assert [w.edges for w in work] == [E, E]
    # GCN projects first where it narrows (32 -> 16, 16 -> 4): it aggregates at the output width
    assert [(w.in_width, w.out_width, w.agg_width, w.weights) for w in work] == [(32, 16, 16, 512), (16, 4, 4, 64)]
    assert [w.backward_aggregates for w in work] == [True, True]  # layer 0 projects: its aggregation has a grad
    sage = layer_work(graph, TrainConfig(model="sage", hidden=64, layers=2))
    assert sage[0].agg_width == 32 and not sage[0].backward_aggregates  # the features need no gradient
    assert sage[0].weights == 2 * 32 * 64


def test_compute_terms_price_counted_work(graph) -> None:  # type: ignore[no-untyped-def]
    cfg = TrainConfig(model="sage", hidden=64, layers=2)
    work = layer_work(graph, cfg)
    t = compute_terms(work, RATES, num_classes=4, params=100)
    E, V = work[0].edges, graph.num_nodes
    assert [w.agg_width for w in work] == [32, 4]  # layer 1 narrows 64 -> 4: it projects first
    agg = E / RATES.aggregate_rate(32) + E / RATES.aggregate_rate(4)
    assert t["aggregate"] == pytest.approx(agg)
    assert t["aggregate_backward"] == pytest.approx(E / RATES.aggregate_rate(4))  # not layer 0's
    dense0 = max(2 * V * 2 * 32 * 64 / RATES.flops, 4 * V * (32 + 64) / RATES.memory)
    dense1 = max(2 * V * 2 * 64 * 4 / RATES.flops, 4 * V * (64 + 4) / RATES.memory)
    assert t["update"] == pytest.approx(dense0 + dense1)
    assert t["update_backward"] == pytest.approx(dense0 + 2 * dense1)  # no input gradient at layer 0
    assert t["optimizer"] == pytest.approx(16 * 4 * 100 / RATES.memory)
    faster = compute_terms(work, replace(RATES, aggregate=tuple((w, 2 * r) for w, r in RATES.aggregate)),
                           num_classes=4, params=100)
    assert faster["aggregate"] == pytest.approx(t["aggregate"] / 2)


def test_inmemory_is_the_sum_of_its_terms(graph) -> None:  # type: ignore[no-untyped-def]
    cfg = TrainConfig(model="gcn", hidden=16)
    p = InMemoryEngine.predict_epoch(graph, cfg, CPU, RATES)
    assert p is not None and p.seconds == pytest.approx(sum(p.terms.values())) and set(p.bytes) == {"device"}
    slow = InMemoryEngine.predict_epoch(graph, cfg, CPU, replace(RATES, memory=RATES.memory / 4))
    assert slow is not None and slow.seconds > p.seconds


def _budgeted(model: str = "gcn") -> TrainConfig:
    return TrainConfig(model=model, hidden=16, memory_budget=200_000, dedup="none")


def test_offload_h2d_is_eq4_on_the_plans_volume(graph) -> None:  # type: ignore[no-untyped-def]
    cfg = _budgeted()
    plan = plan_offload(graph, cfg, CPU)
    assert plan.partition.chunks > 1
    p = OffloadEngine.predict_epoch(graph, cfg, CPU, RATES)
    assert p is not None
    tp = Throughput(hd=RATES.copy, dd=RATES.copy, ru=RATES.gather)
    widths = [w.agg_width if w.projects else w.in_width for w in layer_work(graph, cfg)]
    assert p.terms["h2d"] == pytest.approx(sum(comm_cost(plan.volume, "none", tp, 4 * w) for w in widths))
    assert p.terms["scatter"] == pytest.approx(comm_cost(plan.volume, "none", tp, 4 * widths[1]))
    V = graph.num_nodes  # layer 0 stores its output and cached aggregation (16 + 16), reads both back in backward
    assert p.terms["store"] == pytest.approx(4 * V * 32 / RATES.copy) == p.terms["load_grad"]
    assert p.seconds == pytest.approx(sum(p.terms.values()))  # the CPU: traffic and computation add up
    assert p.bytes["host"] > 0
    slower_bus = OffloadEngine.predict_epoch(graph, cfg, CPU, replace(RATES, copy=RATES.copy / 10))
    assert slower_bus is not None and slower_bus.terms["h2d"] > p.terms["h2d"]
    assert slower_bus.seconds > p.seconds


def test_offload_in_place_cpu_moves_only_the_features(graph) -> None:  # type: ignore[no-untyped-def]
    cfg = TrainConfig(model="gcn", hidden=16)
    p = OffloadEngine.predict_epoch(graph, cfg, CPU, RATES)
    assert p is not None and p.terms["store"] == 0 and p.terms["load_grad"] == 0 and p.terms["scatter"] == 0
    assert p.terms["h2d"] > 0  # layer 0 gathers its dropped-out features


def test_offload_recompute_term_is_what_the_engine_recomputes(graph) -> None:  # type: ignore[no-untyped-def]
    gat = _budgeted("gat")
    work = layer_work(graph, gat)
    p = OffloadEngine.predict_epoch(graph, gat, CPU, RATES)
    assert p is not None
    # GAT's layer 0 is not cacheable: its backward recomputes the whole layer (aggregation, update, attention)
    w0 = work[0]
    assert p.terms["recompute"] == pytest.approx(w0.dense_s(RATES) + w0.aggregate_s(RATES) + w0.attention_s(RATES) / 2)
    gcn = OffloadEngine.predict_epoch(graph, _budgeted(), CPU, RATES)
    assert gcn is not None
    assert gcn.terms["recompute"] == pytest.approx(layer_work(graph, _budgeted())[0].dense_s(RATES))  # UPDATE only


def test_offload_disk_term_prices_spill_at_the_disk_rate(graph, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    cfg = TrainConfig(model="gcn", hidden=16, host_memory=1000)
    monkeypatch.setattr(ft, "estimate_host_bytes", lambda *a, **k: {"activations": 11_000})
    plan = plan_offload(graph, replace(cfg, host_memory=None), CPU)
    p = ft.predict_offload(graph, cfg, CPU, RATES, plan)
    assert p.bytes["disk"] == 2 * 10_000 and p.terms["disk"] == pytest.approx(20_000 / RATES.disk)
    fast = ft.predict_offload(graph, cfg, CPU, replace(RATES, disk=RATES.disk * 10), plan)
    assert fast.seconds < p.seconds


def test_offload_devices_share_the_host_bus(graph, sims) -> None:  # type: ignore[no-untyped-def]
    cfg = _budgeted()
    plan = plan_offload(graph, cfg, CPU)
    one = ft.predict_offload(graph, cfg, sims[0], RATES, plan, cluster=ft.Cluster(devices_per_machine=1))
    two = ft.predict_offload(graph, cfg, sims[0], RATES, plan, cluster=ft.Cluster(devices_per_machine=2))
    assert two.terms["h2d"] == one.terms["h2d"]  # one bus: the traffic does not divide
    assert two.terms["aggregate"] == pytest.approx(one.terms["aggregate"] / 2)  # the computation does


def test_taskparallel_one_device_adds_t_p_and_traffic(graph) -> None:  # type: ignore[no-untyped-def]
    cfg = TrainConfig(model="dgcn", hidden=16)
    p = TaskParallelEngine.predict_epoch(graph, cfg, CPU, RATES)
    assert p is not None
    t = p.terms
    assert p.seconds == pytest.approx(t["t_tasks"] + t["p_tasks"] + t["features"] + t["handoff"])
    assert t["features"] == pytest.approx(2 * 4 * graph.num_nodes * 32 / RATES.copy)  # read as a chunk load is
    work = layer_work(graph, cfg)
    props = [w for w in work if w.edges]
    assert len(props) == 2
    assert t["p_tasks"] == pytest.approx(sum(2 * w.aggregate_s(RATES) for w in props))


def test_taskparallel_pipeline_over_devices(graph, sims) -> None:  # type: ignore[no-untyped-def]
    skip = TrainConfig(model="dgcn", hidden=16, devices=("sim:0", "sim:1"), dependency="skip")
    plan = plan_taskparallel(graph, skip, sims[0])
    p = ft.predict_taskparallel(graph, skip, sims[0], RATES, plan)
    t = p.terms
    S = plan.subgraphs
    a, b = t["t_tasks"] / plan.n_t, t["p_tasks"] / plan.n_p
    assert p.seconds == pytest.approx(max(a, b) + min(a, b) / S + t["features"] + t["handoff"])
    exact = ft.predict_taskparallel(graph, replace(skip, dependency="exact"), sims[0], RATES, plan)
    assert exact.seconds > p.seconds  # the P side waits for every T task


def _fake(seconds: float):  # type: ignore[no-untyped-def]
    return classmethod(lambda cls, *a, **k: EpochTime(seconds, {"x": seconds}, {}, "fake"))


def test_auto_picks_the_fastest_predicted(graph, fixed, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    cfg = TrainConfig(model="gcn", hidden=16)
    monkeypatch.setattr(InMemoryEngine, "predict_epoch", _fake(5.0))
    monkeypatch.setattr(OffloadEngine, "predict_epoch", _fake(1.0))
    monkeypatch.setattr(OffloadEngine, "predict_floor", classmethod(lambda cls, *a, **k: 0.0))
    cls, rejected = select_engine(graph, cfg, CPU)
    assert cls is OffloadEngine  # not the first that fits
    assert rejected.why.startswith("auto: offload, predicted 1 s/epoch against inmemory 5 s")
    monkeypatch.setattr(OffloadEngine, "predict_epoch", _fake(9.0))
    cls, rejected = select_engine(graph, cfg, CPU)
    assert cls is InMemoryEngine and "offload 9 s" in rejected.why


def test_auto_on_real_predictions_prefers_inmemory_and_skips_planning_offload(
        graph, fixed, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    cfg = TrainConfig(model="gcn", hidden=16)

    def boom(*a, **k):  # type: ignore[no-untyped-def]
        raise AssertionError("offload planned although its floor is slower than inmemory's prediction")

    monkeypatch.setattr(engines.OffloadEngine, "_not_supported_reasons", classmethod(boom))
    cls, rejected = select_engine(graph, cfg, CPU)
    assert cls is InMemoryEngine and "offload at least" in rejected.why


def test_an_engine_without_prediction_ranks_last(graph, fixed, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    cfg = TrainConfig(model="gcn", hidden=16)
    monkeypatch.setattr(InMemoryEngine, "predict_epoch", classmethod(lambda cls, *a, **k: None))
    monkeypatch.setattr(OffloadEngine, "predict_epoch", _fake(100.0))
    monkeypatch.setattr(OffloadEngine, "predict_floor", classmethod(lambda cls, *a, **k: 0.0))
    assert select_engine(graph, cfg, CPU)[0] is OffloadEngine


def test_rates_are_measured_again_at_another_thread_count(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(rates_mod, "cache_file", lambda: tmp_path / "rates.json")
    calls: list[int] = []

    def fake(device: torch.device) -> Rates:
        calls.append(torch.get_num_threads())
        return replace(RATES, versions=rates_mod.versions(), threads=torch.get_num_threads())

    monkeypatch.setattr(rates_mod, "measure_apart", fake)
    before = torch.get_num_threads()
    try:
        rates_mod.rates(CPU)
        rates_mod.rates(CPU)
        assert len(calls) == 1  # cached
        torch.set_num_threads(before + 1)
        assert rates_mod.rates(CPU).threads == before + 1 and len(calls) == 2
        rates_mod.rates(CPU, recalibrate=True)
        assert len(calls) == 3
        path = tmp_path / "rates.json"
        saved = json.loads(path.read_text())
        # each thread count keeps its own entry, and what was measured beside it (a what-if's sync cost)
        assert sorted(e["threads"] for e in saved.values()) == [before, before + 1]
        key = next(k for k, e in saved.items() if e["threads"] == before + 1)
        assert key.endswith(f"@{before + 1}t")
        saved[key]["sync_cost"] = {"2": 1e-3}
        path.write_text(json.dumps(saved))
        assert rates_mod.rates(CPU).threads == before + 1 and len(calls) == 3  # still cached, sync cost and all
    finally:
        torch.set_num_threads(before)
    assert rates_mod.rates(CPU).threads == before and len(calls) == 3  # its own entry, kept


def test_plan_prints_and_train_says_the_prediction(fixed, capsys) -> None:  # type: ignore[no-untyped-def]
    spec = "csbm:nodes=600,features=32,classes=4"
    assert main(["plan", "--dataset", spec, "--device", "cpu", "--hidden", "16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    by = {c["name"]: c for c in out["candidates"]}
    assert by["inmemory"]["predicted"]["terms"]["aggregate"] > 0 and "device" in by["inmemory"]["predicted"]["bytes"]
    assert by["taskparallel"]["predicted"] is None  # gcn: it cannot run
    assert out["why"].startswith(f"auto: {out['chosen']}, predicted")
    assert main(["plan", "--dataset", spec, "--device", "cpu", "--hidden", "16"]) == 0
    assert "predicted about" in capsys.readouterr().out
    assert main(["train", "--dataset", spec, "--device", "cpu", "--hidden", "16", "--epochs", "1", "--quiet"]) == 0
    assert "auto: inmemory, predicted" in capsys.readouterr().out


def test_small_arrays_run_at_the_cached_rates(graph) -> None:  # type: ignore[no-untyped-def]
    r = replace(RATES, memory_cached=4e10, aggregate_cached=((16, 1e9), (64, 5e8), (256, 2e8)))
    assert r.memory_rate(1 << 20) == pytest.approx(4e10) and r.memory_rate(64 << 20) == pytest.approx(RATES.memory)
    assert RATES.memory < r.memory_rate(20 << 20) < 4e10
    assert r.aggregate_rate(64, 1 << 20) == pytest.approx(5e8)
    assert r.aggregate_rate(64, 64 << 20) == pytest.approx(5e7) == r.aggregate_rate(64)
    work = layer_work(graph, TrainConfig(model="gcn", hidden=16))  # 600 vertices: everything fits the cache
    near, far = (compute_terms(work, x, num_classes=4, params=100) for x in (r, RATES))
    assert near["aggregate"] == pytest.approx(far["aggregate"] / 10)
    # the input's dropout passes run from cache; the activations, dropout and loss write fresh tensors, whose pages
    # are touched anew: the streamed rate at any size
    inp = 600 * work[0].in_width
    fresh_near = near["elementwise"] - input_dropout_s(inp, r)
    assert fresh_near == pytest.approx(far["elementwise"] - input_dropout_s(inp, RATES))
    assert input_dropout_s(inp, r) == pytest.approx(input_dropout_s(inp, RATES) * RATES.memory / 4e10)


def test_a_graphs_own_aggregation_rate_prices_its_layers_on_a_cpu() -> None:
    g = load_dataset("csbm:nodes=20000,avg_degree=10,features=16", seed=0)  # 200K edges: probed
    own = graph_aggregate_rate(g, 16)
    assert own > 0 and graph_aggregate_rate(g, 16) == own  # measured once per graph and width
    work = layer_work(g, TrainConfig(model="gcn", hidden=16))
    assert all(w.own_rate == graph_aggregate_rate(g, w.agg_width) for w in work if w.edges)
    cpu = replace(RATES, machine="cpu:x86_64x2")
    on_cpu = compute_terms(work, cpu, num_classes=4, params=100)["aggregate"]
    assert on_cpu == pytest.approx(sum(w.edges / w.own_rate for w in work if w.edges))
    accel = replace(RATES, machine="NVIDIA H200#0")  # an accelerator's rates: the probe (on the CPU) does not apply
    assert compute_terms(work, accel, num_classes=4, params=100)["aggregate"] == pytest.approx(
        sum(w.edges / RATES.aggregate_rate(w.agg_width, 4 * w.rows * w.agg_width) for w in work if w.edges))
    small = load_dataset("csbm:nodes=600,avg_degree=5,features=16", seed=0)
    assert graph_aggregate_rate(small, 16) == 0.0  # too few edges to tell: the calibrated rate


def test_input_dropout_is_priced_at_the_dropout_rate(graph) -> None:  # type: ignore[no-untyped-def]
    cfg = TrainConfig(model="gcn", hidden=16)
    base = InMemoryEngine.predict_epoch(graph, cfg, CPU, RATES)
    slow = InMemoryEngine.predict_epoch(graph, cfg, CPU, replace(RATES, dropout=1e6))
    assert base is not None and slow is not None
    assert slow.terms["elementwise"] - base.terms["elementwise"] == pytest.approx(
        graph.num_nodes * 32 / 1e6 - 4 * 4 * graph.num_nodes * 32 / RATES.memory)
