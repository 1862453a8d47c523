"""The distributed engine's predicted epoch (``gnnscale plan --engine distributed --machines N``): HopGNN's traffic
model (:mod:`gnnscale.plan.distributed_time`) with this engine's model, fanouts and training step (timed to fit
the counted work to this machine)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

from gnnscale.engines.sampled import backward_share, default_fanouts, forward, model_depth
from gnnscale.graph.block import Block
from gnnscale.graph.graph import Graph
from gnnscale.nn import build_model
from gnnscale.nn.stack import Stack
from gnnscale.plan import distributed_time
from gnnscale.plan.epoch_time import Cluster, EpochTime
from gnnscale.plan.network_rate import with_network
from gnnscale.plan.rates import Rates

if TYPE_CHECKING:
    from gnnscale.config import TrainConfig


def predict_distributed(graph: Graph, config: TrainConfig, rates: Rates, model: Stack | None,
                        cluster: Cluster) -> EpochTime:
    """One epoch of ``config.strategy`` on ``cluster`` (``model``: a user's, else ``config``'s)."""
    assert graph.num_classes is not None and graph.x is not None and graph.y is not None
    net = model or build_model(config.model, graph.num_features, config.hidden, graph.num_classes,
                               **config.model_kwargs())
    fanouts = tuple(config.fanouts or default_fanouts(model_depth(config, net)))
    x, y = graph.x, graph.y

    def step(blocks: list[Block], seeds: Tensor) -> None:  # timed by the model's compute fit
        src = blocks[0].src_ids
        backward_share(forward(net, blocks, x[src] if src is not None else x, (config.seed, 0)), y[seeds], 1)
        net.zero_grad(set_to_none=True)

    if cluster.network is None or cluster.latency is None or cluster.machines == 1:
        rates = with_network(rates)  # this machine's rate between processes: the default, and one machine's floor
    return distributed_time.predict(graph, config, net, rates, cluster, fanouts, fit=step)
