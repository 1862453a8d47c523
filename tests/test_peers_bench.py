"""benchmarks/peers.py's pure logic: cases and the interleaved schedule, summaries (medians, ranges, ratios to DGL),
the markdown section, marker replacement and the "could not be set up" line. No child process is started."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import peers  # noqa: E402

ENV = {"date": "2026-11-25T23:00:00+00:00", "cpu": "Test CPU (2 cores)", "threads": 1, "rounds": 3, "epochs": 5,
       "warmup": 1, "gnnscale_rev": "abc123def456", "command": ".venv/bin/python benchmarks/peers.py --quick",
       "torch": "2.13.0", "pyg": "2.8.1", "dgl": "2.1.0", "dgl_torch": "2.2.1"}


def _run(case: str, system: str, rnd: int, median: float, kind: str = "full", ok: bool = True,
         **kw: object) -> dict[str, object]:
    ref = "gnnscale" if kind == "offload" else "dgl"
    rec: dict[str, object] = {"case": case, "system": system, "round": rnd, "kind": kind, "reference": ref, "ok": ok}
    if ok:
        rec.update(median_s=median, peak_rss_bytes=2**30, train_peak_bytes=2**29, test_acc=0.8)
    else:
        rec["error"] = "RuntimeError: boom"
    rec.update(kw)
    return rec


def test_cases_and_schedule_rotate_systems() -> None:
    cs = peers.cases(["gcn", "sampling", "gat-200K"], [200_000, 800_000])
    assert [c["name"] for c in cs] == ["gcn-200K", "gcn-800K", "sampling-200K", "gat-200K"]
    assert cs[2]["model"] == "sage" and cs[2]["systems"] == ("gnnscale", "dgl", "pyg")
    sched = peers.schedule(2, cs[:1])
    assert [s for _, _, s in sched] == ["gnnscale", "dgl", "pyg", "dgl", "pyg", "gnnscale"]
    assert [r for r, _, _ in sched] == [0, 0, 0, 1, 1, 1]


def test_dgl_retain_runs_dgl_again_where_it_trains() -> None:
    """``--dgl-retain``: DGL once more (with glibc's tunables) in the training workloads, not in sampling; the
    reference stays plain DGL."""
    cs = {c["name"]: c for c in peers.cases(["gcn", "sampling", "minibatch"], [200_000], dgl_retain=True)}
    assert cs["gcn-200K"]["systems"] == ("gnnscale", "dgl", "pyg", "dgl-retain")
    assert cs["minibatch-200K"]["systems"] == ("gnnscale", "dgl", "dgl-retain")
    assert "dgl-retain" not in cs["sampling-200K"]["systems"]
    assert peers.reference(cs["gcn-200K"]) == "dgl"
    assert peers.RETAIN_ENV == {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}
    assert "dgl-retain" not in peers.cases(["gcn"], [200_000])[0]["systems"]


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


def test_render_section_rows() -> None:
    runs = [_run("gcn-200K", "gnnscale", r, t) for r, t in enumerate([1.0, 3.0, 2.0])]
    runs += [_run("gcn-200K", "dgl", r, 4.0) for r in range(3)]
    runs += [_run("gcn-200K", "pyg", r, 0.0, ok=False) for r in range(3)]
    text = peers.render_section(peers.summarise(runs), ENV, [peers.not_set_up("PyG", "no module\nnamed x")])
    row = "| gcn-200K | gnnscale | 2.000 s (1.000-3.000) | 0.50x DGL | 0.25-0.75 | 1.00 GiB | 0.50 GiB | 0.800 |"
    assert row in text
    assert "| gcn-200K | DGL | 4.000 s (4.000-4.000) | 1.00x DGL | 1.00-1.00 |" in text
    assert "| gcn-200K | PyG | failed: RuntimeError: boom |" in text
    assert "Test CPU (2 cores)" in text and "abc123def456" in text and "`OMP_NUM_THREADS=1`" in text
    assert "interleaved rounds: 3" in text and ENV["command"] in text and "DGL 2.1.0 on torch 2.2.1" in text
    assert "- PyG could not be set up: no module named x; its cells are skipped" in text


def test_not_set_up_is_one_line() -> None:
    line = peers.not_set_up("DGL", "pip failed:\n  ERROR: no wheel\n")
    assert "\n" not in line and line.startswith("DGL could not be set up: pip failed: ERROR: no wheel")
    assert peers.not_set_up("DGL", "").startswith("DGL could not be set up: unknown reason")


def test_replace_section_between_markers() -> None:
    text = f"# R\n\nbefore\n{peers.BEGIN}\nold table\n{peers.END}\nafter\n"
    out = peers.replace_section(text, "new table\n")
    assert out == f"# R\n\nbefore\n{peers.BEGIN}\nnew table\n{peers.END}\nafter\n"
    assert peers.replace_section(out, "newer") == out.replace("new table", "newer")


def test_replace_section_appends_markers_when_absent() -> None:
    assert peers.replace_section("# R\n", "t") == f"# R\n\n{peers.BEGIN}\nt\n{peers.END}\n"
    assert peers.replace_section("", "t") == f"{peers.BEGIN}\nt\n{peers.END}\n"
    assert peers.replace_section("x", "t") == f"x\n\n{peers.BEGIN}\nt\n{peers.END}\n"


def test_sizes_and_workload_validation() -> None:
    assert [peers._size(s) for s in ("200000", "200K", "0.8M")] == [200_000, 200_000, 800_000]
    assert peers.size_name(800_000) == "800K" and peers.size_name(1_000_000) == "1M"
    args = peers.parse_args(["--quick"])
    assert args.sizes == [peers.QUICK_NODES] and args.rounds == 1 and args.epochs == 3
    with pytest.raises(SystemExit):
        peers.parse_args(["--workloads", "gcn,nope"])


def test_render_combines_sessions_from_the_records(tmp_path: Path) -> None:
    import json

    runs = [{**_run("gcn-200K", "gnnscale", 0, 1.0), "record": "run", "session": "s1"},
            {**_run("gcn-200K", "dgl", 0, 2.0), "record": "run", "session": "s1"},
            {**_run("gat-800K", "gnnscale", 0, 6.0), "record": "run", "session": "s2"},
            {**_run("gat-800K", "dgl", 0, 3.0), "record": "run", "session": "s2"},
            {**_run("gcn-200K", "gnnscale", 0, 9.0), "record": "run", "session": "other"}]
    heads = [{**ENV, "record": "summary", "session": s, "command": f"cmd {s}", "notes": [f"note {s}"]}
             for s in ("s1", "s2")]
    out, md = tmp_path / "peers.jsonl", tmp_path / "R.md"
    out.write_text("".join(json.dumps(r) + "\n" for r in [*runs, *heads]))
    md.write_text(f"# R\n{peers.BEGIN}\nold\n{peers.END}\ntail\n")
    assert peers.main(["--render", "s1,s2", "--out", str(out), "--results", str(md), "--note", "loaded"]) == 0
    text = md.read_text()
    assert "old" not in text and text.endswith(f"{peers.END}\ntail\n")
    assert "| gcn-200K | gnnscale | 1.000 s (1.000-1.000) | 0.50x DGL |" in text
    assert "| gat-800K | gnnscale | 6.000 s (6.000-6.000) | 2.00x DGL |" in text
    assert "`cmd s1`, then `cmd s2`" in text and "- note s1" in text and "- note s2" in text and "- loaded" in text
    assert peers.main(["--render", "s1,nope", "--out", str(out), "--results", str(md), "--no-save"]) == 2


def test_rev_and_from_tree_exclude_each_other() -> None:
    with pytest.raises(SystemExit):
        peers.parse_args(["--from-tree", "--rev", "HEAD~1"])


def test_render_takes_a_case_from_the_last_session_that_ran_it(tmp_path: Path) -> None:
    """A later session's rerun of a case replaces the earlier session's rounds of it (never merged with them);
    the other cases keep the session that ran them."""
    import json

    runs = [{**_run("gcn-200K", "gnnscale", 0, 1.0), "record": "run", "session": "s1"},
            {**_run("gcn-200K", "dgl", 0, 2.0), "record": "run", "session": "s1"},
            {**_run("gat-200K", "gnnscale", 0, 8.0), "record": "run", "session": "s1"},
            {**_run("gat-200K", "dgl", 0, 4.0), "record": "run", "session": "s1"},
            {**_run("gat-200K", "gnnscale", 0, 3.0), "record": "run", "session": "s2"},
            {**_run("gat-200K", "gnnscale", 1, 3.0), "record": "run", "session": "s2"},
            {**_run("gat-200K", "dgl", 0, 6.0), "record": "run", "session": "s2"},
            {**_run("gat-200K", "dgl", 1, 6.0), "record": "run", "session": "s2"}]
    assert peers.latest_runs(runs, ["s1", "s2"]) == runs[:2] + runs[4:]
    assert peers.latest_runs(runs, ["s2", "s1"]) == runs[:4]
    heads = [{**ENV, "record": "summary", "session": s, "command": f"cmd {s}", "notes": []} for s in ("s1", "s2")]
    out, md = tmp_path / "peers.jsonl", tmp_path / "R.md"
    out.write_text("".join(json.dumps(r) + "\n" for r in [*runs, *heads]))
    md.write_text(f"{peers.BEGIN}\n{peers.END}\n")
    assert peers.main(["--render", "s1,s2", "--out", str(out), "--results", str(md)]) == 0
    text = md.read_text()
    assert "| gat-200K | gnnscale | 3.000 s (3.000-3.000) | 0.50x DGL |" in text
    assert "| gcn-200K | gnnscale | 1.000 s (1.000-1.000) | 0.50x DGL |" in text
