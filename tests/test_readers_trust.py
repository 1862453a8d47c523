"""Issue #44, the readers' items: index arrays checked before numpy's and scipy's C routines see them (the shared
checks of :mod:`gnnscale.graph.checks`, in every reader), converted directories whose files link elsewhere, a raw
pickle given as a model, and the wording of a missing path, a partial convert, a file that is not an npz and an
edited meta.json. Tiny literal files in ``tmp_path``; CLI runs through ``main``. The fuzz test over every reader is
tests/test_reader_fuzz.py."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import warnings
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from gnnscale.cli import main
from gnnscale.errors import DatasetError
from gnnscale.graph import checks, io
from gnnscale.graph.datasets import load_dataset
from gnnscale.graph.generators import csbm


def _one_error(capsys: pytest.CaptureFixture[str], code: int) -> str:
    """The one line of a failed command: exit status 2, nothing else on stderr (no warning, no traceback)."""
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (code, err)
    return lines[0]


# ------------------------------------------------------------------------------ 1. the shared checks
@pytest.mark.parametrize(("indptr", "indices", "shape", "says"), [
    ([0, 2, 1, 3], [0, 1, 2], (3, 3), "decreases after row 1"),
    ([0, 1, 2, 4], [0, 1, 2], (3, 3), "must run from 0 to the number of entries, 3"),
    ([1, 1, 2, 3], [0, 1, 2], (3, 3), "runs 1..3"),
    ([0, 1, 2], [0, 1], (3, 3), "indptr has 3 entries for 3 rows (expected 4)"),
    ([0, 1, 2, 3], [0, 3, 2], (3, 3), "column index 3 is out of range (0..2)"),
    ([0, 1, 2, 3], [0, -1, 2], (3, 3), "column index -1 is out of range"),
    ([0, 1, 2, 3], [0, 10**9, 2], (3, 3), "column index 1,000,000,000"),
    ([0, 1, 2, 3], [0.0, 1.0, 2.0], (3, 3), "indices: expected a 1-D integer array, found float64"),
    ([0, 1, 2, 3], [0, 1, 2], (3, -3), "shape [3, -3] must hold non-negative integers"),
    ([0, 1, 2, 3], [0, 1, 2], (3, 3, 1), "is not 2 sizes"),
])
def test_csr_parts_are_checked_rule_by_rule(indptr: list[int], indices: list[float], shape: tuple[int, ...],
                                            says: str) -> None:
    with pytest.raises(DatasetError, match="^f.npz: attr ") as exc:
        checks.check_csr(np.array(indptr), np.array(indices), np.array(shape), "f.npz", part="attr")
    assert says in str(exc.value), str(exc.value)


def test_valid_csr_and_coo_parts_pass() -> None:
    m = sp.random(5, 4, density=0.5, format="csr", random_state=0)
    assert checks.check_csr(m.indptr, m.indices, np.array(m.shape), "f", data=m.data) == (5, 4)
    c = m.tocoo()
    assert checks.check_coo(c.row, c.col, m.shape, "f", data=c.data) == (5, 4)
    with pytest.raises(DatasetError, match="row index 5 is out of range"):
        checks.check_coo(np.array([0, 5]), np.array([0, 1]), (5, 4), "f")
    with pytest.raises(DatasetError, match="data: expected 2 numeric values"):
        checks.check_csr(np.array([0, 2]), np.array([0, 1]), (1, 4), "f", data=np.array([1.0]))


def _npz(path: Path, **over: np.ndarray) -> Path:
    """A 4-vertex gnn-benchmark npz (a path, sparse CSR features), with the arrays ``over`` replaced."""
    adj = sp.csr_matrix(np.eye(4, k=1, dtype=np.float32) + np.eye(4, k=-1, dtype=np.float32))
    attr = sp.csr_matrix(np.eye(4, dtype=np.float32))
    parts = {"adj_data": adj.data, "adj_indices": adj.indices, "adj_indptr": adj.indptr, "adj_shape": np.array([4, 4]),
             "attr_data": attr.data, "attr_indices": attr.indices, "attr_indptr": attr.indptr,
             "attr_shape": np.array([4, 4]), "labels": np.array([0, 1, 0, 1])}
    np.savez(path, **{**parts, **over})
    return path


@pytest.mark.parametrize(("over", "says", "built_before"), [
    ({"attr_indices": np.array([0, 1, 2, 10**9])}, "attr column index 1,000,000,000 is out of range (0..3)", 1),
    ({"adj_indptr": np.array([0, 1, 0, 5, 6])}, "adj indptr decreases after row 1 (1 -> 0)", 0),
    ({"adj_indices": np.array([1, 0, 2, 1, 3, 99])}, "adj column index 99 is out of range (0..3)", 0),
    ({"attr_shape": np.array([4, 10**12])}, "attr: a dense 4 x 1,000,000,000,000 matrix needs", 2),
])
def test_npz_index_arrays_are_checked_before_scipy(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch, over: dict[str, np.ndarray],
                                                   says: str, built_before: int) -> None:
    """The review's crashes (SIGSEGV in csr_todense, a heap abort in expandptr, a ValueError traceback): one line,
    and scipy builds no matrix from the broken parts (only the parts checked before them: the adjacency, for a
    broken attr; a dense size too large to allocate is refused before ``toarray``)."""
    f = _npz(tmp_path / "g.npz", **over)
    built = []
    real = sp.csr_matrix

    def spy(arg: object, *a: object, **k: object) -> sp.csr_matrix:
        built.append(arg)
        return real(arg, *a, **k)

    monkeypatch.setattr(io.sp, "csr_matrix", spy)
    line = _one_error(capsys, main(["info", "--dataset", f"npz:{f}"]))
    assert line.startswith(f"error: {f}: {says}"), line
    assert len(built) == built_before


def _planetoid(folder: Path, tx_col: int) -> Path:
    """A tiny Planetoid set named cora (6 + 2 vertices, 4 features) whose tx lists column ``tx_col`` in row 0."""
    folder.mkdir()
    allx = sp.csr_matrix(np.eye(6, 4, dtype=np.float32))
    tx = sp.csr_matrix(np.eye(2, 4, dtype=np.float32))
    tx.indices[0] = tx_col
    parts = {"x": sp.csr_matrix(allx[:2].toarray()), "allx": allx, "tx": tx, "y": np.eye(3, dtype=np.int64)[[0, 1]],
             "ally": np.eye(3, dtype=np.int64)[[0, 1, 2, 0, 1, 2]], "ty": np.eye(3, dtype=np.int64)[[2, 0]],
             "graph": {i: [(i + 1) % 8] for i in range(8)}}
    for ext, obj in parts.items():
        with open(folder / f"ind.cora.{ext}", "wb") as fh:
            pickle.dump(obj, fh)
    (folder / "ind.cora.test.index").write_text("7\n6\n")
    return folder


def test_planetoid_columns_past_the_features_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Column 4 of 4 features was a silent heap write (wrong features, exit 0); 10**9 a segfault."""
    assert load_dataset("planetoid:cora", root=_planetoid(tmp_path / "ok", 0)).x.shape == (8, 4)
    for col in (4, 10**9):
        root = _planetoid(tmp_path / f"c{col}", col)
        line = _one_error(capsys, main(["info", "--dataset", "planetoid:cora", "--root", str(root)]))
        assert line == f"error: {root}/ind.cora.tx: column index {col:,} is out of range (0..3)", line


