"""The distributed what-if (HopGNN's traffic model, ``gnnscale plan --engine distributed --machines N``): every
term of the model, its scaling with N, the paced comm layer and the flags. Rates, the partition, the sampling
rate, the compute fit and the cores are injected: nothing here is timed."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, replace
from datetime import timedelta
from pathlib import Path

import pytest
import torch

from gnnscale.cli.main import main
from gnnscale.config import TrainConfig
from gnnscale.distributed.comm import Comm, Pacer, ring_bytes, ring_rounds
from gnnscale.engines.sampled.distributed_predict import LocalExchange, exchange_work, sync_work
from gnnscale.errors import ConfigError
from gnnscale.graph.generators import csbm
from gnnscale.nn import build_model
from gnnscale.plan import distributed_time as dt
from gnnscale.plan.epoch_time import Cluster
from gnnscale.plan.network_rate import sync_cost, with_network
from gnnscale.plan.rates import Rates, cache_file, cache_key
from gnnscale.units import parse_network

RATES = Rates(gather=1e9, copy=1e9, aggregate=((16, 1e8), (64, 1e8), (256, 1e8)), flops=1e10, memory=1e9,
              disk=1e9, network=1e9, latency=1e-5)
GRAPH = csbm(nodes=400, features=8, seed=0)
BATCH = 16


def _config(strategy: str = "model-centric", **kw: object) -> TrainConfig:
    args: dict[str, object] = {"merge": "off", **kw}
    return TrainConfig(model="sage", hidden=8, engine="distributed", strategy=strategy, batch_size=BATCH, seed=0,
                       **args)  # type: ignore[arg-type]


MODEL = build_model("sage", GRAPH.num_features, 8, GRAPH.num_classes, **_config().model_kwargs())  # type: ignore[arg-type]
PARAM_BYTES = sum(p.numel() * 4 for p in MODEL.parameters())
N_TRAIN = int(GRAPH.train_mask.sum())  # type: ignore[union-attr]


def _predict(strategy: str = "model-centric", ranks: int = 4, *, cores: int = 64, network: float = 1e8,
             latency: float = 0.0, machines: int | None = None, owner: torch.Tensor | None = None,
             config: TrainConfig | None = None, exchange: dt.ExchangeFit | dt.ExchangeFn | None = None,
             sync: dt.SyncFit | dt.SyncFn | None = None, wait: float = 0.0) -> dt.EpochTime:
    cluster = (Cluster(machines=ranks, network=network, latency=latency) if machines is None else
               Cluster(machines=machines, devices_per_machine=ranks // machines, network=network, latency=latency))
    if owner is None:
        owner = torch.arange(GRAPH.num_nodes) % ranks
    return dt.predict(GRAPH, config or _config(strategy), MODEL, RATES, cluster, (5, 5), owner=owner,
                      sample_rate=1e6, cores=cores, fit=dt.ComputeFit(), exchange=exchange, sync=sync,
                      wait=wait)


def _iterations(ranks: int) -> int:
    return math.ceil(N_TRAIN / (ranks * BATCH))


def test_terms_add_up_and_every_strategy_moves_bytes() -> None:
    for strategy in ("model-centric", "micrograph"):
        e = _predict(strategy)
        assert e.seconds == pytest.approx(sum(e.terms.values()))
        assert e.terms["compute"] > 0 and e.terms["sample"] > 0 and e.terms["fetch"] > 0
        assert e.bytes["network"] > 0


@pytest.mark.parametrize("strategy, messages", [("model-centric", lambda r: 3 * (r - 1) + 2 * (r - 1)),
                                                ("micrograph", lambda r: 3 * (r - 1) + (r - 1) + 2 * (r - 1))])
def test_network_latency_term(strategy: str, messages: object) -> None:
    """Each message in turn costs the latency: the exchange's three all-to-alls, a migration per step but the
    last, the ring all-reduce's 2 (R - 1) messages."""
    R = 4
    slow, fast = _predict(strategy, R, latency=1e-3), _predict(strategy, R, latency=0.0)
    assert callable(messages)
    expected = _iterations(R) * messages(R) * 1e-3
    assert slow.terms["latency"] == pytest.approx(expected)
    assert slow.seconds - fast.seconds == pytest.approx(expected)


