"""gnnscale's own on-disk format and readers for the common public formats. Nothing here touches the network.

On-disk format (written by ``gnnscale convert``): a directory holding ``meta.json`` and one ``.npy`` per array
(``indptr``, ``indices``, optional ``edge_weight``, ``x``, ``y``, ``train_mask``, ``val_mask``, ``test_mask``,
``node_ids``: the original vertex ids of a renumbered edge list). ``meta.json``'s ``feature_dtype`` says how ``x.npy``
is read: ``float32`` (also when absent, as in directories written before it existed) or ``bfloat16``, stored as
the raw ``uint16`` bits (NumPy has no bfloat16) and mapped back as a zero-copy ``bfloat16`` view.
:func:`open_dir` memory-maps every array, so a graph larger than RAM opens instantly and pages in on use, and
registers each tensor it maps (:func:`gnnscale.graph.mapped.mapped_file` finds the file of exactly that tensor
again, on any OS: the disk tier reads rows from it instead of the mapping).
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import pickle
import shutil
import struct
import tempfile
import tokenize
import warnings
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from gnnscale.errors import DatasetError, GnnscaleError
from gnnscale.fsutil import honour_umask
from gnnscale.graph.checks import check_coo, check_csr, check_dense_size
from gnnscale.graph.generators import per_class_split
from gnnscale.graph.graph import FEATURE_DTYPES, MASK_NAMES, Graph, feature_dtype_name
from gnnscale.graph.mapped import register_mapped
from gnnscale.notes import note

FORMAT = "gnnscale-graph"
FORMAT_VERSION = 1
_ARRAYS = ("indptr", "indices", "edge_weight", "x", "y", *MASK_NAMES, "node_ids")
# Errors a reader raises on a truncated or malformed file; they become one DatasetError naming the file.
_READ_ERRORS = (OSError, ValueError, EOFError, KeyError, IndexError, pickle.UnpicklingError, zipfile.BadZipFile,
                zlib.error, UnicodeDecodeError, json.JSONDecodeError, TypeError, AttributeError, OverflowError,
                SyntaxError, tokenize.TokenError,  # these two: numpy parsing a damaged .npy header
                NotImplementedError, struct.error)  # a zip header naming another version; a truncated pickle frame


@contextmanager
def reading(path: Path | str) -> Iterator[None]:
    """Turn any low-level failure while reading ``path`` into a one-line :class:`DatasetError`."""
    try:
        yield
    except GnnscaleError:
        raise
    except FileNotFoundError as exc:
        raise DatasetError(f"file not found: {exc.filename or path}") from exc
    except _READ_ERRORS as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DatasetError(f"cannot read {path}: corrupt or not in the expected format ({msg})") from exc
    except MemoryError as exc:  # a size in the file beyond this machine's memory (a damaged or crafted header)
        raise DatasetError(f"cannot read {path}: what it says it holds does not fit in memory") from exc


# ------------------------------------------------------------------------------------------ own format
def save(graph: Graph, out: Path | str) -> Path:
    """Write ``graph`` to directory ``out`` atomically (a temporary sibling directory renamed at the end).

    Raises DatasetError if ``out`` already exists; nothing is left behind on failure.
    """
    out = Path(out)
    if out.exists():
        raise DatasetError(f"output directory {out} already exists; choose a new path")
    if not out.parent.exists():
        raise DatasetError(f"parent directory {out.parent} does not exist")
    with partial_dir(out) as tmp:
        arrays: dict[str, Any] = {}
        for name in _ARRAYS:
            t = getattr(graph, name)
            if t is None:
                continue
            # NumPy has no bfloat16: bfloat16 features are saved as their raw uint16 bits (meta.json says so)
            arr = t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()
            np.save(tmp / f"{name}.npy", arr)
            arrays[name] = {"dtype": str(arr.dtype), "shape": list(arr.shape)}
        if graph.meta.get("classes"):  # the class names of string labels, class i at index i (convert --labels)
            (tmp / CLASSES_FILE).write_text(json.dumps(graph.meta["classes"], indent=1) + "\n")
        write_meta(tmp, name=graph.name, num_nodes=graph.num_nodes, num_edges=graph.num_edges,
                   num_classes=graph.num_classes, arrays=arrays,
                   feature_dtype=None if graph.x is None else feature_dtype_name(graph.x.dtype), meta=graph.meta)
    return out


@contextmanager
def partial_dir(out: Path) -> Iterator[Path]:
    """A hidden temporary sibling of ``out`` (``.<name>.*.partial``, holding the writer's pid) to write into; renamed
    to ``out`` when the ``with`` body ends, removed (with all it holds) when it raises, Ctrl-C included."""
    remove_stale_partials(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=PARTIAL_SUFFIX, dir=out.parent))
    try:
        (tmp / PARTIAL_PID).write_text(str(os.getpid()))
        yield tmp
        (tmp / PARTIAL_PID).unlink()
        honour_umask(tmp)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_meta(folder: Path, *, name: str, num_nodes: int, num_edges: int, num_classes: int | None,
               arrays: dict[str, Any], feature_dtype: str | None, meta: dict[str, Any]) -> None:
    """``folder/meta.json`` as :func:`save` writes it (``arrays``: name -> dtype and shape, in ``_ARRAYS`` order)."""
    doc = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "name": name,
        "num_nodes": num_nodes,
        "num_edges": num_edges,
        "num_classes": num_classes,
        "arrays": arrays,
        **({} if feature_dtype is None else {"feature_dtype": feature_dtype}),
        "meta": meta,
    }
    (folder / "meta.json").write_text(json.dumps(doc, indent=2) + "\n")


CLASSES_FILE = "classes.json"
"""A converted directory's class names (a JSON list, class ``i`` at index ``i``), when its labels were names."""
PARTIAL_SUFFIX = ".partial"
PARTIAL_PID = ".writer-pid"


def remove_stale_partials(out: Path | str) -> list[Path]:
    """Remove what an interrupted :func:`save` to ``out`` left (a hidden ``.<name>.*.partial`` sibling whose
    writer process is gone, e.g. after ``kill -9``); returns the folders removed. A live writer's is kept."""
    out = Path(out)
    removed = []
    for d in out.parent.glob(f".{out.name}.*{PARTIAL_SUFFIX}"):
        try:
            pid = int((d / PARTIAL_PID).read_text())
        except (OSError, ValueError):
            pid = None
        if pid is not None and pid != os.getpid() and _alive(pid):
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_graph_dir(path: Path | str) -> bool:
    return (Path(path) / "meta.json").is_file()


def is_partial_dir(path: Path | str) -> bool:
    """Whether ``path`` is what an interrupted :func:`save` left (:func:`partial_dir`'s folder, or a copy of it)."""
    path = Path(path)
    return path.name.endswith(PARTIAL_SUFFIX) or (path / PARTIAL_PID).is_file()


def open_dir(path: Path | str) -> Graph:
    """Open a directory written by :func:`save`, memory-mapping every array (copy-on-write)."""
    path = Path(path)
    with reading(path / "meta.json"):
        meta = json.loads((path / "meta.json").read_text())
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise DatasetError(f"{path} is not a gnnscale graph directory (meta.json has no format '{FORMAT}')")
        if meta.get("version") != FORMAT_VERSION:
            raise DatasetError(f"{path} has format version {meta.get('version')}; this gnnscale reads {FORMAT_VERSION}")
        fdtype = meta.get("feature_dtype", "float32")  # directories written before bfloat16 hold float32
        if fdtype not in FEATURE_DTYPES:
            raise DatasetError(f"{path}/meta.json: feature_dtype {fdtype!r} is not one this gnnscale reads "
                               f"({', '.join(FEATURE_DTYPES)})")
        data: dict[str, Any] = {}
        for name, info in meta["arrays"].items():
            if name not in _ARRAYS:
                raise DatasetError(f"{path}/meta.json lists unknown array {name!r}")
            f = path / f"{name}.npy"
            _check_inside(f, path)
            if not f.exists():
                raise DatasetError(f"{path} is incomplete: meta.json lists {name} but {f.name} is missing; convert "
                                   "the dataset again (or copy the whole directory)")
            with reading(f):
                arr = _map_npy(f)
            if list(arr.shape) != info["shape"] or str(arr.dtype) != info["dtype"]:
                raise DatasetError(
                    f"{f} holds {arr.dtype}{list(arr.shape)} but meta.json says {info['dtype']}{info['shape']}"
                )
            with warnings.catch_warnings():  # a read-only map (see _map_npy): torch warns that it is not writable
                warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
                if name == "x" and fdtype == "bfloat16":
                    if arr.dtype != np.uint16:
                        raise DatasetError(f"{f} holds {arr.dtype} but meta.json says bfloat16 features (stored as "
                                           "uint16 bits)")
                    data[name] = torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)  # zero-copy: the map
                else:
                    data[name] = torch.from_numpy(arr)
            if isinstance(arr, np.memmap):  # (an empty array is not mapped)
                register_mapped(data[name], f, int(arr.offset))
        if "indptr" not in data or "indices" not in data:
            raise DatasetError(f"{path} lacks indptr.npy or indices.npy")
        _check_counts(path, meta, data)
        return Graph(name=meta["name"], num_classes=meta["num_classes"], meta=meta.get("meta", {}), **data)


