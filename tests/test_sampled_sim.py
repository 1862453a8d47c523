"""The sampled engines on the runtime's sim device (an accelerator simulated on the CPU whose asynchronous copies
read as NaN until they are waited for, and which raises StreamOrderError when a stream touches memory another
stream may still use; docs/runtime.md).

The mini-batch engine (XGNN) trains on ``sim:0`` and on two sim trainers (``devices=("sim:0", "sim:1")``) and
equals its CPU run: two epochs' losses and the weights after them, with no NaN anywhere, every deferred copy
performed. Each trainer samples and extracts on its own stream (a producer thread), and the training stream
waits for it on the device (an event); the producer's stream first waits for the stream the epoch's seeds were
copied on. Each of those waits, removed on its own at its site (the runtime call made a no-op there), fails
the run through the data; so does training's ``record_stream`` of the batch's tensors (the sampling stream
would reuse memory the training stream may still read).
"""

from __future__ import annotations

import functools
import gc
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from test_distributed import FANOUTS, _free_port
from test_distributed import _graph as _rank_graph
from test_hybrid import _config
from torch import Tensor

import gnnscale.runtime as rt
from gnnscale.config import TrainConfig
from gnnscale.engines.sampled.distributed import DistributedEngine
from gnnscale.engines.sampled.minibatch import QUEUE_DEPTH as MB_QUEUE_DEPTH
from gnnscale.engines.sampled.minibatch import MiniBatchEngine
from gnnscale.graph.generators import csbm
from gnnscale.graph.graph import Graph
from gnnscale.nn import build_model
from gnnscale.store import GlobalMemoryStore

CPU = torch.device("cpu")
BATCH = 16  # four iterations per epoch (64 training vertices of 600)


@pytest.fixture(scope="module")
def graph() -> Graph:
    return csbm(nodes=600, features=12, avg_degree=8, seed=5)


def _minibatch(g: Graph, device: rt.Device, devices: tuple[str, ...] | None = None, model: str = "sage",
               **kw: Any) -> MiniBatchEngine:
    cfg = _config(**{"engine": "minibatch", "model": model, "batch_size": BATCH, "devices": devices, **kw})
    assert g.num_classes is not None
    stack = build_model(cfg.model, g.num_features, cfg.hidden, g.num_classes, layers=cfg.layers,
                        dropout=cfg.dropout, heads=cfg.heads, seed=cfg.seed)
    return MiniBatchEngine(g, stack, cfg, device)


@functools.cache
def _reference(model: str) -> tuple[list[float], list[Tensor], dict[str, float | None]]:
    """The mini-batch engine on the CPU: two epochs' losses, the weights and the accuracies after them."""
    ref = _minibatch(csbm(nodes=600, features=12, avg_degree=8, seed=5), CPU, model=model)
    losses = [ref.train_epoch(epoch)["loss"] for epoch in (1, 2)]
    return losses, [p.detach().clone() for p in ref.model.parameters()], ref.evaluate()


def _train(eng: MiniBatchEngine, model: str = "sage") -> list[dict[str, Any]]:
    """Two epochs against the CPU reference: equal losses and weights, nothing NaN."""
    losses, weights, _ = _reference(model)
    recs = []
    for epoch in (1, 2):
        rec: dict[str, Any] = eng.train_epoch(epoch)
        finite = math.isfinite(rec["loss"]) and all(bool(torch.isfinite(p).all()) for p in eng.model.parameters())
        assert finite, "NaN in the loss or the weights"
        assert rec["loss"] == pytest.approx(losses[epoch - 1], rel=1e-5)
        recs.append(rec)
    for a, b in zip(weights, eng.model.parameters(), strict=True):
        torch.testing.assert_close(b.detach(), a, rtol=1e-4, atol=1e-5)
    return recs


