"""``gnnscale.nn.Stack``, the one model type every engine runs (issue #45): PyG convs and BasicGNN models become
Stacks over the *same* parameters and compute PyG's function; a Stack's mistakes are one-line errors; the locality
probe refuses what cannot be trained in parts and passes what can."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch_geometric import nn as pyg
from torch_geometric.nn import MessagePassing
from torch_geometric.nn import models as pyg_models

from gnnscale.errors import ConfigError
from gnnscale.nn import GCNLayer, GraphConvLayer, PyGConv, SAGELayer, Stack, as_stack, build_model
from gnnscale.nn.batchnorm import SplitBatchNorm
from gnnscale.nn.probe import chunk_reason, model_chunk_reasons, probed

F_IN, HID, C = 8, 16, 3


def _graph(n: int = 30, e: int = 100, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, F_IN, generator=g), torch.randint(0, n, (2, e), generator=g)


CONVS = {
    "gcn": lambda i, o: pyg.GCNConv(i, o),
    "sage": lambda i, o: pyg.SAGEConv(i, o),
    "gat": lambda i, o: pyg.GATConv(i, o),
    "gin": lambda i, o: pyg.GINConv(nn.Sequential(nn.Linear(i, o), nn.ReLU(), nn.Linear(o, o))),
    "graph": lambda i, o: pyg.GraphConv(i, o),
    "transformer": lambda i, o: pyg.TransformerConv(i, o),
    "gatv2": lambda i, o: pyg.GATv2Conv(i, o),
    "edge": lambda i, o: pyg.EdgeConv(nn.Linear(2 * i, o)),
}


@pytest.mark.parametrize("kind", sorted(CONVS))
def test_a_stack_of_pyg_convs_computes_the_convs_function(kind: str) -> None:
    """``Stack(convs)(x, edge_index)`` is PyG's ``conv2(relu(conv1(x, ei)), ei)`` on a graph with repeated edges
    and self-loops, whether the conv runs as it is or was converted to a gnnscale layer."""
    torch.manual_seed(0)
    c1, c2 = CONVS[kind](F_IN, HID), CONVS[kind](HID, C)
    stack = Stack([c1, c2], dropout=0.0)
    x, ei = _graph()
    ei = torch.cat([ei, ei[:, :5], torch.tensor([[2, 4], [2, 4]])], dim=1)
    torch.testing.assert_close(stack(x, ei), c2(torch.relu(c1(x, ei)), ei), rtol=1e-5, atol=1e-5)


def test_known_convs_become_gnnscale_layers_over_the_same_parameter_objects() -> None:
    """GCNConv, SAGEConv and GraphConv become GCNLayer, SAGELayer and GraphConvLayer holding the conv's own
    Parameter objects (training the Stack trains the user's convs); the others are wrapped as they are."""
    for convs, types in (([pyg.GCNConv(F_IN, HID), pyg.GCNConv(HID, C)], [GCNLayer, GCNLayer]),
                         ([pyg.SAGEConv(F_IN, HID), pyg.GraphConv(HID, HID), pyg.GATConv(HID, C)],
                          [SAGELayer, GraphConvLayer, PyGConv])):
        stack = Stack(convs, dropout=0.0)
        assert [type(layer) for layer in stack.layers] == types
        mine = {id(p) for p in stack.parameters()}
        theirs = {id(p) for c in convs for p in c.parameters()}
        assert mine == theirs


def test_converting_draws_no_random_numbers() -> None:
    """Building a Stack (the native layers' own initial weights are discarded) leaves the random state as it was:
    a factory built under a seed gets the same weights whatever is converted."""
    torch.manual_seed(0)
    convs = [pyg.SAGEConv(F_IN, HID), pyg.GraphConv(HID, C)]
    state = torch.random.get_rng_state()
    Stack(convs)
    assert torch.equal(state, torch.random.get_rng_state())


@pytest.mark.parametrize("model", ["GCN", "GraphSAGE", "GAT", "GIN", "EdgeCNN", "sage-batchnorm", "gat-jk-cat",
                                   "sage-layernorm"])
def test_a_basic_gnn_converts_with_the_same_parameters_and_function(model: str) -> None:
    """A PyG BasicGNN becomes a Stack whose parameters and buffers hold the same values and whose forward is the
    BasicGNN's (evaluation mode, both normalisations and jumping knowledge included)."""
    kw: dict[str, object] = {}
    name = {"sage-batchnorm": "GraphSAGE", "gat-jk-cat": "GAT", "sage-layernorm": "GraphSAGE"}.get(model, model)
    if model == "sage-batchnorm":
        kw = {"norm": "batch_norm"}
    if model == "gat-jk-cat":
        kw = {"jk": "cat", "heads": 2}
    if model == "sage-layernorm":
        kw = {"norm": "layer_norm", "norm_kwargs": {"mode": "node"}}
    torch.manual_seed(0)
    m = getattr(pyg_models, name)(F_IN, HID, 2, out_channels=C, dropout=0.0, **kw)
    x, ei = _graph()
    m.train()
    m(x, ei)  # move BatchNorm's running statistics away from their initial values
    stack = as_stack(m)
    values = sorted(float(v.double().sum()) for v in m.state_dict().values() if v.dtype.is_floating_point)
    mine = sorted(float(v.double().sum()) for v in stack.state_dict().values() if v.dtype.is_floating_point)
    assert mine == pytest.approx(values)
    m.eval()
    stack.eval()
    torch.testing.assert_close(stack(x, ei), m(x, ei), rtol=1e-5, atol=1e-5)
    if model == "sage-batchnorm":
        assert all(isinstance(n, SplitBatchNorm) for n in stack.norms)


def test_a_built_in_model_is_a_stack() -> None:
    """``--model gcn`` and the rest are Stacks of the zoo's layers (one model type for every engine)."""
    for kind in ("gcn", "sage", "gat", "gin", "mlp"):
        m = build_model(kind, F_IN, HID, C, layers=2, dropout=0.5, heads=4, seed=0)
        assert isinstance(m, Stack) and m.kind == kind
        assert not any(probed(layer) for layer in m.block_layers)


@pytest.mark.parametrize(("convs", "kw", "words"), [
    (lambda: [pyg.SAGEConv(F_IN, HID), pyg.SAGEConv(HID + 1, C)], {}, "conv 1 takes 17 features"),
    (lambda: [pyg.GCNConv(F_IN, HID), pyg.SAGEConv(HID, C)], {}, "different adjacencies"),
    (lambda: [pyg.SAGEConv(F_IN, C)], {"act": "swish!"}, "unknown activation"),
    (lambda: [pyg.SAGEConv(F_IN, HID), pyg.SAGEConv(HID, HID)], {"jk": "cat"}, "needs out_channels"),
    (lambda: [pyg.SAGEConv(F_IN, C)], {"dropout": 1.0}, "dropout must be in [0, 1)"),
    (lambda: [nn.Linear(F_IN, C)], {}, "not Linear"),
    (lambda: [pyg.SAGEConv(-1, C)], {}, "input width is not known"),
    (lambda: [pyg.SAGEConv(F_IN, HID), pyg.SAGEConv(HID, C)], {"norms": [pyg.GraphNorm(HID)]}, "GraphNorm"),
    (lambda: [pyg.SAGEConv(F_IN, HID), pyg.SAGEConv(HID, C)], {"norms": [pyg.LayerNorm(HID)]}, "mode='node'"),
])
def test_a_stack_s_mistakes_are_one_line_errors(convs, kw, words: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as info:
        Stack(convs(), **kw)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_as_stack_refuses_what_is_not_a_model() -> None:
    with pytest.raises(ConfigError, match="gnnscale.nn.Stack or a PyG BasicGNN"):
        as_stack(nn.Linear(3, 3))


class GlobalMean(MessagePassing):
    """Breaks the locality contract: every output row reads the mean of all the rows it is given."""

    def __init__(self, width: int, out: int):
        super().__init__(aggr="add")
        self.in_channels, self.lin = width, nn.Linear(width, out)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.lin(x + x.mean(0, keepdim=True)) + self.propagate(edge_index, x=self.lin(x))


class ByPosition(MessagePassing):
    """Breaks the contract another way: it reads a source row by its position (row 0), not through an edge."""

    def __init__(self, width: int):
        super().__init__(aggr="add")
        self.in_channels, self.lin = width, nn.Linear(width, width)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.propagate(edge_index, x=self.lin(x)) + x[:1]


@pytest.mark.parametrize("kind", sorted(CONVS))
def test_the_probe_passes_every_checked_conv(kind: str) -> None:
    layer = Stack([CONVS[kind](F_IN, HID)]).block_layers[0]
    assert chunk_reason(layer) is None


@pytest.mark.parametrize(("conv", "words"), [
    (lambda: GlobalMean(F_IN, HID), "GlobalMean is not local"),
    (lambda: ByPosition(F_IN), "ByPosition is not local"),
    (lambda: pyg.GCNConv(F_IN, HID, add_self_loops=False), "keep normalize=True and add_self_loops=True"),
    (lambda: pyg.GINConv(nn.Sequential(nn.Linear(F_IN, HID), nn.BatchNorm1d(HID))), "a BatchNorm inside it"),
    (lambda: pyg.GATConv(F_IN, HID, dropout=0.5), "draws its own randomness"),
])
def test_the_probe_refuses_what_cannot_be_trained_in_parts(conv, words: str) -> None:  # type: ignore[no-untyped-def]
    """Each way of breaking the contract is caught, with its reason, and the layer and random state are left
    as they were."""
    stack = Stack([conv()])
    before = {k: v.clone() for k, v in stack.state_dict().items()}
    state = torch.random.get_rng_state()
    reasons = model_chunk_reasons(stack, randomness=True)
    assert len(reasons) == 1 and words in reasons[0] and reasons[0].startswith("layer 0: ")
    assert torch.equal(state, torch.random.get_rng_state())
    assert all(torch.equal(v, stack.state_dict()[k]) for k, v in before.items())


def test_randomness_alone_is_refused_only_where_asked() -> None:
    """A conv with attention dropout is local: a sampled engine (randomness=False) takes it, a chunked
    full-graph engine does not."""
    stack = Stack([pyg.GATConv(F_IN, HID, dropout=0.5)])
    assert model_chunk_reasons(stack, randomness=False) == []
    assert model_chunk_reasons(stack, randomness=True)


def test_the_biases_a_batch_norm_cancels_are_named_for_pyg_convs() -> None:
    """Before a BatchNorm, a conv's output bias has a true gradient of zero (the engines zero its rounding
    noise): PyG convs name theirs -- GINConv's last linear map's, TransformerConv's skip bias -- and only with
    a BatchNorm after them."""
    convs = [pyg.GINConv(nn.Sequential(nn.Linear(F_IN, HID), nn.ReLU(), nn.Linear(HID, HID))),
             pyg.TransformerConv(HID, HID), pyg.GATConv(HID, C)]
    stack = Stack(convs, norms="batch")
    named = {id(p): n for n, p in stack.named_parameters()}
    assert sorted(named[id(p)] for p in stack.biases_before_norm()) == [
        "layers.0.conv.nn.2.bias", "layers.1.conv.lin_skip.bias"]
    assert Stack(convs, norms="layer").biases_before_norm() == []


@pytest.mark.parametrize("cls", [GCNLayer, SAGELayer, GraphConvLayer])
@pytest.mark.parametrize("project_first", [True, False])
def test_update_vjp_gives_autograd_s_bits(cls: type, project_first: bool) -> None:
    """A linear UPDATE's backward without its forward (what the offload engine runs on a CPU instead of
    recomputing UPDATE) gives the gradients autograd gives, bit for bit: parameters, aggregation, destinations."""
    torch.manual_seed(0)
    layer = cls(12, 7, project_first=project_first)
    assert layer.has_update_vjp
    width = 7 if project_first else 12
    agg, xd, grad = torch.randn(30, width), torch.randn(30, 12), torch.randn(30, 7)
    a, d = agg.clone().requires_grad_(), xd.clone().requires_grad_()
    layer.update(a, d).backward(grad)
    want = {n: p.grad.clone() for n, p in layer.named_parameters() if p.grad is not None}
    layer.zero_grad(set_to_none=True)
    got_agg, got_dst = layer.update_vjp(agg, xd, grad, True, True)
    assert torch.equal(got_agg, a.grad)
    if cls is GCNLayer:  # UPDATE does not read the destinations
        assert got_dst is None
    else:
        assert torch.equal(got_dst, d.grad)
    got = {n: p.grad for n, p in layer.named_parameters() if p.grad is not None}
    assert want.keys() == got.keys() and all(torch.equal(want[n], got[n]) for n in want)
