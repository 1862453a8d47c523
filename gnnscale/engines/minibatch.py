"""Mini-batch training over XGNN's global memory store (XGNN §3-5; pipeline vocabulary of HyScale-GNN §III).

Per epoch the training vertices are shuffled (by seed and epoch) and cut into ``--batch-size`` seed batches. For each
batch a k-hop uniform sampler (:func:`gnnscale.sample.sample_blocks`, ``--fanouts``) asks the store
(:class:`~gnnscale.store.GlobalMemoryStore`) for neighbour lists, one de-duplicated request per hop, and relabels
them into blocks; the feature extractor asks the store for the input rows; the model trains on the blocks, one
optimiser step per batch. Sampling and extraction of the next batches run on a producer thread ahead of training,
through a bounded queue (HyScale-GNN's pipeline of sampling, feature loading and training).

Evaluation is layer-wise full-neighbour inference (every vertex's exact output, layer by layer over destination
batches: the in-memory engine's evaluation), or sampled inference with ``--eval-fanouts``.

Mini-batch training learns from sampled neighbourhoods, not the full graph, so ``--engine auto`` never picks it.
With fanouts at least the largest in-degree a step equals the in-memory engine restricted to the batch's seeds.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from gnnscale.engines.base import Engine
from gnnscale.errors import ConfigError
from gnnscale.graph.block import Block
from gnnscale.graph.graph import MASK_NAMES, Graph
from gnnscale.nn.model import GNN
from gnnscale.plan.memory import available_device_bytes
from gnnscale.sample import CSRTopology, sample_blocks
from gnnscale.store.global_store import GlobalMemoryStore

if TYPE_CHECKING:
    from gnnscale.train import TrainConfig

QUEUE_DEPTH = 2
"""Batches sampled and extracted ahead of training."""
STORE_SHARE = 0.5
"""Share of the device budget the store may fill when the ratios are left to the engine."""
PRESAMPLE_BATCHES = 8
"""Mini-batches sampled by ``--hotness presample`` to count how often each vertex is read."""
EVAL_BATCH = 16384
"""Destinations per step of layer-wise inference (at least ``--batch-size``): few large steps, no sampling."""


@dataclass(eq=False)
class _Batch:
    seeds: Tensor
    blocks: list[Block]
    x: Tensor
    sample_s: float
    extract_s: float


def default_fanouts(layers: int) -> tuple[int, ...]:
    """``15, 10`` for two layers (PyG/DGL's usual), 10 per hop otherwise."""
    return (15, 10) if layers == 2 else (10,) * layers


def auto_ratios(graph: Graph, budget: int) -> float:
    """The largest fraction ``r`` of vertices whose topology and features both fit ``budget`` bytes (capped at 1)."""
    topo = (graph.num_nodes + 1) * 8 + graph.num_edges * 12 + graph.num_nodes * 12  # CSR, weights, self-loops
    feats = graph.num_nodes * graph.num_features * 4
    return min(1.0, budget / max(topo + feats, 1))


class MiniBatchEngine(Engine):
    """Sampled mini-batch training with topology and features in a global GPU+host store (XGNN)."""

    name = "minibatch"

    @classmethod
    def _not_supported_reasons(cls, graph: Graph, config: TrainConfig, device: torch.device) -> list[str]:
        if config.engine != "minibatch":
            return ["samples neighbourhoods instead of training on the full graph; choose it with --engine minibatch"]
        fanouts = config.fanouts or default_fanouts(config.layers)
        reasons = []
        if len(fanouts) != config.layers:
            reasons.append(f"--fanouts has {len(fanouts)} values for {config.layers} layers")
        if config.eval_fanouts is not None and len(config.eval_fanouts) != config.layers:
            reasons.append(f"--eval-fanouts has {len(config.eval_fanouts)} values for {config.layers} layers")
        return reasons

    def __init__(self, graph: Graph, model: GNN, config: TrainConfig, device: torch.device):
        super().__init__(graph, model, config, device)
        self.fanouts = tuple(config.fanouts or default_fanouts(config.layers))
        budget = config.memory_budget if config.memory_budget is not None else available_device_bytes(device)
        auto = auto_ratios(graph, int(STORE_SHARE * budget))
        graph_ratio = auto if config.gpu_graph_ratio is None else config.gpu_graph_ratio
        feature_ratio = auto if config.gpu_feature_ratio is None else config.gpu_feature_ratio
        devices = [torch.device(d) for d in config.devices] if config.devices else [device]
        self.masks = {m: getattr(graph, m) for m in MASK_NAMES if getattr(graph, m) is not None}
        self.train_ids = torch.nonzero(self.masks["train_mask"]).view(-1)
        if self.train_ids.numel() == 0:
            raise ConfigError(f"graph {graph.name} has no training vertices")
        hotness = self.presampled_hotness() if config.hotness == "presample" else None
        self.store = GlobalMemoryStore(graph, devices, adjacency=model.adjacency, gpu_graph_ratio=graph_ratio,
                                       gpu_feature_ratio=feature_ratio, memory_budget=budget,
                                       gather=config.gather, hotness=hotness)
        assert graph.y is not None
        self.y = graph.y.to(device)

    def presampled_hotness(self) -> Tensor:
        """Access counts from a short pre-sampling pass (XGNN's alternative to degree): how often each vertex is
        a sampled source in :data:`PRESAMPLE_BATCHES` training batches, plus its out-degree as a tie-breaker."""
        topo = CSRTopology.from_graph(self.graph, self.model.adjacency)
        gen = torch.Generator().manual_seed(self.config.seed)
        order = self.train_ids[torch.randperm(self.train_ids.numel(), generator=gen)]
        counts = torch.zeros(self.graph.num_nodes, dtype=torch.float64)
        size = self.config.batch_size
        for lo in range(0, min(order.numel(), PRESAMPLE_BATCHES * size), size):
            for block in sample_blocks(topo, order[lo : lo + size], self.fanouts, gen):
                assert block.src_ids is not None
                counts.index_add_(0, block.src_ids, torch.ones(block.num_src, dtype=torch.float64))
        deg = self.graph.out_degree().double()
        return counts + deg / (deg.max() + 1)

    def describe(self) -> str:
        s = self.store
        n = max(s.num_nodes, 1)
        return (f"minibatch: batch {self.config.batch_size}, fanouts {','.join(map(str, self.fanouts))}; store: "
                f"topology of {100 * s.hot_graph / n:.0f}% and features of {100 * s.hot_features / n:.0f}% of the "
                f"vertices on {len(s.devices)} device(s), the rest in host memory")

    # ------------------------------------------------------------------------------------------------ pipeline
    def _sample(self, seeds: Tensor, fanouts: tuple[int, ...], gen: torch.Generator) -> _Batch:
        t0 = time.perf_counter()
        blocks = sample_blocks(self.store, seeds, fanouts, gen)
        t1 = time.perf_counter()
        src = blocks[0].src_ids
        assert src is not None
        x = self.store.features(src)
        return _Batch(seeds, blocks, x, t1 - t0, time.perf_counter() - t1)

    def _batches(self, seeds: Tensor, fanouts: tuple[int, ...], gen: torch.Generator) -> Iterator[_Batch]:
        """Sampled and extracted batches of ``seeds``, produced ahead by a thread through a bounded queue."""
        size = self.config.batch_size
        parts = [seeds[i : i + size] for i in range(0, seeds.numel(), size)]
        q: queue.Queue[_Batch | BaseException | None] = queue.Queue(maxsize=QUEUE_DEPTH)
        stop = threading.Event()

        def produce() -> None:
            try:
                for part in parts:
                    if stop.is_set():
                        return
                    q.put(self._sample(part.to(self.device), fanouts, gen))
                q.put(None)
            except BaseException as exc:  # surfaced in the consumer
                q.put(exc)

        thread = threading.Thread(target=produce, name="gnnscale-sampler", daemon=True)
        thread.start()
        try:
            while True:
                item = q.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            while thread.is_alive():  # let a producer blocked on a full queue finish
                try:
                    q.get_nowait()
                except queue.Empty:
                    thread.join(timeout=0.05)

    def _forward(self, batch: _Batch, se: tuple[int, int] | None) -> Tensor:
        h = batch.x
        for i, (layer, block) in enumerate(zip(self.model.block_layers, batch.blocks, strict=True)):
            h = layer(block, self.model.layer_input(i, h, block.row_ids(), se))
        return h

    # ------------------------------------------------------------------------------------------------ training
    def train_epoch(self, epoch: int) -> dict[str, float]:
        self.model.train()
        se = (self.config.seed, epoch)
        key = self.config.seed * 1_000_003 + epoch  # shuffling and sampling: a function of (seed, epoch)
        gen = torch.Generator(device=self.device).manual_seed(key)
        order = torch.randperm(self.train_ids.numel(), generator=torch.Generator().manual_seed(key))
        self.store.reset_stats()
        total = 0.0
        sample_s = extract_s = train_s = 0.0
        edges = batches = 0
        for batch in self._batches(self.train_ids[order], self.fanouts, gen):
            t0 = time.perf_counter()
            self.optimizer.zero_grad(set_to_none=True)
            logits = self._forward(batch, se)
            loss = F.cross_entropy(logits, self.y[batch.seeds])
            loss.backward()
            self.optimizer.step()
            total += float(loss.detach()) * batch.seeds.numel()
            train_s += time.perf_counter() - t0
            sample_s, extract_s = sample_s + batch.sample_s, extract_s + batch.extract_s
            edges += sum(b.num_edges for b in batch.blocks)
            batches += 1
        stats = self.store.reset_stats()
        return {"loss": total / self.train_ids.numel(), "sample_s": sample_s, "extract_s": extract_s,
                "train_s": train_s, "sampled_edges": edges, "batches": batches, "h2d_bytes": stats.h2d_bytes,
                **stats.hit_rates()}

    @torch.no_grad()
    def evaluate(self) -> dict[str, float | None]:
        self.model.eval()
        if self.config.eval_fanouts is not None:
            return self._sampled_eval(tuple(self.config.eval_fanouts))
        n = self.graph.num_nodes
        size = max(self.config.batch_size, EVAL_BATCH)
        h: Tensor | None = None
        for i, layer in enumerate(self.model.block_layers):  # layer-wise, every vertex, full neighbourhoods
            out = None
            for lo in range(0, n, size):
                dst = torch.arange(lo, min(lo + size, n), device=self.device)
                block = sample_blocks(self.store, dst, (-1,))[0]
                src = block.src_ids
                assert src is not None
                x = self.store.features(src) if h is None else h[src.cpu()].to(self.device)
                y = layer(block, self.model.layer_input(i, x, block.row_ids(), None)).cpu()
                if out is None:
                    out = torch.empty(n, y.shape[1])
                out[lo : lo + y.shape[0]] = y
            h = out
        assert h is not None
        self.store.reset_stats()
        return self.accuracies(h, self.y.cpu(), self.masks)

    def _sampled_eval(self, fanouts: tuple[int, ...]) -> dict[str, float | None]:
        pred = torch.full((self.graph.num_nodes,), -1, dtype=torch.int64)
        ids = torch.nonzero(torch.stack(list(self.masks.values())).any(0)).view(-1)
        gen = torch.Generator(device=self.device).manual_seed(self.config.seed)
        for batch in self._batches(ids, fanouts, gen):
            pred[batch.seeds.cpu()] = self._forward(batch, None).argmax(-1).cpu()
        self.store.reset_stats()
        return self.accuracies(pred, self.y.cpu(), self.masks)
