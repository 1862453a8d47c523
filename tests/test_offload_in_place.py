"""The offload engine on a CPU without a device budget reads source rows where they are (issue #30 point 4): the
chunks' propagations multiply the host table through a block over its own rows, and the source rows' gradients
are added into host rows as they are made. Training gives the bits the gathering path gives, and every counter
stays the same; with a budget the CPU rehearses an accelerator's copies."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from gnnscale import TrainConfig
from gnnscale.engines import OffloadEngine
from gnnscale.engines.core import mover as mover_mod
from gnnscale.engines.core.chunks import Chunk
from gnnscale.graph.generators import csbm
from gnnscale.graph.graph import Graph
from gnnscale.nn import build_model
from gnnscale.nn.ops import sparse_mm
from gnnscale.runtime import cpu_kernels

CPU = torch.device("cpu")
COUNTERS = ("h2d_row_bytes", "h2d_topology_bytes", "d2h_bytes", "rows_h2d", "rows_h2d_bytes")


@pytest.fixture(scope="module")
def graph() -> Graph:
    return csbm(nodes=600, features=24, avg_degree=8, seed=2)


def _engine(g: Graph, model: str, layers: int, **kw: object) -> OffloadEngine:
    cfg = TrainConfig(**{"model": model, "hidden": 16, "heads": 2, "layers": layers, "engine": "offload",
                         "partitions": 1, "chunks": 3, "dropout": 0.5, "seed": 0, **kw})
    assert g.num_classes is not None
    net = build_model(cfg.model, g.num_features, cfg.hidden, g.num_classes, layers=cfg.layers, dropout=cfg.dropout,
                      heads=cfg.heads, seed=cfg.seed)
    return OffloadEngine(g, net, cfg, CPU)


def _count_calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    calls: Counter[str] = Counter()
    M = mover_mod.RowMover
    for name in ("rows", "rows_in_place", "accumulate", "accumulate_in_place"):
        real = getattr(M, name)

        def spy(io, *a, _real=real, _name=name, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
            calls[_name] += 1
            return _real(io, *a, **k)

        monkeypatch.setattr(M, name, spy)
    real_copy = mover_mod.rt.copy_async

    def copy_spy(*a, **k):  # noqa: ANN002, ANN003, ANN202  (on a CPU only a store copies)
        calls["stored_by_copy"] += 1
        return real_copy(*a, **k)

    monkeypatch.setattr(mover_mod.rt, "copy_async", copy_spy)
    return calls


@pytest.mark.parametrize(("model", "layers", "kernels"),
                         [("gcn", 2, False), ("gcn", 2, True), ("sage", 3, False), ("sage", 3, True),
                          ("gin", 3, False), ("gat", 3, False)])
def test_reading_in_place_trains_the_bits_gathering_trains(graph: Graph, model: str, layers: int, kernels: bool,
                                                           one_thread: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two epochs reading in place against two gathering (the movers told not to read in place): equal losses
    and parameters in every bit, equal byte and row counters. Reading in place, the passes that can (GCN's and
    SAGE's propagations, GIN's cached layers after the first) make no gather and the cached propagations' source
    gradients no ``[R, F]`` product to push; GAT (attention reads rows by position) reads nothing in place.
    The rows a pass stores are made where they land, with no copy: every one for a 2-layer GCN (projections,
    cached propagations, next layers' inputs), at least the next layers' inputs for the others.
    ``kernels``: with numba's kernels taking every product (``MIN_ELEMENTS`` 0), else torch's."""
    if kernels and not cpu_kernels.available():
        pytest.skip("numba is not installed: the fused kernels cannot run")
    monkeypatch.setattr(cpu_kernels, "MIN_ELEMENTS", 0 if kernels else 1 << 62)
    runs = []
    for in_place in (True, False):
        calls = _count_calls(monkeypatch)
        eng = _engine(graph, model, layers)
        assert all(w.io.in_place for w in eng.workers)
        for w in eng.workers:
            w.io.in_place = in_place
        records = [eng.train_epoch(e) for e in (1, 2)]
        runs.append((records, [p.detach().clone() for p in eng.model.parameters()], Counter(calls)))
        monkeypatch.undo()
        monkeypatch.setattr(cpu_kernels, "MIN_ELEMENTS", 0 if kernels else 1 << 62)
    (rec_in, params_in, calls_in), (rec_g, params_g, calls_g) = runs
    for a, b in zip(rec_in, rec_g, strict=True):
        assert a["loss"] == b["loss"]
        for key in COUNTERS:
            assert a[key] == b[key], key
    for p, q in zip(params_in, params_g, strict=True):
        assert torch.equal(p.view(torch.int32), q.view(torch.int32))
    assert calls_g["rows_in_place"] == calls_g["accumulate_in_place"] == 0
    stores = 2 * (layers - 1) * 3  # at least the next layers' inputs, every chunk of two epochs
    assert calls_g["stored_by_copy"] >= stores
    assert calls_in["stored_by_copy"] <= calls_g["stored_by_copy"] - stores
    if model == "gcn":
        assert calls_in["stored_by_copy"] == 0
    if model == "gat":
        assert calls_in - Counter(stored_by_copy=calls_in["stored_by_copy"]) == \
            calls_g - Counter(stored_by_copy=calls_g["stored_by_copy"])
        return
    chunks = 3 * 2  # per pass, two epochs
    assert calls_in["rows_in_place"] >= chunks and calls_in["accumulate_in_place"] >= chunks
    assert calls_in["rows"] == calls_g["rows"] - calls_in["rows_in_place"]  # each read in place is a gather less
    assert calls_in["accumulate"] == calls_g["accumulate"] - calls_in["accumulate_in_place"]


