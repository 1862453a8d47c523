"""The built-in models: a :class:`~gnnscale.nn.stack.Stack` of the zoo's layers, by name (``--model gcn``)."""

from __future__ import annotations

from gnnscale.errors import ConfigError
from gnnscale.nn.base import BlockLayer
from gnnscale.nn.gat import GATLayer
from gnnscale.nn.gcn import GCNLayer
from gnnscale.nn.gin import GINLayer
from gnnscale.nn.mlp import MLPLayer
from gnnscale.nn.norm import JK_MODES, with_residual
from gnnscale.nn.sage import SAGELayer
from gnnscale.nn.stack import Stack, call_arguments

MODELS: dict[str, type[BlockLayer]] = {
    "gcn": GCNLayer,
    "sage": SAGELayer,
    "gat": GATLayer,
    "gin": GINLayer,
    "mlp": MLPLayer,
}


class GNN(Stack):
    """A built-in model (``--model gcn``, ...): a :class:`~gnnscale.nn.stack.Stack` of ``num_layers`` layers of
    gnnscale's zoo, hidden width ``hidden``, built by name.

    ``norm``, ``residual`` and ``jk`` follow PyG's ``BasicGNN`` (:mod:`gnnscale.nn.norm` says how): a hidden layer
    is conv -> norm -> activation -> dropout (the norm ``norms[l - 1]`` and the rest run in
    :meth:`~gnnscale.nn.stack.Stack.layer_input` of the next layer), the last conv has no norm unless ``jk`` is
    set, and with ``jk`` :meth:`~gnnscale.nn.stack.Stack.head` combines every layer's output and applies the final
    linear map ``lin``. GAT uses ELU between layers, the others ReLU.
    """

    def __init__(
        self,
        kind: str,
        in_features: int,
        hidden: int,
        num_classes: int,
        num_layers: int = 2,
        dropout: float = 0.5,
        heads: int = 4,
        norm: str = "none",
        residual: bool = False,
        jk: str = "none",
        input_dropout: float | None = None,
    ):
        if kind not in MODELS:
            raise ConfigError(f"unknown model {kind!r}; choose one of {', '.join(MODELS)}")
        if num_layers < 1:
            raise ConfigError(f"--layers must be >= 1, got {num_layers}")
        if jk not in JK_MODES:
            raise ConfigError(f"unknown --jk {jk!r}; choose one of {', '.join(JK_MODES)}")
        dims = [in_features] + [hidden] * (num_layers - 1) + [num_classes if jk == "none" else hidden]
        layers: list[BlockLayer] = []
        for i in range(num_layers):
            last = i == num_layers - 1 and jk == "none"
            if kind == "gat":
                if not last and hidden % heads:
                    raise ConfigError(f"--hidden ({hidden}) must be divisible by --heads ({heads}) for GAT")
                h = 1 if last else heads
                layers.append(GATLayer(dims[i], dims[i + 1] // h, heads=h, concat=True))
            elif kind == "gin":  # PyG's GIN model normalises inside each layer's MLP too
                layers.append(GINLayer(dims[i], dims[i + 1], norm=norm))
            else:
                layers.append(MODELS[kind](dims[i], dims[i + 1]))
            if residual:
                layers[-1] = with_residual(layers[-1])
        super().__init__(layers, act="elu" if kind == "gat" else "relu", dropout=dropout, norms=norm, jk=jk,
                         out_channels=None if jk == "none" else num_classes,
                         input_dropout=dropout if input_dropout is None else input_dropout)
        self.kind = kind
        self.residual = residual


__all__ = ["GNN", "MODELS", "Stack", "call_arguments"]
