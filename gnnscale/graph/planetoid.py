"""Planetoid pickles ``ind.<name>.*`` (the GCN reference format: Cora, CiteSeer, PubMed), read with an unpickler that
looks up numpy and scipy types only, and every array it gives checked (:mod:`gnnscale.graph.checks`) before numpy's
or scipy's C routines see it."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from gnnscale.errors import DatasetError
from gnnscale.graph.checks import check_csr, check_dense_size, check_index
from gnnscale.graph.graph import Graph
from gnnscale.graph.io import reading


def find_planetoid(root: Path | str, name: str) -> Path:
    """The folder holding ``ind.<name>.x``: ``root`` itself, or PyG's layouts ``root/raw`` and
    ``root/<Name>/raw`` (and ``root/<Name>``), the dataset folder's name matched case-insensitively (PyG writes
    ``Cora``, ``CiteSeer``, ``PubMed``). Raises DatasetError listing every folder looked in."""
    root = Path(root)
    stem = name.lower()
    named = [root / name]
    if root.is_dir():
        named += sorted(p for p in root.iterdir() if p.is_dir() and p.name.lower() == stem and p.name != name)
    candidates = [root, root / "raw", *(d / "raw" for d in named), *named]
    for c in candidates:
        if (c / f"ind.{stem}.x").is_file():
            return c
    looked = ", ".join(map(str, candidates))
    raise DatasetError(f"Planetoid files ind.{stem}.* not found (looked in {looked}); pass --root DIR")


class _PlanetoidUnpickler(pickle._Unpickler):
    """The Planetoid pickles hold numpy arrays, a scipy CSR matrix and a ``defaultdict`` of lists: only those
    types are looked up. Anything else a file names (``os.system``, ``builtins.eval``: a crafted file) is refused
    before it is called, with a :class:`DatasetError` naming the file and the global.

    A dtype's pickled state (byte order, item size, alignment, flags) is set by numpy's ``__setstate__`` without
    a check: a damaged one makes a dtype whose every use is an internal error. The pure-Python unpickler lets each
    ``BUILD`` of a dtype be checked first: its state must be the one numpy gives that dtype."""

    dispatch = dict(pickle._Unpickler.dispatch)  # type: ignore[attr-defined]

    ALLOWED = frozenset({
        ("numpy", "ndarray"), ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
        ("scipy.sparse.csr", "csr_matrix"), ("scipy.sparse._csr", "csr_matrix"),
        ("collections", "defaultdict"),
        ("__builtin__", "list"), ("builtins", "list"),
    })

    def __init__(self, fh: Any, path: Path):
        super().__init__(fh, encoding="latin1")
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self.ALLOWED:
            raise DatasetError(f"{self.path}: refused to load it: the pickle calls {module}.{name}, which a "
                               "Planetoid file never holds (loading it could run code)")
        return super().find_class(module, name)

    def load_build(self) -> None:
        inst, state = self.stack[-2], self.stack[-1]  # type: ignore[attr-defined]
        if isinstance(inst, np.dtype) and state != inst.__reduce__()[2]:
            raise DatasetError(f"{self.path}: damaged: the pickle gives the {inst} dtype the state {state!r:.60}, "
                               "which numpy never writes")
        super().load_build()  # type: ignore[misc]

    dispatch[pickle.BUILD[0]] = load_build  # type: ignore[assignment]


def read_planetoid(root: Path | str, name: str, normalize: bool = True, coalesce: bool = True) -> Graph:
    """Planetoid pickles ``ind.<name>.*`` (the GCN reference format), standard split.

    Features are row-normalised as in the GCN reference code unless ``normalize`` is false. The pickled adjacency
    lists some edges twice (Cora: 10,858 entries, 10,556 distinct); they are merged, as PyG's ``Planetoid`` does,
    unless ``coalesce`` is false.
    """
    root = Path(root)
    name = name.lower()

    def load(ext: str) -> Any:
        f = root / f"ind.{name}.{ext}"
        with reading(f), open(f, "rb") as fh:
            return _PlanetoidUnpickler(fh, f).load()  # numpy and scipy types only: a crafted file runs nothing

    x, tx, allx, y, ty, ally, graph = (load(e) for e in ("x", "tx", "allx", "y", "ty", "ally", "graph"))
    f = root / f"ind.{name}.test.index"
    with reading(f):
        test_index = np.array([int(line) for line in f.read_text().split()], dtype=np.int64)
    allx, tx, x = (_planetoid_matrix(m, root / f"ind.{name}.{e}") for m, e in ((allx, "allx"), (tx, "tx"), (x, "x")))
    ally, ty, y = (_planetoid_labels(m, root / f"ind.{name}.{e}") for m, e in ((ally, "ally"), (ty, "ty"), (y, "y")))
    _check_planetoid(root / f"ind.{name}", allx, tx, x, ally, ty, y, test_index, graph, name == "citeseer")
    with reading(root / f"ind.{name}.*"):
        check_dense_size(allx.shape[0] + tx.shape[0], allx.shape[1], 8, str(root / f"ind.{name}.allx"))
        allx, tx = (np.asarray(m.todense(), dtype=np.float32) for m in (allx, tx))
        sorted_test = np.sort(test_index)
        if name == "citeseer":  # isolated test vertices are missing from tx/ty: pad with zero rows
            span = sorted_test.max() - sorted_test.min() + 1
            tx_ext = np.zeros((span, tx.shape[1]), np.float32)
            tx_ext[sorted_test - sorted_test.min()] = tx
            ty_ext = np.zeros((span, ty.shape[1]), ty.dtype)
            ty_ext[sorted_test - sorted_test.min()] = ty
            tx, ty = tx_ext, ty_ext
        feats = np.vstack([allx, tx])
        labels = np.vstack([ally, ty]).argmax(1).astype(np.int64)
        feats[test_index] = feats[sorted_test]
        labels[test_index] = labels[sorted_test]
        n = feats.shape[0]
        src = [u for u, nbrs in graph.items() for _ in nbrs]
        dst = [v for nbrs in graph.values() for v in nbrs]
        ei = np.array([src, dst], dtype=np.int64)
        ei = ei[:, (ei[0] < n) & (ei[1] < n)]
    if normalize:
        s = feats.sum(1, keepdims=True)
        feats = feats / np.where(s == 0, 1, s)
    masks = [np.zeros(n, bool) for _ in range(3)]
    masks[0][: y.shape[0]] = True
    masks[1][y.shape[0] : y.shape[0] + 500] = True
    masks[2][test_index] = True
    return Graph.from_edge_index(
        ei,
        n,
        coalesce=coalesce,
        x=torch.from_numpy(feats.astype(np.float32)),
        y=torch.from_numpy(labels),
        train_mask=torch.from_numpy(masks[0]),
        val_mask=torch.from_numpy(masks[1]),
        test_mask=torch.from_numpy(masks[2]),
        name=name,
    )


def _planetoid_matrix(m: Any, f: Path) -> sp.csr_matrix:
    """A Planetoid feature matrix (a pickled scipy CSR matrix, or a dense array) rebuilt from its checked parts:
    the unpickled object's own arrays are never handed to scipy's C routines unchecked."""
    if isinstance(m, np.ndarray):
        if m.ndim != 2 or m.dtype.kind not in "biuf" or not np.isfinite(m).all():
            raise DatasetError(f"{f}: holds {m.dtype}{list(m.shape)}; expected a 2-D matrix of finite features")
        return sp.csr_matrix(m)
    if not isinstance(m, sp.csr_matrix):
        raise DatasetError(f"{f}: holds a {type(m).__name__}; expected a scipy CSR feature matrix")
    state = vars(m)
    parts = {k: state.get(k) for k in ("data", "indices", "indptr")}
    shape = state.get("_shape", state.get("shape"))
    if shape is None or any(v is None for v in parts.values()):
        raise DatasetError(f"{f}: the CSR matrix lacks its data, indices, indptr or shape")
    shape = check_csr(parts["indptr"], parts["indices"], shape, str(f), data=parts["data"], finite=True)
    return sp.csr_matrix((parts["data"], parts["indices"], parts["indptr"]), shape=shape)


def _planetoid_labels(m: Any, f: Path) -> np.ndarray:
    """A Planetoid label matrix: 2-D, numeric, one one-hot row per vertex."""
    if not isinstance(m, np.ndarray) or m.ndim != 2 or m.dtype.kind not in "biuf":
        found = f"{m.dtype}{list(m.shape)}" if isinstance(m, np.ndarray) else type(m).__name__
        raise DatasetError(f"{f}: holds {found}; expected a 2-D one-hot label matrix")
    return m


def _check_planetoid(stem: Path, allx: sp.csr_matrix, tx: sp.csr_matrix, x: sp.csr_matrix, ally: np.ndarray,
                     ty: np.ndarray, y: np.ndarray, test_index: np.ndarray, graph: Any, citeseer: bool) -> None:
    """The Planetoid files agree with each other: one feature width, one class count, one label row per feature
    row, test indices within the vertices, an adjacency dict of integer ids."""
    if len({allx.shape[1], tx.shape[1], x.shape[1]}) != 1:
        raise DatasetError(f"{stem}.*: x, allx and tx have {x.shape[1]:,}, {allx.shape[1]:,} and {tx.shape[1]:,} "
                           "feature columns; they must agree")
    if len({ally.shape[1], ty.shape[1], y.shape[1]}) != 1 or ally.shape[1] == 0:
        raise DatasetError(f"{stem}.*: y, ally and ty have {y.shape[1]}, {ally.shape[1]} and {ty.shape[1]} class "
                           "columns; they must agree")
    for feats, labels, what in ((allx, ally, "allx/ally"), (tx, ty, "tx/ty"), (x, y, "x/y")):
        if feats.shape[0] != labels.shape[0]:
            raise DatasetError(f"{stem}.*: {what} have {feats.shape[0]:,} and {labels.shape[0]:,} rows; they must "
                               "agree")
    if test_index.size == 0 or tx.shape[0] != test_index.size:
        raise DatasetError(f"{stem}.*: tx has {tx.shape[0]:,} rows for {test_index.size:,} test indices; they "
                           "must agree")
    # the test rows follow allx's (Citeseer's span the test indices' range, its isolated test vertices padded)
    span = int(test_index.max()) - int(test_index.min()) + 1 if citeseer else tx.shape[0]
    check_index(test_index, allx.shape[0] + max(span, 0), f"{stem}.test.index", "test vertex")
    if not isinstance(graph, dict) or not all(isinstance(v, list) for v in graph.values()):
        raise DatasetError(f"{stem}.graph: expected a dict of neighbour lists, found {type(graph).__name__}")
    if not all(isinstance(k, (int, np.integer)) for k in graph) or not all(
            isinstance(u, (int, np.integer)) for v in graph.values() for u in v):
        raise DatasetError(f"{stem}.graph: vertex ids must be integers")