def _check_inside(f: Path, folder: Path) -> None:
    """A converted directory's file must be the directory's own: a symbolic link to a file elsewhere (a ``y.npy``
    linked to another graph's labels) is refused, naming the file and where it leads."""
    real = f.resolve()
    if not real.is_relative_to(folder.resolve()):
        raise DatasetError(f"{f} is a link to {real}, outside {folder}; a converted directory must hold its own "
                           "files: copy the file in, or convert again")


def _check_counts(path: Path, meta: dict[str, Any], data: dict[str, Any]) -> None:
    """``meta.json``'s ``num_nodes`` and ``num_edges`` are the arrays' (an edited count is refused, not ignored)."""
    classes = meta.get("num_classes")
    if classes is not None and (isinstance(classes, bool) or not isinstance(classes, int) or not 1 <= classes < 2**31):
        raise DatasetError(f"{path}/meta.json says num_classes {classes!r}; expected a count from 1 (or null)")
    have = {"num_nodes": int(data["indptr"].numel()) - 1, "num_edges": int(data["indices"].numel())}
    for key, n in have.items():
        said = meta.get(key)
        if said is not None and (isinstance(said, bool) or not isinstance(said, int) or said != n):
            raise DatasetError(f"{path}/meta.json says {key} {said!r} but the arrays hold {n:,}; the counts must "
                               "match (convert the dataset again rather than editing meta.json)")


