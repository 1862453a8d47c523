"""The offload engine's host rows: every vertex's layer inputs, their gradients, projected rows and cached
aggregations in host memory (HongTu: vertex data in host memory), allocated once per engine."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from gnnscale.engines.offload.workers import Features, HostTable, Spill
from gnnscale.nn.stack import Stack


def projected_width(layer: torch.nn.Module, width: int) -> int:
    """Columns of ``layer.project`` on ``width`` input columns: one zero row through it, on the layer's own device
    and dtype (a model on a GPU projects a GPU row)."""
    p = next(layer.parameters(), None)
    row = torch.zeros(1, width) if p is None else torch.zeros(1, width, device=p.device, dtype=p.dtype)
    with torch.no_grad():
        return int(layer.project(row).shape[1])  # type: ignore[operator]


@dataclass(eq=False)
class HostRows:
    """Every vertex's rows in host memory (pinned for a GPU), in the engine's vertex order: features, each layer's
    input and its gradient, the projected rows of projecting layers and the cached aggregations. The features are
    read through feature sources (:class:`~gnnscale.engines.offload.workers.Features`); the rest are the engine's
    own scratch, plain host tensors it writes and reads during the epoch."""

    x: Features
    """``[N, F0]`` the features (layer 0's input before its dropout)."""
    inputs: dict[int, Tensor]
    """``h[l]``, ``l >= 1``: layer ``l``'s input (layer ``l - 1``'s output, activation and dropout applied once per
    vertex when it was written)."""
    input_grads: dict[int, Tensor]
    """``dL/dh[l]``, accumulated over the chunks of a backward pass (zero between epochs)."""
    projecting: set[int]
    """Layers that project before a parameter-free propagation (GCN/SAGE wider in than out): every vertex is
    projected once into :attr:`projected`, and the chunks move those narrower rows."""
    caching: set[int]
    """Layers (all but the last) whose aggregation (or propagation) is kept in :attr:`aggregates` for backward."""
    projected: dict[int, Tensor]
    """``p[l]`` of a projecting layer."""
    projected_grads: dict[int, Tensor]
    """``dL/dp[l]``."""
    aggregates: dict[int, Tensor]
    """``a[l]`` of a caching layer (its recomputation then runs only UPDATE)."""
    reading_dst: set[int]
    """Layers whose UPDATE reads the destinations' own rows besides the aggregation."""

    @classmethod
    def allocate(cls, model: Stack, x: Features, host: Callable[[Tensor], Tensor],
                 spill: Spill | None = None) -> HostRows:
        """The buffers ``model`` needs for ``x``'s vertices (``host``: pins a buffer for a GPU); with ``spill``,
        those past its RAM allowance are file-backed (:class:`Spill`)."""
        N, L = x.num_rows, len(model.layers)
        layers = model.block_layers
        widths = [layer.in_features for layer in layers]
        projecting = {l for l in range(L) if layers[l].projects_first}
        caching = {l for l in range(L - 1) if layers[l].cacheable or l in projecting}
        agg_width = {l: projected_width(layers[l], widths[l]) if l in projecting else widths[l] for l in range(L)}

        def buf(w: int, zero: bool) -> Tensor:
            if spill is not None and not spill.fits_ram(N * w * 4):
                return spill.tensor(N, w)  # a new file reads as zeros
            return host(torch.zeros(N, w) if zero else torch.empty(N, w))

        return cls(x, {l: buf(widths[l], False) for l in range(1, L)},
                   {l: buf(widths[l], True) for l in range(1, L)}, projecting, caching,
                   projected={l: buf(agg_width[l], False) for l in projecting},
                   projected_grads={l: buf(agg_width[l], True) for l in projecting},
                   aggregates={l: buf(agg_width[l], False) for l in caching},
                   reading_dst={l for l in range(L) if layers[l].update_uses_dst})

    @staticmethod
    def buffer_bytes(model: Stack, num_rows: int) -> int:
        """Bytes of the buffers :meth:`allocate` makes for ``num_rows`` vertices (float32)."""
        layers, L = model.block_layers, len(model.layers)
        widths = [layer.in_features for layer in layers]
        total = sum(2 * widths[l] for l in range(1, L))
        for l in range(L):
            proj = layers[l].projects_first
            agg = projected_width(layers[l], widths[l]) if proj else widths[l]
            total += 2 * agg if proj else 0
            total += agg if l < L - 1 and (layers[l].cacheable or proj) else 0
        return 4 * num_rows * total

    def buffers(self) -> list[Tensor]:
        """Every host buffer (not the features)."""
        return [*self.inputs.values(), *self.input_grads.values(), *self.projected.values(),
                *self.projected_grads.values(), *self.aggregates.values()]

    def input(self, layer: int) -> HostTable:
        return self.x if layer == 0 else self.inputs[layer]

    def source(self, layer: int) -> tuple[HostTable, HostTable | None]:
        """What a layer gathers per chunk (its input, or its projected rows) and the destination rows its UPDATE
        reads besides (projecting layers that read them only)."""
        if layer not in self.projecting:
            return self.input(layer), None
        return self.projected[layer], (self.input(layer) if layer in self.reading_dst else None)

    def source_grad(self, layer: int) -> Tensor | None:
        """Where a layer's backward adds its source rows' gradients (layer 0's features get none)."""
        if layer in self.projecting:
            return self.projected_grads[layer]
        return self.input_grads[layer] if layer > 0 else None

    def zero_grads(self) -> None:
        for t in (*self.input_grads.values(), *self.projected_grads.values()):
            t.zero_()
