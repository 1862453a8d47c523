"""``python -m benchmarks peers`` and ``inmemory_vs_pyg``: their cases (DGL's in its own venv), the summaries
(medians, ranges, ratios to DGL), which records the tables show and the tables themselves, from the real records
in benchmarks/results/. No benchmark process is started."""

from __future__ import annotations

import ast
import statistics
from pathlib import Path
from typing import Any

import pytest

from benchmarks import inmemory_vs_pyg, peers
from benchmarks.harness import schedule
from benchmarks.harness.cli import parser
from benchmarks.harness.records import RESULTS_DIR, read_records

PEERS = read_records(RESULTS_DIR / "peers.jsonl")
INMEMORY = read_records(RESULTS_DIR / "inmemory_vs_pyg.jsonl")


def _run(case: str, system: str, rnd: int, median: float, kind: str = "full", ok: bool = True,
         **kw: object) -> dict[str, Any]:
    ref = "gnnscale" if kind == "offload" else "dgl"
    rec: dict[str, Any] = {"record": "run", "case": case, "system": system, "round": rnd, "kind": kind,
                           "reference": ref, "ok": ok}
    if ok:
        rec.update(median_s=median, peak_rss_bytes=2**30, train_peak_bytes=2**29, test_acc=0.8)
    else:
        rec["error"] = "RuntimeError: boom\nsecond line"
    rec.update(kw)
    return rec


# ------------------------------------------------------------------------------------------------ cases
@pytest.fixture
def no_side_effects(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[Path, int]]:
    """cases() without pip or graphs: DGL's venv is ``tmp_path/py``, the graphs are only noted."""
    made: list[tuple[Path, int]] = []
    monkeypatch.setattr(peers, "setup_dgl", lambda venv, log: (tmp_path / "py", {"dgl": "2.1.0"}))
    monkeypatch.setattr(peers, "_prepare", lambda data, n: made.append((data, n)))
    return made


def _cases(argv: list[str]) -> list[Any]:
    return peers.cases(parser("peers", peers).parse_args(argv))


def test_default_cases_are_every_workload_and_system_grouped_by_workload(
        no_side_effects: list[tuple[Path, int]], tmp_path: Path) -> None:
    cs = _cases(["--cache", str(tmp_path)])
    groups = list(dict.fromkeys(c.group for c in cs))
    assert groups == ["gcn-200K", "gcn-800K", "sage-200K", "sage-800K", "gat-200K", "gat-800K", "sampling-200K",
                      "minibatch-200K", "offload-200K"]
    assert [c.name for c in cs if c.group == "gcn-200K"] == ["gcn-200K:gnnscale", "gcn-200K:dgl", "gcn-200K:pyg"]
    assert [c.name for c in cs if c.group == "offload-200K"] == ["offload-200K:gnnscale-offload",
                                                                 "offload-200K:gnnscale"]
    assert [n for _, n in no_side_effects] == [200_000, 800_000]
    dgl = next(c for c in cs if c.name == "gcn-800K:dgl")
    assert dgl.python == str(tmp_path / "py") and dgl.module == peers.WORKER and dgl.env == {}
    assert dgl.params["epochs"] == 5 and dgl.params["nodes"] == 800_000 and dgl.params["notes"] == []
    mine = next(c for c in cs if c.name == "sampling-200K:gnnscale")
    assert mine.python is None and mine.params["kind"] == "sampling" and mine.params["model"] == "sage"
    assert mine.env == {"GNNSCALE_CACHE_DIR": str(tmp_path / "gnnscale-cache")}
    assert [(r, c.name) for r, c in schedule(2, cs[:3])] == [
        (0, "gcn-200K:gnnscale"), (0, "gcn-200K:dgl"), (0, "gcn-200K:pyg"),
        (1, "gcn-200K:dgl"), (1, "gcn-200K:pyg"), (1, "gcn-200K:gnnscale")]


def test_quick_cases_and_no_dgl(no_side_effects: list[tuple[Path, int]], tmp_path: Path) -> None:
    cs = _cases(["--quick", "--cache", str(tmp_path)])
    assert {c.params["nodes"] for c in cs} == {peers.QUICK_NODES} and {c.params["epochs"] for c in cs} == {3}
    assert len(cs) == 16 and sum(c.python is not None for c in cs) == 5
    cs = _cases(["--quick", "--workloads", "gcn", "--no-dgl", "--cache", str(tmp_path)])
    assert [c.name for c in cs] == ["gcn-20K:gnnscale", "gcn-20K:pyg"]
    assert cs[0].params["notes"] == ["DGL not run (--no-dgl); its cells are skipped"]


