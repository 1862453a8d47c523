"""The sampled engines' predicted epochs (gnnscale.plan.sampled_epoch): every term of the minibatch engine's model
(sampling, the placement's reads per tier, the copy, the shared host bus, the blocks' work, the optimiser) and of
the hybrid engine's (HyScale-GNN's stages and Eq. 13's sync) from counted work on literal batches, with injected
rates; the engines' predictions on a seeded graph move the right way when a rate changes."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from gnnscale.config import TrainConfig
from gnnscale.engines.sampled.hybrid import HybridEngine
from gnnscale.engines.sampled.minibatch import MiniBatchEngine
from gnnscale.engines.sampled.predict import _store, predict_hybrid
from gnnscale.graph.datasets import load_dataset
from gnnscale.plan import sampled_epoch as se
from gnnscale.plan import work
from gnnscale.plan.epoch_time import HERE, Cluster
from gnnscale.plan.hybrid_model import BatchShape, SamplingTable
from gnnscale.plan.hybrid_resources import Threads
from gnnscale.plan.rates import Rates
from gnnscale.store.placement import HOST, Placement

RATES = Rates(gather=1e9, copy=2e8, aggregate=((2, 32e6), (64, 1e6)), flops=1e9, memory=4e9, disk=1e8)
SHAPE = BatchShape(dims=(2, 64, 2), edges=(40, 10), vertices=(10, 4), input_vertices=30)
TABLE = SamplingTable(sizes=(4,), threads=(1,), seconds=((0.01,),), shapes=(SHAPE,))
# three batches of a trainer's share: input rows by hotness rank (ranks < 4 are hot: partitions rank % 2)
RANKS = (torch.tensor([0, 1, 2, 3, 9, 9]), torch.tensor([0, 2, 5, 7, 8, 9]), torch.tensor([1, 3, 4, 6, 8, 9]))
PROBE = se.SampledProbe(TABLE, 4, RANKS)
# device 0 stores partition 0 and reads partition 1 from host memory; device 1 the reverse, over a link
PLACEMENT = Placement(stored=((0,), (1,)), source=((0, HOST), (0, 1)))
STORE = se.Store(PLACEMENT, hot_features=4, row_bytes=8)


def test_rows_per_tier_follow_the_placement() -> None:
    # hot rows per batch (of 6): partition 0 (ranks 0, 2): (2 + 2 + 0) / 3, partition 1 (ranks 1, 3): (2 + 0 + 2) / 3
    assert se.tier_rows(PROBE, STORE, 0) == pytest.approx({"local": 4 / 3, "peer": 0.0, "host": 6 - 4 / 3})
    assert se.tier_rows(PROBE, STORE, 1) == pytest.approx({"local": 4 / 3, "peer": 4 / 3, "host": 6 - 8 / 3})


def test_block_work_counts_edges_flops_and_elementwise_bytes() -> None:
    w = se.block_work(SHAPE, RATES)
    agg = 40 / RATES.aggregate_rate(2) + 2 * 10 / RATES.aggregate_rate(64)  # layer 2's again backward
    # forward and weight gradient at both layers, the input gradient at layer 2 only (layer 1's input: features)
    upd = (2 * 2 * 10 * 2 * 64 + 3 * 2 * 4 * 64 * 2) / RATES.flops
    # the 30 input rows' dropout, the hidden layer's passes over its 10 x 64 outputs, the loss over 4 x 2 scores
    passes = work.INPUT_PASSES * 30 * 2 + work.ELEMENTWISE_PASSES * 10 * 64 + work.LOSS_PASSES * 4 * 2
    elem = passes * 4 / RATES.memory
    assert w == pytest.approx({"aggregate": agg, "update": upd, "elementwise": elem})


def _feed(rates: Rates, on_bus: int) -> float:
    """Trainer 0's (the most host rows) feed of one batch on an accelerator, counted by hand."""
    host, local = 6 - 4 / 3, 4 / 3
    copy = host * 8 / rates.copy
    return 0.01 + host * 8 / rates.gather + local * 8 / (rates.memory / 2) + copy + (on_bus - 1) * copy


@pytest.mark.parametrize("cluster", [HERE, Cluster(devices_per_machine=4)])
def test_minibatch_feed_bound_epoch_is_every_feed_term(cluster: Cluster) -> None:
    slow = dataclasses.replace(RATES, copy=1e5)  # the feed far slower than the blocks' work
    e = se.minibatch_epoch(PROBE, STORE, slow, accelerator=True, num_train=40, batch=8, parameters=100, cores=2,
                           cluster=cluster)
    on_bus = cluster.devices_per_machine or 2
    feed = _feed(slow, on_bus)
    step = work.ADAM_PASSES * 100 * 4 / slow.memory + 2 * 1 * 100 * 4 / slow.copy  # Adam; 2 trainers' grads
    assert e.seconds == pytest.approx(5 * feed + 5 * step + feed)
    assert e.terms["bus"] == pytest.approx((on_bus - 1) * e.terms["copy"]) and e.terms["copy"] > 0
    assert e.terms["sample"] == pytest.approx(5 * 0.01)
    assert e.bytes == {"host": int((14 / 3 + 10 / 3) * 8 * 5), "device": int(2 * 6 * 8 * 5)}


