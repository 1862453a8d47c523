"""The distributed engine (HopGNN on torch.distributed): micrograph schedules, exactness against the model-centric
strategy and the single-process mini-batch engine, counters that show the mechanisms (exchanges, migrations, rows
fetched), per-rank feature memory, faults, iteration checkpoints and bad input.

Multi-rank tests start real gloo ranks: in-process workers through ``torch.multiprocessing`` (spawn) for the
engine's internals, and the ``gnnscale`` command (``--ranks``, torchrun) for whole runs.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from gnnscale.config import TrainConfig
from gnnscale.distributed.schedule import MergeController, build_schedule, home_groups
from gnnscale.engines.sampled.minibatch import MiniBatchEngine
from gnnscale.graph import io
from gnnscale.graph.generators import csbm
from gnnscale.nn import build_model
from gnnscale.runtime.host import proc_kib
from gnnscale.sample import sample_key
from gnnscale.store.features import ReadStats
from gnnscale.store.partitioned import PartitionedFeatures
from gnnscale.train import train

GNNSCALE = [sys.executable, "-m", "gnnscale"]
TORCHRUN = Path(sys.executable).with_name("torchrun")
FANOUTS = (5, 3)


def _graph() -> Any:
    return csbm(nodes=600, features=8, avg_degree=6, seed=5, train=0.5, communities=6)


# --------------------------------------------------------------------------------------------- schedules
def test_time_steps_train_every_root_at_home_once() -> None:
    owner = torch.tensor([0, 0, 1, 1, 2, 2, 0, 1, 2])
    parts = [torch.tensor([0, 2, 4]), torch.tensor([1, 3, 5, 6]), torch.tensor([7, 8])]
    roots = home_groups(parts, owner, 3)
    assert [r.tolist() for r in roots[1]] == [[1, 6], [3], [5]]
    s = build_schedule(roots)
    assert s.steps == 3 and s.offsets == [0, 1, 2]
    for k in range(3):
        assert sorted(s.model_on(r, k) for r in range(3)) == [0, 1, 2]  # one model per rank per step
        for r in range(3):
            assert bool((owner[s.roots_on(r, k)] == r).all())  # trained where its features live
    for d in range(3):  # model d trains exactly its batch
        assert sorted(torch.cat(s.work[d]).tolist()) == sorted(parts[d].tolist())
        assert [s.host(d, k) for k in range(3)] == [(d + k) % 3 for k in range(3)]
    assert [s.hop(k) for k in range(2)] == [1, 1]


def test_merging_follows_figure_10() -> None:
    # Figure 10: three servers; the step with the fewest roots (t1) is merged into t0 and t2 per model
    owner = torch.arange(30) % 3
    ids = {s: [v for v in range(30) if v % 3 == s] for s in range(3)}
    # model d's roots per home rank; step t trains roots[d][(d + t) % 3]: t1 gets 2 + 2 + 1 roots
    sizes = [[3, 2, 3], [2, 3, 1], [3, 3, 2]]  # sizes[d][s]
    take = {s: iter(ids[s]) for s in range(3)}
    parts = [torch.tensor([next(take[s]) for s in range(3) for _ in range(sizes[d][s])]) for d in range(3)]
    s0 = build_schedule(home_groups(parts, owner, 3))
    counts = s0.step_counts()
    assert counts == [3 + 3 + 2, 2 + 1 + 3, 3 + 2 + 3]
    s1 = build_schedule(home_groups(parts, owner, 3), merges=1)
    assert s1.merged == [1] and s1.offsets == [0, 2] and s1.steps == 2
    for d in range(3):
        assert sorted(torch.cat(s1.work[d]).tolist()) == sorted(parts[d].tolist())  # nothing lost or duplicated
        moved = s0.work[d][1]
        halves = torch.tensor_split(moved, 2)
        assert s1.work[d][0].tolist() == s0.work[d][0].tolist() + halves[0].tolist()
        assert s1.work[d][1].tolist() == s0.work[d][2].tolist() + halves[1].tolist()
    assert s1.hop(0) == 2  # models skip the removed step's rank
    equal = [torch.tensor([0, 1, 2]), torch.tensor([3, 4, 5]), torch.tensor([6, 7, 8])]  # 3 roots every step
    assert build_schedule(home_groups(equal, torch.arange(9) % 3, 3), merges=1).merged == [0]  # the earliest
    s2 = build_schedule(home_groups(parts, owner, 3), merges=5)  # never fewer than one step
    assert s2.steps == 1 and s2.step_counts() == [sum(p.numel() for p in parts)]


def test_merge_controller_examines_after_warm_up_and_keeps_the_fastest() -> None:
    m = MergeController("auto", 4)
    assert m.merges == 0
    m.epoch_done(1, 100.0)  # warm-up: its time says nothing
    assert m.merges == 0
    m.epoch_done(2, 10.0)  # the baseline
    assert m.merges == 1  # epoch 3 examines one merge
    m.epoch_done(3, 8.0)
    assert m.merges == 2
    m.epoch_done(4, 9.0)  # not faster: back to the fastest epoch's merging, for good
    assert (m.merges, m.frozen) == (1, True)
    m.epoch_done(5, 1.0)
    assert m.merges == 1
    assert [h[1] for h in m.history] == [0, 0, 1, 2, 1]
    slower = MergeController("auto", 3)
    for e, t in enumerate((5.0, 1.0, 2.0), 1):
        slower.epoch_done(e, t)
    assert (slower.merges, slower.frozen) == (0, True)
    noise = MergeController("auto", 3)  # 2% faster is within an epoch time's noise: no merging bought with it
    for e, t in enumerate((5.0, 1.0, 0.98), 1):
        noise.epoch_done(e, t)
    assert (noise.merges, noise.frozen) == (0, True)
    down = MergeController("auto", 3)
    for e, t in enumerate((9.0, 3.0, 2.0, 1.0, 0.5), 1):
        down.epoch_done(e, t)
    assert down.merges == 2 and down.frozen  # one step left: nothing more to merge
    assert MergeController("off", 4).merges == 0
    fixed = MergeController("2", 4)
    fixed.epoch_done(1, 1.0)
    assert (fixed.merges, fixed.frozen) == (2, True)
    again = MergeController("auto", 4)
    again.load_state_dict(m.state_dict())
    assert (again.merges, again.frozen, again.history) == (1, True, m.history)


# --------------------------------------------------------------------------------------------- multi-rank
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _dist_engine(g: Any, model_name: str, plan_dir: str, **options: Any) -> Any:
    """This rank's engine (inside a spawned rank): batch 25 per rank, the test's fanouts, hidden 8."""
    from gnnscale.engines.sampled.distributed import DistributedEngine

    cfg = TrainConfig(engine="distributed", model=model_name, batch_size=25, fanouts=FANOUTS, seed=0,
                      plan_dir=plan_dir, heads=2, hidden=8, **options)
    model = build_model(model_name, g.num_features, 8, g.num_classes, layers=2, dropout=0.5, heads=2, seed=0)
    return DistributedEngine(g, model, cfg, torch.device("cpu"))


def _gradients_task(rank: int, world: int, model_name: str, variants: list[dict[str, Any]], plan_dir: str
                    ) -> list[dict[str, Any]]:
    from gnnscale.distributed.schedule import Schedule

    out = []
    step_counts = Schedule.step_counts
    for v in variants:
        v = dict(v)
        if v.pop("middle", False):  # make the middle step the one with the fewest roots: models then hop by 2
            Schedule.step_counts = lambda self: [0 if o == 1 else 1 for o in self.offsets]  # type: ignore
        g = _graph()
        eng = _dist_engine(g, model_name, plan_dir, **v)
        assert g.x is not None
        g.x = torch.full_like(g.x, float("nan"))  # a rank reading features anywhere but its part and its peers
        asked: list[torch.Tensor] = []
        exchange = eng.comm.exchange

        def spy(ids: torch.Tensor, *a: Any, exchange: Any = exchange, asked: list[torch.Tensor] = asked,
                **k: Any) -> Any:
            asked.append(ids.clone())  # what this rank asked its peers for
            return exchange(ids, *a, **k)

        eng.comm.exchange = spy  # type: ignore[method-assign]
        fetched: list[Any] = []  # the sources of rows fetched ahead (pre-gathering)
        fetch = eng.features.fetch

        def fetch_spy(ids: torch.Tensor, *a: Any, fetch: Any = fetch, fetched: list[Any] = fetched) -> Any:
            fetched.append(fetch(ids, *a))
            return fetched[-1]

        eng.features.fetch = fetch_spy  # type: ignore[method-assign]
        eng.features.reset_stats()
        before = dict(eng.comm.counters)
        got = eng.iteration_gradients(1, 0)
        after = eng.comm.counters
        Schedule.step_counts = step_counts  # type: ignore[method-assign]
        reads = [eng.features.read_stats(), sum((f.read_stats() for f in fetched), ReadStats())]
        out.append({**got, "reads": [{"rows": dict(r.rows), "bytes": dict(r.bytes)} for r in reads],
                    "exchanges": after["exchanges"] - before["exchanges"],
                    "migrations": after["migrations"] - before["migrations"],
                    "asked": asked, "owner": eng.owner.clone(), "cache_peak": eng._cache_peak,
                    "params": sum(p.numel() for p in eng.model.parameters()),
                    "own": eng.features.own.clone(), "rows_read": eng.features.rows_read})
    eng.comm.close()
    return out


def _refuse_task(rank: int, world: int, plan_dir: str) -> list[str]:
    """Each strategy with feature sources that refuse to read: the iteration fails (on every rank alike, before
    any collective of the read), so no input row is read around them."""
    from gnnscale.store.partitioned import FetchedRows

    def refuse(*a: Any) -> Any:
        raise RuntimeError("feature read refused")

    PartitionedFeatures._gather = refuse  # type: ignore[method-assign]
    FetchedRows._gather = refuse  # type: ignore[method-assign]
    out = []
    for v in ({"strategy": "model-centric"}, {"strategy": "micrograph", "pregather": "off"},
              {"strategy": "micrograph", "pregather": "on"}):
        eng = _dist_engine(_graph(), "sage", plan_dir, **v)
        try:
            eng.iteration_gradients(1, 0)
            out.append("trained")
        except RuntimeError as exc:
            out.append(str(exc))
    eng.comm.close()
    return out


def _epochs_task(rank: int, world: int, plan_dir: str) -> dict[str, Any]:
    """Three epochs with ``--merge auto`` while this rank counts what it asked for and the rows it trained on.
    Rank 1 runs late (its own clock says its epochs are slower): the examination must use one time for all."""
    eng = _dist_engine(_graph(), "sage", plan_dir, strategy="micrograph", merge="auto")
    count = {"asked": 0, "needed": 0, "local": 0}
    exchange, inputs = eng.comm.exchange, eng._inputs

    def spy(ids: torch.Tensor, *a: Any, **k: Any) -> Any:
        count["asked"] += ids.numel()
        return exchange(ids, *a, **k)

    def rows(src: torch.Tensor, *a: Any) -> Any:
        count["needed"] += src.numel()
        count["local"] += int((eng.owner[src] == rank).sum())
        return inputs(src, *a)

    eng.comm.exchange, eng._inputs = spy, rows  # type: ignore[method-assign]
    records, counted = [], []
    for epoch in (1, 2, 3):
        count.update(asked=0, needed=0, local=0)
        if rank == 1:
            time.sleep(0.05 * epoch)  # a late rank (not a wait for anything: its clock differs from rank 0's)
        records.append(eng.train_epoch(epoch))
        counted.append(dict(count))
    eng.comm.close()
    return {"history": list(eng.merge.history), "records": records, "counted": counted}


def _network_task(rank: int, world: int, plan_dir: str) -> dict[str, Any]:
    """One micrograph epoch (every step kept) while this rank counts its exchanges, and every iteration adds a
    collective of 3 float64 of its own: the record's ``network_bytes`` must include it (counted by the comm layer,
    not added up from the other counters)."""
    eng = _dist_engine(_graph(), "sage", plan_dir, strategy="micrograph", merge="off")
    count = {"exchanges": 0}
    exchange, iteration = eng.comm.exchange, eng._iteration

    def spy(*a: Any, **k: Any) -> Any:
        count["exchanges"] += 1
        return exchange(*a, **k)

    def extra(*a: Any, **k: Any) -> None:
        eng.comm.all_reduce(torch.zeros(3, dtype=torch.float64), "sum", "test")
        iteration(*a, **k)

    eng.comm.exchange, eng._iteration = spy, extra  # type: ignore[method-assign]
    record = eng.train_epoch(1)
    eng.comm.close()
    return {"record": record, "exchanges": count["exchanges"],
            "param_bytes": sum(p.numel() * p.element_size() for p in eng.model.parameters())}


def _hang_task(rank: int, world: int, out: str) -> float | None:
    """Rank 1 stays alive (its heartbeat beats) but never joins rank 0's collective; rank 0 must give up after
    the job's timeout (3 s), not torch's default of 30 minutes. Returns rank 0's seconds until it gave up."""
    from gnnscale.distributed.comm import Comm
    from gnnscale.errors import RankFailure

    comm = Comm.setup(torch.device("cpu"), 3.0)
    done = Path(out) / "done"
    if rank == 1:
        deadline = time.monotonic() + 60
        while not done.exists() and time.monotonic() < deadline:  # until rank 0 has given up
            time.sleep(0.1)
        os._exit(0)
    t0 = time.monotonic()
    try:
        comm.all_reduce(torch.zeros(1), "sum", "probe")
        return None
    except RankFailure:
        return time.monotonic() - t0
    finally:
        done.touch()


