"""``--norm batch`` with several trainers in one process (gnnscale/engines/sampled/norm.py): the trainers reduce
BatchNorm's statistics over the global batch, each vertex counted once however many shares reach it, so the
mini-batch engine on 3 trainers equals it on 1, and the hybrid engine with DRM off equals the mini-batch engine."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch

from gnnscale import TrainConfig, train
from gnnscale.engines.sampled import norm as sampled_norm
from gnnscale.engines.sampled.norm import GroupAborted, TrainerGroup, norm_sites, wait_all
from gnnscale.graph.generators import csbm
from gnnscale.graph.graph import Graph
from gnnscale.nn import build_model
from gnnscale.sample import CSRTopology, sample_blocks

THREE = ("cpu", "cpu:1", "cpu:2")


def _graph() -> Graph:
    return csbm(nodes=600, features=12, avg_degree=8, seed=5)  # 60 training vertices


def _kw(model: str, residual: bool = False, **over: Any) -> dict[str, Any]:
    # batches of 29, 29 and 2 seeds: the last one leaves a trainer without a share
    kw: dict[str, Any] = dict(model=model, layers=2, hidden=16, dropout=0.5, fanouts=(4, 3), seed=2, batch_size=29,
                              epochs=2, norm="batch", residual=residual)
    return {**kw, **over}


def _assert_same_run(got: Any, ref: Any) -> None:
    """Per-epoch losses (1e-5), accuracies and the running statistics the master model ends with.

    The running means too: the biases that shift them, just before a BatchNorm (GCN's, GIN's MLP's linear maps),
    keep exactly zero gradients in every engine (``GNN.biases_before_norm``), so they no longer drift apart with
    the rounding of each run (per-trainer statistics miss by about 0.1)."""
    assert [r["loss"] for r in got.history] == pytest.approx([r["loss"] for r in ref.history], rel=1e-5)
    for key in ("train_acc", "val_acc", "test_acc"):
        assert [r[key] for r in got.history] == [r[key] for r in ref.history], key
    mine, theirs = got.model.state_dict(), ref.model.state_dict()
    stats = [k for k in theirs if k.endswith("running_var")]
    assert stats
    for k in stats:
        torch.testing.assert_close(mine[k], theirs[k], rtol=1e-4, atol=1e-5)
        mean = k.replace("running_var", "running_mean")
        torch.testing.assert_close(mine[mean], theirs[mean], rtol=1e-4, atol=1e-5)
        tracked = k.replace("running_var", "num_batches_tracked")
        assert int(mine[tracked]) == int(theirs[tracked]) == 6, tracked  # one update per batch, 3 a epoch


@pytest.mark.parametrize(("model", "residual", "layers"), [("gcn", False, 2), ("gin", False, 3), ("gcn", True, 2),
                                                           ("gin", True, 2)])
def test_minibatch_with_three_trainers_equals_one(model: str, residual: bool, layers: int) -> None:
    g = _graph()
    kw = _kw(model, residual, layers=layers, fanouts=(4, 3, 3)[:layers])
    ref = train(g, TrainConfig(engine="minibatch", **kw), "cpu")
    got = train(g, TrainConfig(engine="minibatch", devices=THREE, **kw), "cpu")
    assert [r["trainer_seeds"] for r in got.history] == [[21, 21, 18]] * 2  # the last batch: 1, 1 and none
    _assert_same_run(got, ref)


@pytest.mark.parametrize("model", ["gin", "gcn"])
def test_hybrid_with_drm_off_equals_minibatch(model: str) -> None:
    """Three unequal trainers; the CPU trainer (the master) has no share of the last batch (2 seeds at 0.2), so its
    running statistics come from the trainers that trained."""
    g = _graph()
    kw = _kw(model, residual=True)
    ref = train(g, TrainConfig(engine="minibatch", **kw), "cpu")
    got = train(g, TrainConfig(engine="hybrid", devices=THREE, shares=(0.2, 0.4, 0.4), drm="off", **kw), "cpu")
    assert [r["trainer_seeds"] for r in got.history] == [[12, 23, 25]] * 2
    _assert_same_run(got, ref)


def test_the_trainers_reduce_every_norm_forward_and_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every norm call and its backward is one reduction over the trainers (a count that is 0 when the trainers
    normalise alone); and without the reductions, the statistics of each trainer's share, the run is not the
    one-trainer run, so the equality tests above see per-trainer statistics."""
    g = _graph()
    kw = _kw("gin", epochs=1, batch_size=30)  # 2 batches, 10 seeds a share (BatchNorm1d alone needs 2 rows)
    ref = train(g, TrainConfig(engine="minibatch", **kw), "cpu")
    engines: list[Any] = []
    got = train(g, TrainConfig(engine="minibatch", devices=THREE, **kw), "cpu",
                on_start=lambda e, *_: engines.append(e))
    sync = engines[0].norm_sync
    sites = 3  # GIN with 2 layers: each layer's MLP norm and the hidden norm between the layers
    assert sync.reductions == 2 * sites * 2  # forward and backward, 2 batches
    # the statistics traffic in the epoch record: each trainer's float64 vectors, 2F + 1 moments and 2F gradient
    # sums per norm (F: 16 hidden, the classes in the last layer's MLP), 2 batches
    assert g.num_classes is not None
    widths = [16, 16, g.num_classes]
    assert got.history[0]["norm_reduced_bytes"] == 2 * 3 * 8 * sum(4 * f + 1 for f in widths)
    calls = [sum(bn.calls for bn in sampled_norm.split_norms(m)) for m in engines[0].replicas.models]
    assert calls == [sites * 2] * 3

    monkeypatch.setattr(sampled_norm.BatchNormSync, "build", classmethod(lambda cls, models, master=0: None))
    alone = train(g, TrainConfig(engine="minibatch", devices=THREE, **kw), "cpu",
                  on_start=lambda e, *_: engines.append(e))
    assert engines[1].norm_sync is None
    assert alone.history[0]["loss"] != pytest.approx(ref.history[0]["loss"], rel=1e-5)
    mine, theirs = alone.model.state_dict(), ref.model.state_dict()
    assert any(not torch.allclose(mine[k], theirs[k], rtol=1e-3, atol=1e-3) for k in theirs if "running_var" in k)


def test_row_weights_count_every_vertex_of_the_batch_once() -> None:
    """The weights of the three shares' rows of each norm add up, per vertex, to one: the one-trainer batch's
    deduplicated rows of that norm (keyed sampling: the shares' neighbourhoods are the batch's)."""
    g = _graph()
    assert g.train_mask is not None
    model = build_model("gin", g.num_features, 16, 4, layers=3, dropout=0.5, heads=1, seed=0, norm="batch")
    topo = CSRTopology.from_graph(g, model.adjacency)
    seeds = torch.nonzero(g.train_mask).view(-1)[:40]
    whole = norm_sites(model, sample_blocks(topo, seeds, (4, 3, 3), key=11))
    shares = [norm_sites(model, sample_blocks(topo, part, (4, 3, 3), key=11)) for part in seeds.tensor_split(3)]
    posted = {r: [ids for _, ids in sites] for r, sites in enumerate(shares)}
    trained, weights = sampled_norm._row_weights({**posted, 3: None})  # a fourth trainer without a share
    assert trained == [0, 1, 2]
    assert len(whole) == 5  # 3 MLP norms, 2 between the layers
    overlap = []
    for s, (_, rows) in enumerate(whole):
        total = torch.zeros(g.num_nodes, dtype=torch.float64)
        for r in trained:
            w = weights[r][s]
            total.index_add_(0, posted[r][s], torch.ones(posted[r][s].numel(), dtype=torch.float64)
                             if w is None else w)
        assert torch.equal(torch.nonzero(total).view(-1), rows.sort().values)
        torch.testing.assert_close(total[rows], torch.ones(rows.numel(), dtype=torch.float64))
        overlap.append(any(weights[r][s] is not None for r in trained))
    assert overlap == [True, True, True, True, False]  # the shares' neighbourhoods overlap; their seeds do not


def test_a_failing_trainer_releases_the_others() -> None:
    """A trainer that fails mid-step aborts the group: the others stop waiting (no deadlock), and the failure
    raised is the real one, not theirs."""
    group = TrainerGroup(3)
    arrived = threading.Barrier(3)

    def trainer(rank: int) -> int:
        arrived.wait()
        if rank == 1:
            group.abort()
            raise ValueError("trainer 1 failed")
        return int(group.exchange(rank, rank, 3, "x", lambda posted: sum(posted.values())))

    with ThreadPoolExecutor(3) as pool, pytest.raises(ValueError, match="trainer 1 failed"):
        wait_all([pool.submit(trainer, r) for r in range(3)])
    with pytest.raises(GroupAborted):
        group.exchange(0, 0, 1, "x", lambda posted: 0)
    group.reset()
    with ThreadPoolExecutor(2) as pool:  # a new step: a round of two, then one with different tags fails loudly
        assert wait_all([pool.submit(group.exchange, r, r + 1, 2, "y", lambda p: sum(p.values()))
                         for r in range(2)]) == [3, 3]
        with pytest.raises(RuntimeError, match="different things"):
            wait_all([pool.submit(group.exchange, r, r, 2, f"tag{r}", lambda p: 0) for r in range(2)])


def test_two_trainers_on_one_accelerator_are_refused() -> None:
    """Autograd runs one accelerator's backward on one thread: two trainers there could not reduce (the first would
    wait for the second forever), so the engine says so before it starts; CPU trainers run backward on their own
    threads and may share the CPU."""
    from gnnscale.engines.sampled.minibatch import MiniBatchEngine

    why = MiniBatchEngine.batch_norm_reason(TrainConfig(engine="minibatch", devices=("cuda", "cuda:0"), norm="batch"))
    assert why is not None and "cuda:0 named twice" in why
    assert MiniBatchEngine.batch_norm_reason(TrainConfig(engine="minibatch", devices=("cuda:0", "cuda:1"))) is None
    assert MiniBatchEngine.batch_norm_reason(TrainConfig(engine="minibatch", devices=THREE)) is None
