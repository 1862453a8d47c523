"""The full-graph path at scale (issue #11): no host syncs that grow with the chunk count, topology built once and
counted apart from rows, gradient buffers left clean by a failed epoch, Eq. 4's device-to-device term."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from torch import Tensor

from gnnscale import TrainConfig
from gnnscale.engines import InMemoryEngine, OffloadEngine
from gnnscale.graph.generators import csbm
from gnnscale.graph.graph import Graph
from gnnscale.nn import build_model
from gnnscale.nn import ops as nn_ops
from gnnscale.partition import partition_graph, permute_csr
from gnnscale.partition.dedup import Throughput, chunk_rows, comm_cost, comm_volume, default_schedule
from gnnscale.testing import SyncCounter

CPU = torch.device("cpu")


def _model(g: Graph, cfg: TrainConfig):  # noqa: ANN202
    assert g.num_classes is not None
    return build_model(cfg.model, g.num_features, cfg.hidden, g.num_classes, layers=cfg.layers,
                       dropout=cfg.dropout, heads=cfg.heads, seed=cfg.seed)


def _offload(g: Graph, **kw: object) -> OffloadEngine:
    cfg = TrainConfig(**{"hidden": 16, "heads": 2, "engine": "offload", "partitions": 1, "seed": 0, **kw})
    return OffloadEngine(g, _model(g, cfg), cfg, CPU)


@pytest.fixture(scope="module")
def graph() -> Graph:
    return csbm(nodes=800, features=12, avg_degree=8, seed=0)


def _syncs(g: Graph, chunks: int, **kw: object) -> tuple[dict[str, int], dict[str, int]]:
    eng = _offload(g, chunks=chunks, **kw)
    eng.train_epoch(1)
    with SyncCounter() as train:
        eng.train_epoch(2)
    with SyncCounter() as evaluate:
        eng.evaluate()
    return dict(train.counts), dict(evaluate.counts)


# ------------------------------------------------------------------------------------------------ host syncs
@pytest.mark.parametrize("dedup", ["full", "none"])
@pytest.mark.parametrize("model", ["gcn", "gat"])
def test_host_syncs_per_epoch_do_not_grow_with_the_chunk_count(graph: Graph, model: str, dedup: str) -> None:
    few = _syncs(graph, 4, model=model, dedup=dedup)
    many = _syncs(graph, 32, model=model, dedup=dedup)
    assert few == many, f"syncs with 4 chunks {few}, with 32 chunks {many}"
    train, evaluate = many
    # a constant per epoch and layer: the loss read back once per pass, the accuracy counts in evaluation
    assert sum(train.values()) <= 12 and sum(evaluate.values()) <= 12, many


def _old_keep_mask(row_ids: Tensor, num_features: int, p: float, key: int) -> Tensor:
    """keep_mask as it was: the column key built with ``torch.tensor(..., device=dev)`` on every call."""
    dev = row_ids.device
    r = row_ids.long()
    hr = nn_ops._mix31(((r ^ (r >> 31)) & nn_ops._M31) ^ key)
    cols = torch.arange(num_features, device=dev, dtype=torch.int64)
    hc = nn_ops._mix31((cols * 0x9E3779B1) & nn_ops._M31 ^ nn_ops._mix31(torch.tensor(key ^ 0x5BD1E995, device=dev)))
    u = hr.to(torch.int32).unsqueeze(1) ^ hc.to(torch.int32).unsqueeze(0)
    u *= nn_ops._FIB32
    u >>= 1
    u &= nn_ops._M31
    return u >= int(p * (1 << 31))


def test_the_sync_count_sees_a_per_chunk_tensor_from_python(graph: Graph, monkeypatch: pytest.MonkeyPatch) -> None:
    """The counting test above fails on the former keep_mask (a blocking host->device copy per chunk)."""
    monkeypatch.setattr(nn_ops, "keep_mask", _old_keep_mask)
    few, many = _syncs(graph, 4)[0], _syncs(graph, 32)[0]
    assert many["tensor_from_python"] > few["tensor_from_python"] >= 4


def test_sync_counter_counts_host_pulls_and_data_dependent_shapes() -> None:
    x = torch.arange(6)
    with SyncCounter() as c:
        int(x[1])
        x.tolist()
        x.cpu()
        torch.nonzero(x)
        x[x > 2]
        torch.repeat_interleave(x, x)
        torch.repeat_interleave(x, x, output_size=15)  # size known: no sync
        x + 1
    assert c.counts == {"item": 1, "tolist()": 1, "cpu()": 1, "nonzero": 1, "bool_index": 1,
                        "repeat_interleave": 1}


# ------------------------------------------------------------------------------------------------ topology
def test_topology_is_built_once_and_counted_apart_from_rows(graph: Graph, monkeypatch: pytest.MonkeyPatch) -> None:
    eng = _offload(graph, model="gcn", chunks=8, dedup="none")
    assert eng.plan.resident_topology  # the default budget (free host memory) holds every block: turn it off
    eng.plan = dataclasses.replace(eng.plan, resident_topology=False)  # a copy: the planner's memo stays as is
    for w in eng.workers:
        w.io.resident = None
    blocks = [c.block for c in eng.chunks]
    assert all(b.has_transpose and b.indptr.dtype == torch.int32 and b.indices.dtype == torch.int32 for b in blocks)
    sorts = []
    monkeypatch.setattr(torch.Tensor, "to_sparse_csc", lambda self, *a, **k: sorts.append(1) or 1 / 0)
    rec = eng.train_epoch(1)
    assert not sorts, "a transpose was rebuilt during the epoch"
    # GCN, 2 layers, 12 features -> 16: layer 0 is cached. Forward layer 0 moves the blocks without transposes,
    # the last layer (loss and backward through its propagation) with them, layer 0's backward none at all.
    assert rec["h2d_topology_bytes"] == sum(b.nbytes(False) + b.nbytes(True) for b in blocks)
    assert rec["h2d_bytes"] == rec["h2d_row_bytes"] + rec["h2d_topology_bytes"] + rec["h2d_index_bytes"]
    rows = sum(c.rows.numel() for c in eng.chunks)
    assert rec["h2d_row_bytes"] >= rows * 4 * (graph.num_features + 16)  # layer 0 and the last layer's rows


def test_resident_topology_moves_once_when_the_budget_holds_it(graph: Graph) -> None:
    eng = _offload(graph, model="gcn", chunks=8, dedup="full")
    assert eng.plan.resident_topology
    first, second = eng.train_epoch(1), eng.train_epoch(2)
    assert first["h2d_topology_bytes"] == sum(c.block.nbytes() for c in eng.chunks)
    assert second["h2d_topology_bytes"] == 0 and second["h2d_row_bytes"] == first["h2d_row_bytes"]
    # the planner counts the resident blocks in its estimate (its passes then load none); a budget without room
    # for them, the passes' estimate with blocks loaded per chunk, resends them
    blocks = sum(c.block.nbytes() for c in eng.chunks)
    assert eng.plan.estimate > eng.plan.chunk_estimate and eng.plan.estimate >= blocks > 0
    tight = _offload(graph, model="gcn", chunks=8, dedup="full", memory_budget=eng.plan.chunk_estimate)
    assert not tight.plan.resident_topology and tight.plan.estimate == eng.plan.chunk_estimate
    assert tight.train_epoch(1)["h2d_topology_bytes"] > 0 and tight.train_epoch(2)["h2d_topology_bytes"] > 0


# ------------------------------------------------------------------------------------------------ failures
@pytest.mark.parametrize("dedup", ["full", "none"])
def test_a_failed_epoch_leaves_no_stale_gradients(graph: Graph, dedup: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An epoch that raises half-way through backward, then the same epoch again, equals that epoch run once."""
    eng = _offload(graph, model="sage", layers=3, chunks=4, dedup=dedup)
    ref = InMemoryEngine(graph, _model(graph, eng.config), eng.config, CPU)
    layer = eng.model.block_layers[0]
    calls = []
    update, update_vjp = layer.update, layer.update_vjp

    def flaky(*args: Tensor) -> Tensor:
        if torch.is_grad_enabled():  # layer 0's backward, chunk by chunk: fail on the second chunk
            calls.append(1)
            if len(calls) == 2:
                raise RuntimeError("device lost")
        return update(*args)

    def flaky_vjp(*args: object) -> object:  # the CPU's backward of UPDATE without its forward (update_vjp)
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("device lost")
        return update_vjp(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(layer, "update", flaky)
    monkeypatch.setattr(layer, "update_vjp", flaky_vjp)
    with pytest.raises(RuntimeError, match="device lost"):
        eng.train_epoch(1)
    grads = eng.host.input_grads.values()
    assert any(bool(t.any()) for t in grads) is False, "host gradient buffers kept part of a pass"
    a, b = ref.train_epoch(1)["loss"], eng.train_epoch(1)["loss"]
    assert abs(a - b) <= 1e-5 * abs(a)
    for p, q in zip(ref.model.parameters(), eng.model.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None
        assert float((p.grad - q.grad).abs().max()) <= 1e-4 * max(1.0, float(p.grad.abs().max()))


# ------------------------------------------------------------------------------------------------ Eq. 4
def test_eq4_prices_rows_read_from_other_partitions_at_the_device_to_device_rate() -> None:
    g = csbm(nodes=600, features=4, avg_degree=8, seed=2)
    part = partition_graph(g, 3, 4, "random")
    ip, ix = permute_csr(g.indptr, g.indices, None, part.perm, part.inverse())[:2]
    rows = chunk_rows(ip, ix, part.chunk_ptr)
    vol = comm_volume(rows, default_schedule(3, 4))
    assert vol.ori > vol.p2p > vol.ru  # with three partitions, chunks of a batch share rows
    slow, fast = Throughput(hd=1e9, dd=1e6, ru=2e9), Throughput(hd=1e9, dd=1e12, ru=2e9)
    diff = comm_cost(vol, "full", slow) - comm_cost(vol, "full", fast)
    assert diff == pytest.approx((vol.ori - vol.p2p) * 4 * (1 / 1e6 - 1 / 1e12), rel=1e-9)
    expected = (vol.ru / 1e9 + (vol.ori - vol.p2p) / 1e6 + (vol.p2p - vol.ru) / 2e9) * 4
    assert comm_cost(vol, "full", slow) == pytest.approx(expected, rel=1e-12)
    # the other modes never read another partition's buffer
    assert comm_cost(vol, "reuse", slow) == comm_cost(vol, "reuse", fast)


# ------------------------------------------------------------------------------------------------ preprocessing
def test_metis_runs_once_per_partitioning_and_once_at_the_chosen_chunk_count(
        monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # noqa: ANN001
    """``--chunker auto`` without ``--chunks``: the chunk count is searched on range splits, METIS runs for the
    level-1 split and then once per partition at the count chosen -- never per candidate."""
    import gnnscale.partition.plan as plan_mod
    from gnnscale.plan.offload import _MEMO, plan_offload

    g = csbm(nodes=3000, features=16, avg_degree=10, seed=1)
    calls: list[tuple[int, bool]] = []
    metis = plan_mod._metis

    def counted(ei: Tensor, n: int, m: int, seed: int, volume: bool = False) -> Tensor:
        calls.append((m, volume))
        return metis(ei, n, m, seed, volume)

    monkeypatch.setattr(plan_mod, "_metis", counted)
    base = TrainConfig(model="gcn", hidden=16, engine="offload", partitions=2, chunker="auto", seed=0,
                       plan_dir=str(tmp_path))
    probe = plan_offload(g, TrainConfig(**{**base.__dict__, "chunks": 8, "chunker": "range"}), CPU)
    calls.clear()
    _MEMO.clear()
    plan = plan_offload(g, TrainConfig(**{**base.__dict__, "memory_budget": probe.search_estimate}), CPU)
    n = plan.partition.chunks
    assert 4 <= n <= 8 and len(plan.searched) >= 3  # a real search over several candidate counts
    assert calls == [(n, True), (n, True)], calls  # level 1 reused from the probe's saved plan; chunks: at n only
    assert {re.match(r"[a-z]+", k).group() for k in plan.costs} == {"range", "metis"}  # type: ignore[union-attr]


def test_the_plan_is_built_once_per_run_without_a_budget(graph: Graph, monkeypatch: pytest.MonkeyPatch) -> None:
    """``engine=auto``, no ``--gpu-memory``: the selector's check and the engine's set-up share one plan, although
    free memory changes between them."""
    from gnnscale import train
    from gnnscale.plan import offload as planner

    builds = []
    chunk_rows_ = planner.chunk_rows
    monkeypatch.setattr(planner, "chunk_rows", lambda *a: builds.append(1) or chunk_rows_(*a))
    readings = iter(range(1 << 40, 1 << 41, 1 << 20))  # a different free-memory reading on every call
    monkeypatch.setattr(planner, "available_device_bytes", lambda device: next(readings))
    planner._MEMO.clear()
    train(graph, TrainConfig(model="gcn", hidden=16, engine="offload", epochs=1, chunks=4), "cpu")
    assert builds == [1]
