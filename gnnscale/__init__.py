"""gnnscale: train graph neural networks on graphs bigger than one GPU's memory, with unchanged results."""

from gnnscale import _compat  # noqa: F401  (warning filters, optional-dependency probes)
from gnnscale.errors import ConfigError, DatasetError, EngineError, GnnscaleError, GraphError
from gnnscale.graph import Block, Graph
from gnnscale.graph.datasets import load_dataset
from gnnscale.launcher import launch
from gnnscale.predict import load_model, predict
from gnnscale.saved_model import save_model
from gnnscale.train import TrainConfig, TrainResult, train
from gnnscale.version import __version__

__all__ = [
    "Block",
    "ConfigError",
    "DatasetError",
    "EngineError",
    "GnnscaleError",
    "Graph",
    "GraphError",
    "TrainConfig",
    "TrainResult",
    "__version__",
    "launch",
    "load_dataset",
    "load_model",
    "predict",
    "save_model",
    "train",
]
