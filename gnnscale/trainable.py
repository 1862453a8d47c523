"""What a graph and a model must be for :func:`gnnscale.train.train` to train them, checked before anything is
planned: a graph with features, labels and disjoint splits (a PyG ``Data`` converted), the parts a reader made up,
what training the model on the graph quietly would not do (data caveats), and a model of the user's that fits the
graph. Below the engines: the CLI's ``partition`` and the launcher check with the same functions."""

from __future__ import annotations

import torch

from gnnscale.config import TrainConfig
from gnnscale.errors import ConfigError, GraphError
from gnnscale.graph.graph import Graph
from gnnscale.nn import Stack, as_stack
from gnnscale.nn.factory import build_from_factory
from gnnscale.nn.stack import class_count
from gnnscale.notes import note, warn


def check_trainable(graph: Graph) -> None:
    """A graph must carry features, labels and a non-empty train mask to be trained on."""
    if graph.x is None or graph.num_features == 0:
        raise GraphError(f"graph {graph.name} has no features to train on")
    if graph.y is None:
        raise GraphError(f"graph {graph.name} has no labels to train on")
    if graph.train_mask is None or not bool(graph.train_mask.any()):
        raise GraphError(f"graph {graph.name} has no training vertices (train_mask is empty)")
    masks = [(m, getattr(graph, m)) for m in ("train_mask", "val_mask", "test_mask")]
    masks = [(m, t) for m, t in masks if t is not None]
    for i, (a, ta) in enumerate(masks):
        for b, tb in masks[i + 1 :]:
            both = int((ta & tb).sum())
            if both:
                raise GraphError(f"graph {graph.name}: {both} vertices are in both {a} and {b}; the splits must be "
                                 "disjoint (a vertex trained on cannot measure generalisation)")


def as_graph(graph: object) -> Graph:
    """``graph`` itself, or a PyG ``Data`` converted by :meth:`Graph.from_pyg` (said in a note); anything else is
    a GraphError naming the ways to build a Graph."""
    if isinstance(graph, Graph):
        return graph
    if getattr(graph, "edge_index", None) is not None:
        note(f"train: converted the {type(graph).__name__} with Graph.from_pyg (call it yourself to pick a split=, "
             "a name or coalesce=True)")
        return Graph.from_pyg(graph)
    raise GraphError(f"train takes a gnnscale Graph, got a {type(graph).__name__}: build one with Graph.from_pyg("
                     "data), Graph.from_edge_index(edge_index, x=..., y=..., train_mask=...) or load_dataset(spec)")


def made_up_parts(graph: Graph) -> list[str]:
    """Which of the graph's ``features`` and ``labels`` a reader made up (drawn at random: the data had none), as
    its ``meta["made_up"]`` records them."""
    return [p for p in ("features", "labels") if p in (graph.meta.get("made_up") or [])]


_UNWEIGHTED = {"sage": "as PyG's SAGEConv, which takes no edge_weight",
               "gat": "as PyG's GATConv, which reads edge features only with edge_dim",
               "gin": "as PyG's GINConv, which takes no edge_weight", "dgat": "its attention weighs the edges",
               "mlp": "it reads no edges"}
"""Why a model that does not read edge weights does not (the note's words)."""


def data_caveats(graph: Graph, model: Stack) -> list[tuple[str, str]]:
    """What training ``model`` on ``graph`` quietly would not do as its user may think, as ``(kind, line)`` pairs
    (``note``/``warn``): edge weights the model does not read (only GCN's normalised adjacency is weighted, as in
    PyG, where ``GCNConv`` takes ``edge_weight`` and ``SAGEConv``, ``GATConv`` and ``GINConv`` do not), and a train
    split of fewer than two classes (every prediction is then that class: accuracies of 1.0 say nothing)."""
    out = []
    if graph.edge_weight is not None and not model.adjacency.weighted:
        why = _UNWEIGHTED.get(model.kind, "it aggregates over unweighted edges")
        out.append(("note", f"the {model.kind} model ignores the edge weights of {graph.name} ({why}); only gcn "
                            "and dgcn aggregate with them"))
    if graph.y is not None and graph.train_mask is not None:
        classes = torch.unique(graph.y[graph.train_mask])
        if classes.numel() == 1:  # (none: an empty train split, an error of check_trainable)
            c = int(classes[0])
            named = f" ({graph.class_names[c]!r})" if graph.class_names else ""
            out.append(("warn", f"the {int(graph.train_mask.sum())} training vertices of {graph.name} all have class "
                                f"{c}{named}: the model learns to predict that class, and its accuracies (1.0 where "
                                "every vertex has it) say nothing"))
    return out


MODEL_FIELDS = ("model", "hidden", "layers", "dropout", "heads", "norm", "residual", "jk", "input_dropout")
"""The config's fields that describe the model: ignored when :func:`train` is given a model of the user's."""


def user_model(model: torch.nn.Module | None, config: TrainConfig, graph: Graph, primary: bool) -> Stack | None:
    """The user's model an engine trains: ``model`` as a Stack (:func:`~gnnscale.nn.as_stack`), else the one
    ``config.model_factory`` makes (:func:`~gnnscale.nn.factory.build_from_factory`), else ``None`` (the config's
    built-in model); with one warning (``primary``: the process that reports) naming the config's model fields
    that were set, which do not apply to a model of the user's."""
    if model is None and config.model_factory is None:
        return None
    assert graph.num_classes is not None
    if model is not None:
        stack = as_stack(model)
    else:
        assert config.model_factory is not None
        stack = build_from_factory(config.model_factory, graph.num_features, graph.num_classes, config.seed)
    default = TrainConfig()
    changed = [f"{f}={getattr(config, f)!r}" for f in MODEL_FIELDS if getattr(config, f) != getattr(default, f)
               and not (f == "layers" and config.layers == len(stack.layers))]  # (the sampled engines' fanouts)
    if model is not None and config.model_factory is not None:
        changed.append(f"model_factory={config.model_factory!r}")
    if changed and primary:
        who = "model=" if model is not None else f"--model-factory {config.model_factory}"
        warn(f"{who}: the config's model fields are ignored ({', '.join(changed)}): the model given is trained")
    check_model_fits(stack, graph)
    return stack


def check_model_fits(model: Stack, graph: Graph) -> None:
    """A user's model must take the graph's features and give its classes."""
    width, classes = model.block_layers[0].in_features, class_count(model)
    if width != graph.num_features or classes != graph.num_classes:
        raise ConfigError(f"the model takes {width} features and gives {classes} class scores; {graph.name} has "
                          f"{graph.num_features} features and {graph.num_classes} classes")