def test_minibatch_train_bound_epoch_is_the_blocks_work() -> None:
    slow = dataclasses.replace(RATES, flops=1e5)  # the blocks' work far slower than the feed
    e = se.minibatch_epoch(PROBE, STORE, slow, accelerator=True, num_train=40, batch=8, parameters=100, cores=2,
                           cluster=HERE)
    train = sum(se.block_work(SHAPE, slow).values())
    step = work.ADAM_PASSES * 100 * 4 / slow.memory + 2 * 100 * 4 / slow.copy
    assert e.seconds == pytest.approx(5 * train + 5 * step + _feed(slow, 2))


def test_minibatch_on_a_cpu_shares_its_cores_and_copies_nothing() -> None:
    e = se.minibatch_epoch(PROBE, STORE, RATES, accelerator=False, num_train=40, batch=8, parameters=100, cores=1,
                           cluster=HERE)
    feed = 0.01 + (14 / 3) * 8 / RATES.gather + (4 / 3) * 8 / RATES.gather  # the "device" tier: host memory too
    train = sum(se.block_work(SHAPE, RATES).values())
    step = work.ADAM_PASSES * 100 * 4 / RATES.memory + 2 * 100 * 4 / RATES.memory
    assert e.terms["copy"] == e.terms["bus"] == 0.0
    assert e.seconds == pytest.approx(5 * 2 * (feed + train) / 1 + 5 * step + feed)  # two trainers on one core
    assert set(e.bytes) == {"host"}
    # one trainer on two cores: its feed thread holds the interpreter lock, so feed and training add up
    one = se.Store(Placement(stored=((0, 1),), source=((0, 0),)), hot_features=4, row_bytes=8)
    e1 = se.minibatch_epoch(PROBE, one, RATES, accelerator=False, num_train=40, batch=8, parameters=100, cores=2,
                            cluster=HERE)
    rows = se.tier_rows(PROBE, one, 0)
    feed1 = 0.01 + (rows["host"] + rows["local"]) * 8 / RATES.gather
    assert e1.seconds == pytest.approx(5 * (feed1 + train) + 5 * work.ADAM_PASSES * 100 * 4 / RATES.memory + feed1)


def test_hybrid_epoch_is_eq6_of_the_counted_stages_with_eq13_sync() -> None:
    slow = dataclasses.replace(RATES, copy=2e4)  # Eq. 13's weights over the link set the pace
    table = SamplingTable(sizes=(8,), threads=(1,), seconds=((0.001,),), shapes=(SHAPE,))
    perf = se.hybrid_model(table, RATES, slow, [False, True], cores=8)
    e = se.hybrid_epoch(perf, num_train=40, batch=8, split=[0.5, 0.5], threads=Threads(1, 1, 1), parameters=100,
                        rates=RATES)
    half = table.shape(4, SHAPE.dims)
    sync = 2 * (2 * 64 + 64 * 2) * 4 / slow.copy
    train = max(sum(se.block_work(half, RATES).values()), sum(se.block_work(half, slow).values()))
    fill = 0.001 + 2 * half.input_vertices * 2 * 4 / RATES.gather + half.input_vertices * 2 * 4 / slow.copy
    step = work.ADAM_PASSES * 100 * 4 / RATES.memory
    assert e.terms["sync"] == pytest.approx(5 * sync)
    assert e.seconds == pytest.approx(5 * (train + sync) + fill + 5 * step)
    assert e.bytes["device"] == int((half.input_vertices * 2 * 4 + 2 * (2 * 64 + 64 * 2) * 4) * 5)


def test_hybrid_more_trainer_threads_shrink_only_eq10s_share() -> None:
    perf = se.hybrid_model(TABLE, RATES, RATES, [False], cores=8)
    one = perf.trainer_time(0, SHAPE, Threads(1, 1, 1))
    two = perf.trainer_time(0, SHAPE, Threads(1, 1, 2))
    eq10 = one / perf.calibration[0]  # the calibration's remainder stays on the trainer's own thread
    assert perf.calibration[0] > 1 and two == pytest.approx(one - eq10 / 2)
    assert perf.trainer_work(0, SHAPE, Threads(1, 1, 2)) == pytest.approx(one)  # the same core-seconds


# ------------------------------------------------------------------------------------------------ the engines
@pytest.fixture(scope="module")
def graph():  # type: ignore[no-untyped-def]
    return load_dataset("csbm:nodes=1500,features=8,avg_degree=6,train=0.5", None, seed=0)


