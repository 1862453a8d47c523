"""``--norm batch`` in the distributed engine (gnnscale/engines/sampled/distributed_norm.py): BatchNorm's statistics
span the whole global batch of an iteration over the ranks and, in micrograph training, over every time step, so each
strategy's iteration equals the single-process mini-batch engine's step on the union of the ranks' batches (its loss,
gradients and running statistics), and whole runs equal its runs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from gnnscale import TrainConfig, load_dataset, train
from gnnscale.engines.sampled.minibatch import MiniBatchEngine
from gnnscale.graph.generators import csbm
from gnnscale.nn import build_model
from gnnscale.nn.batchnorm import split_norms
from gnnscale.sample import sample_key

GNNSCALE = [sys.executable, "-m", "gnnscale"]
FANOUTS = (5, 3)


def _variants(world: int) -> list[dict[str, Any]]:
    return [{"strategy": "model-centric"}, {"strategy": "micrograph", "pregather": "on", "merge": "off"},
            {"strategy": "micrograph", "pregather": "off", "merge": str(world - 1)}]


def _graph() -> Any:
    return csbm(nodes=600, features=8, avg_degree=6, seed=5, train=0.5, communities=6)


def _model(name: str, g: Any, residual: bool) -> Any:
    return build_model(name, g.num_features, 8, g.num_classes, layers=2, dropout=0.5, heads=2, seed=0, norm="batch",
                       residual=residual)


def _stats(model: Any) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items() if "running" in k or "num_batches" in k}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _iteration_task(rank: int, world: int, name: str, residual: bool, seeds: int | None, plan_dir: str
                    ) -> list[dict[str, Any]]:
    """Each variant's first iteration of epoch 1 (no optimiser step; ``seeds``: a global batch of that many seeds
    instead, so that a rank's share may be empty), then, with a full batch, the same with the statistics left per
    rank (the reducer adds nothing from the peers): what the test must tell apart."""
    from gnnscale.engines.sampled.distributed import DistributedEngine

    out = []
    variants = _variants(world)
    for v in [*variants, *({**v, "alone": True} for v in variants if seeds is None)]:
        v = dict(v)
        alone = v.pop("alone", False)
        g = _graph()
        cfg = TrainConfig(engine="distributed", model=name, batch_size=25, fanouts=FANOUTS, seed=0, plan_dir=plan_dir,
                          heads=2, hidden=8, norm="batch", residual=residual, **v)
        eng = DistributedEngine(g, _model(name, g, residual), cfg, torch.device("cpu"))
        if seeds is not None:
            batch = eng._batches(1)[0][:seeds]
            eng._batches = lambda epoch, batch=batch: [batch]  # type: ignore[method-assign]
        if alone:
            eng.batch_norm.reduce = lambda t: t.detach().clone()  # type: ignore[method-assign]
        got = eng.iteration_gradients(1, 0)
        out.append({"loss": got["loss"], "grads": got["grads"], "stats": _stats(eng.model),
                    "reductions": eng.batch_norm.counters["reductions"], "norms": len(eng.batch_norm.norms)})
    eng.comm.close()
    return out


def _entry(rank: int, world: int, port: int, out: str, args: tuple[Any, ...]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    torch.save(_iteration_task(rank, world, *args), Path(out) / f"rank{rank}.pt")


def _spawn(tmp_path: Path, world: int, *args: Any) -> list[Any]:
    import torch.multiprocessing as mp

    mp.start_processes(_entry, args=(world, _free_port(), str(tmp_path), args), nprocs=world, start_method="spawn")
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world)]


def _reference(name: str, residual: bool, seeds: int | None, world: int) -> dict[str, Any]:
    """The single-process mini-batch engine (one trainer) on the union of the ranks' batches: its loss, gradients
    and the running statistics after the step's forward."""
    g = _graph()
    cfg = TrainConfig(engine="minibatch", model=name, batch_size=25 * world, fanouts=FANOUTS, seed=0, heads=2,
                      hidden=8, norm="batch", residual=residual)
    model = _model(name, g, residual)
    mb = MiniBatchEngine(g, model, cfg, torch.device("cpu"))
    model.train()
    batch = mb.train_ids[mb._order(1)][: 25 * world][:seeds]
    sample = mb._prepare(mb.trainers[0], batch, FANOUTS, sample_key(0, 1))
    loss = F.cross_entropy(mb._forward(sample, (0, 1)), mb.y[batch])
    loss.backward()
    return {"loss": float(loss.detach()), "grads": [p.grad.clone() for p in model.parameters()],  # type: ignore
            "stats": _stats(model)}