def test_bandwidth_term_scales_with_the_rate() -> None:
    a, b = _predict("micrograph", network=1e8), _predict("micrograph", network=5e7)
    moved = ("fetch", "migrate", "allreduce")
    assert all(a.terms[k] > 0 for k in moved)
    for k in moved:
        assert b.terms[k] == pytest.approx(2 * a.terms[k])
    assert b.seconds - a.seconds == pytest.approx(sum(a.terms[k] for k in moved))
    assert a.bytes == b.bytes  # the bytes do not depend on the rate


def test_migration_bytes() -> None:
    """After every step but the last, parameters and gradients hop (2 x P x 4 bytes, one message)."""
    R, rate = 4, 1e8
    e = _predict("micrograph", R, network=rate)
    assert e.terms["migrate"] == pytest.approx(_iterations(R) * (R - 1) * 2 * PARAM_BYTES / rate)
    assert _predict("model-centric", R).terms["migrate"] == 0
    merged = _predict(config=_config("micrograph", merge="2"), ranks=R, network=rate)
    assert merged.terms["migrate"] == pytest.approx(_iterations(R) * (R - 3) * 2 * PARAM_BYTES / rate)


def test_all_reduce_term() -> None:
    R, rate = 4, 1e8
    e = _predict("model-centric", R, network=rate)
    assert e.terms["allreduce"] == pytest.approx(_iterations(R) * ring_bytes(PARAM_BYTES, R) / rate)
    assert ring_bytes(100, 4) == 150 and ring_rounds(4) == 6 and ring_bytes(100, 1) == 0


def test_ranks_of_one_machine_share_its_cores() -> None:
    """4 ranks on one machine of 2 cores compute twice as slowly; 4 machines of one rank each do not."""
    shared = _predict("micrograph", 4, machines=1, cores=2)
    alone = _predict("micrograph", 4, cores=2)
    c = shared.terms
    assert c["contention"] == pytest.approx(c["sample"] + c["compute"])
    assert alone.terms["contention"] == 0
    assert _predict("micrograph", 4, machines=1, cores=4).terms["contention"] == 0
    assert dt.cores_shared(Cluster(machines=2, devices_per_machine=3), 6, cores=2) == 1.5


def test_machines_share_their_link() -> None:
    """More machines: a (N - G) / (N - 1) share of a rank's bytes leaves its machine, on a link its G ranks share."""
    net = dt.Network.of(Cluster(machines=2, devices_per_machine=2, network=1e8, latency=1e-4), RATES, 4)
    assert net.per_byte == pytest.approx(max(2 * (2 / 3) / 1e8, (1 / 3) / RATES.network))
    assert net.latency == 1e-4
    one = dt.Network.of(Cluster(machines=1, devices_per_machine=4, network=1e8), RATES, 4)
    assert one.per_byte == pytest.approx(1 / 1e8) and one.latency == RATES.latency


def test_one_machine_is_never_faster_than_its_loopback() -> None:
    """Ranks of one machine talk over its loopback whatever network is named (an emulated one sleeps only the
    difference): a collective takes the longer of the two."""
    slow_loop = replace(RATES, network=1e6, latency=1e-3)
    fast = dt.Network.of(Cluster(machines=1, devices_per_machine=4, network=1e9, latency=1e-6), slow_loop, 4)
    assert fast.seconds(1000, 3) == pytest.approx((3e-3, 1e-3))  # the loopback's
    assert fast.seconds(10**9, 1) == pytest.approx((1e-3, 1e3))  # the loopback's rate
    slow = dt.Network.of(Cluster(machines=1, devices_per_machine=4, network=1e3, latency=1e-6), slow_loop, 4)
    assert slow.seconds(1000, 3) == pytest.approx((3e-6, 1.0))  # the named network's
    e = _predict("model-centric", 4, machines=1, network=1e12, latency=1e-9)
    lo = dt.predict(GRAPH, _config(), MODEL, slow_loop, Cluster(machines=1, devices_per_machine=4, network=1e12,
                    latency=1e-9), (5, 5), owner=torch.arange(GRAPH.num_nodes) % 4, sample_rate=1e6, cores=64,
                    fit=dt.ComputeFit())
    assert lo.terms["latency"] == pytest.approx(_iterations(4) * 5 * 3 * 1e-3)
    assert lo.seconds > e.seconds


