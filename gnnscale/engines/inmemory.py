"""The reference engine: the whole graph, every layer's activations and the model on one device."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from gnnscale.engines.core.base import Engine, graph_bytes
from gnnscale.graph.block import Block
from gnnscale.graph.graph import MASK_NAMES, Graph
from gnnscale.nn.stack import Stack
from gnnscale.plan.epoch_time import HERE, Cluster, EpochTime
from gnnscale.plan.fullgraph_time import predict_inmemory
from gnnscale.plan.memory import available_device_bytes, estimate_inmemory_bytes
from gnnscale.plan.rates import Rates
from gnnscale.units import format_bytes

if TYPE_CHECKING:
    from gnnscale.config import TrainConfig


class InMemoryEngine(Engine):
    """Whole-graph training on one device. Every other engine is tested against this one."""

    name = "inmemory"
    splits_layers = False  # every layer runs on the whole graph: a user's layer need not be local
    trains_jk = True
    trains_decoupled = True

    @classmethod
    def batch_norm_reason(cls, config: TrainConfig) -> str | None:
        """BatchNorm over every vertex of a layer, as PyG's full-batch training."""
        del config
        return None

    @classmethod
    def estimate(cls, graph: Graph, config: TrainConfig, device: torch.device, *, model: Stack | None = None) -> str:
        need = estimate_inmemory_bytes(graph, config, model)["total"]
        return f"about {format_bytes(need)} of device memory for the whole graph and its activations"

    @classmethod
    def predict_epoch(cls, graph: Graph, config: TrainConfig, device: torch.device, rates: Rates, *,
                      model: Stack | None = None, cluster: Cluster = HERE) -> EpochTime | None:
        """The whole graph's counted work on one device (:func:`~gnnscale.plan.fullgraph_time.predict_inmemory`)."""
        del device, cluster
        return predict_inmemory(graph, config, rates, model=model)

    @classmethod
    def _not_supported_reasons(cls, graph: Graph, config: TrainConfig, device: torch.device, *,
                               model: Stack | None = None) -> list[str]:
        if config.devices and len(config.devices) > 1:
            return [f"runs on one device, not {len(config.devices)} (--devices)"]
        need = estimate_inmemory_bytes(graph, config, model)["total"]
        if config.memory_budget is not None:
            have, what = config.memory_budget, "the memory budget"
        else:
            have, what = available_device_bytes(device), f"free memory on {device}"
        if need > have:
            return [f"needs about {format_bytes(need)} for the whole graph and its activations, "
                    f"more than {what} ({format_bytes(have)})"]
        # --host-memory: this engine does not take it, so it fits only when what it holds in host memory does (on
        # a CPU the whole run; on an accelerator the graph it loads): --engine auto then takes one that honours it
        held = need if device.type == "cpu" else graph_bytes(graph)
        if config.host_memory is not None and held > config.host_memory:
            return [f"does not take --host-memory and holds about {format_bytes(held)} in host memory, more than "
                    f"the {format_bytes(config.host_memory)} budget"]
        return []

    def __init__(self, graph: Graph, model: Stack, config: TrainConfig, device: torch.device):
        super().__init__(graph, model, config, device)
        self.block = Block.from_graph(graph, model.adjacency).to(device)
        self.block.adj(), self.block.adj_t(), self.block.dst_index()  # build caches now, not inside epoch 1
        assert graph.x is not None and graph.y is not None
        self.x = graph.x.to(device).float()  # bfloat16 features cross at half the bytes, upcast on the device
        self.y = graph.y.to(device)
        self.masks = {m: getattr(graph, m).to(device) for m in MASK_NAMES if getattr(graph, m) is not None}

    def train_epoch(self, epoch: int) -> dict[str, float]:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        out = self.model(self.block, self.x, (self.config.seed, epoch))  # [N, C]
        train = self.masks["train_mask"]
        loss = F.cross_entropy(out[train], self.y[train])
        loss.backward()
        self.optimizer.step()
        return {"loss": float(loss.detach())}

    @torch.no_grad()
    def evaluate(self) -> dict[str, float | None]:
        self.model.eval()
        return self.accuracies(self.model(self.block, self.x), self.y, self.masks)

    def predict(self) -> Tensor:
        self.model.eval()
        return self.model(self.block, self.x).argmax(dim=-1).cpu()