def _close(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(float((x - y).abs().max()) <= 1e-4 * max(float(y.abs().max()), 1e-3) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize(("world", "name", "residual", "seeds"),
                         [(2, "gin", True, None), (2, "sage", False, 1), (3, "gcn", False, None)],
                         ids=["gin-residual", "sage-one-seed", "gcn-3-ranks"])
def test_every_strategy_s_iteration_equals_the_minibatch_engine_s_step(tmp_path: Path, world: int, name: str,
                                                                       residual: bool, seeds: int | None) -> None:
    """GIN (a norm between the layers and one in each layer's MLP, a residual around it) on a full global batch;
    SAGE on a batch of one seed (rank 1's share, and its micrographs, empty: it takes part in every all-reduce
    with zeros); GCN on 3 ranks (a vertex sampled by up to 3 ranks, micrographs merged into fewer steps). Every
    rank's loss, summed gradients and running statistics are the mini-batch engine's; with the statistics left
    per rank, they are not (the test sees a missing all-reduce)."""
    ranks = _spawn(tmp_path, world, name, residual, seeds, str(tmp_path / "plans"))
    ref = _reference(name, residual, seeds, world)
    variants = _variants(world)
    n = len(variants)
    for r in range(world):
        for i, v in enumerate(variants):
            got = ranks[r][i]
            assert got["loss"] == pytest.approx(ref["loss"], rel=1e-5), (v, r)
            assert _close(got["grads"], ref["grads"]), (v, r)
            assert got["stats"].keys() == ref["stats"].keys() and got["stats"]
            for k, t in ref["stats"].items():
                torch.testing.assert_close(got["stats"][k], t, rtol=1e-4, atol=1e-6, msg=f"{v} rank {r}: {k}")
            # one all-reduce of the statistics and one of the gradient sums per norm and iteration
            assert got["reductions"] == 2 * got["norms"] > 0, v
            if seeds is None:  # the per-rank statistics fail the same checks
                alone = ranks[r][n + i]
                assert not _close(alone["grads"], ref["grads"]), v
                if world == 2:
                    assert alone["loss"] != pytest.approx(ref["loss"], rel=1e-5), v


def _cli(tmp_path: Path, strategy: str) -> list[dict[str, Any]]:
    metrics = tmp_path / f"{strategy}.jsonl"
    args = ["train", "--dataset", "csbm:nodes=400", "--engine", "distributed", "--ranks", "2", "--model", "gin",
            "--norm", "batch", "--strategy", strategy, "--batch-size", "60", "--fanouts", "5,3", "--epochs", "3",
            "--quiet", "--device", "cpu", "--metrics", str(metrics)]
    p = subprocess.run([*GNNSCALE, *args], capture_output=True, text=True, timeout=240,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    return [r for r in records if not r.get("summary")]


def test_whole_runs_with_batch_norm_equal_the_minibatch_engine(tmp_path: Path) -> None:
    """``gnnscale train --engine distributed --ranks 2 --norm batch`` (GIN), both strategies: per epoch the
    mini-batch engine's losses and accuracies (evaluation reads the running statistics the ranks kept); the record
    counts the statistics' traffic: per iteration and rank, each norm's moments (``2F + 1`` float64) and gradient
    sums (``2F``)."""
    cfg = TrainConfig(engine="minibatch", model="gin", norm="batch", batch_size=120, fanouts=(5, 3), epochs=3,
                      seed=0)
    result = train(load_dataset("csbm:nodes=400"), cfg, "cpu")  # the graph the CLI loads
    ref = result.history
    per_iteration = sum(8 * (4 * bn.num_features + 1) for bn in split_norms(result.model)) * 2  # both ranks
    for strategy in ("micrograph", "model-centric"):
        got = _cli(tmp_path, strategy)
        assert [r["loss"] for r in got] == pytest.approx([r["loss"] for r in ref], rel=1e-5), strategy
        for k in ("train_acc", "val_acc", "test_acc"):
            assert [r[k] for r in got] == pytest.approx([r[k] for r in ref], abs=1e-6), (strategy, k)
        assert [r["norm_reduced_bytes"] for r in got] == [r["batches"] * per_iteration for r in got], strategy