# ------------------------------------------------------------------------------------------------ equal runs
@pytest.mark.parametrize(("trainers", "model"), [(1, "sage"), (2, "sage"), (2, "gcn")])
def test_minibatch_on_sim_devices_equals_its_cpu_run(graph: Graph, sims: list[rt.SimDevice], trainers: int,
                                                     model: str) -> None:
    """``--device sim:0`` (one trainer) and ``--devices sim:0,sim:1`` (two): the store's device tier, the
    sampling, the extraction and the training on sim devices; every copy deferred, then performed."""
    devices = None if trainers == 1 else tuple(f"sim:{i}" for i in range(trainers))
    eng = _minibatch(graph, sims[0], devices, model=model)
    assert [t.device for t in eng.trainers] == sims[:trainers]
    before = [(d.copies_issued, d.copies_completed) for d in sims[:trainers]]
    recs = _train(eng, model)
    assert eng.evaluate() == _reference(model)[2]  # layer-wise inference over the store on the sim devices
    for d, (issued, completed) in zip(sims[:trainers], before, strict=True):
        assert d.copies_issued > issued
        assert d.copies_completed - completed == d.copies_issued - issued
    assert all(s > 0 for s in recs[0]["trainer_seeds"]) and len(recs[0]["trainer_seeds"]) == trainers
    if trainers == 1:  # two trainers read each other's partitions: their requests wait too (PeerLink)
        rt.reset_counts()
        iterations = eng.train_epoch(3)["batches"]
        # per epoch the producer's stream waits for the seeds' once, training for every batch's event
        assert rt.wait_count(sims[0]) == 1 + iterations
        # per batch the store reader's host syncs (a route and a take per hop, one for the rows); the loss once
        assert rt.sync_count(sims[0]) == (2 * 2 + 1) * iterations + 1
        assert rt.sync_count(CPU) == 0 and rt.wait_count(CPU) == 0


# ------------------------------------------------------------------------------------------------ mistakes caught
def _skip(monkeypatch: pytest.MonkeyPatch, name: str, skipped: Callable[..., bool]) -> None:
    """``rt.<name>`` does nothing where ``skipped(*args)`` (the site's call made a no-op)."""
    real = getattr(rt, name)
    monkeypatch.setattr(rt, name, lambda *a: None if skipped(*a) else real(*a))


