"""Issue #44, item 1: every reader against mutated files. Valid tiny files of each kind (npz, Planetoid pickles, edge
lists, OGB directories, converted directories, saved models, checkpoints) are written in a temporary folder, then
hypothesis mutates their bytes, arrays, indices, shapes and metadata; each case must either load or end in one
``error:`` line with exit status 2: never a signal (a C routine writing past a buffer), never a traceback.

``make test`` runs a bounded, derandomised number of cases in-process (``gnnscale.cli.main``), and one subprocess
with the files that used to crash it. ``make fuzz`` sets ``GNNSCALE_FUZZ_EXAMPLES`` (cases per reader) and
``GNNSCALE_FUZZ_ISOLATED=1``: the cases then run in a worker process (one for many cases, a new one after a crash), so
a segfault fails its case instead of ending pytest.
"""

from __future__ import annotations

import atexit
import contextlib
import gzip
import io as pyio
import json
import os
import pickle
import select
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gnnscale.cli import main
from gnnscale.graph import io
from gnnscale.graph.generators import csbm

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = int(os.environ.get("GNNSCALE_FUZZ_EXAMPLES", "0"))
ISOLATED = os.environ.get("GNNSCALE_FUZZ_ISOLATED") == "1"
FUZZ = settings(max_examples=EXAMPLES or 12, deadline=None, database=None, derandomize=not EXAMPLES,
                suppress_health_check=list(HealthCheck))
# values an index array may be mutated to: the boundaries, far beyond them, and the integer limits
SPECIAL = [0, 1, -1, 2, 5, 6, 7, 8, 1500, 2**31 - 1, 2**31, 10**9, 2**62, -(2**31), -(2**63), 2**63 - 1]
TOKENS = ["0", "-1", "7", "99", "1e9", "1000000000", "9223372036854775807", "99999999999999999999", "nan", "inf",
          "-inf", "1.5", "x", "", "#", ",", "0,0", "\t"]


# ------------------------------------------------------------------------------------------- valid files
def _npz(path: Path) -> Path:
    """A 6-vertex gnn-benchmark npz: a ring as CSR adjacency, sparse CSR features, integer labels."""
    adj = sp.csr_matrix(np.roll(np.eye(6, dtype=np.float32), 1, axis=1) + np.roll(np.eye(6, dtype=np.float32), -1, 1))
    attr = sp.csr_matrix(np.eye(6, 4, dtype=np.float32))
    np.savez(path, adj_data=adj.data, adj_indices=adj.indices, adj_indptr=adj.indptr, adj_shape=np.array(adj.shape),
             attr_data=attr.data, attr_indices=attr.indices, attr_indptr=attr.indptr,
             attr_shape=np.array(attr.shape), labels=np.array([0, 1, 2, 0, 1, 2]))
    return path


def _planetoid_parts() -> dict[str, Any]:
    """A tiny Planetoid set named cora: 6 training-pool vertices (2 labelled), 2 test vertices, 4 features."""
    def onehot(c: list[int]) -> np.ndarray:
        return np.eye(3, dtype=np.int64)[c]

    allx = sp.csr_matrix(np.eye(6, 4, dtype=np.float32) + 0.5)
    return {"x": sp.csr_matrix(allx[:2].toarray()), "allx": allx, "tx": sp.csr_matrix(np.ones((2, 4), np.float32)),
            "y": onehot([0, 1]), "ally": onehot([0, 1, 2, 0, 1, 2]), "ty": onehot([2, 0]),
            "graph": {i: [(i + 1) % 8, (i + 7) % 8] for i in range(8)}, "test.index": "7\n6\n"}


def _write_planetoid(folder: Path, parts: dict[str, Any]) -> None:
    for ext, obj in parts.items():
        f = folder / f"ind.cora.{ext}"
        if isinstance(obj, str):
            f.write_text(obj)
        else:
            with open(f, "wb") as fh:
                pickle.dump(obj, fh)


