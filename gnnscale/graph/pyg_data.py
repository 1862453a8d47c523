"""What :meth:`Graph.from_pyg <gnnscale.graph.graph.Graph.from_pyg>` reads from a ``torch_geometric.data.Data``:
edges, one weight per edge, features (densified when sparse), labels and masks (one split's column when a mask
holds several, PyG's ``[N, k]``). Works on the ``Data``'s attributes only; it never imports PyG."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from gnnscale.errors import GraphError
from gnnscale.notes import note, warn

MASK_NAMES = ("train_mask", "val_mask", "test_mask")
# what from_pyg reads from a Data; anything else is dropped with a warning
_PYG_KEYS = frozenset({"edge_index", "x", "y", "num_nodes", "edge_weight", "edge_attr", *MASK_NAMES})


def pyg_arguments(data: Any, split: int | None = None) -> tuple[Tensor, int, Tensor | None, dict[str, Any]]:
    """``(edge_index, num_nodes, edge weights or None, x / y / masks)`` of a PyG ``Data`` for
    ``Graph.from_edge_index``; what is dropped is one warning, what is changed (weights from ``edge_attr``, a
    split picked, features densified) one note each."""
    if getattr(data, "edge_index", None) is None:
        raise GraphError(f"from_pyg: {type(data).__name__} has no edge_index (a PyG Data is expected)")
    num_edges = int(data.edge_index.shape[1])
    ew = getattr(data, "edge_weight", None)
    ea = getattr(data, "edge_attr", None)
    dropped = []
    if ew is not None:
        ew = _one_per_edge(ew, num_edges, "edge_weight")
        if ea is not None:
            dropped.append(f"edge_attr {list(ea.shape)} (edge_weight is used)")
    elif ea is not None:
        if ea.dim() == 1 or (ea.dim() == 2 and ea.shape[1] == 1):
            ew = _one_per_edge(ea, num_edges, "edge_attr")
            note(f"from_pyg: the one-column edge_attr {list(ea.shape)} is used as the edge weights")
        else:
            dropped.append(f"edge_attr {list(ea.shape)} (a Graph holds one weight per edge)")
    keys = data.keys() if callable(getattr(data, "keys", None)) else []
    dropped += sorted(k for k in keys if k not in _PYG_KEYS)
    if dropped:
        warn(f"from_pyg: dropped {', '.join(dropped)}")
    y = getattr(data, "y", None)
    kw: dict[str, Any] = {"x": _dense_features(getattr(data, "x", None)),
                          "y": None if y is None else y.long().view(-1), **_masks(data, split)}
    return data.edge_index, int(data.num_nodes), ew, kw


def _one_per_edge(w: Tensor, num_edges: int, what: str) -> Tensor:
    """``[E]`` float32 weights from ``w`` of shape ``[E]`` or ``[E, 1]``; another shape is a GraphError."""
    if w.shape not in ((num_edges,), (num_edges, 1)):
        raise GraphError(f"{what} has shape {tuple(w.shape)}, expected ({num_edges},) or ({num_edges}, 1)")
    return w.reshape(-1).float()


def _dense_features(x: Any) -> Tensor | None:
    """``x`` as a dense float32 tensor: a sparse one (torch's sparse layouts, or torch_sparse's ``SparseTensor``)
    is densified, with a note giving the size it takes."""
    if x is None:
        return None
    if not isinstance(x, Tensor) or x.layout != torch.strided:
        if not callable(getattr(x, "to_dense", None)):
            raise GraphError(f"from_pyg: x is a {type(x).__name__}; give a tensor")
        shape = tuple(int(d) for d in (x.shape if isinstance(x, Tensor) else x.sizes()))
        what = x.layout if isinstance(x, Tensor) else type(x).__name__
        size = 4 * shape[0] * (shape[1] if len(shape) > 1 else 1)
        try:
            dense = x.to_dense().float()
        except (RuntimeError, MemoryError) as exc:
            raise GraphError(f"from_pyg: x is a sparse tensor {list(shape)} that does not fit in memory dense "
                             f"({size / 2**30:.1f} GiB as float32)") from exc
        note(f"from_pyg: x is a sparse tensor ({what}, {list(shape)}); densified to float32 ({size / 2**20:.1f} MiB)")
        return dense.contiguous()
    return x.float().contiguous()


def _masks(data: Any, split: int | None) -> dict[str, Tensor | None]:
    """The train/val/test masks; a mask of several splits (``[N, k]``, one column per split, as PyG's WikiCS)
    gives its column ``split`` (default 0, said in a note)."""
    masks = {m: getattr(data, m, None) for m in MASK_NAMES}
    multi = {m: t for m, t in masks.items() if t is not None and t.dim() == 2}
    if not multi:
        if split is not None:
            warn(f"from_pyg: split={split} ignored: the masks hold one split each")
        return masks
    shapes = {tuple(t.shape) for t in multi.values()}
    shown = ", ".join(f"[{s[0]}, {s[1]}]" for s in sorted(shapes))
    k = min(s[1] for s in shapes)
    if split is not None and not 0 <= split < k:
        raise GraphError(f"from_pyg: split={split} is out of range: {', '.join(multi)} hold {k} splits (shape "
                         f"{shown}); give split=0..{k - 1}")
    if split is None:
        split = 0
        note(f"from_pyg: {', '.join(multi)} {'holds' if len(multi) == 1 else 'hold'} {k} splits (shape {shown}); "
             "split 0 is used (split=K picks another)")
    return {m: (multi[m][:, split].contiguous() if m in multi else t) for m, t in masks.items()}


def vertex_data(data: dict[str, Any]) -> dict[str, Any]:
    """The vertex data of a ``Graph.from_edge_index`` call as a Graph holds it, from what a PyG user has: numpy
    arrays (or lists) as tensors; features of another dtype (float64, integers) as float32, as ``from_pyg`` takes
    them (bfloat16 ones stay); integer labels (any width, or integral floats) as int64; string labels as classes
    ``0..C-1`` in sorted order, the names kept in ``meta["class_names"]`` (``Graph.class_names``; ``None`` or ``""``
    is an unlabelled vertex, ``-1``). A type that is none of these is a ``TypeError`` naming what to pass."""
    out = dict(data)
    x = _tensor("x", data.get("x"))
    if x is not None and x.dtype not in (torch.float32, torch.bfloat16):
        if x.dtype.is_complex:
            raise TypeError(f"x must hold real numbers, got {x.dtype}")
        x = x.float()
    out["x"] = x
    y = data.get("y")
    if y is not None:
        names = _string_labels(y)
        if names is not None:
            out["y"], out["meta"] = names[0], {**(data.get("meta") or {}), "class_names": names[1]}
            out.setdefault("num_classes", len(names[1]))
        else:
            out["y"] = _integer_labels(_tensor("y", y))
    for m in MASK_NAMES:
        out[m] = _tensor(m, data.get(m))
    return {k: v for k, v in out.items() if v is not None or k in data}


def _tensor(what: str, value: Any) -> Tensor | None:
    """``value`` as a tensor (numpy arrays and lists converted; a tensor as it is)."""
    if value is None or isinstance(value, Tensor):
        return value
    if isinstance(value, list | tuple) or hasattr(value, "__array__"):  # lists, pandas columns, ...
        value = np.asarray(value)
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        return torch.from_numpy(np.ascontiguousarray(value))
    kind = f"a numpy array of {value.dtype}" if isinstance(value, np.ndarray) else f"a {type(value).__name__}"
    raise TypeError(f"{what} must be a torch.Tensor or a numpy array of numbers, got {kind}")


def _string_labels(y: Any) -> tuple[Tensor, list[str]] | None:
    """String labels as ``(int64 classes, sorted names)``, ``None`` or ``""`` as ``-1``; ``None`` when ``y`` is not
    made of strings."""
    if isinstance(y, Tensor):
        return None
    arr = np.asarray(y, dtype=object) if isinstance(y, list | tuple) else np.asarray(y) if hasattr(
        y, "__array__") else y
    if not isinstance(arr, np.ndarray) or arr.dtype.kind not in "USO":
        return None
    flat = arr.reshape(-1)
    if arr.dtype.kind == "O" and not all(v is None or isinstance(v, str | bytes) for v in flat):
        return None  # numbers in an object array: read as numbers
    text = [None if v is None else v.decode() if isinstance(v, bytes) else str(v) for v in flat]
    names = sorted({t for t in text if t})
    index = {n: i for i, n in enumerate(names)}
    return torch.tensor([index[t] if t else -1 for t in text], dtype=torch.int64), names


def _integer_labels(y: Tensor | None) -> Tensor | None:
    """Integer labels as int64; integral floats too; fractional ones are a GraphError."""
    if y is None or y.dtype == torch.int64:
        return y
    if y.dtype.is_floating_point:
        if not bool(torch.all(y == torch.round(y))):
            raise GraphError(f"labels must be integers (or strings: class names), got fractional {y.dtype} values")
    elif y.dtype == torch.bool or y.dtype.is_complex:
        raise GraphError(f"labels must be integers (or strings: class names), got {y.dtype}")
    return y.long()