@pytest.mark.parametrize("trainers", [1, 2])
@pytest.mark.parametrize(("removed", "failure"), [
    ("training's wait on the batch's event", r"on sim:\d/default reads .* that sim:\d/stream\d+ wrote"),
    ("sampling's wait on the seeds' stream", r"on sim:0/stream\d+ reads .* that sim:0/default wrote"),
    ("training's record_stream of the batch", r"on sim:0/stream\d+ may reuse .* while sim:0/default may still"),
])
def test_a_missing_wait_of_the_minibatch_engine_fails(graph: Graph, sims: list[rt.SimDevice], trainers: int,
                                                      removed: str, failure: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Each wait of ``MiniBatchEngine._batches`` made a no-op at its site: the training stream's wait on the
    event the producer recorded after the batch (else training reads the extraction's copies unordered), the
    producer stream's wait on the stream the epoch's seeds were copied on (else sampling reads them unordered),
    and training's ``record_stream`` of the batch's tensors (else the sampling stream's next allocation may take
    memory training still reads). Each fails the run through the data."""
    devices = None if trainers == 1 else ("sim:0", "sim:1")
    # 16 iterations an epoch, many more than the producer may run ahead (QUEUE_DEPTH): batch k is allocated only
    # after training took batch k - 3 and so dropped batch k - 4; with 4 iterations the producer could finish the
    # epoch before training dropped its first batch, and nothing would allocate after the free (a flaky test)
    eng = _minibatch(graph, sims[0], devices, batch_size=BATCH // 4)
    assert -(-64 // (BATCH // 4)) > MB_QUEUE_DEPTH + 8
    streams = [t.stream for t in eng.trainers]
    if removed.startswith("training's wait"):
        _skip(monkeypatch, "wait_event", lambda event, stream: stream is not None
              and all(stream is not s for s in streams))
    elif removed.startswith("sampling's wait"):
        _skip(monkeypatch, "wait_stream", lambda stream, other: any(stream is s for s in streams))
    else:
        _skip(monkeypatch, "record_stream", lambda tensor, stream: all(stream is not s for s in streams))
    threshold = gc.get_threshold()
    gc.set_threshold(50)  # a batch held in a reference cycle is freed promptly, whatever ran before this test
    try:
        with pytest.raises(rt.StreamOrderError, match=failure):
            _train(eng)
    finally:
        gc.set_threshold(*threshold)
    monkeypatch.undo()
    _settle(sims)


def _settle(sims: list[rt.SimDevice]) -> None:
    """The host waits for every stream of the process's sim devices, while the failed run's engine is still alive:
    its memory, freed later, leaves no debt for the next test's allocations."""
    for d in sims:
        rt.synchronize(d)


# ------------------------------------------------------------------------------------------------ CUDA twins
def test_sim_sampling_equals_cpu_sampling_with_real_fanouts(sims: list[rt.SimDevice]) -> None:
    """Twin of test_minibatch_xgnn's CUDA-only ``test_cuda_sampling_equals_cpu_sampling_with_real_fanouts``: with
    30% of the topology and features on the device (the rest read from host memory), the device sampler draws the
    CPU's keyed sample, reads the same entries and rows, and the epoch's loss is the CPU's."""
    g = csbm(nodes=2000, features=16, avg_degree=8, seed=2)

    def run(device: rt.Device) -> dict[str, Any]:
        eng = _minibatch(g, device, model="sage", dropout=0.0, fanouts=(5, 3), gpu_graph_ratio=0.3,
                         gpu_feature_ratio=0.3, batch_size=128, hidden=16, seed=1)
        return eng.train_epoch(1)

    cpu, sim = run(CPU), run(sims[0])
    assert sim["sampled_edges"] == cpu["sampled_edges"]
    assert sim["fetched_neighbor_entries"] == cpu["fetched_neighbor_entries"]
    assert sim["h2d_row_bytes"] == cpu["h2d_row_bytes"] > 0
    assert sim["loss"] == pytest.approx(cpu["loss"], rel=1e-5)


def test_sim_staging_buffer_is_allocated_once_and_reused() -> None:
    """Twin of test_minibatch_xgnn's CUDA-only ``test_cuda_staging_buffer_is_pinned_once_and_reused``: ten reads
    of growing size through one staging buffer (the store's host rows to the device), each x[ids] once its stream
    is waited for; the buffer is made once. (On a sim device nothing is page-locked: docs/runtime.md.)"""
    g = csbm(nodes=3000, features=16, avg_degree=8, seed=3)
    assert g.x is not None
    dev = rt.SimDevice(0, 1 << 22)
    store = GlobalMemoryStore(g, [dev], gpu_feature_ratio=0.1, gather="index_select")
    gen = torch.Generator().manual_seed(0)
    for i in range(10):
        ids = torch.randperm(g.num_nodes, generator=gen)[: 200 + 10 * i]
        got = store.features(rt.to_device(ids, dev))
        rt.synchronize(dev)
        assert torch.equal(got, g.x[ids]), i
    assert store.stats.staging_allocs == 1


# ------------------------------------------------------------------------------------------------ distributed
def _rank_task(rank: int, plan_dir: str) -> dict[str, Any]:
    """This rank's two epochs (and its evaluation) on the CPU, then on ``sim:LOCAL_RANK``, from the same
    weights."""
    out: dict[str, Any] = {}
    for name, device in (("cpu", CPU), ("sim", rt.sim_device(int(os.environ["LOCAL_RANK"])))):
        g = _rank_graph()
        cfg = TrainConfig(engine="distributed", model="sage", batch_size=25, fanouts=FANOUTS, seed=0,
                          plan_dir=plan_dir, hidden=8, strategy="micrograph")
        model = build_model("sage", g.num_features, 8, g.num_classes, layers=2, dropout=0.5, heads=1, seed=0)
        eng = DistributedEngine(g, model, cfg, device)
        issued = device.copies_issued if isinstance(device, rt.SimDevice) else 0
        out[name] = {"losses": [eng.train_epoch(epoch)["loss"] for epoch in (1, 2)], "eval": eng.evaluate(),
                     "weights": [p.detach().clone() for p in eng.model.parameters()],
                     "copies": device.copies_issued - issued if isinstance(device, rt.SimDevice) else 0}
        eng.comm.close()
    return out


def _rank_entry(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    torch.save(_rank_task(rank, str(Path(out) / "plans")), Path(out) / f"rank{rank}.pt")


def test_distributed_ranks_on_sim_devices_equal_cpu_ranks(tmp_path: Path) -> None:
    """Two gloo ranks, each on ``sim:LOCAL_RANK`` (its features, labels and blocks in the sim device's memory,
    copied through the runtime), train the CPU ranks' epochs: the same losses, weights and accuracies."""
    import torch.multiprocessing as mp

    mp.start_processes(_rank_entry, args=(2, _free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    for got in ranks:
        assert got["sim"]["copies"] > 0  # the blocks and rows really went through the sim device
        assert got["sim"]["losses"] == pytest.approx(got["cpu"]["losses"], rel=1e-5)
        assert all(math.isfinite(v) for v in got["sim"]["losses"])
        assert got["sim"]["eval"] == got["cpu"]["eval"]
        for a, b in zip(got["cpu"]["weights"], got["sim"]["weights"], strict=True):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    assert ranks[0]["sim"]["losses"] == ranks[1]["sim"]["losses"]  # the job's loss, the same on every rank