def test_planetoid_matrix_is_rebuilt_from_its_checked_parts(tmp_path: Path) -> None:
    """A pickled CSR matrix is never used as unpickled: scipy gets a new one made of the checked arrays."""
    root = _planetoid(tmp_path / "p", 0)
    with open(root / "ind.cora.tx", "rb") as fh:
        tx = pickle.load(fh)
    tx.indptr = np.array([0, 2, 1])  # runs backwards: scipy's own checks do not look
    with open(root / "ind.cora.tx", "wb") as fh:
        pickle.dump(tx, fh)
    with pytest.raises(DatasetError, match=r"ind\.cora\.tx: indptr (decreases|runs)"):
        load_dataset("planetoid:cora", root=root)


def test_ogb_ids_that_are_not_integers_are_one_error(tmp_path: Path) -> None:
    """An id of ``nan`` or ``1e30`` was cast to int64 silently (a RuntimeWarning, then garbage ids)."""
    raw = tmp_path / "tiny" / "raw"
    raw.mkdir(parents=True)
    (raw / "edge.csv").write_text("0,1\n1,nan\n")
    with pytest.raises(DatasetError, match=r"edge\.csv: value nan is not an integer id"):
        io._read_csv(raw / "edge.csv", np.int64)


# ------------------------------------------------------------------- 2. links out of a converted directory
def test_a_converted_file_linked_from_outside_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    io.save(csbm(nodes=30, avg_degree=3, features=4, classes=2, seed=0), tmp_path / "a")
    io.save(csbm(nodes=30, avg_degree=3, features=4, classes=2, seed=1), tmp_path / "b")
    y = tmp_path / "a" / "y.npy"
    y.unlink()
    y.symlink_to(tmp_path / "b" / "y.npy")
    line = _one_error(capsys, main(["info", "--dataset", str(tmp_path / "a")]))
    assert line.startswith(f"error: {y} is a link to {(tmp_path / 'b' / 'y.npy').resolve()}, outside "), line
    # a link within the directory, and the directory itself reached through a link, are its own files
    x = tmp_path / "b" / "x.npy"
    os.replace(x, tmp_path / "b" / "x.data")
    x.symlink_to("x.data")
    (tmp_path / "c").symlink_to(tmp_path / "b")
    assert load_dataset(str(tmp_path / "c")).num_nodes == 30