EDGES = "# Nodes: 6 Edges: 7\n0 1\n1 2\n2 3\n3 4\n4 5\n5 0\n1 3\n"


def _ogb(root: Path) -> Path:
    base = root / "tiny" / "raw"
    split = root / "tiny" / "split" / "random"
    base.mkdir(parents=True)
    split.mkdir(parents=True)

    def gz(f: Path, rows: list[str]) -> None:
        with gzip.open(f, "wt") as fh:
            fh.write("\n".join(rows) + "\n")

    gz(base / "edge.csv.gz", ["0,1", "1,2", "2,3", "3,4", "4,5", "5,0"])
    gz(base / "node-feat.csv.gz", [",".join(str(v) for v in r) for r in np.eye(6, 3)])
    gz(base / "node-label.csv.gz", ["0", "1", "2", "0", "1", "2"])
    gz(base / "num-node-list.csv.gz", ["6"])
    for part, ids in (("train", ["0", "1"]), ("valid", ["2", "3"]), ("test", ["4", "5"])):
        gz(split / f"{part}.csv.gz", ids)
    return root


@pytest.fixture(scope="module")
def valid(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One valid file (or folder) of each kind, written by gnnscale itself where it has a writer."""
    base = tmp_path_factory.mktemp("valid")
    g = csbm(nodes=24, avg_degree=3, features=4, classes=2, seed=0)
    io.save(g, base / "graph")
    (base / "planetoid").mkdir()
    _write_planetoid(base / "planetoid", _planetoid_parts())
    (base / "edges.txt").write_text(EDGES)
    _ogb(base / "ogb")
    _npz(base / "g.npz")
    with contextlib.redirect_stdout(pyio.StringIO()), contextlib.redirect_stderr(pyio.StringIO()):
        rc = main(["train", "--dataset", str(base / "graph"), "--epochs", "2", "--hidden", "8",
                   "--save-model", str(base / "model.pt"), "--checkpoint", str(base / "ckpt")])
    assert rc == 0
    return {"graph": base / "graph", "planetoid": base / "planetoid", "edges": base / "edges.txt",
            "ogb": base / "ogb", "npz": base / "g.npz", "model": base / "model.pt", "ckpt": base / "ckpt"}


# ---------------------------------------------------------------------------------------------- running
def _check(rc: int, err: str, argv: list[str]) -> None:
    """``rc`` 0, or 2 with one ``error:`` line last; besides it only gnnscale's ``note:``/``warning:`` lines."""
    lines = err.strip().splitlines()
    stray = [ln for ln in lines if not ln.startswith(("note: ", "warning: ", "error: "))]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert rc in (0, 2), f"{argv}: exit status {rc}\n{err}"
    assert not stray, f"{argv}: stray output (a traceback or a library's warning):\n{err}"
    if rc == 2:
        assert len(errors) == 1 and lines[-1] == errors[0], f"{argv}: expected one error line last:\n{err}"
    else:
        assert not errors, f"{argv}: error line with exit 0:\n{err}"


# what pytest's configuration silences (pyproject.toml), and what Python does not show by default
QUIET = (DeprecationWarning, PendingDeprecationWarning)
QUIET_TEXT = ("Sparse CSR tensor support is in beta state", "Sparse invariant checks are implicitly disabled")


def _in_process(argv: list[str]) -> tuple[int, str]:
    """``main(argv)`` here: ``(exit status, stderr)``, with the warnings Python would print on stderr (pytest
    records them instead) and the traceback of anything that escapes ``main``."""
    err = pyio.StringIO()
    with contextlib.redirect_stdout(pyio.StringIO()), contextlib.redirect_stderr(err), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        try:
            rc = main(argv)
        except Exception:  # noqa: BLE001 -- a bug: shown as the traceback it is
            traceback.print_exc(file=err)
            rc = 1
    shown = [w for w in caught if not issubclass(w.category, QUIET) and not str(w.message).startswith(QUIET_TEXT)]
    return rc, "".join(f"{w.category.__name__}: {w.message}\n" for w in shown) + err.getvalue()


_MARK = "@@fuzz-result "
_WORKER = f"""
import importlib.util, json, os, sys
spec = importlib.util.spec_from_file_location("reader_fuzz", {str(Path(__file__))!r})
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
for line in sys.stdin:
    rc, err = mod._in_process(json.loads(line))
    os.write(1, ({_MARK!r} + json.dumps([rc, err]) + "\\n").encode())
"""


class _Isolated:
    """A worker process that runs the cases one after another (it imports torch once, not per case); a case that
    kills it (a signal) is reported with that signal, and the next case starts a new worker."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.buf = b""
        atexit.register(self.close)

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def run(self, argv: list[str], timeout: float = 120.0) -> tuple[int, str]:
        if self.proc is None:
            self.proc = subprocess.Popen([sys.executable, "-c", _WORKER], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                         env={**os.environ, "PYTHONPATH": str(ROOT)})
            self.buf = b""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write((json.dumps(argv) + "\n").encode())
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while True:
            for line in self.buf.split(b"\n")[:-1]:
                if line.startswith(_MARK.encode()):
                    self.buf = self.buf[self.buf.index(line) + len(line) + 1 :]
                    rc, err = json.loads(line[len(_MARK) :])
                    return rc, err
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.close()
                raise AssertionError(f"{argv}: no answer in {timeout:.0f} s")
            chunk = os.read(fd, 1 << 16)
            if not chunk:  # the worker died in this case
                rc = self.proc.wait()
                self.proc = None
                return rc, f"the process ended with exit status {rc} (a negative status is a signal)"
            self.buf += chunk


_ISOLATED = _Isolated()


def run_case(argv: list[str]) -> None:
    rc, err = (_ISOLATED.run if ISOLATED else _in_process)(argv)
    _check(rc, err, argv)


@contextlib.contextmanager
def scratch(src: Path) -> Iterator[Path]:
    """A fresh copy of ``src`` (file or folder) in a temporary folder, removed afterwards."""
    d = Path(tempfile.mkdtemp(prefix="fuzz-"))
    try:
        dst = d / src.name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dst)
        yield dst
    finally:
        shutil.rmtree(d, ignore_errors=True)


# ------------------------------------------------------------------------------------------ mutations
def mutate_bytes(draw: Callable[..., Any], f: Path) -> None:
    """Overwrite a few bytes, zero a run, truncate or append."""
    raw = bytearray(f.read_bytes())
    how = draw(st.sampled_from(["overwrite", "zero", "truncate", "append"]))
    if how == "overwrite" and raw:
        for _ in range(draw(st.integers(1, 8))):
            raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
    elif how == "zero" and raw:
        at, n = draw(st.integers(0, len(raw) - 1)), draw(st.integers(1, 64))
        raw[at : at + n] = bytes(len(raw[at : at + n]))
    elif how == "truncate":
        raw = raw[: draw(st.integers(0, max(0, len(raw) - 1)))]
    else:
        raw += bytes(draw(st.binary(min_size=1, max_size=32)))
    f.write_bytes(bytes(raw))


def mutate_array(draw: Callable[..., Any], a: np.ndarray) -> np.ndarray:
    """An array like ``a`` with a value set to a boundary, reordered, resized, retyped or reshaped."""
    a = np.array(a)
    a = a.reshape(-1) if a.ndim == 0 else a  # (a scalar tensor, an optimiser's step)
    how = draw(st.sampled_from(["value", "value", "value", "reverse", "shuffle", "drop", "extend", "dtype",
                                "reshape", "empty"]))
    if how == "value" and a.size:
        flat = a.reshape(-1)
        v = draw(st.sampled_from(SPECIAL))
        if flat.dtype.kind in "iu":
            info = np.iinfo(flat.dtype)
            flat = flat.astype(np.int64) if not info.min <= v <= info.max else flat
            v = int(np.clip(v, np.iinfo(flat.dtype).min, np.iinfo(flat.dtype).max))
        elif flat.dtype.kind == "f":
            v = draw(st.sampled_from([v, float("nan"), float("inf")]))
        flat = flat.copy()
        flat[draw(st.integers(0, flat.size - 1))] = v
        return flat.reshape(a.shape)
    if how == "reverse":
        return a[::-1].copy()
    if how == "shuffle" and a.size:
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        return rng.permutation(a.reshape(-1)).reshape(a.shape)
    if how == "drop" and a.size:
        return a.reshape(-1)[: draw(st.integers(0, a.size - 1))]
    if how == "extend":
        return np.concatenate([a.reshape(-1), a.reshape(-1)[:3], np.array([draw(st.sampled_from(SPECIAL[:9]))],
                                                                           dtype=a.dtype)])
    if how == "dtype":
        return a.astype(draw(st.sampled_from([np.float64, np.float32, np.int8, np.int32, np.uint64, np.bool_])))
    if how == "reshape" and a.size:
        return a.reshape(1, -1) if a.ndim == 1 else a.reshape(-1)
    return a[:0]


def _npz_mutated(draw: Callable[..., Any], f: Path) -> None:
    if draw(st.booleans()):
        mutate_bytes(draw, f)
        return
    with np.load(f) as d:
        arrays = {k: d[k] for k in d.files}
    for _ in range(draw(st.integers(1, 2))):
        key = draw(st.sampled_from(sorted(arrays)))
        arrays[key] = mutate_array(draw, arrays[key])
    np.savez(f, **arrays)


def _dir_mutated(draw: Callable[..., Any], d: Path) -> None:
    """A converted directory with a mutated array (meta.json updated or not), meta.json edited, or bytes."""
    meta = json.loads((d / "meta.json").read_text())
    how = draw(st.sampled_from(["array", "array", "meta", "bytes"]))
    if how == "array":
        name = draw(st.sampled_from(sorted(meta["arrays"])))
        arr = mutate_array(draw, np.load(d / f"{name}.npy"))
        np.save(d / f"{name}.npy", arr)
        if draw(st.booleans()):  # the meta.json a careful forger writes too
            meta["arrays"][name] = {"dtype": str(arr.dtype), "shape": list(arr.shape)}
            if name == "indptr":
                meta["num_nodes"] = max(arr.shape[0] - 1, 0)
            if name == "indices":
                meta["num_edges"] = arr.shape[0]
            (d / "meta.json").write_text(json.dumps(meta))
    elif how == "meta":
        key = draw(st.sampled_from(["num_nodes", "num_edges", "version", "feature_dtype", "num_classes", "arrays",
                                    "name", "format"]))
        meta[key] = draw(st.sampled_from([None, -1, 0, 1, 10**12, 2.5, "x", "bfloat16", [], {}, True]))
        (d / "meta.json").write_text(json.dumps(meta))
    else:
        mutate_bytes(draw, d / draw(st.sampled_from(sorted(p.name for p in d.iterdir()))))


def _planetoid_mutated(draw: Callable[..., Any], d: Path) -> None:
    parts = _planetoid_parts()
    how = draw(st.sampled_from(["csr", "csr", "labels", "graph", "index", "bytes"]))
    if how == "csr":
        m = parts[draw(st.sampled_from(["x", "allx", "tx"]))]
        attr = draw(st.sampled_from(["indices", "indptr", "data", "_shape"]))
        if attr == "_shape":
            m._shape = draw(st.sampled_from([(2, 10**9), (10**9, 4), (-1, 4), (2,), (2.5, 4), (0, 0)]))
        else:
            setattr(m, attr, mutate_array(draw, getattr(m, attr)))
    elif how == "labels":
        key = draw(st.sampled_from(["y", "ally", "ty"]))
        parts[key] = mutate_array(draw, parts[key])
    elif how == "graph":
        g = parts["graph"]
        g[draw(st.sampled_from([0, 3, 10**9, -5]))] = [draw(st.sampled_from(SPECIAL))]
    elif how == "index":
        parts["test.index"] = "\n".join(draw(st.lists(st.sampled_from(TOKENS[:9]), max_size=4))) + "\n"
    _write_planetoid(d, parts)
    if how == "bytes":
        mutate_bytes(draw, d / f"ind.cora.{draw(st.sampled_from(sorted(parts)))}")


def _text_mutated(draw: Callable[..., Any], text: str) -> str:
    """A text file's tokens replaced, lines dropped or doubled."""
    lines = text.splitlines()
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(lines) - 1)) if lines else 0
        how = draw(st.sampled_from(["token", "token", "drop", "double"]))
        if how == "token" and lines:
            fields = lines[i].replace(",", " ").split() or [""]
            fields[draw(st.integers(0, len(fields) - 1))] = draw(st.sampled_from(TOKENS))
            sep = "," if "," in lines[i] else " "
            lines[i] = sep.join(fields)
        elif how == "drop" and lines:
            del lines[i]
        elif lines:
            lines.insert(i, lines[i])
    return "\n".join(lines) + "\n"


