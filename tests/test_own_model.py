"""Your own model on every engine (issue #45): a :class:`~gnnscale.nn.Stack` of PyG convs trains on the chunked
and sampled engines to the in-memory result, and to a plain PyG training loop's.

For each of the seven convs of the acceptance (``GCNConv`` through its adapter, ``SAGEConv``, ``GATConv``,
``GINConv``, ``GraphConv``, ``TransformerConv``, ``GATv2Conv``) in a 2-layer Stack without dropout, over five
epochs: offload (2 partitions x 3 chunks) equals a hand-written PyG full-graph loop on the same initial weights;
minibatch with every neighbour equals inmemory; hybrid with DRM off equals minibatch (the distributed engine:
``tests/test_own_model_distributed.py``). A PyG ``BasicGNN`` trains as the Stack of its convs; a layer that is not
local, or draws its own randomness, is refused by the probe under the engines that split it.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from own_model_convs import BATCHES, CONVS, EPOCHS, FULL_BATCH, HIDDEN, SEED, convs, edge_index, graph, stack
from torch import Tensor, nn
from torch_geometric.nn import GATConv, MessagePassing, SAGEConv
from torch_geometric.nn.models import GAT, GraphSAGE

import gnnscale as gs
from gnnscale.errors import EngineError
from gnnscale.graph.graph import Graph
from gnnscale.nn import Stack

LOSS_ATOL = 1e-5
PARAM_TOL = 1e-4


def _config(**kw: Any) -> gs.TrainConfig:
    return gs.TrainConfig(epochs=EPOCHS, seed=SEED, **kw)


def _losses(result: gs.TrainResult) -> list[float]:
    return [r["loss"] for r in result.history]


def _accuracies(result: gs.TrainResult) -> list[list[float | None]]:
    return [[r[k] for k in ("train_acc", "val_acc", "test_acc")] for r in result.history]


def _same_parameters(got: nn.Module, want: nn.Module) -> None:
    """``got``'s and ``want``'s state (by name) allclose at :data:`PARAM_TOL`."""
    mine, theirs = got.state_dict(), want.state_dict()
    assert mine.keys() == theirs.keys()
    for k in theirs:
        torch.testing.assert_close(mine[k], theirs[k], rtol=PARAM_TOL, atol=PARAM_TOL, msg=k)


def _pyg_loop(layers: list[nn.Module], g: Graph, epochs: int = EPOCHS) -> list[float]:
    """A plain PyG full-graph training loop: ``conv2(relu(conv1(x, edge_index)), edge_index)``, cross-entropy over
    the training vertices, Adam with the TrainConfig's lr and weight decay; the loss of each epoch (before its
    step)."""
    cfg = gs.TrainConfig()
    params = [p for conv in layers for p in conv.parameters()]
    opt = torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    x, y, mask, ei = g.x, g.y, g.train_mask, edge_index(g)
    assert x is not None and y is not None and mask is not None
    for conv in layers:
        conv.train()
    losses = []
    for _ in range(epochs):
        opt.zero_grad()
        out = layers[1](F.relu(layers[0](x, ei)), ei)
        loss = F.cross_entropy(out[mask], y[mask])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


# ------------------------------------------------------------------------------------- offload against plain PyG
@pytest.mark.parametrize("name", CONVS)
def test_offload_trains_a_stack_of_pyg_convs_as_a_plain_pyg_loop(name: str) -> None:
    """Offload (2 partitions x 3 chunks: each conv runs on chunks' bipartite blocks, GCNConv through the adapter
    that takes the whole graph's normalisation) gives the per-epoch losses of a PyG loop over the whole graph
    (within 1e-5), and the same trained weights (allclose 1e-4), from the same initial weights."""
    g = graph()
    assert g.num_classes is not None
    ours, theirs = convs(name, g.num_features, g.num_classes), convs(name, g.num_features, g.num_classes)
    for a, b in zip(ours, theirs, strict=True):
        _same_parameters(a, b)  # the same initial weights
    model = Stack(ours, act="relu", dropout=0.0)
    config = _config(engine="offload", partitions=2, chunks=3)
    result = gs.train(g, config, "cpu", model=model)
    assert result.engine == "offload" and result.model is model and result.summary["model"] == "stack"
    want = _pyg_loop(theirs, g)
    assert _losses(result) == pytest.approx(want, abs=LOSS_ATOL)
    assert want[-1] < want[0]  # it trained
    held = {id(p) for p in result.model.parameters()}
    for a, b in zip(ours, theirs, strict=True):
        assert all(id(p) in held for p in a.parameters())  # the Stack trained the convs' own parameters
        _same_parameters(a, b)
    # offload's chunked inference predicts the trained PyG model's classes
    with torch.no_grad():
        scores = theirs[1](F.relu(theirs[0](g.x, edge_index(g))), edge_index(g))
    top2 = scores.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 1e-4  # (a near tie may go either way in float32)
    pred = gs.predict(g, (result.model, config), "cpu")
    assert bool(clear.float().mean() > 0.95) and torch.equal(pred[clear], scores.argmax(-1)[clear])


# ------------------------------------------------------------------------------------------ the sampled engines
@pytest.mark.parametrize("name", CONVS)
def test_minibatch_with_every_neighbour_equals_inmemory(name: str) -> None:
    """``--fanouts -1,-1`` and one batch of every training vertex: each conv sees every in-edge of the batch's
    neighbourhood, so the mini-batch engine's losses, accuracies (its layer-wise evaluation), trained weights and
    predictions are the in-memory engine's."""
    g = graph()
    assert g.num_classes is not None
    ref = gs.train(g, _config(engine="inmemory"), "cpu", model=stack(name, g.num_features, g.num_classes))
    config = _config(engine="minibatch", **FULL_BATCH)
    got = gs.train(g, config, "cpu", model=stack(name, g.num_features, g.num_classes))
    assert got.engine == "minibatch"
    assert _losses(got) == pytest.approx(_losses(ref), abs=LOSS_ATOL)
    assert _accuracies(got) == _accuracies(ref)
    _same_parameters(got.model, ref.model)
    # its layer-wise prediction over every vertex: the in-memory engine's
    assert torch.equal(gs.predict(g, (got.model, config), "cpu"),
                       gs.predict(g, (ref.model, _config(engine="inmemory")), "cpu"))


@pytest.mark.parametrize("name", CONVS)
def test_hybrid_with_drm_off_equals_minibatch(name: str) -> None:
    """The hybrid engine on two trainers (the CPU and a second CPU device, 30/70 of each batch), DRM off, three
    batches an epoch: the replicas' gradients summed equal the mini-batch engine's step on the whole batch."""
    g = graph()
    assert g.num_classes is not None
    ref = gs.train(g, _config(engine="minibatch", **BATCHES), "cpu", model=stack(name, g.num_features, g.num_classes))
    got = gs.train(g, _config(engine="hybrid", devices=("cpu", "cpu:1"), shares=(0.3, 0.7), drm="off", **BATCHES),
                   "cpu", model=stack(name, g.num_features, g.num_classes))
    assert got.engine == "hybrid"
    assert _losses(got) == pytest.approx(_losses(ref), abs=LOSS_ATOL)
    assert _accuracies(got) == _accuracies(ref)
    _same_parameters(got.model, ref.model)


# ---------------------------------------------------------------------------------------------------- BasicGNN
BASIC = {"GraphSAGE": (GraphSAGE, {}), "GAT": (GAT, {"heads": 2}), "GraphSAGE-jk-cat": (GraphSAGE, {"jk": "cat"})}


def _basic(kind: str, g: Graph) -> Any:
    cls, kw = BASIC[kind]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        return cls(g.num_features, HIDDEN, num_layers=2, out_channels=g.num_classes, dropout=0.0, **kw)


@pytest.mark.parametrize("kind", list(BASIC))
def test_a_pyg_basic_gnn_trains_as_the_stack_of_its_convs(kind: str) -> None:
    """``gs.train(graph, config, model=GraphSAGE(...))`` (or ``GAT``) converts it over its own parameters: the
    same losses and weights as the Stack of an identical BasicGNN's convs (and ``lin`` with jumping knowledge),
    on the offload engine; and those are the losses of the BasicGNN's own forward in a plain PyG loop."""
    g = graph()
    basic = _basic(kind, g)
    got = gs.train(g, _config(engine="offload", chunks=3), "cpu", model=basic)
    twin = _basic(kind, g)
    jk = twin.jk_mode
    same = Stack(list(twin.convs), act="relu", dropout=0.0, jk=jk, lin=getattr(twin, "lin", None))
    ref = gs.train(g, _config(engine="offload", chunks=3), "cpu", model=same)
    assert _losses(got) == _losses(ref)
    _same_parameters(got.model, ref.model)
    _same_parameters(basic, twin)  # trained in place: the BasicGNN holds the weights

    plain = _basic(kind, g)
    opt = torch.optim.Adam(plain.parameters(), lr=gs.TrainConfig().lr, weight_decay=gs.TrainConfig().weight_decay)
    x, y, mask, ei = g.x, g.y, g.train_mask, edge_index(g)
    assert x is not None and y is not None and mask is not None
    want = []
    for _ in range(EPOCHS):
        opt.zero_grad()
        loss = F.cross_entropy(plain(x, ei)[mask], y[mask])
        loss.backward()
        opt.step()
        want.append(loss.item())
    assert _losses(got) == pytest.approx(want, abs=LOSS_ATOL)
    _same_parameters(basic, plain)


# ----------------------------------------------------------------------------------------------------- refusals
class GlobalMeanConv(MessagePassing):
    """A user's conv that breaks the locality contract: the mean of its neighbours plus the mean over *all* the
    vertices it is given (a chunk's or a batch's rows are not the graph's)."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__(aggr="mean")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.lin = nn.Linear(in_channels, out_channels)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        h = self.lin(x)
        return self.propagate(edge_index, x=h) + h.mean(dim=0, keepdim=True)  # type: ignore[no-any-return]


def _global_mean_stack(g: Graph) -> Stack:
    assert g.num_classes is not None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        return Stack([GlobalMeanConv(g.num_features, HIDDEN), SAGEConv(HIDDEN, g.num_classes)], dropout=0.0)


@pytest.mark.parametrize(("engine", "options"), [("offload", {"chunks": 3}), ("minibatch", BATCHES),
                                                 ("hybrid", {"drm": "off", **BATCHES})])
def test_a_conv_with_a_global_mean_is_refused_by_the_probe(engine: str, options: dict[str, Any]) -> None:
    """The probe runs the user's conv on a small graph whole and in chunks: a global mean differs, so every
    engine that runs a conv on parts of the graph refuses it in one line naming the layer and why, and says that
    the in-memory engine trains it. (Without the probe these engines would train it, wrongly.)"""
    g = graph()
    with pytest.raises(EngineError) as caught:
        gs.train(g, _config(engine=engine, **options), "cpu", model=_global_mean_stack(g))
    message = str(caught.value)
    assert f"the {engine} engine cannot train" in message
    assert "layer 0: GlobalMeanConv is not local" in message and "only the in-memory engine trains it" in message
    assert "layer 1" not in message  # SAGEConv is gnnscale's own layer: exact in parts, not probed
    assert "\n" not in message


def test_a_conv_with_a_global_mean_trains_on_the_in_memory_engine() -> None:
    """The in-memory engine runs every conv on the whole graph: it trains the non-local conv, and ``auto`` in
    full-graph mode chooses it (not refused by the probe)."""
    g = graph()
    result = gs.train(g, _config(engine="inmemory"), "cpu", model=_global_mean_stack(g))
    assert result.engine == "inmemory" and _losses(result)[-1] < _losses(result)[0]
    assert gs.train(g, _config(), "cpu", model=_global_mean_stack(g)).engine == "inmemory"
    # predicting with a chunked engine is refused by the same probe (its chunks would give other classes)
    with pytest.raises(EngineError, match="cannot predict for .*GlobalMeanConv is not local"):
        gs.predict(g, (result.model, _config(engine="inmemory")), "cpu", engine="offload")


def _dropout_gat(g: Graph) -> Stack:
    assert g.num_classes is not None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        return Stack([GATConv(g.num_features, HIDDEN, dropout=0.5), GATConv(HIDDEN, g.num_classes)], dropout=0.0)


def test_a_conv_drawing_its_own_randomness_is_refused_by_the_chunked_engines() -> None:
    """GATConv's attention dropout draws masks from torch's global generator: each chunk would draw other masks
    than the whole graph, so offload refuses it with that reason (and says to set that dropout to 0); the
    in-memory engine trains it."""
    g = graph()
    with pytest.raises(EngineError, match=r"the offload engine cannot train .*layer 0: GATConv draws its own "
                                          r"randomness .*set that dropout to 0"):
        gs.train(g, _config(engine="offload", chunks=3), "cpu", model=_dropout_gat(g))
    assert gs.train(g, _config(engine="inmemory"), "cpu", model=_dropout_gat(g)).engine == "inmemory"


def test_taskparallel_refuses_a_stack_saying_it_trains_the_decoupled_models_only() -> None:
    """NeutronTask's engine trains the decoupled models (T and P tasks) only: a Stack is refused in one line that
    says so and names the engines that train it."""
    g = graph()
    assert g.num_classes is not None
    with pytest.raises(EngineError) as caught:
        gs.train(g, _config(engine="taskparallel"), "cpu", model=stack("GATConv", g.num_features, g.num_classes))
    message = str(caught.value)
    assert message.startswith("the taskparallel engine cannot train csbm on cpu: it trains the decoupled models "
                              "(dgcn, dgat) only, not a Stack of layers"), message
    assert "the engines that train this model: inmemory, offload, minibatch, hybrid, distributed" in message


# ----------------------------------------------------------------------------- norms and jumping knowledge in a Stack
@pytest.mark.parametrize("name", ["SAGEConv", "GATConv"])
def test_a_stack_with_batch_norm_trains_on_offload_as_inmemory(name: str) -> None:
    """``Stack(convs, norms="batch")``: offload reduces BatchNorm's statistics over its chunks (split passes), so
    the losses, accuracies (the running statistics) and weights are the in-memory engine's; with keyed dropout."""
    g = graph()
    assert g.num_classes is not None

    def model() -> Stack:
        return Stack(convs(name, g.num_features, g.num_classes), dropout=0.5, norms="batch")

    ref = gs.train(g, _config(engine="inmemory"), "cpu", model=model())
    got = gs.train(g, _config(engine="offload", partitions=2, chunks=3), "cpu", model=model())
    assert "norms.0.running_mean" in got.model.state_dict()
    assert all(r["norm_passes"] > 0 for r in got.history)  # the statistics passes over the chunks ran
    assert _losses(got) == pytest.approx(_losses(ref), abs=LOSS_ATOL)
    assert _accuracies(got) == _accuracies(ref)
    _same_parameters(got.model, ref.model)


@pytest.mark.parametrize("name", ["SAGEConv", "TransformerConv"])
def test_a_stack_with_jumping_knowledge_trains_on_offload_and_minibatch_as_inmemory(name: str) -> None:
    """``Stack(convs, jk="cat", out_channels=C)``: the class scores from both layers' outputs, concatenated, then
    ``lin``; offload and minibatch (every neighbour, one batch) train it as the in-memory engine does."""
    g = graph()
    assert g.num_classes is not None

    def model() -> Stack:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(SEED)  # lin's initial weights too
            return Stack(convs(name, g.num_features, g.num_classes, out=HIDDEN), dropout=0.0, jk="cat",
                         out_channels=g.num_classes)

    ref = gs.train(g, _config(engine="inmemory"), "cpu", model=model())
    for engine, options in (("offload", {"partitions": 2, "chunks": 3}), ("minibatch", FULL_BATCH)):
        got = gs.train(g, _config(engine=engine, **options), "cpu", model=model())
        assert _losses(got) == pytest.approx(_losses(ref), abs=LOSS_ATOL), engine
        assert _accuracies(got) == _accuracies(ref), engine
        _same_parameters(got.model, ref.model)


# ------------------------------------------------------------------------------------- a Stack of another depth
def _three_layers(g: Graph) -> Stack:
    assert g.num_classes is not None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        return Stack([SAGEConv(g.num_features, HIDDEN), GATConv(HIDDEN, HIDDEN), SAGEConv(HIDDEN, g.num_classes)],
                     dropout=0.0)


def test_the_sampled_engines_take_one_fanout_per_conv_of_the_model(capfd: pytest.CaptureFixture[str]) -> None:
    """The sampled engines sample one hop per conv of the user's model, not per ``config.layers`` (2 by default):
    a 3-conv Stack trains on minibatch and hybrid with the default fanouts (three hops), with ``layers=3`` and
    three fanouts equals inmemory (``layers`` agrees with the model: no warning that it is ignored), and two
    fanouts for its three convs are refused in one line."""
    g = graph()
    for engine in ("minibatch", "hybrid"):
        result = gs.train(g, _config(engine=engine, batch_size=16), "cpu", model=_three_layers(g))
        assert result.engine == engine and _losses(result)[-1] < _losses(result)[0]
    ref = gs.train(g, _config(engine="inmemory"), "cpu", model=_three_layers(g))
    capfd.readouterr()
    got = gs.train(g, _config(engine="minibatch", layers=3, fanouts=(-1, -1, -1), batch_size=64), "cpu",
                   model=_three_layers(g))
    assert "ignored" not in capfd.readouterr().err
    assert _losses(got) == pytest.approx(_losses(ref), abs=LOSS_ATOL)
    _same_parameters(got.model, ref.model)
    with pytest.raises(EngineError, match=r"the minibatch engine cannot train csbm on cpu: --fanouts has 2 values "
                                          r"for 3 layers of the model$"):
        gs.train(g, _config(engine="minibatch", fanouts=(5, 5)), "cpu", model=_three_layers(g))