# ------------------------------------------------------------------------------ 16. a raw-pickle model
def test_a_raw_pickle_model_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """torch warned (``UserWarning: Detected pickle protocol 4``) before the error line."""
    f = tmp_path / "model.pt"
    with open(f, "wb") as fh:
        pickle.dump({"format": "gnnscale-model", "version": 1}, fh, protocol=4)
    io.save(csbm(nodes=30, avg_degree=3, features=4, classes=2, seed=0), tmp_path / "g")
    with warnings.catch_warnings(record=True) as caught:  # pytest records warnings instead of printing them
        warnings.simplefilter("always")
        code = main(["predict", "--model", str(f), "--dataset", str(tmp_path / "g"), "--out", str(tmp_path / "p.npy")])
    assert not caught, [str(w.message) for w in caught]
    line = _one_error(capsys, code)
    assert f"--model {f} is not a readable model file" in line, line


# --------------------------------------------------------------------------------------- 23. wording
def test_a_missing_directory_is_said_to_be_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for spec in ("/no/such/dir", str(tmp_path / "gone"), "./relative/gone"):
        line = _one_error(capsys, main(["info", "--dataset", spec]))
        assert line == f"error: dataset path {spec} does not exist (no such file or directory)", line
    assert "unknown dataset" in _one_error(capsys, main(["info", "--dataset", "nosuchkind"]))


