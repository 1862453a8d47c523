"""``--norm``, ``--residual`` and ``--jk``: gnnscale's GNN equals PyG's ``BasicGNN`` models (``GCN``,
``GraphSAGE``, ``GIN``, ``GAT``) with the same weights, for every choice, in evaluation (running statistics) and in
training with dropout 0 (batch statistics, and the running statistics they leave); config and CLI checks; and
each engine either trains a choice as the in-memory engine does or refuses it in one line."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor, nn
from torch_geometric.nn import Linear as PygLinear
from torch_geometric.nn.models import GAT, GCN, GIN, GraphSAGE

from gnnscale import TrainConfig
from gnnscale.cli import main
from gnnscale.errors import ConfigError
from gnnscale.graph.block import Block
from gnnscale.graph.generators import csbm
from gnnscale.graph.graph import Graph
from gnnscale.nn import GNN, build_model

IN, HIDDEN, CLASSES, LAYERS = 5, 6, 3, 3
PYG = {"gcn": GCN, "sage": GraphSAGE, "gin": GIN, "gat": GAT}
NORM_NAMES = {"none": None, "batch": "batch_norm", "layer": "layer_norm"}
CHOICES = [(norm, (i + j) % 2 == 1, jk) for i, norm in enumerate(("none", "batch", "layer"))
           for j, jk in enumerate(("none", "last", "cat", "max"))]
"""Every (norm, jk) pair once; each norm and each jk with and without the residual."""


class _Residual(nn.Module):
    """PyG ``GATConv``'s ``residual=True`` around a PyG conv that has none: ``conv(x) + res(x)``."""

    def __init__(self, conv: nn.Module, in_channels: int, out_channels: int):
        super().__init__()
        self.conv, self.res = conv, PygLinear(in_channels, out_channels, bias=False)

    def forward(self, x: Tensor, edge_index: Tensor, **kw: Any) -> Tensor:
        return self.conv(x, edge_index, **kw) + self.res(x)  # type: ignore[no-any-return]


def _pyg_model(kind: str, norm: str, residual: bool, jk: str) -> nn.Module:
    base = PYG[kind]
    kw: dict[str, Any] = dict(norm=NORM_NAMES[norm], jk=None if jk == "none" else jk)
    if norm == "layer":
        kw["norm_kwargs"] = {"mode": "node"}  # per vertex (PyG's default "graph" mode spans the whole graph)
    if kind == "gat":
        # gnnscale's last GAT layer has one head; with jk every layer is a hidden one, with the heads concatenated
        kw.update(act="elu", heads=1 if jk == "none" else 2, residual=residual)
    elif residual:
        base = type(f"Residual{base.__name__}", (base,), {
            "init_conv": lambda self, i, o, **k: _Residual(PYG[kind].init_conv(self, i, o, **k), i, o)})
    return base(IN, HIDDEN, LAYERS, CLASSES, dropout=0.0, **kw)  # type: ignore[no-any-return]


def _their_name(name: str, kind: str, norm: str, residual: bool) -> str:
    """The PyG model's name of gnnscale's parameter or buffer ``name``."""
    parts = name.split(".")
    if parts[0] == "layers":
        parts[0] = "convs"
        if residual and kind != "gat" and parts[2] != "res":
            parts.insert(2, "conv")
        if parts[-3] == "mlp":  # GIN: Linear, [norm], ReLU, Linear -> PyG MLP's lins.0, norms.0, lins.1
            i, last = int(parts[-2]), 2 if norm == "none" else 3
            parts[-3:-1] = ["nn", "lins", "0" if i == 0 else "1"] if i in (0, last) else ["nn", "norms", "0"]
    if norm == "batch" and "norms" in parts:
        parts.insert(parts.index("norms") + 2, "module")
    return ".".join(parts)


