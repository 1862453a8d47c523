"""Layer zoo (aggregate + update over blocks), the model type every engine runs (:class:`Stack`), and PyG convs
as block layers."""

from gnnscale.nn.base import BlockLayer
from gnnscale.nn.gat import GATLayer
from gnnscale.nn.gcn import GCNLayer
from gnnscale.nn.gin import GINLayer
from gnnscale.nn.graphconv import GraphConvLayer
from gnnscale.nn.mlp import MLPLayer
from gnnscale.nn.model import GNN, MODELS
from gnnscale.nn.norm import JK_MODES, NORMS
from gnnscale.nn.ops import keyed_dropout, mix_key, spmm, spmm_mean
from gnnscale.nn.pyg import PyGConv, as_block_layer
from gnnscale.nn.sage import SAGELayer
from gnnscale.nn.stack import Stack, as_stack
from gnnscale.nn.zoo import ALL_MODELS, build_model

__all__ = [
    "ALL_MODELS",
    "GNN",
    "JK_MODES",
    "MODELS",
    "NORMS",
    "BlockLayer",
    "GATLayer",
    "GCNLayer",
    "GINLayer",
    "GraphConvLayer",
    "PyGConv",
    "Stack",
    "as_block_layer",
    "as_stack",
    "MLPLayer",
    "SAGELayer",
    "build_model",
    "keyed_dropout",
    "mix_key",
    "spmm",
    "spmm_mean",
]