def test_a_partial_convert_is_named_as_such(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """What a killed convert leaves (``.out.*.partial`` with the writer's pid, no meta.json), given as the dataset,
    or the ``--out`` it never reached."""
    out = tmp_path / "out"
    partial = tmp_path / f".out.x1y2{io.PARTIAL_SUFFIX}"
    partial.mkdir()
    (partial / io.PARTIAL_PID).write_text("999999999")
    np.save(partial / "indptr.npy", np.zeros(3, np.int64))
    line = _one_error(capsys, main(["info", "--dataset", str(partial)]))
    assert "is the partial output of a 'gnnscale convert' that was interrupted" in line, line
    assert "run the convert again" in line
    line = _one_error(capsys, main(["info", "--dataset", str(out)]))
    assert line == (f"error: {out} does not exist; {partial} is what an interrupted 'gnnscale convert' to it left: "
                    "run the convert again (it removes that folder)"), line


def test_npz_on_a_text_file_says_it_is_not_an_npz(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "edges.txt.gz"
    with gzip.open(f, "wt") as fh:
        fh.write("0 1\n1 2\n")
    line = _one_error(capsys, main(["info", "--dataset", f"npz:{f}"]))
    assert "allow_pickle" not in line
    assert line == (f"error: {f} is not an npz file (a zip archive of .npy arrays, as np.savez writes): it is a gzip "
                    "file; an edge list is read with edgelist:<file>"), line


@pytest.mark.parametrize("key", ["num_nodes", "num_edges"])
def test_edited_counts_in_meta_json_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str) -> None:
    g = csbm(nodes=30, avg_degree=3, features=4, classes=2, seed=0)
    io.save(g, tmp_path / "g")
    meta = json.loads((tmp_path / "g" / "meta.json").read_text())
    true = meta[key]
    meta[key] = true + 5
    (tmp_path / "g" / "meta.json").write_text(json.dumps(meta))
    line = _one_error(capsys, main(["info", "--dataset", str(tmp_path / "g")]))
    assert line == (f"error: {tmp_path / 'g'}/meta.json says {key} {true + 5} but the arrays hold {true:,}; the "
                    "counts must match (convert the dataset again rather than editing meta.json)"), line


# ---------------------------------------------------- 1. model and checkpoint files that read but are damaged
@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("trained")
    io.save(csbm(nodes=30, avg_degree=3, features=4, classes=2, seed=0), d / "g")
    assert main(["train", "--dataset", str(d / "g"), "--epochs", "2", "--hidden", "8", "--save-model",
                 str(d / "model.pt"), "--checkpoint", str(d / "ckpt")]) == 0
    return d


def _edited(src: Path, dst: Path, **changes: object) -> Path:
    """``src`` with ``changes``, and a checksum made anew for the edited content: a crafted file, not one damaged
    by chance (that the checksum refuses, tests/test_checkpoint.py), so what it holds must be checked as well."""
    from gnnscale.checkpoint import content_digest

    state = torch.load(src, weights_only=True)
    state.pop("checksum", None)
    for k, v in changes.items():
        if v is None:
            del state[k]
        else:
            state[k] = v
    try:
        state["checksum"] = content_digest(state)
    except RecursionError:  # content that holds itself has no checksum: saved as a file from before checksums
        pass
    dst.parent.mkdir(exist_ok=True)
    torch.save(state, dst)
    return dst


@pytest.mark.parametrize(("changes", "says"), [
    ({"num_features": 10**7}, "it says num_features 10000000, which no weight matrix of it has"),
    ({"state_dict": None}, "its 'state_dict' entry is missing or not a dict"),
    ({"config": {"model": "gcn", "no_such_field": 1}}, "its config or weights do not make a model"),
])
def test_a_damaged_model_file_is_one_line(trained: Path, capsys: pytest.CaptureFixture[str],
                                          changes: dict[str, object], says: str) -> None:
    """A file that reads (weights_only) but whose entries were damaged: no KeyError or TypeError traceback, and no
    model of the size a damaged count asks for is allocated."""
    capsys.readouterr()
    f = _edited(trained / "model.pt", trained / "edited" / "model.pt", **changes)
    code = main(["predict", "--model", str(f), "--dataset", str(trained / "g"), "--out", str(trained / "p.npy")])
    line = _one_error(capsys, code)
    assert line.startswith(f"error: --model {f} is damaged: ") and says in line, line


def _damaged_optimizer(state: dict) -> dict:
    opt = state["optimizer"]
    first = next(iter(opt["state"].values()))
    first["exp_avg"] = first["exp_avg"][:1]  # one row: torch's load_state_dict takes it, the next step fails
    return opt


def _renamed_state(state: dict) -> dict:
    opt = state["optimizer"]
    first = next(iter(opt["state"].values()))
    first["exp_avg_sX"] = first.pop("exp_avg_sq")  # a flipped byte in a key: a KeyError at the next step
    return opt


def _holds_itself() -> list:
    loop: list = []
    loop.append(loop)
    return loop


@pytest.mark.parametrize(("edit", "says"), [
    (lambda s: {"history": None}, "its 'history' entry is missing or not a list"),
    (lambda s: {"optimizer": _renamed_state(s)}, "its optimiser state is not that of this model's optimiser"),
    (lambda s: {"config": {**s["config"], "seed": _holds_itself()}}, "its config holds values no setting takes"),
    (lambda s: {"best": {**s["best"], "_val": None}}, "its epoch records (history, best) are not what gnnscale"),
    (lambda s: {"optimizer": _damaged_optimizer(s)}, "its optimiser state is not that of this model's optimiser"),
    (lambda s: {"best_state": {**s["best_state"], next(iter(s["best_state"])): torch.zeros(1)}},
     "the best epoch's weights are not the model's"),
])
def test_a_damaged_checkpoint_is_one_line(trained: Path, capsys: pytest.CaptureFixture[str], edit: object,
                                          says: str) -> None:
    """A checkpoint that reads but whose entries were damaged: each was a traceback, some only at the next epoch."""
    capsys.readouterr()
    ck = trained / "ck2"
    src = trained / "ckpt" / "checkpoint.pt"
    _edited(src, ck / "checkpoint.pt", **edit(torch.load(src, weights_only=True)))  # type: ignore[operator]
    code = main(["train", "--dataset", str(trained / "g"), "--epochs", "3", "--hidden", "8", "--checkpoint", str(ck),
                 "--resume"])
    line = _one_error(capsys, code)
    assert f"--resume: {ck / 'checkpoint.pt'}" in line and "is damaged: " in line and says in line, line


# ------------------------------------------------------------------------------- what the fuzz test found
def test_an_edge_list_id_beyond_int64_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An OverflowError traceback in the streaming convert's parser."""
    f = tmp_path / "e.txt"
    f.write_text("0 1\n1 99999999999999999999\n")
    for argv in (["info", "--dataset", f"edgelist:{f}"],
                 ["convert", "--dataset", f"edgelist:{f}", "--out", str(tmp_path / "out"), "--host-memory", "64M"]):
        line = _one_error(capsys, main(argv))
        said = f"error: {f}: line 2: vertex id beyond int64 (at most 9223372036854775807): '1 99999999999999999999'"
        assert line == said, line
    assert not (tmp_path / "out").exists()


def test_a_damaged_npy_header_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """numpy's header parser raised tokenize.TokenError, which no reader caught."""
    io.save(csbm(nodes=30, avg_degree=3, features=4, classes=2, seed=0), tmp_path / "g")
    f = tmp_path / "g" / "indices.npy"
    raw = bytearray(f.read_bytes())
    raw[9:11] = b"\0\0"  # the start of the header's dict: an unclosed bracket to the tokenizer
    f.write_bytes(bytes(raw))
    line = _one_error(capsys, main(["info", "--dataset", str(tmp_path / "g")]))
    assert line.startswith(f"error: cannot read {f}: corrupt or not in the expected format"), line


def test_a_dense_size_beyond_available_memory_is_refused_before_allocating(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 6 x 10**9 feature matrix (24 GB) fit in physical memory but not beside its copies: the process was killed.
    The check counts the reader's copies against the memory available."""
    monkeypatch.setattr(checks, "available_memory", lambda: 10 * 2**30)
    checks.check_dense_size(6, 10**8, 4, "f.npz: attr")  # 2.4 GB, three copies: 7.2 GB of 10
    with pytest.raises(DatasetError, match=r"f\.npz: attr: a dense 6 x 1,000,000,000 matrix needs 22\.4 GiB"):
        checks.check_dense_size(6, 10**9, 4, "f.npz: attr")
    with pytest.raises(DatasetError, match="3 copies while it is read"):
        checks.check_dense_size(6, 2 * 10**8, 4, "f.npz: attr")  # 4.8 GB fits, its three copies do not


def test_ogb_vertex_count_must_match_the_features(tmp_path: Path) -> None:
    """An empty num-node-list was an IndexError traceback; a count unlike node-feat's rows sized the masks."""


    base = tmp_path / "tiny" / "raw"
    split = tmp_path / "tiny" / "split" / "random"
    base.mkdir(parents=True)
    split.mkdir(parents=True)
    files = {base / "edge.csv.gz": "0,1\n1,2\n", base / "node-feat.csv.gz": "1,0\n0,1\n1,1\n",
             base / "node-label.csv.gz": "0\n1\n0\n", split / "train.csv.gz": "0\n", split / "valid.csv.gz": "1\n",
             split / "test.csv.gz": "2\n"}
    for f, text in files.items():
        with gzip.open(f, "wt") as fh:
            fh.write(text)
    assert load_dataset("ogb:tiny", root=tmp_path).num_nodes == 3
    for count in ("", "10000000000\n"):
        with gzip.open(base / "num-node-list.csv.gz", "wt") as fh:
            fh.write(count)
        with pytest.raises(DatasetError, match="num-node-list.csv.gz: says .* vertices but node-feat has 3 rows"):
            load_dataset("ogb:tiny", root=tmp_path)


def test_a_float_label_beyond_int64_is_one_error() -> None:
    """9223372036854775807 read as a float was cast to int64 with a RuntimeWarning (wrapping to -2**63)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(DatasetError, match=r"node-label: label 9\.22337e\+18 at vertex 1 is not a class number"):
            io.class_labels(np.array([0.0, 9223372036854775807.0, 1.0]), "node-label")


def test_a_damaged_dtype_in_a_planetoid_pickle_is_refused(tmp_path: Path) -> None:
    """One byte of a dtype's pickled state made numpy build a broken int32 (``get_clear_loop not set``: internal
    errors and tracebacks wherever it was used); each dtype's state is now checked before numpy takes it."""
    root = _planetoid(tmp_path / "p", 0)
    f = root / "ind.cora.allx"
    raw = f.read_bytes()
    at = raw.index(b"<")  # the byte order of the first dtype's state
    f.write_bytes(raw[:at] + b"|" + raw[at + 1 :])
    with pytest.raises(DatasetError, match=r"ind\.cora\.allx: damaged: the pickle gives the \w+ dtype the state"):
        load_dataset("planetoid:cora", root=root)


def test_more_damage_the_fuzz_test_found_is_one_line(tmp_path: Path, trained: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A zip header asking for zip version 6.4 (NotImplementedError), a pickle cut inside its first frame header
    (struct.error), a checkpoint config holding a tensor (RuntimeError comparing it): tracebacks, each."""
    f = _npz(tmp_path / "g.npz")
    raw = bytearray(f.read_bytes())
    at = raw.index(b"PK\x01\x02") + 6  # the central directory's "version needed to extract"
    raw[at] = 64
    f.write_bytes(bytes(raw))
    assert "corrupt or not in the expected format" in _one_error(capsys, main(["info", "--dataset", f"npz:{f}"]))
    root = _planetoid(tmp_path / "p", 0)
    (root / "ind.cora.allx").write_bytes((root / "ind.cora.allx").read_bytes()[:3])
    line = _one_error(capsys, main(["info", "--dataset", "planetoid:cora", "--root", str(root)]))
    assert "ind.cora.allx: corrupt or not in the expected format" in line, line
    src = trained / "ckpt" / "checkpoint.pt"
    state = torch.load(src, weights_only=True)
    ck = tmp_path / "ck"
    _edited(src, ck / "checkpoint.pt", config={**state["config"], "dropout": torch.zeros(3)})
    line = _one_error(capsys, main(["train", "--dataset", str(trained / "g"), "--epochs", "3", "--hidden", "8",
                                    "--checkpoint", str(ck), "--resume"]))
    assert "is damaged: its config holds values no setting takes" in line, line
