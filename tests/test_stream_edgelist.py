"""Streaming convert of edge lists (issue #29 item 1): ``gnnscale convert --dataset edgelist:FILE`` writes the
directory block by block, byte for byte the in-memory convert's with the same notes, blocks bounded by the plan,
nothing left behind on failure."""

from __future__ import annotations

import filecmp
import gzip
from pathlib import Path

import numpy as np
import pytest

from gnnscale.cli import main
from gnnscale.errors import DatasetError
from gnnscale.graph import io, stream, stream_edges
from gnnscale.graph.datasets import load_dataset


def _same_dirs(a: Path, b: Path) -> None:
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for name in names:
        assert filecmp.cmp(a / name, b / name, shallow=False), name


def _tiny_blocks(monkeypatch: pytest.MonkeyPatch, text: int = 7, edges: int = 3, buckets: int = 4,
                 rows: int = 5) -> None:
    """Blocks of a line or two of text, three edges, four buckets, five rows: every boundary falls in the data."""
    monkeypatch.setattr(stream_edges, "plan_text", lambda budget: text)
    monkeypatch.setattr(stream, "plan_blocks",
                        lambda *a, **k: stream.Blocks(edges=edges, buckets=buckets, rows=rows))


PLAIN = """# a comment
% another
10 20
20 10
10 10
30 20 # trailing comment
10 20
70 30
"""
CSV_WEIGHTED = """src,dst,weight
1,2,0.5
2,3,1.5
1,2,2.25
3,1,0.125
4,4,3.0
2,1,7.0
"""
SNAP = """# Undirected graph: test.txt
# Nodes: 9 Edges: 6
0 1
1 2
2 3
3 0
5 6
6 5
"""
TIMESTAMPS = """0 1 1700000000
1 2 1700000100
2 0 1700000200
"""
LATE_HEADER = """# the column names come after comments and a blank line, in a later block than the first

from to
3 4
4 3
# Edges: 3
9 3
"""
THREE_COLUMNS = """0 1 5
1 2 6
2 3 7
"""


def _random_list(seed: int, edges: int, weighted: bool) -> str:
    rng = np.random.default_rng(seed)
    ids = rng.choice(10_000_000, 300, replace=False)
    src, dst = ids[rng.integers(0, 300, edges)], ids[rng.integers(0, 300, edges)]
    if not weighted:
        return "".join(f"{s}\t{d}\n" for s, d in zip(src, dst, strict=True))
    w = rng.integers(1, 9, edges) / 4
    return "# weighted\n" + "".join(f"{s} {d} {x}\n" for s, d, x in zip(src, dst, w, strict=True))


CASES = [
    ("plain.txt", PLAIN, "", {}),
    ("plain.txt", PLAIN, ":coalesce=1,features=3", {}),
    ("plain.txt", PLAIN, ":symmetrize=1", {}),
    ("plain.txt", PLAIN, "", {"keep_ids": True}),
    ("plain.txt", PLAIN, ":keep_ids=1,feature_dtype=bf16,classes=3", {}),
    ("w.csv", CSV_WEIGHTED, ":weight_column=3", {}),
    ("w.csv", CSV_WEIGHTED, ":weight_column=3,coalesce=1", {}),
    ("w.csv", CSV_WEIGHTED, ":weight_column=3,symmetrize=1", {}),
    ("w.csv", CSV_WEIGHTED, ":weight_column=3,symmetrize=1,coalesce=1", {"feature_dtype": "bf16"}),
    ("snap.txt", SNAP, "", {}),
    ("crlf.txt", SNAP.replace("\n", "\r\n"), ":symmetrize=1,coalesce=1", {}),
    ("late.txt", LATE_HEADER, "", {}),
    ("snap.txt", SNAP, ":symmetrize=0,features=0,classes=0", {}),
    ("t.txt", TIMESTAMPS, ":weight_column=3", {}),
    ("three.txt.gz", THREE_COLUMNS, ":features=2", {}),
    ("rand.txt", _random_list(1, 2000, False), ":symmetrize=1", {}),
    ("randw.txt", _random_list(2, 2000, True), ":weight_column=3,coalesce=1,symmetrize=1", {}),
    ("randw.txt", _random_list(3, 2000, True), ":weight_column=3,seed=4", {"seed": 9}),
]


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    if name.endswith(".gz"):
        with gzip.open(path, "wt") as fh:
            fh.write(text)
    else:
        path.write_text(text)
    return path