def _ogb_mutated(draw: Callable[..., Any], root: Path) -> None:
    files = sorted(p for p in root.rglob("*.csv.gz"))
    f = draw(st.sampled_from(files))
    if draw(st.booleans()):
        mutate_bytes(draw, f)
    else:
        with gzip.open(f, "rt") as fh:
            text = fh.read()
        with gzip.open(f, "wt") as fh:
            fh.write(_text_mutated(draw, text))


# ------------------------------------------------------------------------------------------------ tests
@FUZZ
@given(data=st.data())
def test_mutated_npz_loads_or_is_one_error(valid: dict[str, Path], data: st.DataObject) -> None:
    with scratch(valid["npz"]) as f:
        _npz_mutated(data.draw, f)
        run_case(["info", "--dataset", f"npz:{f}"])


@FUZZ
@given(data=st.data())
def test_mutated_planetoid_loads_or_is_one_error(valid: dict[str, Path], data: st.DataObject) -> None:
    with scratch(valid["planetoid"]) as d:
        _planetoid_mutated(data.draw, d)
        run_case(["info", "--dataset", "planetoid:cora", "--root", str(d)])


@FUZZ
@given(data=st.data())
def test_mutated_edge_list_loads_or_is_one_error(valid: dict[str, Path], data: st.DataObject) -> None:
    with scratch(valid["edges"]) as f:
        if data.draw(st.booleans()):
            f.write_text(_text_mutated(data.draw, f.read_text()))
        else:
            mutate_bytes(data.draw, f)
        if data.draw(st.booleans()):  # the streaming convert reads edge lists too
            run_case(["convert", "--dataset", f"edgelist:{f}", "--out", str(f.parent / "out"), "--host-memory", "64M"])
        else:
            run_case(["info", "--dataset", f"edgelist:{f}"])