def test_dgl_retain_runs_dgl_again_where_it_trains(no_side_effects: list[tuple[Path, int]], tmp_path: Path) -> None:
    """``--dgl-retain``: DGL once more (glibc's tunables in its case's environment) in the training workloads,
    not in sampling; the reference stays plain DGL."""
    cs = {c.name: c for c in _cases(["--workloads", "gcn,sampling,minibatch", "--sizes", "200K", "--dgl-retain",
                                     "--cache", str(tmp_path)])}
    assert [n for n in cs if n.startswith("gcn")] == ["gcn-200K:gnnscale", "gcn-200K:dgl", "gcn-200K:pyg",
                                                      "gcn-200K:dgl-retain"]
    assert "minibatch-200K:dgl-retain" in cs and "sampling-200K:dgl-retain" not in cs
    assert cs["gcn-200K:dgl-retain"].env == peers.RETAIN_ENV and cs["gcn-200K:dgl-retain"].python
    assert cs["gcn-200K:dgl-retain"].params["reference"] == "dgl"
    assert peers.RETAIN_ENV == {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}


def test_dgl_that_cannot_be_set_up_gives_no_dgl_case_and_a_note(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    monkeypatch.setattr(peers, "setup_dgl", lambda venv, log: (None, "`pip install` failed:\n ERROR: no wheel"))
    monkeypatch.setattr(peers, "_prepare", lambda data, n: None)
    cs = _cases(["--quick", "--workloads", "gcn", "--cache", str(tmp_path)])
    assert [c.name for c in cs] == ["gcn-20K:gnnscale", "gcn-20K:pyg"]
    assert cs[0].params["notes"] == ["DGL could not be set up: `pip install` failed: ERROR: no wheel; its cells are "
                                     "skipped"]


def test_workloads_sizes_and_one_size_items(no_side_effects: list[tuple[Path, int]], tmp_path: Path) -> None:
    assert [peers._size(s) for s in ("200000", "200K", "0.8M")] == [200_000, 200_000, 800_000]
    assert peers.size_name(800_000) == "800K" and peers.size_name(1_000_000) == "1M"
    cs = peers.workload_cases(["gcn", "sampling", "gat-200K"], [200_000, 800_000])
    assert [c["name"] for c in cs] == ["gcn-200K", "gcn-800K", "sampling-200K", "gat-200K"]
    with pytest.raises(SystemExit):
        parser("peers", peers).parse_args(["--workloads", "gcn,nope"])
    with pytest.raises(SystemExit):
        _cases(["--epochs", "1", "--warmup", "1", "--cache", str(tmp_path)])


def test_the_dgl_worker_imports_no_gnnscale_at_its_top() -> None:
    """DGL's venv has torch 2.2.1 and none of gnnscale's dependencies: only numpy and torch at the top."""
    tree = ast.parse(Path(peers.__file__).with_name("_peers_workers.py").read_text())
    tops = {a.name.split(".")[0] for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    tops |= {n.module.split(".")[0] for n in tree.body if isinstance(n, ast.ImportFrom) and n.module}
    assert tops <= {"__future__", "argparse", "contextlib", "json", "os", "resource", "time", "collections",
                    "pathlib", "typing", "numpy", "torch"}, tops


# ------------------------------------------------------------------------------------------------ summaries
def test_summaries_median_range_and_ratio_to_dgl() -> None:
    runs = [_run("gcn-200K", "gnnscale", r, t) for r, t in enumerate([1.0, 3.0, 2.0])]
    runs += [_run("gcn-200K", "dgl", r, t) for r, t in enumerate([4.0, 5.0, 6.0])]
    runs += [_run("gcn-200K", "pyg", 0, 9.0), _run("gcn-200K", "pyg", 1, 0.0, ok=False)]
    s = {x["system"]: x for x in peers.summarise(runs)}
    assert (s["gnnscale"]["median_s"], s["gnnscale"]["min_s"], s["gnnscale"]["max_s"]) == (2.0, 1.0, 3.0)
    assert s["gnnscale"]["ratio"] == pytest.approx(2.0 / 5.0)
    assert s["dgl"]["ratio"] == pytest.approx(1.0)
    assert s["pyg"]["rounds_ok"] == 1 and s["pyg"]["errors"] == ["RuntimeError: boom"]
    assert s["pyg"]["ratio"] == pytest.approx(9.0 / 5.0)
    assert s["gnnscale"]["round_ratios"] == pytest.approx([1.0 / 4.0, 3.0 / 5.0, 2.0 / 6.0])
    assert s["pyg"]["round_ratios"] == pytest.approx([9.0 / 4.0])


def test_sampling_ratio_is_throughput_and_offload_refers_to_inmemory() -> None:
    runs = [_run("sampling-200K", "gnnscale", 0, 2.0, kind="sampling", mteps=5.0, test_acc=None),
            _run("sampling-200K", "dgl", 0, 1.0, kind="sampling", mteps=10.0, test_acc=None),
            _run("offload-200K", "gnnscale-offload", 0, 3.0, kind="offload"),
            _run("offload-200K", "gnnscale", 0, 2.0, kind="offload")]
    s = {(x["case"], x["system"]): x for x in peers.summarise(runs)}
    assert s["sampling-200K", "gnnscale"]["ratio"] == pytest.approx(0.5)
    assert s["offload-200K", "gnnscale-offload"]["ratio"] == pytest.approx(1.5)


def test_no_reference_gives_no_ratio() -> None:
    runs = [_run("gcn-200K", "gnnscale", 0, 1.0), _run("gcn-200K", "dgl", 0, 0.0, ok=False)]
    s = {x["system"]: x for x in peers.summarise(runs)}
    assert s["gnnscale"]["ratio"] is None and "median_s" not in s["dgl"]


def test_not_set_up_is_one_line() -> None:
    line = peers.not_set_up("DGL", "pip failed:\n  ERROR: no wheel\n")
    assert "\n" not in line and line.startswith("DGL could not be set up: pip failed: ERROR: no wheel")
    assert peers.not_set_up("DGL", "").startswith("DGL could not be set up: unknown reason")


# ------------------------------------------------------------------------------------------------ selection, table
def test_harness_records_name_their_case_with_the_system() -> None:
    """The harness's records name a case ``<case>:<system>`` (and carry a session with its rounds); a failed run
    has the case's parameters and an error. Their table rows are the older records' rows."""
    runs = [{**_run(f"gcn-20K:{s}", s, 0, t), "session": "q"} for s, t in (("gnnscale", 1.0), ("dgl", 2.0))]
    runs.append({**_run("gcn-20K:pyg", "pyg", 0, 0.0, ok=False), "session": "q", "notes": ["a note"]})
    text = peers.render(runs)
    assert "| gcn-20K | gnnscale | 1.000 s (1.000-1.000) | 0.50x DGL | 0.50 | 1.00 GiB | 0.50 GiB | 0.800 |" in text
    assert "| gcn-20K | PyG | failed: RuntimeError: boom | - |" in text and "- a note" in text


def test_selection_prefers_full_sessions_and_takes_each_case_from_the_latest() -> None:
    """Among the 3-round sessions each case comes from the last that ran it (a later rerun replaces, never merges);
    a 7-round or 1-round session counts only when no 3-round session exists."""
    runs = [{**_run("gcn-200K", s, r, 1.0), "session": "s1"} for r in range(3) for s in ("gnnscale", "dgl")]
    runs += [{**_run("gat-200K", s, r, 8.0), "session": "s1"} for r in range(3) for s in ("gnnscale", "dgl")]
    runs += [{**_run("gat-200K", s, r, 3.0), "session": "s2"} for r in range(3) for s in ("gnnscale", "dgl")]
    runs += [{**_run("gcn-200K", s, r, 5.0), "session": "long"} for r in range(7) for s in ("gnnscale", "dgl")]
    runs += [{**_run("gcn-20K", s, 0, 5.0), "session": "quick"} for s in ("gnnscale", "dgl")]
    got = peers.select_runs(runs)
    assert {(r["case"], r["session"]) for r in got} == {("gcn-200K", "s1"), ("gat-200K", "s2")}
    assert {r["session"] for r in peers.select_runs(runs[-2:])} == {"quick"}


def test_render_reproduces_the_peers_table_from_the_records() -> None:
    """The current table: 200K from session 5028b2e0d739, 800K GCN and SAGE from f3220270cdee, GAT from
    5b98aca2ba26 (offload from 5028b2e0d739, not the later 7-round 91a8da1116cb); figures from their records."""
    text = peers.render(PEERS)
    runs = [r for r in PEERS if r.get("record") == "run"]

    def median(session: str, case: str, system: str) -> float:
        return statistics.median(r["median_s"] for r in runs
                                 if (r["session"], r["case"], r["system"]) == (session, case, system))

    gcn, dgl = median("f3220270cdee", "gcn-800K", "gnnscale"), median("f3220270cdee", "gcn-800K", "dgl")
    assert f"| gcn-800K | gnnscale | {gcn:.3f} s (" in text and f"| {gcn / dgl:.2f}x DGL |" in text
    assert "| gcn-800K | gnnscale | 1.983 s (1.974-2.070) | 0.42x DGL | 0.40-0.46 | 4.29 GiB | 2.54 GiB | 0.858 |" \
        in text
    off = median("5028b2e0d739", "offload-200K", "gnnscale-offload")
    assert f"| offload-200K | gnnscale offload, 8 chunks | {off:.3f} s" in text and off == pytest.approx(0.446, 1e-3)
    gat = median("5b98aca2ba26", "gat-800K", "pyg")
    assert f"| gat-800K | PyG | {gat:.3f} s" in text and "| gat-800K | DGL, freed blocks kept |" not in text
    assert "5028b2e0d739 (gcn-200K, sage-200K, sampling-200K, minibatch-200K, offload-200K)" in text
    assert "| sampling-200K | PyG | failed: RuntimeError: PyG's neighbour sampler needs pyg_lib" in text
    assert text.count("\n| ") == 1 + 27 and peers.render(PEERS) == text


def test_headline_against_dgl_and_pyg_from_the_records() -> None:
    rows = peers.headline(PEERS)
    assert [r.what.split(":")[0] for r in rows] == ["gnnscale against DGL"] * 2 + ["gnnscale against PyG"]
    assert rows[0].figure == "GCN/SAGE/GAT 200K-800K: 0.36-0.67x DGL's epoch time"
    assert "minibatch-200K: mini-batch SAGE epoch 0.57x DGL's time" in rows[1].figure
    assert "sampling-200K: neighbour sampling 1.44x DGL's throughput" in rows[1].figure
    gn = [r for r in rows[2].records if r["case"] == "gcn-200K" and r["system"] == "gnnscale"]
    py = [r for r in rows[2].records if r["case"] == "gcn-200K" and r["system"] == "pyg"]
    q = statistics.median(r["median_s"] for r in gn) / statistics.median(r["median_s"] for r in py)
    assert rows[2].figure.startswith("GCN/SAGE/GAT 200K-800K: ") and f"{q:.2f}" in rows[2].figure
    assert {r["session"] for r in rows[0].records} == {"5028b2e0d739", "f3220270cdee", "5b98aca2ba26"}


# ------------------------------------------------------------------------------------------------ inmemory_vs_pyg
def test_inmemory_vs_pyg_cases() -> None:
    ap = parser("inmemory_vs_pyg", inmemory_vs_pyg)
    cs = inmemory_vs_pyg.cases(ap.parse_args([]))
    assert [c.name for c in cs] == ["gcn:gnnscale-inmemory", "gcn:pyg", "gcn:pyg-sparse", "sage:gnnscale-inmemory",
                                    "sage:pyg"]
    assert [c.group for c in cs] == ["gcn"] * 3 + ["sage"] * 2
    assert cs[0].params == {"nodes": 200_000, "warmup": 2, "epochs": 10, "seed": 0, "device": "auto",
                            "model": "gcn", "impl": "gnnscale-inmemory"}
    quick = inmemory_vs_pyg.cases(ap.parse_args(["--quick", "--models", "gat"]))
    assert [c.name for c in quick] == ["gat:gnnscale-inmemory", "gat:pyg"]
    assert (quick[0].params["nodes"], quick[0].params["warmup"], quick[0].params["epochs"]) == (20_000, 1, 3)


def test_inmemory_vs_pyg_render_is_the_latest_run_with_ratios_per_round() -> None:
    text = inmemory_vs_pyg.render(INMEMORY)
    last = [r for r in INMEMORY if r["gnnscale_rev"] == "9b5da19"]
    q = [r["median_epoch_s"] / o["median_epoch_s"] for r in last if (r["model"], r["impl"]) == ("gcn", "pyg")
         for o in last if (o["model"], o["impl"], o["round"]) == ("gcn", "gnnscale-inmemory", r["round"])]
    assert q == pytest.approx([r["ratio_vs_ours"] for r in last if (r["model"], r["impl"]) == ("gcn", "pyg")])
    row = (f"| GCN | PyG `GCNConv(cached=True)`, edge_index | 14.028 | 21.993, 14.028, 5.202 | 1580 | "
           f"**{statistics.median(q):.2f}** [{min(q):.2f} - {max(q):.2f}] |")
    assert row == "| GCN | PyG `GCNConv(cached=True)`, edge_index | 14.028 | 21.993, 14.028, 5.202 | 1580 | " \
                  "**2.44** [2.19 - 3.02] |" and row in text
    assert "| SAGE | gnnscale inmemory | 6.300 | 7.888, 6.300, 3.308 | 680 | 1.00 |" in text
    assert "0d09649" not in text and "1,999,836 directed edges" in text and "3 rounds" in text
