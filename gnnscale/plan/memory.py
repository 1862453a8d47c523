"""Memory model of whole-graph training on one device, host-memory readings and the CPU stand-in for a device's
peak-memory counter."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from gnnscale import runtime as rt
from gnnscale.graph.graph import Graph
from gnnscale.nn.base import BlockLayer
from gnnscale.nn.stack import Stack

if TYPE_CHECKING:
    from gnnscale.config import TrainConfig


def _widths(graph: Graph, config: TrainConfig, model: Stack | None) -> list[int]:
    """Each layer's input width, then the last layer's output width: ``model``'s own layers' when given, else
    ``config``'s (``hidden`` and ``layers``, the features and the classes)."""
    if model is not None:
        layers = model.block_layers
        return [layers[0].in_features] + [layer.out_features for layer in layers]
    return [max(graph.num_features, 1)] + [config.hidden] * (config.layers - 1) + [graph.num_classes or 1]


def _parameters(config: TrainConfig, model: Stack | None, dims: list[int]) -> int:
    """Parameter count: ``model``'s own when given, else ``config``'s model's weight matrices at ``dims``."""
    if model is not None:
        return sum(p.numel() for p in model.parameters())
    return sum(dims[i] * dims[i + 1] * (2 if config.model in ("sage", "gin") else 1) for i in range(len(dims) - 1))


def _attention_heads(config: TrainConfig, model: Stack | None, layer: int) -> int:
    """Attention heads of layer ``layer`` (0: it computes nothing per edge): ``config``'s GAT's, or a layer of
    ``model`` that computes per edge (:attr:`~gnnscale.nn.base.BlockLayer.edge_compute`), by its ``heads`` (or
    its wrapped conv's: PyG's attention convs), else one."""
    if model is None:
        return 0 if config.model != "gat" else 1 if layer == config.layers - 1 else config.heads
    block: BlockLayer = model.block_layers[layer]
    if not block.edge_compute:
        return 0
    heads = getattr(block, "heads", None) or getattr(getattr(block, "conv", None), "heads", None)
    return heads if isinstance(heads, int) and heads > 0 else 1


def estimate_inmemory_bytes(graph: Graph, config: TrainConfig, model: Stack | None = None) -> dict[str, int]:
    """Peak bytes of whole-graph training on one device, by part (an estimate, within tens of percent).

    Counts the graph (features, normalised adjacency and its transpose), every layer's saved activations and
    gradients (with dropout masks), per-edge attention tensors for GAT (or a user's layer that computes per edge),
    and parameters with Adam state. ``model``: a user's model (its layers' widths and its parameters), else
    ``config``'s built-in one.
    """
    n, e, f = graph.num_nodes, graph.num_edges + graph.num_nodes, max(graph.num_features, 1)
    dims = _widths(graph, config, model)
    adjacency = 2 * (8 * (n + 1) + 12 * e)  # CSR + transpose: int64 indices, float32 values
    data = 4 * n * f + 9 * n  # features, labels, masks
    acts = 0
    for i in range(len(dims) - 1):
        width_in, width_out = dims[i], dims[i + 1]
        # input after dropout, aggregate, output, their gradients; the int64 dropout hash temporaries
        acts += 4 * n * (2 * width_in + 2 * width_out) * 2 + 8 * n * width_in
        heads = _attention_heads(config, model, i)
        if heads:
            acts += 4 * e * heads * 6 + 4 * e * width_out * 2  # scores, softmax, messages and their grads
    params = 4 * 4 * _parameters(config, model, dims)
    total = adjacency + data + acts + params
    return {"graph": adjacency + data, "activations": acts, "parameters": params, "total": total}


