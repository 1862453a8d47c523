"""Peak counting for :mod:`benchmarks.taskparallel` (not a benchmark): a live-bytes counter that remembers the
tensors live at its peak, what the in-memory engine keeps on its device, and the engines' counted units."""

from __future__ import annotations

import collections
from typing import Any

import torch
from torch import Tensor

from gnnscale.engines import InMemoryEngine, OffloadEngine, TaskParallelEngine
from gnnscale.plan.memory import LiveBytesCounter


class PeakTensors(LiveBytesCounter):
    """A :class:`LiveBytesCounter` that also remembers the shape and dtype of every tensor it tracks and, at each
    new peak, which tensors were live (``--explain-peaks``)."""

    def __init__(self, baseline: int = 0):
        super().__init__(baseline)
        self.meta: dict[int, tuple[tuple[int, ...], str]] = {}
        self.at_peak: list[tuple[tuple[int, ...], str, int]] = []

    def _track(self, t: Any) -> None:
        if isinstance(t, Tensor) and t.layout == torch.strided and t.device.type != "meta":
            key = t.untyped_storage().data_ptr()
            entry = self.live.get(key)
            if entry is None or entry[0].expired():  # a new storage (not a second view of a live one)
                self.meta[key] = (tuple(t.shape), str(t.dtype).removeprefix("torch."))
        super()._track(t)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        before = self.peak
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if self.peak > before:
            self.at_peak = [(*self.meta.get(k, ((), "?")), b) for k, (ref, b) in self.live.items()
                            if not ref.expired()]
        return out

    def summary(self, top: int = 8) -> list[dict[str, Any]]:
        """The live tensors at the peak grouped by (shape, dtype), largest total first."""
        groups: dict[tuple[tuple[int, ...], str], list[int]] = collections.defaultdict(list)
        for shape, dtype, b in self.at_peak:
            groups[(shape, dtype)].append(b)
        rows: list[dict[str, Any]] = [{"shape": list(s), "dtype": d, "count": len(bs), "bytes": sum(bs)}
                                      for (s, d), bs in groups.items()]
        rows.sort(key=lambda r: -r["bytes"])
        return rows[:top]


def _resident_bytes(tensors: list[Any]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (sparse tensors: their components)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if not isinstance(t, Tensor):
            continue
        if t.layout == torch.sparse_csr:
            parts = [t.crow_indices(), t.col_indices(), t.values()]
        elif t.layout == torch.strided:
            parts = [t]
        else:  # pragma: no cover - no other layout is kept by the engines
            continue
        for p in parts:
            s = p.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def inmemory_resident(engine: InMemoryEngine) -> int:
    """What the in-memory engine keeps on its device between epochs: the whole graph's block (with its cached
    sparse matrices), features, labels, masks, parameters and Adam's state."""
    b = engine.block
    tensors: list[Any] = [b.indptr, b.indices, b.edge_weight, b.src_ids, b.t_indptr, b.t_indices, b.t_weight,
                          *b._cache.values(), engine.x, engine.y, *engine.masks.values(),
                          *engine.model.parameters()]
    for state in engine.optimizer.state.values():
        tensors.extend(v for v in state.values() if isinstance(v, Tensor))
    return _resident_bytes(tensors)


def counted_units(engine: Any) -> list[Any]:
    """The engine's per-device objects that hold a ``counter`` (task-parallel runners, offload workers)."""
    if isinstance(engine, TaskParallelEngine):
        return list(engine.runners)
    if isinstance(engine, OffloadEngine):
        return [w for w in engine.workers if w.counter is not None] + ([engine] if engine.counter is not None else [])
    return []