def _map_npy(f: Path) -> np.ndarray:
    """``f`` memory-mapped copy-on-write; read-only where the kernel refuses a private writable map of that size
    (ENOMEM: with Linux's default overcommit heuristic, a file larger than RAM and swap, such as a 27 GB ``x.npy``
    on a 24 GiB machine). Nothing in gnnscale writes to a loaded graph's arrays; a read-only one would fault."""
    try:
        return np.load(f, mmap_mode="c", allow_pickle=False)
    except OSError as exc:
        if exc.errno != errno.ENOMEM:
            raise
        return np.load(f, mmap_mode="r", allow_pickle=False)


def stored_feature_dtype(path: Path | str) -> torch.dtype | None:
    """``bfloat16`` for the ``x.npy`` of a graph directory whose ``meta.json`` says ``feature_dtype: bfloat16``
    (:func:`open_dir` reads its ``uint16`` bits so); ``None`` for any other file (read as its own dtype)."""
    path = Path(path)
    if path.name != "x.npy" or not is_graph_dir(path.parent):
        return None
    with reading(path.parent / "meta.json"):
        meta = json.loads((path.parent / "meta.json").read_text())
    ok = isinstance(meta, dict) and meta.get("format") == FORMAT and meta.get("feature_dtype") == "bfloat16"
    return torch.bfloat16 if ok else None


# --------------------------------------------------------------------------------------------- readers
def read_npz(
    path: Path | str,
    seed: int = 0,
    train_per_class: int = 20,
    val_per_class: int = 30,
    coalesce: bool = False,
    self_loops: bool = False,
) -> Graph:
    """gnn-benchmark npz (raw files of PyG's Amazon/Coauthor) with a seeded per-class split.

    The adjacency is read as PyG's ``torch_geometric.io.read_npz`` reads it: self-loops removed (Amazon Photo
    lists one; a one-line note says how many, ``self_loops=1`` keeps them), then symmetrised. Two differences,
    both kept on purpose: repeated adjacency entries stay multi-edges unless ``coalesce`` (PyG's ``to_undirected``
    merges them; none of the Amazon files has any), and features keep their stored values (PyG sets every
    positive value to 1; the Amazon files store only ones, so the matrices are equal).
    """
    path = Path(path)
    _check_npz(path)
    with reading(path), open(path, "rb") as fh, np.load(fh, allow_pickle=False) as d:
        adj = _npz_csr(d, "adj", path)
        n = adj.shape[0]
        if adj.shape[1] != n:
            raise DatasetError(f"{path}: the adjacency is {n:,} x {adj.shape[1]:,}; it must be square")
        if "attr_data" in d:
            attr = _npz_csr(d, "attr", path)
            check_dense_size(attr.shape[0], attr.shape[1], 4, f"{path}: attr")
            feats = attr.toarray()
        elif "attr_matrix" in d:
            feats = np.asarray(d["attr_matrix"])
            if feats.ndim != 2 or feats.dtype.kind not in "biuf":
                raise DatasetError(f"{path}: attr_matrix holds {feats.dtype}{list(feats.shape)}; expected a 2-D "
                                   "numeric matrix")
        else:
            raise DatasetError(f"{path}: no features (neither attr_data/attr_indices/attr_indptr/attr_shape nor "
                               "attr_matrix)")
        if "labels" not in d:
            raise DatasetError(f"{path}: no labels array")
        labels = class_labels(d["labels"], f"{path}")
    if labels.shape[0] != n or feats.shape[0] != n:
        raise DatasetError(
            f"{path}: adjacency has {n} rows but features/labels have {feats.shape[0]}/{labels.shape[0]}"
        )
    coo = sp.coo_matrix(adj)
    ei = np.vstack([coo.row, coo.col]).astype(np.int64)
    loops = ei[0] == ei[1]
    if not self_loops and loops.any():
        ei = ei[:, ~loops]
        k = int(loops.sum())
        note(f"{path.name}: removed {k} self-loop{'s' if k > 1 else ''}, as PyG's read_npz does "
             "(self_loops=1 keeps them)")
    tr, va, te = per_class_split(labels, train_per_class, val_per_class, np.random.default_rng(seed))
    g = Graph.from_edge_index(
        ei,
        n,
        coalesce=coalesce,
        x=torch.from_numpy(feats.astype(np.float32)),
        y=torch.from_numpy(labels),
        train_mask=tr,
        val_mask=va,
        test_mask=te,
        name=path.name.removesuffix(".npz"),
    )
    return symmetrized(g)