@pytest.mark.parametrize(("name", "text", "opts", "kw"), CASES)
def test_streamed_directory_and_notes_equal_the_in_memory_convert(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], name: str, text: str,
        opts: str, kw: dict) -> None:
    spec = f"edgelist:{_write(tmp_path, name, text)}{opts}"
    io.save(load_dataset(spec, **kw), tmp_path / "mem")
    said = capsys.readouterr().err
    _tiny_blocks(monkeypatch)
    w = stream_edges.convert(spec, tmp_path / "stream", host_memory=1 << 30, **kw)
    assert capsys.readouterr().err == said
    _same_dirs(tmp_path / "mem", tmp_path / "stream")
    g = io.open_dir(tmp_path / "stream")
    assert (w.nodes, w.edges, w.nbytes) == (g.num_nodes, g.num_edges, g.nbytes()["total"])


def test_the_cases_cover_every_option() -> None:
    said = " ".join(opts + str(kw) for _, _, opts, kw in CASES)
    for option in ("keep_ids", "weight_column", "symmetrize=1", "symmetrize=0", "coalesce", "feature_dtype",
                   "features=0", "seed"):
        assert option in said, option
    notes = " ".join(text for _, text, _, _ in CASES)
    assert "src,dst" in notes and "# Nodes:" in notes and "%" in notes and "# trailing" in notes


def test_blocks_hold_the_first_pass_in_pieces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Count, not time: with tiny blocks, the first pass parses the file in many blocks, each a few lines, and the
    second reads the raw edges back three at a time."""
    path = _write(tmp_path, "r.txt", _random_list(5, 500, False))
    blocks: list[int] = []
    real = stream_edges._text_blocks

    def counted(p: Path, size: int):  # type: ignore[no-untyped-def]
        for text, line in real(p, size):
            blocks.append(text.count("\n"))
            yield text, line

    monkeypatch.setattr(stream_edges, "_text_blocks", counted)
    _tiny_blocks(monkeypatch, text=40)
    stream_edges.convert(f"edgelist:{path}", tmp_path / "g", host_memory=1 << 30)
    assert sum(blocks) == 500 and len(blocks) > 100 and max(blocks) <= 4


def test_no_block_exceeds_the_planned_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Count, not time: every array the writer materialises passes through stream._materialised; with small blocks
    the largest is bounded by the blocks, far below the graph's edge arrays."""
    seen: list[int] = []

    def record(arr: np.ndarray) -> np.ndarray:
        seen.append(arr.nbytes)
        return arr

    monkeypatch.setattr(stream, "_materialised", record)
    path = _write(tmp_path, "r.txt", _random_list(6, 20_000, True))
    monkeypatch.setattr(stream_edges, "plan_text", lambda budget: 4096)
    monkeypatch.setattr(stream, "plan_blocks", lambda *a, **k: stream.Blocks(edges=1000, buckets=16, rows=64))
    w = stream_edges.convert(f"edgelist:{path}:weight_column=3,symmetrize=1,features=16", tmp_path / "g",
                             host_memory=1 << 30)
    text_ids = 2 * 8 * 4096 // 10  # a 4096-character block has fewer than 4096 / 10 lines of two ids
    bucket = 2 * 20_000 * 8 // 16 * 3 // 2  # a sixteenth of the directed edges' keys, with skew
    assert len(seen) > 100
    assert max(seen) <= max(text_ids, 1000 * 8, bucket, 64 * 16 * 4)
    assert max(seen) < w.edges * 8 // 4  # never the whole indices array