@FUZZ
@given(data=st.data())
def test_mutated_ogb_directory_loads_or_is_one_error(valid: dict[str, Path], data: st.DataObject) -> None:
    with scratch(valid["ogb"]) as root:
        _ogb_mutated(data.draw, root)
        run_case(["info", "--dataset", "ogb:tiny", "--root", str(root)])


@FUZZ
@given(data=st.data())
def test_mutated_converted_directory_loads_or_is_one_error(valid: dict[str, Path], data: st.DataObject) -> None:
    with scratch(valid["graph"]) as d:
        _dir_mutated(data.draw, d)
        if data.draw(st.integers(0, 3)) == 0:  # training reads what info does not (features through the engines)
            run_case(["train", "--dataset", str(d), "--epochs", "1", "--hidden", "8"])
        else:
            run_case(["info", "--dataset", str(d)])


def _saved_mutated(draw: Callable[..., Any], f: Path) -> None:
    """A model or checkpoint file (today's format) with its bytes mutated, or, read and written again, one entry
    (nested ones too: a weight, the config's fields) replaced by another value or a tensor cut, retyped or
    reshaped: a file that still reads, so the mutation reaches what is built from it."""
    if draw(st.booleans()):
        mutate_bytes(draw, f)
        return
    state = torch.load(f, weights_only=True)
    node: Any = state
    while True:  # walk down to a dict entry
        key = draw(st.sampled_from(sorted(node, key=str)))
        if isinstance(node[key], dict) and node[key] and draw(st.booleans()):
            node = node[key]
            continue
        break
    old = node[key]
    if isinstance(old, torch.Tensor) and draw(st.booleans()):
        node[key] = torch.from_numpy(np.ascontiguousarray(mutate_array(draw, old.numpy())))
    else:
        node[key] = draw(st.sampled_from([None, -1, 0, 10**12, 2.5, "x", "gat", [], {}, True, torch.zeros(3),
                                          torch.zeros(0, 4), torch.full((2, 2), float("nan"))]))
    torch.save(state, f)