def _check_npz(path: Path) -> None:
    """An npz file is a zip archive of ``.npy`` arrays: anything else (an edge list, a gzip file) is one error
    saying so, before numpy guesses at it (its own message talks about pickles)."""
    with reading(path), open(path, "rb") as fh:
        magic = fh.read(4)
    if magic[:2] != b"PK":
        kind = "a gzip file" if magic[:2] == b"\x1f\x8b" else ("an .npy array" if magic == b"\x93NUM" else "")
        hint = "; an edge list is read with edgelist:<file>" if kind != "an .npy array" else ""
        raise DatasetError(f"{path} is not an npz file (a zip archive of .npy arrays, as np.savez writes)"
                           f"{f': it is {kind}' if kind else ''}{hint}")


def _npz_csr(d: Any, prefix: str, path: Path) -> sp.csr_matrix:
    """The CSR matrix stored as ``<prefix>_data``, ``_indices``, ``_indptr``, ``_shape`` in the npz ``d``, checked
    (:func:`gnnscale.graph.checks.check_csr`) before scipy sees it."""
    parts = [f"{prefix}_{k}" for k in ("data", "indices", "indptr", "shape")]
    missing = [p for p in parts if p not in d]
    if missing:
        raise DatasetError(f"{path}: no {', '.join(missing)} array (a gnn-benchmark npz stores each sparse matrix "
                           "as _data, _indices, _indptr and _shape)")
    data, indices, indptr, shape = (d[p] for p in parts)
    shape = check_csr(indptr, indices, shape, str(path), data=data, part=prefix, finite=prefix == "attr")
    return sp.csr_matrix((data, indices, indptr), shape=shape)


def class_labels(values: Any, where: str) -> np.ndarray:
    """``[N]`` int64 class labels from ``values``: integers as they are, floats only where integral (``2.0`` is
    class 2; NaN is ``-1``, unlabelled, as OGB writes it). Other floats (regression targets such as 0.0-4.0) are
    one DatasetError naming ``where`` and the first such value: truncating them would make up classes."""
    v = np.asarray(values).reshape(-1)
    if v.dtype.kind in "iub":
        return v.astype(np.int64)
    if v.dtype.kind != "f":
        raise DatasetError(f"{where}: labels of type {v.dtype} are not class numbers; give integer class labels")
    nan = np.isnan(v)
    bad = ~nan & ((v != np.round(v)) | np.isinf(v))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise DatasetError(f"{where}: labels are not integral ({int(bad.sum()):,} of {v.size:,}, the first "
                           f"{v[i]:g} at vertex {i}): gnnscale trains classifiers, and regression targets are not "
                           "classes; give integer class labels (floats such as 1.0 are read as classes)")
    huge = ~nan & (np.abs(v) >= 2.0**62)  # integral, but beyond any class count (and int64: a cast would wrap)
    if huge.any():
        i = int(np.flatnonzero(huge)[0])
        raise DatasetError(f"{where}: label {v[i]:g} at vertex {i} is not a class number; give class labels 0..C-1")
    out = np.where(nan, -1, v).astype(np.int64)
    return out


