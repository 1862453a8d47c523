"""The distributed engine's predicted epoch (``gnnscale plan --engine distributed --machines N``): HopGNN's traffic
model (:mod:`gnnscale.plan.distributed_time`) with this engine's model, fanouts, training step, exchanges' local
work and synchronisation (each timed to fit the counted work to this machine)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from gnnscale.engines.sampled.loop import backward_share, default_fanouts, forward, model_depth
from gnnscale.graph.block import Block
from gnnscale.graph.graph import Graph
from gnnscale.nn import build_model
from gnnscale.nn.stack import Stack
from gnnscale.plan import distributed_time
from gnnscale.plan.epoch_time import Cluster, EpochTime
from gnnscale.plan.network_rate import sync_cost, with_network
from gnnscale.plan.rates import Rates
from gnnscale.store.partitioned import PartitionedFeatures

if TYPE_CHECKING:
    from gnnscale.config import TrainConfig


class LocalExchange:
    """:meth:`gnnscale.distributed.comm.Comm.exchange`'s local work on one rank without its collectives: the
    owners looked up, the ids sorted by owner and counted, the peers' requests (``served``) answered from the
    rank's rows, the received rows stitched back in order."""

    def __init__(self, world: int):
        self.world = world
        self.served = torch.empty(0, dtype=torch.int64)

    def exchange(self, ids: Tensor, owner: Tensor, serve: Callable[[Tensor], Tensor], width: int,
                 dtype: torch.dtype, what: str = "feature fetch") -> Tensor:
        dest = owner[ids]
        order = torch.argsort(dest, stable=True)
        sc = torch.bincount(dest, minlength=self.world).tolist()
        req = ids[order]
        rows = serve(self.served).to(dtype).reshape(-1, width)
        back = torch.empty((req.numel(), width), dtype=dtype)
        out = torch.empty((ids.numel(), width), dtype=dtype)
        out[order] = back
        del sc, rows
        return out


def exchange_work(graph: Graph, config: TrainConfig, ranks: int) -> distributed_time.ExchangeFn:
    """Rank 0's exchange as the engine runs it (through its feature source; pre-gathering: one fetch, then every
    step's inputs from the fetched rows), without the collectives."""
    assert graph.x is not None
    x = graph.x
    parts: dict[int, tuple[PartitionedFeatures, LocalExchange]] = {}
    pregather = config.strategy == "micrograph" and config.pregather == "on"

    def work(owner: Tensor, srcs: list[Tensor], served: Tensor) -> None:
        if id(owner) not in parts:
            loc = LocalExchange(ranks)
            parts.clear()
            parts[id(owner)] = (PartitionedFeatures(x, owner, 0, exchange=loc), loc)
        part, loc = parts[id(owner)]
        loc.served = served
        if pregather:
            rows = part.fetch(torch.cat(srcs))
            for s in srcs:
                rows.gather(s)
        else:
            for s in srcs:
                part.gather(s)

    return work


def sync_work(net: Stack, config: TrainConfig) -> distributed_time.SyncFn:
    """A rank's local work around its collectives (``0``: an iteration's gradients flattened for the all-reduce,
    taken back, the optimiser's step; ``1``: a migration's model and gradients flattened and unflattened), on a
    copy of ``net``."""
    model = copy.deepcopy(net)
    params = list(model.parameters())
    for p in params:
        p.grad = torch.zeros_like(p)
    opt = torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay)

    def work(kind: int) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        if kind == 0:
            flat = torch.cat([g.reshape(-1) for g in grads])
            off = 0
            for p in params:
                p.grad = flat[off : off + p.numel()].view_as(p)
                off += p.numel()
            opt.step()
            return
        flat = torch.cat([p.detach().reshape(-1) for p in params] + [g.reshape(-1) for g in grads])
        into = torch.empty_like(flat)
        into.copy_(flat)
        off = 0
        with torch.no_grad():
            for p in params:
                p.copy_(into[off : off + p.numel()].view_as(p))
                off += p.numel()
            for p in params:
                p.grad = into[off : off + p.numel()].view_as(p).clone()
                off += p.numel()

    return work


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
    ranks = cluster.machines * (cluster.devices_per_machine or 1)
    wait = sync_cost(rates, max(2, cluster.devices_per_machine or 1))  # the ranks of one machine
    return distributed_time.predict(graph, config, net, rates, cluster, fanouts, fit=step,
                                    exchange=exchange_work(graph, config, ranks), sync=sync_work(net, config),
                                    wait=wait)