@FUZZ
@given(data=st.data())
def test_mutated_model_file_predicts_or_is_one_error(valid: dict[str, Path], data: st.DataObject) -> None:
    with scratch(valid["model"]) as f:
        _saved_mutated(data.draw, f)
        run_case(["predict", "--model", str(f), "--dataset", str(valid["graph"]), "--out", str(f.parent / "p.npy")])


@FUZZ
@given(data=st.data())
def test_mutated_checkpoint_resumes_or_is_one_error(valid: dict[str, Path], data: st.DataObject) -> None:
    with scratch(valid["ckpt"]) as d:
        _saved_mutated(data.draw, d / "checkpoint.pt")
        run_case(["train", "--dataset", str(valid["graph"]), "--epochs", "3", "--hidden", "8", "--checkpoint", str(d),
                  "--resume"])


# ----------------------------------------------------------------------------- the crashes, out of process
def _crashers(d: Path) -> list[list[str]]:
    """The files of the review that ended in SIGSEGV or a heap abort, each with its command."""
    out = []
    for name, key, value in (("big_attr.npz", "attr_indices", np.array([0, 1, 2, 10**9])),
                             ("backwards.npz", "adj_indptr", np.array([0, 2, 1, 6, 8, 10, 12]))):
        f = _npz(d / name)
        with np.load(f) as z:
            arrays = {k: z[k] for k in z.files}
        arrays[key] = value
        np.savez(f, **arrays)
        out += [["info", "--dataset", f"npz:{f}"],
                ["convert", "--dataset", f"npz:{f}", "--out", str(d / f"{name}.out")]]
    for col in (10**9, 4):  # far past the features, and just past them (a silent heap write)
        root = d / f"planetoid{col}"
        root.mkdir()
        parts = _planetoid_parts()
        parts["tx"].indices[0] = col
        _write_planetoid(root, parts)
        out.append(["info", "--dataset", "planetoid:cora", "--root", str(root)])
    return out


def test_files_that_crashed_the_process_end_in_one_line(tmp_path: Path) -> None:
    """One subprocess runs each command in turn and prints its status: a segfault or abort ends it with a signal,
    which the in-process cases could not report."""
    cases = _crashers(tmp_path)
    script = ("import contextlib, io, json, sys\nfrom gnnscale.cli import main\n"
              "for argv in json.loads(sys.argv[1]):\n"
              "    err = io.StringIO()\n"
              "    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):\n"
              "        rc = main(argv)\n"
              "    print(json.dumps([rc, err.getvalue()]), flush=True)\n")
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(cases)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=240, check=False)
    assert proc.returncode == 0, f"ended by signal {-proc.returncode}" if proc.returncode < 0 else proc.stderr
    results = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(results) == len(cases)
    for argv, (rc, err) in zip(cases, results, strict=True):
        _check(rc, err, argv)
        assert rc == 2 and ("out of range" in err or "decreases" in err), (argv, err)
