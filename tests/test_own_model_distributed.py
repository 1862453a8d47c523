"""Your own model on the distributed engine (issue #45): a :class:`~gnnscale.nn.Stack` of PyG convs, named by
``config.model_factory`` (``--model-factory module:function``), trains on two ranks as the mini-batch engine trains
it on one process.

Every rank builds the model through the factory (imported by name in the rank, its weights drawn under the
config's seed), so no model crosses between processes; ``gnnscale.launch`` rebuilds rank 0's result through the
same factory.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from own_model_convs import BATCHES, CONVS, EPOCHS, SEED, factory, graph

import gnnscale as gs
from gnnscale.nn import Stack

RANKS = 2
MODELS = (*CONVS, "normed")
"""The seven convs, and a Stack with a BatchNorm (its statistics over the global batch, reduced between ranks)
and dropout."""
LOSS_ATOL = 1e-5
PARAM_TOL = 1e-4


def _config(engine: str, name: str, **kw: Any) -> gs.TrainConfig:
    """The factory of conv ``name``, every neighbour, 16 training vertices per step: the mini-batch engine's batch,
    or 8 per rank."""
    batch = BATCHES["batch_size"] // RANKS if engine == "distributed" else BATCHES["batch_size"]
    return gs.TrainConfig(engine=engine, model_factory=factory(name), fanouts=BATCHES["fanouts"], batch_size=batch,
                          epochs=EPOCHS, seed=SEED, **kw)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, port: int, out: str) -> None:
    """One rank of the job: train every factory's model with the distributed engine, one after another in the same
    process group; rank 0 keeps the losses and trained weights."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(RANKS),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    trained = {}
    for name in MODELS:
        result = gs.train(graph(), _config("distributed", name, merge="off"), "cpu")
        trained[name] = {"losses": [r["loss"] for r in result.history], "state": result.model.state_dict(),
                         "kind": type(result.model).__name__}
    if rank == 0:
        torch.save(trained, Path(out) / "trained.pt")


def test_every_conv_trains_on_two_ranks_as_on_the_minibatch_engine(tmp_path: Path) -> None:
    """One job of two gloo ranks trains the seven convs' Stacks and one with a BatchNorm and dropout (each built in
    the ranks by its factory): the per-epoch losses equal the mini-batch engine's on the global batch (within
    1e-5), and so do the trained weights and BatchNorm's running statistics (allclose 1e-4)."""
    mp.start_processes(_rank, args=(_free_port(), str(tmp_path)), nprocs=RANKS, start_method="spawn")
    trained = torch.load(tmp_path / "trained.pt", weights_only=True)
    assert list(trained) == list(MODELS)
    for name in MODELS:
        ref = gs.train(graph(), _config("minibatch", name), "cpu")
        got = trained[name]
        assert got["kind"] == "Stack", name
        assert got["losses"] == pytest.approx([r["loss"] for r in ref.history], abs=LOSS_ATOL), name
        want = ref.model.state_dict()
        assert got["state"].keys() == want.keys(), name
        for k, v in want.items():
            torch.testing.assert_close(got["state"][k], v, rtol=PARAM_TOL, atol=PARAM_TOL, msg=f"{name} {k}")


def test_launch_with_a_model_factory_returns_the_factory_s_model_trained() -> None:
    """``gs.launch`` with ``config.model_factory``: the ranks build the model through the factory, and the result
    comes back as that model (rebuilt here through the factory, with rank 0's weights), trained as the mini-batch
    engine trains it; it predicts in this process."""
    g = graph()
    result = gs.launch(g, _config("distributed", "GATConv", merge="off"), ranks=RANKS, device="cpu")
    ref = gs.train(g, _config("minibatch", "GATConv"), "cpu")
    assert isinstance(result.model, Stack) and result.engine == "distributed"
    assert (result.summary["model"], result.summary["model_factory"]) == ("stack", factory("GATConv"))
    assert [r["loss"] for r in result.history] == pytest.approx([r["loss"] for r in ref.history], abs=LOSS_ATOL)
    mine, want = result.model.state_dict(), ref.model.state_dict()
    assert mine.keys() == want.keys()
    for k, v in want.items():
        torch.testing.assert_close(mine[k], v, rtol=PARAM_TOL, atol=PARAM_TOL, msg=k)
    pred = gs.predict(g, (result.model, _config("inmemory", "GATConv")), "cpu")
    assert torch.equal(pred, gs.predict(g, (ref.model, _config("inmemory", "GATConv")), "cpu"))