def estimate_host_bytes(graph: Graph, config: TrainConfig, *, layer_copies: int,
                        model: Stack | None = None) -> dict[str, int]:
    """Host bytes a run needs beyond the graph already loaded, by part (a lower bound, to refuse a run that cannot
    fit before it starts rather than die in the allocator):

    - ``model``: the parameters, their gradients and Adam's two moments (4 float32 copies);
    - ``activations``: ``layer_copies`` rows per vertex and hidden layer (layer-wise inference keeps each layer's
      output for every vertex: 1; engines that keep every vertex's activations in host memory keep a layer's
      input and its gradient: 2, and copy the features once into their vertex order).

    ``model``: a user's model (its layers' widths and its parameters), else ``config``'s built-in one.
    """
    n, f = graph.num_nodes, max(graph.num_features, 1)
    dims = _widths(graph, config, model)
    out = {"model": 4 * 4 * _parameters(config, model, dims)}
    if layer_copies:
        out["activations"] = layer_copies * 4 * n * sum(dims[1:-1]) + (4 * n * f if layer_copies > 1 else 0)
    return out


def available_device_bytes(device: torch.device) -> int:
    """Free memory on ``device``: the accelerator's free memory, or the host's available RAM for CPU."""
    return int(rt.mem_get_info(device)[0])


def replica_baseline(model: torch.nn.Module, index: int) -> int:
    """Bytes a multi-device engine's device ``index`` holds before any op runs: its replica's parameters and, on
    the first device (the master's), Adam's two state tensors per parameter. Gradients are not included: the
    worker threads create them under their :class:`LiveBytesCounter`, which counts them."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    return params * (3 if index == 0 else 1)


class LiveBytesCounter(TorchDispatchMode):
    """Counts the bytes of every tensor created while active and still alive, and their peak.

    The CPU stand-in for an accelerator allocator's peak (``runtime.peak_bytes``): with no GPU, an engine runs its
    device-side work under this mode, so "device" allocations (staged rows, block topology, activations, tensors
    autograd saves, gradients, optimiser state) are measured rather than estimated. Tensors that existed before
    (host buffers, parameters) are not seen; add them as ``baseline``. Views share their base's storage and count once.
    """

    def __init__(self, baseline: int = 0):
        super().__init__()
        self.baseline = baseline
        self.live: dict[int, tuple[Any, int]] = {}  # storage key -> (weak reference, bytes)
        self.current = 0
        self.peak = baseline

    def reset_peak(self) -> None:
        self._sweep()
        self.peak = self.baseline + self.current

    def _sweep(self) -> None:
        dead = [k for k, (ref, _) in self.live.items() if ref.expired()]
        for k in dead:
            self.current -= self.live.pop(k)[1]

    def _track(self, t: Any) -> None:
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            return
        if t.layout != torch.strided:  # sparse: count its component tensors
            parts = (t.crow_indices(), t.col_indices(), t.values()) if t.layout == torch.sparse_csr else (
                (t.ccol_indices(), t.row_indices(), t.values()) if t.layout == torch.sparse_csc else ())
            for p in parts:
                self._track(p)
            return
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if storage.nbytes() == 0 or (key in self.live and not self.live[key][0].expired()):
            return
        if key in self.live:
            self.current -= self.live.pop(key)[1]
        self.live[key] = (StorageWeakRef(storage), storage.nbytes())
        self.current += storage.nbytes()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        # in-place ops and views return (part of) an input: no new memory, even when that input predates the mode
        inputs = {a.untyped_storage().data_ptr() for a in _tensors(args, kwargs) if a.layout == torch.strided}
        new = [t for t in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(t, torch.Tensor) and not (
            t.layout == torch.strided and t.untyped_storage().data_ptr() in inputs)]
        if new:  # the peak can only rise when memory is allocated: sweep the dead then, not on every op
            self._sweep()
            for t in new:
                self._track(t)
            self.peak = max(self.peak, self.baseline + self.current)
        return out


def _tensors(args: Any, kwargs: Any) -> list[torch.Tensor]:
    """The tensors among an op's arguments (one level of lists, as aten ops take them)."""
    out = []
    for a in (*args, *(kwargs or {}).values()):
        for x in a if isinstance(a, (tuple, list)) else (a,):
            if isinstance(x, torch.Tensor):
                out.append(x)
    return out