def test_minibatch_store_follows_the_ratio_and_the_what_if_devices(graph) -> None:  # type: ignore[no-untyped-def]
    cfg = TrainConfig(engine="minibatch", devices=("cpu", "cpu"), gpu_feature_ratio=0.25, gpu_graph_ratio=0.0)
    store, rank = _store(graph, cfg, [torch.device("cpu")] * 2, 0.5, Cluster(devices_per_machine=4))
    assert store.placement.num_gpus == 4 and store.hot_features == round(0.25 * graph.num_nodes)
    assert int(rank[torch.argmax(graph.out_degree())]) == 0


def test_engines_predictions_move_with_the_rates(graph) -> None:  # type: ignore[no-untyped-def]
    cpu = torch.device("cpu")
    mb = TrainConfig(engine="minibatch", batch_size=128, fanouts=(4, 4), hidden=16)
    hy = TrainConfig(engine="hybrid", batch_size=128, fanouts=(4, 4), hidden=16, devices=("cpu", "cpu:1"),
                     threads=(1, 1, 1))
    for engine, cfg in ((MiniBatchEngine, mb), (HybridEngine, hy)):
        base = engine.predict_epoch(graph, cfg, cpu, RATES)
        slower = engine.predict_epoch(graph, cfg, cpu, dataclasses.replace(RATES, flops=RATES.flops / 100))
        assert base is not None and slower is not None
        assert slower.seconds > base.seconds > 0 and base.bytes["host"] > 0
        assert {"aggregate", "update"} <= set(base.terms) or {"TC", "sync"} <= set(base.terms)


def test_hybrid_trainer_threads_are_the_cpu_trainers_alone() -> None:
    perf = se.hybrid_model(TABLE, RATES, RATES, [False, False], cores=8)  # the CPU beside a CPU stand-in
    one, two = Threads(1, 1, 1), Threads(1, 1, 2)
    assert perf.trainer_time(1, SHAPE, two) == pytest.approx(perf.trainer_time(1, SHAPE, one))
    assert perf.trainer_time(0, SHAPE, two) < perf.trainer_time(0, SHAPE, one)


def test_a_blocks_aggregation_reads_its_source_rows_and_backward_builds_its_transpose() -> None:
    layers = se.batch_layers(SHAPE)
    assert [w.src_rows for w in layers] == [30, 10]  # the batch's input rows, then layer 1's outputs
    cached = dataclasses.replace(RATES, aggregate_cached=((2, 64e6), (64, 2e6)), memory_cached=8e9)
    wide = BatchShape(dims=(2, 64, 2), edges=(40, 10), vertices=(10, 4), input_vertices=10_000_000)
    # 10M input rows are past the cache: layer 1's aggregation at the streamed rate, though its 10 rows are not
    assert se.block_work(wide, cached)["aggregate"] > se.block_work(SHAPE, cached)["aggregate"]
    assert se.batch_layers(wide)[0].aggregate_s(cached) == pytest.approx(40 / RATES.aggregate_rate(2))
    probe = se.SampledProbe(TABLE, 4, RANKS, transpose_s=0.25)
    base = se.minibatch_epoch(PROBE, STORE, RATES, accelerator=False, num_train=40, batch=8, parameters=100,
                              cores=1, cluster=HERE)
    more = se.minibatch_epoch(probe, STORE, RATES, accelerator=False, num_train=40, batch=8, parameters=100,
                              cores=1, cluster=HERE)
    assert more.terms["transpose"] == pytest.approx(5 * 0.25)
    assert more.seconds - base.seconds == pytest.approx(5 * 2 * 0.25)  # two trainers on one core, 5 batches


def test_hybrid_on_the_cpu_alone_prices_its_stages_on_one_interpreter(graph, monkeypatch, sims) -> None:  # type: ignore[no-untyped-def]
    seen: list[int] = []
    real = se.hybrid_model

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(args[4] if len(args) > 4 else kwargs["cores"])
        return real(*args, **kwargs)

    monkeypatch.setattr(se, "hybrid_model", spy)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    cfg = TrainConfig(engine="hybrid", batch_size=128, fanouts=(4, 4), hidden=16, threads=(1, 1, 1))
    predict_hybrid(graph, cfg, [torch.device("cpu"), torch.device("cpu:1")], RATES, model=None)
    predict_hybrid(graph, cfg, [torch.device("cpu"), sims[0]], RATES, model=None, cpu_rates=RATES)
    assert seen == [1, 8]  # threads of one process on the CPU alone; beside an accelerator, the machine's cores


def test_a_layer_that_projects_first_multiplies_every_source_row() -> None:
    plain, first = se.batch_layers(SHAPE), se.batch_layers(SHAPE, (True, False))
    assert (first[0].rows, first[0].agg_width, first[0].projects) == (30, 64, True)  # 30 sources, 64 wide
    assert (plain[0].rows, plain[0].agg_width) == (10, 2)
    assert first[1] == plain[1]
    w = se.block_work(SHAPE, RATES, (True, False))["update"] - se.block_work(SHAPE, RATES)["update"]
    assert w == pytest.approx(2 * 2 * (30 - 10) * 2 * 64 / RATES.flops)  # forward and weight gradient, 20 rows more
