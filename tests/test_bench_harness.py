"""The benchmark harness (issue #48): every case its own process with one thread, interleaved rounds, records
that name the machine, versions, commit and command; RESULTS.md written from the records alone."""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks.harness import Case, registry, schedule
from benchmarks.harness.machine import source_tree
from benchmarks.harness.records import latest_session, read_records
from benchmarks.harness.results import RESULTS_MD, generate
from benchmarks.harness.runner import run_benchmark

ROOT = Path(__file__).resolve().parents[1]

FAKE = textwrap.dedent('''
    import os
    import torch

    def run(params):
        if params.get("fail"):
            raise ValueError("this case fails on purpose")
        return [{"x": params["x"], "pid": os.getpid(), "torch_threads": torch.get_num_threads(),
                 "omp": os.environ.get("OMP_NUM_THREADS"), "extra": os.environ.get("FAKE_EXTRA")}]
''')


def test_the_schedule_interleaves_and_rotates_each_group() -> None:
    a, b, c = Case("a", group="g"), Case("b", group="g"), Case("c")
    order = [(r, case.name) for r, case in schedule(3, [a, b, c])]
    assert order == [(0, "a"), (0, "b"), (0, "c"), (1, "b"), (1, "a"), (1, "c"), (2, "a"), (2, "b"), (2, "c")]


def _args(**kw: object) -> argparse.Namespace:
    return argparse.Namespace(**{"quick": False, "rounds": 2, "threads": 1, "from_tree": True, "verbose": False,
                                 **kw})


def test_every_case_runs_in_a_process_of_its_own_with_one_thread(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "fake_bench_case.py").write_text(FAKE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # the harness's --threads wins over the caller's
    cases = [Case("one", {"x": 1}, group="g", module="fake_bench_case"),
             Case("two", {"x": 2}, group="g", module="fake_bench_case", env={"FAKE_EXTRA": "yes"}),
             Case("bad", {"x": 3, "fail": True}, module="fake_bench_case")]
    bench = SimpleNamespace(cases=lambda args: cases)
    out = tmp_path / "fake.jsonl"
    recs = run_benchmark("fake", bench, _args(), "python -m benchmarks fake", out)  # type: ignore[arg-type]
    assert [(r["round"], r["case"]) for r in recs] == [(0, "one"), (0, "two"), (0, "bad"),
                                                       (1, "two"), (1, "one"), (1, "bad")]
    ok = [r for r in recs if r["ok"]]
    assert len(ok) == 4 and len({r["pid"] for r in ok}) == 4 and os.getpid() not in {r["pid"] for r in ok}
    assert {r["torch_threads"] for r in ok} == {1} and {r["omp"] for r in ok} == {"1"}
    assert {r["extra"] for r in ok if r["case"] == "two"} == {"yes"} and {r["extra"] for r in ok
                                                                          if r["case"] == "one"} == {None}
    bad = [r for r in recs if not r["ok"]]
    assert len(bad) == 2 and all("this case fails on purpose" in r["error"] for r in bad)
    for r in recs:
        assert r["benchmark"] == "fake" and r["command"] == "python -m benchmarks fake"
        assert r["host_cpu"] and r["date"] and r["session"] == recs[0]["session"] and r["rounds"] == 2
        assert len(r["gnnscale_rev"].split("-")[0]) == 12 and r["clean"] == (not r["gnnscale_rev"].endswith("-dirty"))
    assert all(r["torch"] for r in ok)  # the version the case process imported
    assert read_records(out) == json.loads(json.dumps(recs))  # each run appended as it ended


def test_a_dirty_tree_runs_from_a_clean_worktree_of_head(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "gnnscale").mkdir(parents=True)
    (repo / "gnnscale" / "x.py").write_text("A = 1\n")
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    with source_tree(repo, from_tree=False) as (src, rev, why):
        assert src == repo and why is None and not rev.endswith("-dirty")
    (repo / "gnnscale" / "x.py").write_text("A = 2\n")
    with source_tree(repo, from_tree=False) as (src, rev, why):
        assert src != repo and (src / "gnnscale" / "x.py").read_text() == "A = 1\n"
        assert "gnnscale/x.py" in (why or "") and not rev.endswith("-dirty")
    assert not src.exists()  # the worktree is gone afterwards
    with source_tree(repo, from_tree=True) as (src, rev, _):
        assert src == repo and rev.endswith("-dirty")


def test_every_module_of_benchmarks_is_a_benchmark_of_the_harness() -> None:
    names = registry.benchmarks()
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        if path.stem.startswith("_"):
            continue
        tree = ast.parse(path.read_text())
        assert path.stem in names, f"benchmarks/{path.name} defines no cases/run/render: run it through the harness"
        mains = [n for n in ast.walk(tree) if isinstance(n, ast.Compare) and isinstance(n.left, ast.Name)
                 and n.left.id == "__name__"]
        assert not mains, f"benchmarks/{path.name} runs as a script; the harness runs it (python -m benchmarks)"


def test_the_list_and_a_bad_name() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "benchmarks", "--list"], capture_output=True, text=True, env=env,
                       cwd=ROOT)
    assert p.returncode == 0 and "locality" in p.stdout
    p = subprocess.run([sys.executable, "-m", "benchmarks", "no_such_bench"], capture_output=True, text=True,
                       env=env, cwd=ROOT)
    assert p.returncode == 2 and p.stderr.strip().startswith("error: no benchmark 'no_such_bench'")


def test_results_md_is_what_the_records_give() -> None:
    text = generate()
    assert RESULTS_MD.read_text() == text, "benchmarks/RESULTS.md is stale: run `python -m benchmarks results`"


def test_a_section_comes_from_its_records_only(tmp_path: Path) -> None:
    rec = {"session": "s1", "dataset": "csbm:nodes=10", "nodes": 10, "edges": 40, "chunks": 8, "chunker": "metis",
           "alpha": 2.345, "command": "python -m benchmarks locality", "gnnscale_rev": "abcdef123456",
           "date": "2026-01-02T00:00:00+00:00"}
    (tmp_path / "locality.jsonl").write_text(json.dumps(rec) + "\n" + json.dumps({**rec, "session": "s2",
                                                                                 "alpha": 3.456}) + "\n")
    text = generate(tmp_path)
    assert "| 3.46 |" in text and "2.35" not in text  # the latest run, not the earlier one
    assert "abcdef123456" in text and generate(tmp_path) == text


def test_latest_session_groups_old_records_by_command_and_commit() -> None:
    old = [{"command": "a", "gnnscale_rev": "1", "v": 1}, {"command": "a", "gnnscale_rev": "2", "v": 2},
           {"command": "a", "gnnscale_rev": "2", "v": 3}]
    assert [r["v"] for r in latest_session(old)] == [2, 3]


def test_the_headline_order_names_benchmarks_that_exist() -> None:
    from benchmarks.harness.results import FIRST
    assert set(FIRST) <= set(registry.benchmarks()), set(FIRST) - set(registry.benchmarks())