def symmetrized(g: Graph, what: str | None = None) -> Graph:
    """``g.symmetrize()``, recorded in ``meta["symmetrized_from_edges"]`` (``gnnscale info`` shows it); with
    ``what`` (a file name), also said in a one-line note ``symmetrised WHAT: E -> E' edges``."""
    s = g.symmetrize()
    s.meta = {**g.meta, "symmetrized_from_edges": g.num_edges}
    if what is not None:
        note(f"symmetrised {what}: {g.num_edges:,} -> {s.num_edges:,} edges")
    return s


def _read_csv(path: Path, dtype: type) -> np.ndarray:
    with reading(path):
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as fh:  # type: ignore[operator]
            lines = [ln for ln in fh.read().splitlines() if ln.strip()]
        if not lines:
            return np.zeros((0, 1), dtype=dtype)
        cols = len(lines[0].split(","))
        vals = np.array(",".join(lines).split(","), dtype=np.float64)
        if vals.size != cols * len(lines):
            raise DatasetError(f"{path}: rows have different numbers of columns")
        if np.dtype(dtype).kind in "iu":  # ids and indices: integers, within int64 (no silent cast of NaN or 1e30)
            bad = ~np.isfinite(vals) | (vals != np.round(vals)) | (np.abs(vals) >= 2.0**63)
            if bad.any():
                raise DatasetError(f"{path}: value {float(vals[np.flatnonzero(bad)[0]])!r} is not an integer id")
        return vals.reshape(len(lines), cols).astype(dtype)


def read_ogb(root: Path | str, name: str, symmetrize: bool = True, coalesce: bool = False) -> Graph:
    """OGB node-property-prediction directory: ``raw/edge.csv.gz``, ``raw/node-feat.csv.gz``,
    ``raw/node-label.csv.gz``, ``split/<type>/{train,valid,test}.csv.gz``. Symmetrised by default; repeated edges
    are multi-edges unless ``coalesce``.

    ``root`` may be the dataset directory itself or hold it as ``<name>`` or ``<name with _ for ->``.
    """
    root = Path(root)
    candidates = [root / name, root / name.replace("-", "_"), root]
    base = next((c for c in candidates if (c / "raw").is_dir()), None)
    if base is None:
        looked = ", ".join(map(str, candidates))
        raise DatasetError(f"no OGB dataset {name!r} under {root} (looked for raw/ in {looked})")
    raw = base / "raw"

    def find(stem: Path) -> Path:
        for p in (stem.with_name(stem.name + ".csv.gz"), stem.with_name(stem.name + ".csv")):
            if p.exists():
                return p
        raise DatasetError(f"file not found: {stem}.csv.gz")

    ei = _read_csv(find(raw / "edge"), np.int64).T
    if ei.shape[0] != 2:
        raise DatasetError(f"{raw}/edge.csv: expected 2 columns, got {ei.shape[0]}")
    feats = _read_csv(find(raw / "node-feat"), np.float32)
    labels = class_labels(_read_csv(find(raw / "node-label"), np.float64), f"{raw}/node-label")
    n = feats.shape[0]
    nn_file = raw / "num-node-list.csv.gz"
    if nn_file.exists():
        counts = _read_csv(nn_file, np.int64).reshape(-1)
        if counts.size != 1 or int(counts[0]) != n:
            raise DatasetError(f"{nn_file}: says {counts.tolist()} vertices but node-feat has {n:,} rows; they "
                               "must agree")
    check_coo(ei[0], ei[1], (n, n), str(find(raw / "edge")), part="edge list's")
    split_dirs = sorted(p for p in (base / "split").glob("*") if p.is_dir()) if (base / "split").is_dir() else []
    if not split_dirs:
        raise DatasetError(f"no split/<type>/ directory in {base}")
    masks = []
    for part in ("train", "valid", "test"):
        idx = _read_csv(find(split_dirs[0] / part), np.int64).reshape(-1)
        m = torch.zeros(n, dtype=torch.bool)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise DatasetError(f"{split_dirs[0]}/{part}: vertex id out of range for {n} vertices")
        m[torch.from_numpy(idx)] = True
        masks.append(m)
    g = Graph.from_edge_index(
        ei,
        n,
        coalesce=coalesce,
        x=torch.from_numpy(feats),
        y=torch.from_numpy(labels),
        train_mask=masks[0],
        val_mask=masks[1],
        test_mask=masks[2],
        name=name,
    )
    return symmetrized(g) if symmetrize else g