def test_remote_rows_grow_with_machines(tmp_path: Path) -> None:
    """On the real (METIS or fallback) partition, smaller parts leave more of a batch's inputs remote."""
    cfg = _config("model-centric", plan_dir=str(tmp_path))
    moved = []
    for ranks in (2, 4, 8):
        e = dt.predict(GRAPH, replace(cfg, batch_size=128 // ranks), MODEL, RATES, Cluster(machines=ranks), (5, 5),
                       sample_rate=1e6, cores=64, fit=dt.ComputeFit())
        moved.append(e.bytes["network"])
    assert moved[0] < moved[1] < moved[2]


def test_a_graph_too_big_for_metis_partitions_the_replayed_subgraph(tmp_path: Path) -> None:
    """The sample: METIS of the subgraph the replay touches owns every vertex the replay asks about."""
    cfg = _config("micrograph", plan_dir=str(tmp_path))
    whole = dt.predict(GRAPH, cfg, MODEL, RATES, Cluster(machines=4), (5, 5), sample_rate=1e6, cores=64,
                       fit=dt.ComputeFit())
    sample = dt.predict(GRAPH, cfg, MODEL, RATES, Cluster(machines=4), (5, 5), sample_rate=1e6, cores=64,
                        fit=dt.ComputeFit(), metis_max_edges=0)
    assert "subgraph" in sample.model and "subgraph" not in whole.model
    assert 0.5 < sample.bytes["network"] / whole.bytes["network"] < 2
    touched = torch.tensor([0, 3, 5, 9])
    owner = dt.sampled_owner(GRAPH, 2, cfg, touched)
    assert set(owner[touched].tolist()) == {0, 1} and int((owner >= 0).sum()) == 4


def test_many_machines_are_predicted_without_processes() -> None:
    e = _predict("micrograph", 64, network=3.125e9, latency=5e-5)
    assert e.terms["migrate"] > 0 and e.bytes["network"] > 0


def test_compute_fit() -> None:
    fit = dt.ComputeFit(fixed=0.5, scale=2.0)
    assert fit.seconds(1.0) == 2.5 and fit.seconds(0.0) == 0.0
    calls: list[int] = []
    one = ([], torch.tensor([0]), 0.0)
    timed = dt.ComputeFit.timed(lambda b, s: calls.append(len(s)), [([], torch.tensor([1, 2]), 1.0)], one)
    assert calls == [1, 1, 2, 2] and timed.fixed >= 0 and timed.scale >= 0


@pytest.mark.parametrize("strategy, exchanges", [("model-centric", 1), ("micrograph", 1)])
def test_exchange_local_work_term(strategy: str, exchanges: int) -> None:
    """Each exchange costs its busiest rank ``fixed + per_row x (received + served rows)``, added to the epoch."""
    R = 4
    base = _predict(strategy, R)
    fixed = _predict(strategy, R, exchange=dt.ExchangeFit(fixed=1e-3))
    assert base.terms["exchange"] == 0
    assert fixed.terms["exchange"] == pytest.approx(_iterations(R) * exchanges * 1e-3)
    assert fixed.seconds - base.seconds == pytest.approx(fixed.terms["exchange"])
    one, two = (_predict(strategy, R, exchange=dt.ExchangeFit(per_row=r)) for r in (1e-6, 2e-6))
    assert one.terms["exchange"] > 0 and two.terms["exchange"] == pytest.approx(2 * one.terms["exchange"])
    assert two.seconds - one.seconds == pytest.approx(one.terms["exchange"])
    # at least every received row of the busiest rank: the epoch's bytes bound it from below
    received_rows = base.bytes["network"] / R / (GRAPH.x.shape[1] * 4 + dt.ID_BYTES)  # type: ignore[union-attr]
    assert one.terms["exchange"] >= 0.5 * received_rows * 1e-6


def test_pregather_off_prices_an_exchange_per_step() -> None:
    R = 4
    e = _predict(config=_config("micrograph", pregather="off"), ranks=R, exchange=dt.ExchangeFit(fixed=1e-3))
    assert e.terms["exchange"] == pytest.approx(_iterations(R) * R * 1e-3)


@pytest.mark.parametrize("strategy, migrations", [("model-centric", 0), ("micrograph", 3)])
def test_sync_local_work_term(strategy: str, migrations: int) -> None:
    """Every iteration costs the all-reduce's and optimiser's local work, every migration its own."""
    R = 4
    base = _predict(strategy, R)
    e = _predict(strategy, R, sync=dt.SyncFit(iteration=2e-3, migration=1e-3))
    assert base.terms["sync"] == 0
    assert e.terms["sync"] == pytest.approx(_iterations(R) * (2e-3 + migrations * 1e-3))
    assert e.seconds - base.seconds == pytest.approx(e.terms["sync"])


def test_shared_cores_slow_the_local_work_too() -> None:
    e = _predict("micrograph", 4, machines=1, cores=2, exchange=dt.ExchangeFit(1e-3, 1e-6),
                 sync=dt.SyncFit(1e-3, 1e-3))
    c = e.terms
    assert c["exchange"] > 0 and c["sync"] > 0
    assert c["contention"] == pytest.approx(c["sample"] + c["compute"] + c["exchange"] + c["sync"])


def test_exchange_and_sync_fits_time_the_given_work() -> None:
    calls: list[tuple[int, int]] = []
    owner = torch.tensor([0, 1, 0, 1])
    sample = ([torch.tensor([1, 2, 3])], torch.tensor([0, 2]), 4)
    fit = dt.ExchangeFit.timed(lambda o, s, v: calls.append((len(s), v.numel())), owner, [sample])
    assert calls == [(1, 0)] * 3 + [(1, 2)] * 3 and fit.fixed >= 0 and fit.per_row >= 0
    assert dt.ExchangeFit(0.5, 0.25).seconds(4) == 1.5
    kinds: list[int] = []
    sync = dt.SyncFit.timed(kinds.append)
    assert kinds == [0] * 5 + [1] * 5 and sync.iteration >= 0 and sync.migration >= 0


def test_the_replay_times_rank_0s_exchanges() -> None:
    """The replay hands the exchange work rank 0's step inputs and the ids its peers asked it for (all its own)."""
    seen: list[tuple[list[torch.Tensor], torch.Tensor]] = []
    owner = torch.arange(GRAPH.num_nodes) % 4
    e = _predict("micrograph", 4, owner=owner, exchange=lambda o, s, v: seen.append((s, v)),
                 sync=lambda k: None)
    assert seen and all(bool((owner[v] == 0).all()) for _, v in seen if v.numel())
    assert any(v.numel() for _, v in seen) and all(s for s, _ in seen)
    assert e.terms["exchange"] >= 0


def test_local_exchange_serves_and_stitches() -> None:
    """The engine's exchange without collectives runs through the rank's feature source (every step's rows)."""
    work = exchange_work(GRAPH, _config("model-centric"), 2)
    owner = torch.arange(GRAPH.num_nodes) % 2
    work(owner, [torch.arange(10)], torch.tensor([0, 2, 4]))
    work(owner, [torch.empty(0, dtype=torch.int64)], torch.empty(0, dtype=torch.int64))
    pre = exchange_work(GRAPH, _config("micrograph"), 2)
    pre(owner, [torch.arange(6), torch.arange(4, 12)], torch.tensor([8]))
    loc = LocalExchange(2)
    loc.served = torch.tensor([0, 2])
    served: list[torch.Tensor] = []
    out = loc.exchange(torch.tensor([1, 3]), owner, lambda r: served.append(r) or torch.zeros(r.numel(), 8), 8,
                       torch.float32)
    assert out.shape == (2, 8) and served[0].tolist() == [0, 2]
    sync = sync_work(MODEL, _config())
    sync(0)
    sync(1)


@pytest.mark.parametrize("strategy, collectives", [("model-centric", 3 + 1), ("micrograph", 3 + 3 + 1)])
def test_every_collective_waits_for_the_ranks(strategy: str, collectives: int) -> None:
    """Each collective (an exchange's three all-to-alls, every migration, the all-reduce) costs ``wait``."""
    R = 4
    base, e = _predict(strategy, R), _predict(strategy, R, wait=1e-3)
    assert base.terms["wait"] == 0
    assert e.terms["wait"] == pytest.approx(_iterations(R) * collectives * 1e-3)
    assert e.seconds - base.seconds == pytest.approx(e.terms["wait"])


def test_sync_cost_is_measured_once_per_rank_count() -> None:
    path = cache_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    r = replace(RATES, machine="m", versions="v")
    key = cache_key("m", r.threads)  # the entry of the machine at the thread count its rates were measured
    path.write_text(json.dumps({key: {"versions": "v"}}))
    calls: list[int] = []

    def fake(ranks: int) -> float:
        calls.append(ranks)
        return 1e-3 * ranks

    assert sync_cost(r, 3, fake) == 3e-3 and sync_cost(r, 3, fake) == 3e-3 and sync_cost(r, 2, fake) == 2e-3
    assert calls == [3, 2] and sync_cost(r, 1, fake) == 0.0
    assert json.loads(path.read_text())[key]["sync_cost"] == {"3": 3e-3, "2": 2e-3}


def test_network_rate_is_measured_once_and_cached() -> None:
    path = cache_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    unmeasured = replace(RATES, network=0.0, latency=0.0, machine="test-box", versions="v")
    key = cache_key("test-box", unmeasured.threads)
    path.write_text(json.dumps({key: {**asdict(unmeasured)}}))
    calls: list[int] = []

    def measure() -> tuple[float, float]:
        calls.append(1)
        return 5e9, 2e-5

    got = with_network(unmeasured, measure)
    assert (got.network, got.latency) == (5e9, 2e-5) and calls == [1]
    assert json.loads(path.read_text())[key]["network"] == 5e9
    assert with_network(got, measure) is got and calls == [1]  # known: not measured again


# --------------------------------------------------------------------------------------- the paced comm layer
class FakeClock:
    def __init__(self) -> None:
        self.now, self.slept = 0.0, []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def test_pacer_sleeps_the_difference() -> None:
    clock = FakeClock()
    p = Pacer(rate=1e6, latency=1e-4, clock=clock, sleep=clock.sleep)
    clock.now = 0.001  # the real collective took 1 ms
    p.finish(0.0, 10_000, 3)  # target: 3 x 0.1 ms + 10 ms
    assert clock.slept == [pytest.approx(0.0003 + 0.01 - 0.001)]
    clock.now = 1.0
    p.finish(0.0, 10, 1)  # slower than the target already: no sleep
    assert len(clock.slept) == 1


def test_comm_paces_its_collectives() -> None:
    clock = FakeClock()
    comm = Comm(0, 4, torch.device("cpu"), timedelta(seconds=1),
                pacer=Pacer(rate=1e6, latency=1e-3, clock=clock, sleep=clock.sleep))
    comm._count(2000, 1000, comm._start())  # an all-to-all: one message to each of 3 peers, the larger side
    assert clock.slept[-1] == pytest.approx(3e-3 + 2000 / 1e6)
    comm._count(400, 400, comm._start(), ring_rounds(4), ring_bytes(400, 4))
    assert clock.slept[-1] == pytest.approx(6e-3 + 600 / 1e6)
    assert comm.counters["sent_bytes"] == 2400


def test_emulated_network_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GNNSCALE_EMULATE_NETWORK", "100Mbit,latency=200us")
    p = Pacer.from_env()
    assert p is not None and p.rate == pytest.approx(12.5e6) and p.latency == pytest.approx(2e-4)
    monkeypatch.delenv("GNNSCALE_EMULATE_NETWORK")
    assert Pacer.from_env() is None


# ------------------------------------------------------------------------------------------------- the flags
def test_parse_network() -> None:
    assert parse_network("25Gbit") == (pytest.approx(3.125e9), None)
    assert parse_network("100Mbit,latency=50us") == (pytest.approx(12.5e6), pytest.approx(5e-5))
    assert parse_network("3GB/s,latency=1ms") == (pytest.approx(3e9), pytest.approx(1e-3))
    assert parse_network("100MB/s,latency=2s")[1] == 2.0
    for bad in ("fast", "0Gbit", "25Gb", "25Gbit,latency=fast", "25Gbit,latency=1us,latency=2us", "-1Gbit"):
        with pytest.raises(ConfigError, match="--network"):
            parse_network(bad)


SMALL = "csbm:nodes=300"


@pytest.mark.parametrize("flags", [["--engine", "distributed", "--machines", "65"],
                                   ["--engine", "distributed", "--machines", "0"],
                                   ["--engine", "distributed", "--machines", "2", "--network", "fast"],
                                   ["--engine", "distributed", "--devices-per-machine", "0"],
                                   ["--engine", "offload", "--machines", "2"],
                                   ["--machines", "2"]])
def test_bad_whatif_flags_exit_2(flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--dataset", SMALL, *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "Traceback" not in err[0]


def test_plan_whatif_prints_both_strategies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--dataset", SMALL, "--engine", "distributed", "--machines", "3", "--devices-per-machine", "2",
            "--network", "10Gbit,latency=20us", "--batch-size", "16", "--hidden", "8", "--plan-dir", str(tmp_path)]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ranks"] == 6 and out["network_bytes_per_s"] == pytest.approx(1.25e9)
    assert set(out["strategies"]) == {"micrograph", "model-centric"}
    for e in out["strategies"].values():
        assert e["seconds"] > 0 and e["bytes"]["network"] > 0 and "latency" in e["terms"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "micrograph" in text and "model-centric" in text and "s/epoch" in text