@pytest.mark.parametrize(("text", "flags", "vertices"), [
    ("".join(f"{i} {i + 1}\n" for i in range(0, 60_000, 2)), [], "vertices"),  # the distinct ids, while read
    ("0 1\n5 100000000\n", ["--keep-ids"], "100,000,001 vertices"),  # ids kept as given: the vertex arrays
])
def test_a_budget_below_the_vertex_arrays_is_one_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        text: str, flags: list[str], vertices: str) -> None:
    path = _write(tmp_path, "r.txt", text)
    assert main(["convert", "--dataset", f"edgelist:{path}", "--out", str(tmp_path / "g"),
                 "--host-memory", "3MB", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "too small" in err[0] and vertices in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.txt"]


def test_short_disk_is_one_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    class Usage:
        free = 1000

    monkeypatch.setattr(stream_edges.shutil, "disk_usage", lambda path: Usage())
    path = _write(tmp_path, "r.txt", PLAIN)
    assert main(["convert", "--dataset", f"edgelist:{path}", "--out", str(tmp_path / "g")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error:") and "disk space" in err[-1] and len(err) == 2  # the renumbering note first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.txt"]


def _fail_after(monkeypatch: pytest.MonkeyPatch, calls: int, exc: BaseException) -> None:
    real = stream._materialised
    count = {"n": 0}

    def boom(arr: np.ndarray) -> np.ndarray:
        count["n"] += 1
        if count["n"] > calls:
            raise exc
        return real(arr)

    monkeypatch.setattr(stream, "_materialised", boom)


@pytest.mark.parametrize("exc", [RuntimeError("disk on fire"), KeyboardInterrupt()])
@pytest.mark.parametrize("calls", [2, 40, 140, 155, 300])  # parsing, bucketing, merging, writing, features
def test_failure_mid_write_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  exc: BaseException, calls: int) -> None:
    path = _write(tmp_path, "r.txt", _random_list(7, 300, True))
    _tiny_blocks(monkeypatch, text=200, edges=20, buckets=4, rows=2)
    (tmp_path / "out").mkdir()
    _fail_after(monkeypatch, calls, exc)
    with pytest.raises(type(exc)):
        stream_edges.convert(f"edgelist:{path}:weight_column=3,symmetrize=1", tmp_path / "out" / "g",
                             host_memory=1 << 30)
    assert list((tmp_path / "out").iterdir()) == []


def test_bad_line_names_the_files_line_across_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path, "bad.txt", "# c\n0 1\n1 2\n2 3\n3 x\n")
    with pytest.raises(DatasetError, match="line 5: non-integer vertex id"):
        load_dataset(f"edgelist:{path}")
    _tiny_blocks(monkeypatch)
    with pytest.raises(DatasetError, match="line 5: non-integer vertex id"):
        stream_edges.convert(f"edgelist:{path}", tmp_path / "g", host_memory=1 << 30)
    odd = _write(tmp_path, "odd.txt", "0 1\n1 2\n2 3 4\n")
    with pytest.raises(DatasetError, match="line 3: 3 columns where line 1 has 2"):
        stream_edges.convert(f"edgelist:{odd}", tmp_path / "g", host_memory=1 << 30)
    assert not (tmp_path / "g").exists()


def test_cli_convert_streams_edge_lists(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, "w.csv", CSV_WEIGHTED)
    spec = f"edgelist:{path}:weight_column=3,symmetrize=1"
    assert main(["convert", "--dataset", spec, "--out", str(tmp_path / "s"), "--host-memory", "64MB",
                 "--seed", "3", "--keep-ids"]) == 0
    out = capsys.readouterr().out
    assert "wrote" in out and "5 nodes" in out and "float32 features" in out
    io.save(load_dataset(spec, seed=3, keep_ids=True), tmp_path / "m")
    _same_dirs(tmp_path / "m", tmp_path / "s")


def test_cli_line_without_features(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, "p.txt", PLAIN)
    assert main(["convert", "--dataset", f"edgelist:{path}:features=0", "--out", str(tmp_path / "s")]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("wrote") and line.endswith("4 nodes, 6 edges, 132 B")
    assert not (tmp_path / "s" / "x.npy").exists()


def test_the_budget_advice_names_the_graphs_vertices_and_is_enough(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Issue #44 item 19: refused mid-way through the first pass, convert still names the graph's vertex count (not
    the ids read so far, nor the unmerged blocks' overcount), and its least budget, rounded up, is enough."""
    rng = np.random.default_rng(0)
    ids = rng.permutation(60_000).reshape(-1, 2)
    path = _write(tmp_path, "r.txt", "".join(f"{a} {b}\n{b} {a}\n" for a, b in ids))  # every id twice
    monkeypatch.setattr(stream_edges, "plan_text", lambda budget: 1 << 14)  # many blocks
    argv = ["convert", "--dataset", f"edgelist:{path}", "--out", str(tmp_path / "g")]
    assert main([*argv, "--host-memory", "2MB"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "60,000 vertices" in err, err
    advice = err.split("give at least ")[1]
    assert main([*argv, "--host-memory", advice.replace(" ", "")]) == 0, capsys.readouterr().err
    assert io.open_dir(tmp_path / "g").num_nodes == 60_000