def _entry(rank: int, world: int, port: int, out: str, task: str, args: tuple[Any, ...]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    result = {"gradients": _gradients_task, "epochs": _epochs_task, "hang": _hang_task,
              "refuse": _refuse_task, "network": _network_task}[task](rank, world, *args)
    torch.save(result, Path(out) / f"rank{rank}.pt")


def _spawn(tmp_path: Path, world: int, task: str, *args: Any) -> list[Any]:
    import torch.multiprocessing as mp

    mp.start_processes(_entry, args=(world, _free_port(), str(tmp_path), task, args), nprocs=world,
                       start_method="spawn")
    return [torch.load(path, weights_only=False) if (path := tmp_path / f"rank{r}.pt").exists() else None
            for r in range(world)]


def _reference(model_name: str, world: int) -> tuple[float, list[torch.Tensor], list[list[torch.Tensor]]]:
    """The single-process mini-batch engine's first step on the union of the ranks' batches (no optimiser step):
    its loss and gradients, and the gradients of each rank's batch alone (its share of the union's mean loss)."""
    g = _graph()
    cfg = TrainConfig(engine="minibatch", model=model_name, batch_size=25 * world, fanouts=FANOUTS, seed=0,
                      heads=2, hidden=8)
    model = build_model(model_name, g.num_features, 8, g.num_classes, layers=2, dropout=0.5, heads=2, seed=0)
    mb = MiniBatchEngine(g, model, cfg, torch.device("cpu"))
    model.train()
    seeds = mb.train_ids[mb._order(1)][: 25 * world]
    per_part = []
    for part in torch.tensor_split(seeds, world):
        model.zero_grad(set_to_none=True)
        batch = mb._prepare(mb.trainers[0], part, FANOUTS, sample_key(0, 1))
        (F.cross_entropy(mb._forward(batch, (0, 1)), mb.y[part], reduction="sum") / seeds.numel()).backward()
        per_part.append([p.grad.clone() for p in model.parameters()])  # type: ignore[union-attr]
    model.zero_grad(set_to_none=True)
    batch = mb._prepare(mb.trainers[0], seeds, FANOUTS, sample_key(0, 1))
    loss = F.cross_entropy(mb._forward(batch, (0, 1)), mb.y[seeds])
    loss.backward()
    return float(loss.detach()), [p.grad.clone() for p in model.parameters()], per_part  # type: ignore[union-attr]


def _close(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    for x, y in zip(a, b, strict=True):
        assert float((x - y).abs().max()) <= 1e-4 * max(float(y.abs().max()), 1e-3)


@pytest.mark.parametrize(("world", "model_name"), [(2, "sage"), (3, "gat")])
def test_micrograph_iteration_equals_model_centric_and_the_minibatch_engine(
        tmp_path: Path, world: int, model_name: str) -> None:
    variants = [{"strategy": "model-centric"},
                {"strategy": "micrograph", "pregather": "on", "merge": "off"},
                {"strategy": "micrograph", "pregather": "off", "merge": "off"},
                {"strategy": "micrograph", "pregather": "on", "merge": "1"},
                {"strategy": "micrograph", "pregather": "off", "merge": str(world - 1)}]
    if world == 3:  # a merged middle step: the models skip its rank
        variants.append({"strategy": "micrograph", "pregather": "on", "merge": "1", "middle": True})
    ranks = _spawn(tmp_path, world, "gradients", model_name, variants, str(tmp_path / "plans"))
    ref_loss, ref_grads, per_part = _reference(model_name, world)
    for i, v in enumerate(variants):
        held = sorted(ranks[r][i]["held_model"] for r in range(world))
        assert held == list(range(world)), v  # after the last step every model is on one rank
        for r in range(world):
            got = ranks[r][i]
            assert got["loss"] == pytest.approx(ref_loss, rel=1e-5), (v, r)
            _close(got["grads"], ref_grads)  # every rank holds the summed gradients
            # before the all-reduce: the model a rank holds carries its whole mini-batch's gradients, gathered on
            # the ranks it visited (the migrations moved them along)
            _close(got["held_grads"], per_part[got["held_model"]])
        if v["strategy"] == "micrograph" and v["merge"] == "off":
            assert [ranks[r][i]["held_model"] for r in range(world)] == [(r + 1) % world for r in range(world)]
    # the partition: each rank read its own rows only, and the parts cover the graph
    n = _graph().num_nodes
    own = [ranks[r][0]["own"] for r in range(world)]
    assert sorted(torch.cat(own).tolist()) == list(range(n))
    for r in range(world):
        assert ranks[r][0]["rows_read"] == own[r].numel() < n
    # the mechanisms, per rank: exchanges, migrations, steps
    steps = {1: world, 2: world, 3: world - 1, 4: 1, 5: 2}
    for r in range(world):
        mc, pre, nopre = ranks[r][0], ranks[r][1], ranks[r][2]
        assert (mc["exchanges"], mc["migrations"], mc["counters"]["time_steps"]) == (1, 0, 1)
        for i, s in steps.items():
            if i >= len(variants):
                continue
            got = ranks[r][i]
            assert got["counters"]["time_steps"] == s
            assert got["migrations"] == s - 1  # the model moves between consecutive steps
            assert got["exchanges"] == (1 if variants[i]["pregather"] == "on" else s)
            # a migration sends the model's parameters and its gradients (float32)
            assert got["counters"]["migration_bytes"] == (s - 1) * 2 * got["params"] * 4
        for got in ranks[r]:  # every exchange asks each remote row once, never one of this rank's
            owner, width = got["owner"], _graph().num_features
            for ids in got["asked"]:
                assert torch.unique(ids).numel() == ids.numel() and bool((owner[ids] != r).all())
            rows = sum(ids.numel() for ids in got["asked"])
            assert got["counters"]["remote_rows"] == rows and got["counters"]["remote_bytes"] == rows * width * 4
            assert got["cache_peak"] == max((ids.numel() for ids in got["asked"]), default=0) * width * 4
        for v, got in zip(variants, ranks[r], strict=True):  # the counters are the feature sources' read counters
            (part, ahead), c = got["reads"], got["counters"]
            assert part["rows"].get("remote", 0) == c["remote_rows"], v
            assert part["bytes"].get("remote", 0) == c["remote_bytes"], v
            assert part["rows"].get("local", 0) + ahead["rows"].get("local", 0) == c["local_rows"], v
            served = part["rows"].get("local", 0) + sum(ahead["rows"].values())
            if v.get("pregather") != "on":  # fetched by the reads themselves (src is unique: each row once)
                served += part["rows"].get("remote", 0)
            else:
                assert part["rows"].get("local", 0) == 0 and ahead["rows"].get("fetched", 0) > 0, v
            assert served == c["needed_rows"], v
        assert pre["counters"]["needed_rows"] == nopre["counters"]["needed_rows"]
        # pre-gathering asks once for the union of what the steps ask for one by one
        assert sorted(torch.cat(pre["asked"]).tolist()) == sorted(set(torch.cat(nopre["asked"]).tolist()))
    total = {k: [sum(ranks[r][i]["counters"][k] for r in range(world)) for i in range(len(variants))]
             for k in ("remote_rows", "local_rows", "needed_rows")}
    hit = [total["local_rows"][i] / total["needed_rows"][i] for i in range(len(variants))]
    assert hit[1] > hit[0] + 0.2  # micrographs are trained where their roots live
    assert total["remote_rows"][1] < total["remote_rows"][0]


def test_every_input_row_is_read_through_the_rank_s_feature_source(tmp_path: Path) -> None:
    ranks = _spawn(tmp_path, 2, "refuse", str(tmp_path / "plans"))
    assert ranks == [["feature read refused"] * 3] * 2


def test_epoch_records_sum_every_rank_and_the_examination_is_the_job_s(tmp_path: Path) -> None:
    world = 2
    got = _spawn(tmp_path, world, "epochs", str(tmp_path / "plans"))
    # one epoch time for all ranks (the slowest's), so every rank merges alike
    assert len(got[0]["history"]) == 3 and got[0]["history"] == got[1]["history"]
    for e in range(3):
        rec = got[0]["records"][e]
        assert rec["remote_rows"] == sum(g["counted"][e]["asked"] for g in got)  # every rank's, not rank 0's
        assert rec["remote_bytes"] == rec["remote_rows"] * 8 * 4
        assert rec["needed_rows"] == sum(g["counted"][e]["needed"] for g in got)
        assert rec["local_rows"] == sum(g["counted"][e]["local"] for g in got)
        assert rec["local_hit_rate"] == pytest.approx(rec["local_rows"] / rec["needed_rows"])
        assert rec["merges"] == got[0]["history"][e][1]  # this epoch's merging, not the next one's
        assert rec["time_steps"] == world - rec["merges"]  # per iteration, not summed over ranks
        assert len(rec["rank_cache_peak_bytes"]) == world and min(rec["rank_cache_peak_bytes"]) > 0


def test_network_bytes_are_features_migrations_and_collectives(tmp_path: Path) -> None:
    world = 2
    got = _spawn(tmp_path, world, "network", str(tmp_path / "plans"))
    rec = got[0]["record"]
    assert rec == got[1]["record"]  # the job's figures, summed over the ranks
    exchanges = sum(g["exchanges"] for g in got)
    steps = rec["batches"] * world  # one gradient all-reduce and one test collective per rank and iteration
    ids = 8 * rec["remote_rows"]  # the id requests (int64), each remote row asked for once
    counts = exchanges * 8 * (world - 1)  # each exchange's per-peer counts
    assert rec["migration_bytes"] > 0 and rec["remote_bytes"] > 0
    assert rec["network_bytes"] == (rec["remote_bytes"] + rec["migration_bytes"] + ids + counts
                                    + steps * (got[0]["param_bytes"] + 3 * 8))


def test_a_peer_that_hangs_is_given_up_after_the_job_s_timeout(tmp_path: Path) -> None:
    elapsed = _spawn(tmp_path, 2, "hang", str(tmp_path))[0]
    assert elapsed is not None and elapsed < 30  # --timeout 3 s (+ naming the rank), not torch's 30 minutes


# ----------------------------------------------------------------------------------------------- the CLI
def _disk_graph(tmp_path: Path) -> Path:
    path = tmp_path / "graph"
    if not path.exists():
        io.save(_graph(), path)
    return path


def _run(args: list[str], env: dict[str, str] | None = None, timeout: float = 240,
         cmd: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*(cmd or GNNSCALE), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def _train_args(tmp_path: Path, *extra: str) -> list[str]:
    return ["train", "--dataset", str(_disk_graph(tmp_path)), "--engine", "distributed", "--model", "sage",
            "--batch-size", "60", "--fanouts", "5,3", "--epochs", "3", "--quiet", "--device", "cpu", *extra]


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _minibatch_history(world: int) -> list[dict[str, Any]]:
    cfg = TrainConfig(engine="minibatch", model="sage", batch_size=60 * world, fanouts=(5, 3), epochs=3, seed=0)
    return train(_graph(), cfg, "cpu").history


def _two_machines(tmp_path: Path, args: list[str], metrics: Path) -> subprocess.CompletedProcess[str]:
    """``torchrun --nnodes 2`` twice, each agent with its own ``--metrics`` path: the global rank 0 (on either
    agent, the rendezvous decides) must be the only rank that writes and prints. Returns the agents' joined
    output, with ``metrics`` the file that was written."""
    port = _free_port()
    procs = [subprocess.Popen(
        [str(TORCHRUN), "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
         f"127.0.0.1:{port}", "--rdzv-id", "twomachines", "-m", "gnnscale", *args,
         "--metrics", str(tmp_path / f"node{n}.jsonl")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        for n in range(2)]
    outs = [p.communicate(timeout=240) for p in procs]
    written = [n for n in range(2) if (tmp_path / f"node{n}.jsonl").exists()]
    assert len(written) == 1, written  # one metrics file, from the agent holding rank 0
    (tmp_path / f"node{written[0]}.jsonl").rename(metrics)
    assert outs[1 - written[0]][0] == ""  # the other machine's rank prints nothing
    return subprocess.CompletedProcess(procs[0].args, max(p.returncode for p in procs),
                                       "".join(o for o, _ in outs), "".join(e for _, e in outs))


def test_whole_runs_of_both_strategies_equal_the_minibatch_engine(tmp_path: Path) -> None:
    reference = _minibatch_history(2)
    expected = [r["loss"] for r in reference]
    for strategy, launcher in (("micrograph", "ranks"), ("model-centric", "torchrun")):
        m = tmp_path / f"{strategy}.jsonl"
        args = _train_args(tmp_path, "--strategy", strategy, "--merge", "off")
        if launcher == "ranks":
            p = _run([*args, "--metrics", str(m), "--ranks", "2"])
        else:  # README's multi-machine form: two torchrun agents ("machines") of one rank each, c10d rendezvous
            p = _two_machines(tmp_path, args, m)
        assert p.returncode == 0, p.stderr
        recs = _records(m)
        epochs = [r for r in recs if not r.get("summary")]
        assert [r["epoch"] for r in epochs] == [1, 2, 3] and recs[-1]["summary"]  # rank 0 alone wrote it
        assert [r["loss"] for r in epochs] == pytest.approx(expected, rel=1e-5)
        for r, ref in zip(epochs, reference, strict=True):  # distributed layer-wise inference: the same answers
            assert [r[k] for k in ("train_acc", "val_acc", "test_acc")] == pytest.approx(
                [ref[k] for k in ("train_acc", "val_acc", "test_acc")], abs=1e-6)
        for r in epochs:
            assert r["ranks"] == 2 and r["strategy"] == strategy and len(r["rank_feature_bytes"]) == 2
            whole = 600 * 8 * 4
            assert sum(r["rank_feature_bytes"]) == whole and max(r["rank_feature_bytes"]) < whole
            assert r["remote_bytes"] == r["remote_rows"] * 8 * 4
            assert r["local_hit_rate"] == pytest.approx(r["local_rows"] / r["needed_rows"])
            assert r["time_steps"] == (2 if strategy == "micrograph" else 1)
        assert p.stdout.count("distributed: 2 ranks") == 1  # one rank reports
    mc = _records(tmp_path / "model-centric.jsonl")[0]
    mg = _records(tmp_path / "micrograph.jsonl")[0]
    assert mg["remote_bytes"] < mc["remote_bytes"] and mg["migration_bytes"] > 0 == mc["migration_bytes"]
    assert mg["local_hit_rate"] > mc["local_hit_rate"]


# ------------------------------------------------------------------------------------------------ faults
@pytest.mark.parametrize("kind", ["kill", "raise"])
def test_a_failed_rank_stops_the_job_and_is_named(tmp_path: Path, kind: str) -> None:
    # 3 ranks starting torch on a busy machine take what they take: the test waits for the faulty rank's own line
    # (the job is up and failing now, GNNSCALE_FAULT), then bounds only how long the job takes to stop after it
    args = [*GNNSCALE, *_train_args(tmp_path), "--ranks", "3"]
    out = tmp_path / "stdout"
    with out.open("w") as stdout:
        proc = subprocess.Popen(args, stdout=stdout, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "OMP_NUM_THREADS": "1", "GNNSCALE_FAULT": f"1:1:1:{kind}"})
        assert proc.stderr is not None
        seen = []
        try:
            for line in proc.stderr:  # ends at the fault's line, or when the job ends without one (EOF)
                seen.append(line)
                if line.startswith("GNNSCALE_FAULT: rank 1 fails"):
                    break
            assert seen and seen[-1].startswith("GNNSCALE_FAULT"), "".join(seen)
            rest = proc.communicate(timeout=120)[1]  # the launcher stops the job once a rank died
        finally:
            if proc.poll() is None:  # a job that did not stop: the assertion above says so
                proc.kill()
                proc.communicate()
    stderr = "".join(seen) + rest
    assert proc.returncode != 0
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert errors, stderr
    assert all("rank 1" in line for line in errors), errors  # every report names the failed rank
    assert "Traceback" not in stderr or kind == "raise"
    if kind == "kill":
        assert any("SIGKILL" in line for line in errors)
    else:  # the rank that raised left its error in the job's store: its peers quote it
        peers = [line for line in errors if " stops: " in line]
        assert peers and all("rank 1: RuntimeError: fault injected" in line for line in peers), errors


def test_resume_from_an_iteration_checkpoint_continues_the_same_losses(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    args = [*_train_args(tmp_path), "--ranks", "2", "--checkpoint", str(ck), "--checkpoint-iterations", "1"]
    died = _run(args, env={"GNNSCALE_FAULT": "1:2:2:kill"})  # dies as epoch 2's third iteration starts
    assert died.returncode != 0
    state = torch.load(ck / "checkpoint.pt", weights_only=False)
    assert state["epoch"] == 1 and state["engine"]["progress"]["iteration"] == 2  # mid-epoch 2
    resumed = tmp_path / "resumed.jsonl"
    p = _run([*args, "--resume", "--metrics", str(resumed)])
    assert p.returncode == 0, p.stderr
    b = [r for r in _records(resumed) if not r.get("summary")]
    assert [r["epoch"] for r in b] == [1, 2, 3]
    # an uninterrupted run's losses: the mini-batch engine's (the whole-run test shows the distributed engine's
    # equal them), epoch 2 put together from the iterations before the kill and those after the resume
    assert [r["loss"] for r in b] == pytest.approx([r["loss"] for r in _minibatch_history(2)], rel=1e-5)


# -------------------------------------------------------------------------------------------- bad input
def _main_code(argv: list[str]) -> int:
    from gnnscale.cli import main

    try:
        return main(argv)
    except SystemExit as exc:  # argparse
        return int(exc.code or 0)


def test_bad_input_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tiny = tmp_path / "tiny"
    g = _graph()
    cases = [
        (["--ranks", "2", "--strategy", "nope"], "invalid choice"),
        ([], "--engine distributed runs as a job of ranks"),
        (["--ranks", "2", "--plan", str(tmp_path / "missing.npz")], "no such file"),
        (["--ranks", "2", "--merge", "sometimes"], "--merge"),
    ]
    from gnnscale.partition.plan import partition_graph

    plan3 = partition_graph(g, 3, 1, "random", 0).save(tmp_path / "p3.npz")
    cases.append((["--ranks", "2", "--plan", str(plan3)], "3 partitions for 2 ranks"))
    other = partition_graph(csbm(nodes=300, features=8, seed=9), 2, 1, "random", 0).save(tmp_path / "other.npz")
    cases.append((["--ranks", "2", "--plan", str(other)], "made for another graph"))
    io.save(csbm(nodes=3, features=4, avg_degree=1, seed=1, train=0.34), tiny)
    for extra, needle in cases[:5]:  # found before any rank starts: in this process
        code = _main_code([*_train_args(tmp_path), *extra])
        lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert code == 2, (extra, lines)
        assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], (extra, lines)
    p = _run([*_train_args(tmp_path), *cases[5][0]], timeout=120)  # found by the ranks: rank 0 says it
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert p.returncode == 2 and len(lines) == 1 and cases[5][1] in lines[0], p.stderr
    p = _run(["train", "--dataset", str(tiny), "--engine", "distributed", "--ranks", "4", "--epochs", "1"])
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert p.returncode == 2 and len(lines) == 1 and "more than the graph's 3 vertices" in lines[0], p.stderr


def test_gpus_per_rank(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """NCCL takes one GPU per rank: rank LOCAL_RANK gets cuda:LOCAL_RANK, and a machine with more ranks than
    GPUs, or one --device cuda:N for all its ranks, is a clear error (not NCCL's "duplicate GPU" abort)."""
    from gnnscale.engines import resolve_devices
    from gnnscale.errors import ConfigError
    from gnnscale.testing import fake_accelerator

    fake_accelerator(monkeypatch, 2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    cfg = TrainConfig(engine="distributed")
    assert resolve_devices(cfg, "cuda") == torch.device("cuda:1")
    assert resolve_devices(cfg, "cpu") == torch.device("cpu")
    with pytest.raises(ConfigError, match="all 2 ranks of this machine on one GPU"):
        resolve_devices(cfg, "cuda:0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    with pytest.raises(ConfigError, match="3 ranks on this machine but 2 CUDA device"):
        resolve_devices(cfg, "cuda")
    code = _main_code(["train", "--engine", "distributed", "--ranks", "3", "--device", "cuda"])  # no rank starts
    assert code == 2 and "3 ranks on this machine but 2 CUDA device" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------- memory
def test_a_rank_reads_only_its_rows_from_an_on_disk_graph(tmp_path: Path) -> None:
    n, f = 40000, 256
    g = csbm(nodes=n, features=f, avg_degree=2, seed=3)
    io.save(g, tmp_path / "wide")
    del g
    disk = io.open_dir(tmp_path / "wide")
    owner = torch.arange(n) % 4
    before = proc_kib("/proc/self/status", "RssAnon")
    part = PartitionedFeatures(disk.x, owner, 1)  # type: ignore[arg-type]
    grown = ((proc_kib("/proc/self/status", "RssAnon") or 0) - (before or 0)) * 1024
    whole = n * f * 4
    assert part.rows_read == n // 4 and part.nbytes == whole // 4
    assert grown < whole / 2  # a quarter held, never the whole matrix materialised (40 MB)
    assert torch.equal(part.local(torch.tensor([1, 5, 39997])), disk.x[torch.tensor([1, 5, 39997])])
    with pytest.raises(IndexError, match="does not hold"):
        part.local(torch.tensor([0]))

    class Source:  # counts every row handed out by the source (a whole-matrix read, even brief, shows)
        def __init__(self, x: torch.Tensor) -> None:
            self.x, self.shape, self.dtype, self.read = x, x.shape, x.dtype, 0

        def __getitem__(self, idx: Any) -> torch.Tensor:
            rows = self.x[idx]
            self.read += rows.shape[0]
            return rows

    src = Source(disk.x)
    counted = PartitionedFeatures(src, owner, 2)  # type: ignore[arg-type]
    assert src.read == counted.rows_read == n // 4
    assert torch.equal(counted.rows, disk.x[owner == 2])
