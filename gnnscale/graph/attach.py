"""Bring your own vertex data: ``gnnscale convert --features FILE.npy --labels FILE.csv`` puts them on a graph
(an edge list's, whose features and labels are otherwise made up), checked against it. The files are data only:
``np.load(allow_pickle=False)``, and the CSV parsed as text.

* ``--features FILE.npy``: one ``[N, F]`` numeric array, row ``i`` the features of vertex ``i`` in the graph's
  vertex order (an edge list's ids in increasing order, or the ids themselves with ``--keep-ids``); stored as
  float32, or bfloat16 with ``--feature-dtype bf16``.
* ``--labels FILE.csv``: lines ``id,label`` (an optional ``id,label`` header, ``#`` comments): ``id`` a vertex's
  id as the edge list gives it, ``label`` a class name or number. Vertices not listed are unlabelled (``-1``).
  Labels that are all non-negative integers are the classes themselves; otherwise the distinct names, sorted, are
  classes ``0..C-1`` and the list is kept (``meta["classes"]``, ``classes.json`` of the converted directory).
  Labels come with a new random split of the labelled vertices (25/50/25, seeded with ``--seed``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from gnnscale.errors import DatasetError
from gnnscale.graph.generators import random_split
from gnnscale.graph.graph import Graph

__all__ = ["attach_features", "attach_labels"]

SPLIT = (0.25, 0.5, 0.25)
"""The train/val/test fractions of the labelled vertices (as an edge list's made-up labels)."""


def _without(meta: dict[str, object], key: str, parts: tuple[str, ...]) -> list[str]:
    return [p for p in (meta.get(key) or []) if p not in parts]  # type: ignore[attr-defined]


def attach_features(g: Graph, path: str | Path) -> Graph:
    """``g`` with the features of the ``.npy`` file ``path`` (float32); DatasetError naming the file when it is not
    one ``[g.num_nodes, F]`` array of finite numbers."""
    p = Path(path)
    try:
        arr = np.load(p, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise DatasetError(f"--features {p}: no such file") from None
    except (OSError, ValueError, EOFError) as exc:
        raise DatasetError(f"--features {p}: not a .npy array file ({' '.join(str(exc).split())[:120]})") from None
    if not isinstance(arr, np.ndarray):
        raise DatasetError(f"--features {p}: an .npz archive; give one array saved with np.save (.npy)")
    n = g.num_nodes
    if arr.ndim != 2 or arr.shape[0] != n or arr.shape[1] < 1:
        raise DatasetError(f"--features {p}: shape {list(arr.shape)}, but {g.name} has {n:,} vertices: give an "
                           f"[{n}, F] array, row i for vertex i")
    if arr.dtype.kind not in "fiub":
        raise DatasetError(f"--features {p}: holds {arr.dtype}, not numbers")
    x = torch.from_numpy(np.array(arr, dtype=np.float32))  # [N, F], read into memory
    bad = ~torch.isfinite(x).all(1)
    if bool(bad.any()):
        raise DatasetError(f"--features {p}: row {int(torch.nonzero(bad)[0])} is not finite (NaN or inf)")
    meta = dict(g.meta)
    meta["made_up"] = _without(meta, "made_up", ("features",))
    meta["generated"] = _without(meta, "generated", ("features",))
    meta["features_from"] = str(p)
    return replace(g, x=x, meta=meta)


def attach_labels(g: Graph, path: str | Path, seed: int) -> Graph:
    """``g`` with the labels of the CSV file ``path`` (module docstring) and a new split; DatasetError naming the
    file and line for a malformed line, an id that is no vertex of ``g``, an id listed twice or no label at all."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise DatasetError(f"--labels {p}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"--labels {p}: cannot read it as text ({' '.join(str(exc).split())[:120]})") from None
    ids: list[int] = []
    names: list[str] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line or (not ids and line.replace(" ", "").lower() == "id,label"):
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 2 or not fields[1]:
            raise DatasetError(f"--labels {p}: line {number}: expected 'id,label', got {raw.strip()!r}")
        try:
            ids.append(int(fields[0]))
        except ValueError:
            raise DatasetError(f"--labels {p}: line {number}: vertex id {fields[0]!r} is not an integer") from None
        names.append(fields[1])
    if not ids:
        raise DatasetError(f"--labels {p}: no 'id,label' lines")
    vertex = _vertices(g, np.array(ids, dtype=object), p)
    seen, first = np.unique(vertex, return_index=True)
    if seen.size < vertex.size:
        dup = np.setdiff1d(np.arange(vertex.size), first)[0]
        raise DatasetError(f"--labels {p}: vertex id {ids[int(dup)]} is listed twice")
    numeric = all(s.isdigit() for s in names)
    if numeric and max(int(s) for s in names) >= 1 << 31:
        raise DatasetError(f"--labels {p}: label {max(names, key=int)} is too large for a class number")
    classes = sorted(set(names)) if not numeric else None
    index = {s: i for i, s in enumerate(classes or [])}
    y = torch.full((g.num_nodes,), -1, dtype=torch.int64)
    y[torch.from_numpy(vertex)] = torch.tensor([int(s) if numeric else index[s] for s in names], dtype=torch.int64)
    labelled = torch.from_numpy(vertex[np.argsort(vertex)])
    masks = []
    for m in random_split(labelled.numel(), SPLIT, np.random.default_rng(seed)):
        full = torch.zeros(g.num_nodes, dtype=torch.bool)
        full[labelled[m]] = True
        masks.append(full)
    meta = dict(g.meta)
    meta["made_up"] = _without(meta, "made_up", ("labels",))
    meta["generated"] = [*_without(meta, "generated", ("labels", "split")), "split"]
    meta["seed"] = int(seed)
    meta["labels_from"] = str(p)
    if classes is not None:
        meta["classes"] = classes
    else:
        meta.pop("classes", None)
    num_classes = len(classes) if classes is not None else int(y.max()) + 1
    return replace(g, y=y, num_classes=num_classes, train_mask=masks[0], val_mask=masks[1], test_mask=masks[2],
                   meta=meta)


def _vertices(g: Graph, ids: np.ndarray, p: Path) -> np.ndarray:
    """The vertices of the original ``ids`` (an edge list's, renumbered or kept)."""
    known = None if g.node_ids is None else g.node_ids.numpy()
    n = g.num_nodes
    out = np.empty(len(ids), dtype=np.int64)
    for i, v in enumerate(ids):
        if known is None:
            ok = 0 <= v < n
            out[i] = v if ok else -1
        else:
            j = int(np.searchsorted(known, v)) if -(2**63) <= v < 2**63 else n
            ok = j < n and int(known[j]) == v
            out[i] = j if ok else -1
        if not ok:
            raise DatasetError(f"--labels {p}: vertex id {v} is not a vertex of {g.name} (its {n:,} vertices"
                               + (f" have ids {int(known[0])}..{int(known[-1])})" if known is not None
                                  else f" are 0..{n - 1})"))
    return out
