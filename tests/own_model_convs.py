"""The PyG convs of issue #45's acceptance, shared by ``tests/test_own_model*.py``: two-layer models of each, the
same weights for every seed, and a model factory per conv (``own_model_convs:gcn``, ...) that a rank of a
distributed job imports by name, as ``--model-factory`` names it.

Not a test module (pytest collects ``test_*.py`` only); the tests import it from their own folder, which pytest
puts on ``sys.path`` (and spawned ranks inherit it).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch_geometric.nn import GATConv, GATv2Conv, GCNConv, GINConv, GraphConv, SAGEConv, TransformerConv

from gnnscale.graph.csr import csr_rows
from gnnscale.graph.generators import csbm
from gnnscale.graph.graph import Graph
from gnnscale.nn import Stack

HIDDEN = 16
EPOCHS = 5
SEED = 0
FULL_BATCH = {"fanouts": (-1, -1), "batch_size": 64}
"""Every neighbour, one batch of every training vertex (40 of the graph's 400): the in-memory engine's step."""
BATCHES = {"fanouts": (-1, -1), "batch_size": 16}
"""Every neighbour, three batches an epoch: the sampled engines must agree batch by batch."""


def graph() -> Graph:
    """The tests' graph: 400 vertices (40 training), 12 features, 5 classes, seeded."""
    return csbm(nodes=400, features=12, seed=0)


def _gin(i: int, o: int) -> GINConv:
    return GINConv(nn.Sequential(nn.Linear(i, o), nn.ReLU(), nn.Linear(o, o)))


LAYERS: dict[str, Callable[[int, int, bool], nn.Module]] = {
    # (in, out, hidden?) -> conv; the hidden attention layers have two heads, concatenated to HIDDEN
    "GCNConv": lambda i, o, hidden: GCNConv(i, o),
    "SAGEConv": lambda i, o, hidden: SAGEConv(i, o),
    "GATConv": lambda i, o, hidden: GATConv(i, o // 2, heads=2) if hidden else GATConv(i, o),
    "GINConv": lambda i, o, hidden: _gin(i, o),
    "GraphConv": lambda i, o, hidden: GraphConv(i, o),
    "TransformerConv": lambda i, o, hidden: TransformerConv(i, o // 2, heads=2) if hidden else TransformerConv(i, o),
    "GATv2Conv": lambda i, o, hidden: GATv2Conv(i, o // 2, heads=2) if hidden else GATv2Conv(i, o),
}
"""The seven convs of the acceptance (GATConv's attention dropout 0, its default)."""
CONVS = tuple(LAYERS)


def convs(name: str, in_features: int, num_classes: int, out: int | None = None) -> list[nn.Module]:
    """Two convs ``name``: ``in_features -> HIDDEN -> out`` (``num_classes`` unless given), their weights drawn
    under :data:`SEED` (the global random state is left as it was): two calls give equal weights."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        return [LAYERS[name](in_features, HIDDEN, True),
                LAYERS[name](HIDDEN, num_classes if out is None else out, False)]


def stack(name: str, in_features: int, num_classes: int) -> Stack:
    """A 2-layer :class:`Stack` of ``name`` convs, ReLU between them, no dropout."""
    return Stack(convs(name, in_features, num_classes), act="relu", dropout=0.0)


def edge_index(g: Graph) -> Tensor:
    """``[2, E]`` PyG edge index of ``g``: sources are the CSR's column indices, destinations its rows."""
    return torch.stack([g.indices, csr_rows(g.indptr)])


# ------------------------------------------------------------------------- factories (--model-factory module:function)
def gcn(in_features: int, num_classes: int) -> Stack:
    return stack("GCNConv", in_features, num_classes)


def sage(in_features: int, num_classes: int) -> Stack:
    return stack("SAGEConv", in_features, num_classes)


def gat(in_features: int, num_classes: int) -> Stack:
    return stack("GATConv", in_features, num_classes)


def gin(in_features: int, num_classes: int) -> Stack:
    return stack("GINConv", in_features, num_classes)


def graphconv(in_features: int, num_classes: int) -> Stack:
    return stack("GraphConv", in_features, num_classes)


def transformer(in_features: int, num_classes: int) -> Stack:
    return stack("TransformerConv", in_features, num_classes)


def gatv2(in_features: int, num_classes: int) -> Stack:
    return stack("GATv2Conv", in_features, num_classes)


def normed(in_features: int, num_classes: int) -> Stack:
    """SAGEConv then GATConv with a BatchNorm between them and (keyed) dropout 0.5."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        layers = [SAGEConv(in_features, HIDDEN), GATConv(HIDDEN, num_classes)]
    return Stack(layers, act="relu", dropout=0.5, norms="batch")


FACTORIES = {"GCNConv": "gcn", "SAGEConv": "sage", "GATConv": "gat", "GINConv": "gin", "GraphConv": "graphconv",
             "TransformerConv": "transformer", "GATv2Conv": "gatv2", "normed": "normed"}
"""Each conv's factory, as ``--model-factory own_model_convs:NAME`` names it (``normed``: :func:`normed`)."""


def factory(name: str) -> str:
    """The ``module:function`` spec of conv ``name``'s factory."""
    return f"{__name__}:{FACTORIES[name]}"