def _pair(kind: str, norm: str, residual: bool, jk: str) -> tuple[GNN, nn.Module]:
    heads = 1 if kind == "gat" and jk == "none" else 2  # as _pyg_model's
    ours = build_model(kind, IN, HIDDEN, CLASSES, layers=LAYERS, dropout=0.0, heads=heads, seed=0, norm=norm,
                       residual=residual, jk=jk)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # every parameter and statistic away from its default, so a missing one shows
        for name, t in ours.state_dict().items():
            if t.is_floating_point():
                t.copy_(torch.rand(t.shape, generator=gen) + 0.5 if "running_var" in name or name.endswith("eps")
                        else torch.randn(t.shape, generator=gen) * 0.5)
    theirs = _pyg_model(kind, norm, residual, jk)
    mapped = {_their_name(k, kind, norm, residual): v for k, v in ours.state_dict().items()}
    missing, unexpected = theirs.load_state_dict(mapped, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    return ours, theirs


def _graph() -> Graph:
    return csbm(nodes=40, features=IN, avg_degree=4, seed=3, classes=CLASSES)


@pytest.mark.parametrize("kind", list(PYG))
@pytest.mark.parametrize(("norm", "residual", "jk"), CHOICES)
def test_outputs_equal_pygs_basic_gnn(kind: str, norm: str, residual: bool, jk: str) -> None:
    g = _graph()
    assert g.x is not None
    ours, theirs = _pair(kind, norm, residual, jk)
    block, ei = Block.from_graph(g, ours.adjacency), g.edge_index()
    ours.eval(), theirs.eval()
    with torch.no_grad():
        torch.testing.assert_close(ours(block, g.x), theirs(g.x, ei), rtol=1e-4, atol=1e-5)
    ours.train(), theirs.train()  # batch statistics; dropout is 0
    torch.testing.assert_close(ours(block, g.x, (0, 1)), theirs(g.x, ei), rtol=1e-4, atol=1e-5)
    theirs_state = theirs.state_dict()
    for name, t in ours.state_dict().items():  # the running statistics the training pass left
        torch.testing.assert_close(t, theirs_state[_their_name(name, kind, norm, residual)], msg=name)


def test_structure_follows_pyg() -> None:
    """No norm after the last layer without jk, one after every layer with it; the classes from ``lin``."""
    plain = build_model("gcn", IN, HIDDEN, CLASSES, layers=3, dropout=0.5, heads=1, seed=0, norm="batch")
    assert len(plain.norms) == 2 and plain.lin is None and plain.block_layers[-1].out_features == CLASSES
    cat = build_model("gcn", IN, HIDDEN, CLASSES, layers=3, dropout=0.5, heads=1, seed=0, norm="layer", jk="cat")
    assert len(cat.norms) == 3 and cat.lin is not None and cat.lin.in_features == 3 * HIDDEN
    assert all(layer.out_features == HIDDEN for layer in cat.block_layers)
    default = build_model("gcn", IN, HIDDEN, CLASSES, layers=2, dropout=0.5, heads=1, seed=0)
    assert sorted(default.state_dict()) == ["layers.0.bias", "layers.0.lin.weight", "layers.1.bias",
                                            "layers.1.lin.weight"]  # defaults as before: no new weights


def test_batch_norm_statistics_are_in_the_state_dict_and_reload() -> None:
    g = _graph()
    assert g.x is not None
    m = build_model("gin", IN, HIDDEN, CLASSES, layers=2, dropout=0.5, heads=1, seed=0, norm="batch")
    block = Block.from_graph(g, m.adjacency)
    m.train()
    m(block, g.x, (0, 1))
    state = m.state_dict()
    assert int(state["norms.0.num_batches_tracked"]) == 1 and float(state["norms.0.running_mean"].abs().sum()) > 0
    again = build_model("gin", IN, HIDDEN, CLASSES, layers=2, dropout=0.5, heads=1, seed=0, norm="batch")
    again.load_state_dict(state)
    m.eval(), again.eval()
    torch.testing.assert_close(again(block, g.x), m(block, g.x))


def test_config_validates_the_choices() -> None:
    assert TrainConfig(norm="batch", residual="on", jk="max").residual is True  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="unknown --norm 'group'"):
        TrainConfig(norm="group")
    with pytest.raises(ConfigError, match="unknown --jk 'lstm'"):
        TrainConfig(jk="lstm")
    with pytest.raises(ConfigError, match="residual"):
        TrainConfig(residual="maybe")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="decoupled dgcn"):
        TrainConfig(model="dgcn", residual=True)


def test_cli_takes_the_flags(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["train", "--dataset", "csbm:nodes=120", "--epochs", "2", "--engine", "inmemory", "--model", "gin",
               "--norm", "batch", "--residual", "--jk", "cat", "--save-model", str(tmp_path / "m.pt")])
    assert rc == 0
    state = torch.load(tmp_path / "m.pt", weights_only=True)
    assert state["config"]["norm"] == "batch" and state["config"]["jk"] == "cat" and state["config"]["residual"]
    assert "norms.1.running_mean" in state["state_dict"] and "layers.0.res.weight" in state["state_dict"]
    capsys.readouterr()
    assert main(["train", "--norm", "group"]) == 2
    assert "error: train: argument --norm: invalid choice: 'group'" in capsys.readouterr().err