@pytest.mark.parametrize("budget", [{"memory_budget": 4_000_000}, {"host_memory": 1 << 30}])
def test_with_a_budget_the_cpu_gathers(graph: Graph, budget: dict[str, int], monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``--gpu-memory`` the CPU stands in for the accelerator the budget is for: every source row is
    gathered (a new tensor, counted as device memory), nothing is read in place. Under ``--host-memory`` too:
    the blocks over host rows (4 bytes an edge) are not in the host plan."""
    calls = _count_calls(monkeypatch)
    eng = _engine(graph, "gcn", 2, **budget)
    assert not any(w.io.in_place for w in eng.workers)
    eng.train_epoch(1)
    assert calls["rows"] > 0 and calls["rows_in_place"] == calls["accumulate_in_place"] == 0


def test_a_chunk_s_block_over_the_host_rows_multiplies_as_its_local_block_over_the_gathered_rows(
        graph: Graph) -> None:
    """:meth:`Chunk.in_place`: entry for entry the local block's, its columns the chunk's row ids; its product
    with the host table equals the local block's with the gathered rows, bit for bit (the same terms in the same
    order), and it is built once."""
    eng = _engine(graph, "gcn", 2)
    table = torch.randn(graph.num_nodes, 16)
    for chunk in eng.chunks:
        assert isinstance(chunk, Chunk)
        block = chunk.in_place(graph.num_nodes)
        assert block is chunk.in_place(graph.num_nodes) and block.num_src == graph.num_nodes
        assert torch.equal(block.indptr.long(), chunk.block.indptr.long())
        assert torch.equal(block.indices.long(), chunk.rows[chunk.block.indices.long()])
        local = sparse_mm(chunk.block.adj(), table.index_select(0, chunk.rows))
        assert torch.equal(sparse_mm(block.adj(), table).view(torch.int32), local.view(torch.int32))


@pytest.mark.parametrize("model", ["gcn", "sage"])
def test_a_cpu_reading_in_place_backpropagates_update_without_recomputing_it(graph: Graph, model: str,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """In a caching layer's backward, a CPU that reads in place takes UPDATE's gradient from the next layer's
    stored input (``update_vjp``: no forward product); with a budget (an accelerator's rehearsal) it recomputes
    UPDATE under autograd. Both give the same bits (the test above); here the mechanism is counted: UPDATE runs
    once per chunk per forward pass in place, and once more per chunk in backward under the budget."""
    calls: Counter[str] = Counter()
    layer_cls = type(build_model(model, 4, 4, 2, layers=2, dropout=0.0, heads=2, seed=0).block_layers[0])
    update, update_vjp = layer_cls.update, layer_cls.update_vjp

    def counted_update(self, agg, x_dst):  # type: ignore[no-untyped-def]
        calls["update"] += 1
        return update(self, agg, x_dst)

    def counted_vjp(self, *args):  # type: ignore[no-untyped-def]
        calls["update_vjp"] += 1
        return update_vjp(self, *args)

    monkeypatch.setattr(layer_cls, "update", counted_update)
    monkeypatch.setattr(layer_cls, "update_vjp", counted_vjp)
    in_place = _engine(graph, model, 3)
    chunks = in_place.num_chunks
    in_place.train_epoch(1)
    # 3 layers: layers 0 and 1 cache (their backward is where UPDATE would be recomputed); the last is fused
    assert calls["update_vjp"] == 2 * chunks and calls["update"] == 3 * chunks
    calls.clear()
    rehearsal = _engine(graph, model, 3, memory_budget=10**9)
    rehearsal.train_epoch(1)
    assert calls["update_vjp"] == 0 and calls["update"] == 3 * rehearsal.num_chunks + 2 * rehearsal.num_chunks
