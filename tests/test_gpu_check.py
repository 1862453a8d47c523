"""`make gpu-check`'s driver (benchmarks/_gpu_check.py) and the benchmark ``gpu_check`` (benchmarks/gpu_check.py): its
dry run goes through every step on CPU, so the GPU run that a lent machine gets once cannot have rotted; a step
forced to fail leaves its traceback and the other steps' results in summary.md; steps past the deadline are
recorded as not run; the step records render as RESULTS.md's section."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import _gpu_check as gpu_check
from benchmarks import _gpu_check_engines as ge
from benchmarks import gpu_check as bench
from benchmarks.harness import read_records, registry
from benchmarks.harness.cli import parser
from benchmarks.harness.records import RESULTS_DIR

ROOT = Path(__file__).resolve().parents[1]
STEPS = ["env", "engines", "offload", "mover", "gather", "taskparallel", "hybrid", "tests", "distributed", "minibatch"]
ENGINES = ["inmemory", "offload", "taskparallel", "minibatch", "hybrid", "distributed"]
HARNESS_STEPS = ["offload", "gather", "taskparallel", "hybrid", "minibatch"]  # python -m benchmarks NAME


def _run(out: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """``bash benchmarks/gpu_check.sh OUT --dry-run FLAGS`` (what ``make gpu-check DRY=1`` runs)."""
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop(gpu_check.FAIL_ENV, None)
    return subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), str(out), "--dry-run", *flags],
                          env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("gpu-check")
    proc = _run(out)
    assert proc.returncode == 0, f"dry run failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    return out, proc.stdout


def test_dry_run_reports_every_step_ok(dry_run: tuple[Path, str]) -> None:
    out, stdout = dry_run
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == STEPS
    by_env = steps[0]["env"]
    for s in steps:
        assert s["status"] == "ok" and s["rc"] == 0 and s["dry_run"] and s["failure"] == "", s
        assert s["seconds"] <= s["timeout_s"] and s["step_command"]
        assert s["benchmark"] == "gpu_check" and s["session"] == steps[0]["session"] and s["gnnscale_rev"]
        assert s["command"].startswith("bash benchmarks/gpu_check.sh ") and "--dry-run" in s["command"]
        assert s["device_name"] == "no CUDA device" and s["torch"] == by_env["torch"]
    by = {s["step"]: s for s in steps}
    assert by["env"]["env"]["torch"] and "csbm_options" in by["env"]["env"]
    assert by["tests"]["counts"]["collected"] >= 1  # the CUDA tests, collected (run on a GPU)
    assert "--cuda-only" in by["tests"]["step_command"]
    for name in HARNESS_STEPS:
        assert f"-m benchmarks {name} " in by[name]["step_command"] and "--from-tree" in by[name]["step_command"]
    for name in ("offload", "minibatch", "taskparallel", "hybrid", "engines", "mover"):
        assert by[name]["records"] >= 2 and by[name]["records_not_ok"] == 0, by[name]
    assert "packages (needed by):" in stdout and "pymetis" in stdout
    assert any(line.startswith("distributed: 1 ranks (cpu, gloo)") for line in by["distributed"]["lines"])
    assert any(line.startswith("test accuracy") for line in by["distributed"]["lines"])
    assert "torch.distributed.run --standalone" in by["distributed"]["step_command"]
    assert "of 10 steps passed on no CUDA device" in bench.render(steps)


def test_dry_run_records_and_summary(dry_run: tuple[Path, str]) -> None:
    out, _ = dry_run
    offload = [json.loads(line) for line in (out / "offload.jsonl").read_text().splitlines()]
    assert {r["impl"] for r in offload} == {"offload", "inmemory"}
    assert [r["budget_spec"] for r in offload if r["impl"] == "offload"] == ["1MB"]
    for r in offload:
        assert r["status"] == "ok" and r["median_epoch_s"] > 0 and r["model"] == "gcn" and r["nodes"] == 2000
        if r["impl"] == "offload":
            assert r["h2d_bytes"] > 0
    inmem = next(r["median_epoch_s"] for r in offload if r["impl"] == "inmemory")
    off = next(r["median_epoch_s"] for r in offload if r["impl"] == "offload")
    assert f"| {off / inmem:.2f} |" in (out / "summary.md").read_text()  # the ratio the summary computes
    records = [json.loads(line) for line in (out / "minibatch.jsonl").read_text().splitlines()]
    samplers = [r for r in records if r["kind"] == "sampler"]
    assert len(samplers) == 3 and all(r["mteps"] > 0 for r in samplers)  # ours and the two baselines, same run
    tp = [json.loads(line) for line in (out / "taskparallel.jsonl").read_text().splitlines()]
    engines = {r["engine"]: r for r in tp if r["kind"] == "engine"}
    assert set(engines) == {"taskparallel", "offload", "inmemory"}
    assert len(engines["taskparallel"]["device_peak_bytes"]) == 2 and engines["taskparallel"]["mean_epoch_s"] > 0
    assert engines["taskparallel"]["final_loss"] == pytest.approx(engines["inmemory"]["final_loss"], rel=1e-5)
    assert [r["parts"] for r in tp if r["kind"] == "replication"] == [2]
    minibatch = [r for r in records if r["kind"] == "engine"]
    assert [r["gpu_feature_ratio"] for r in minibatch] == [0.25]
    assert all(r["status"] == "ok" and r["median_epoch_s"] > 0 and r["model"] == "sage" for r in minibatch)

    hy = [json.loads(line) for line in (out / "hybrid.jsonl").read_text().splitlines()]
    assert [r["devices"] for r in hy if r["kind"] == "model"] == ["cpu", "cpu,cpu:1"]
    assert all(r["predicted_epoch_s"] > 0 and r["measured_epoch_s"] > 0 for r in hy if r["kind"] == "model")
    drm = [r for r in hy if r["kind"] == "drm"]
    assert len(drm) == 1 and {float(k) for k in drm[0]["sweep"]} == {0.2, 0.5}

    summary = (out / "summary.md").read_text()
    for name in STEPS:
        assert f"## {name}: ok" in summary
    assert "median epoch (s)" in summary and "/ inmemory" in summary and "(XGNN)" in summary
    assert "-m benchmarks offload --device cuda" in summary  # what the GPU run would measure
    assert gpu_check.DATASET in summary and "--gpu-memory 6 " in summary and "--skip-pyg" in summary
    assert "-m benchmarks._gpu_check_engines --device cuda" in summary
    assert "-m benchmarks._gpu_check_mover --device cuda" in summary


def test_dry_run_engines_equal_and_mover_rates(dry_run: tuple[Path, str]) -> None:
    """The engines step ran every engine on both sides and compared them; the mover step timed the plain pinned
    copy and the mover (on the sim device: deferred copies) and found the rows exact."""
    out, _ = dry_run
    by = {s["step"]: s for s in map(json.loads, (out / "steps.jsonl").read_text().splitlines())}
    engines = by["engines"]["data"]
    assert [r["engine"] for r in engines] == ENGINES
    for r in engines:
        assert r["status"] == "ok" and len(r["device_losses"]) == len(r["cpu_losses"]) == 2, r
        assert r["max_diff"] <= 1e-4 and "traceback" not in r
    mover = by["mover"]["data"]
    assert [r["method"] for r in mover] == ["pinned copy", "mover slice", "mover rows (index_select)"]
    assert all(r["device"] == "sim:0" and r["exact"] and r["counted_ok"] and r["gbps"] > 0 for r in mover)
    summary = (out / "summary.md").read_text()
    assert "| engine | model | devices | device losses | CPU losses | max diff |" in summary
    assert "| pinned copy |" in summary and "/ pinned copy" in summary


def test_a_forced_failure_leaves_its_traceback_and_the_other_steps(tmp_path: Path) -> None:
    """--fail-step mover: its traceback is in summary.md and steps.jsonl, and the steps after it still ran."""
    only = "env,mover,tests,distributed"
    proc = _run(tmp_path, "--only", only, "--fail-step", "mover")
    assert proc.returncode == 1, proc.stdout[-3000:]
    steps = {s["step"]: s for s in map(json.loads, (tmp_path / "steps.jsonl").read_text().splitlines())}
    assert list(steps) == only.split(",")
    assert steps["mover"]["status"] == "failed" and steps["mover"]["rc"] == 1
    assert steps["mover"]["traceback"].startswith("Traceback (most recent call last):")
    assert "RuntimeError: step mover forced to fail" in steps["mover"]["traceback"]
    assert steps["mover"]["failure"].startswith("RuntimeError: step mover forced to fail")
    for name in ("env", "tests", "distributed"):
        assert steps[name]["status"] == "ok", steps[name]
    summary = (tmp_path / "summary.md").read_text()
    assert "## mover: failed" in summary and "RuntimeError: step mover forced to fail" in summary
    assert "## env: ok" in summary and "## tests: ok" in summary and "## distributed: ok" in summary
    assert "- test accuracy" in summary  # the distributed step's own result, after the failed one
    assert "steps ok; failed: mover" in proc.stdout
    text = bench.render(list(steps.values()))  # the records of results/gpu_check.jsonl, as the section shows them
    assert "| mover | **failed** |" in text and "3 of 4 steps passed on no CUDA device" in text


def test_steps_past_the_deadline_are_recorded_not_run(tmp_path: Path) -> None:
    proc = _run(tmp_path, "--only", "engines,mover", "--deadline", "0")
    assert proc.returncode == 0, proc.stdout[-3000:]
    steps = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert [(s["step"], s["status"]) for s in steps] == [(n, gpu_check.DEADLINE) for n in ("env", "engines", "mover")]
    summary = (tmp_path / "summary.md").read_text()
    assert "## engines: not run (deadline)" in summary and "| mover | not run (deadline) |" in summary


def test_step_limits_favour_the_earlier_steps() -> None:
    """A step gets what the later steps do not need, at least its budget, never more than is left."""
    assert gpu_check.step_timeout(60, later=300, left=450, dry=False) == 150
    assert gpu_check.step_timeout(60, later=300, left=100, dry=False) == 60  # earlier steps come first
    assert gpu_check.step_timeout(60, later=300, left=30, dry=False) == 30
    assert gpu_check.step_timeout(60, later=0, left=gpu_check.MIN_STEP_S - 1, dry=False) is None
    steps = gpu_check.build_steps(argparse.Namespace(dry_run=False), Path("OUT"), "python3", gpu_check.DATASET,
                                  Path("S"))
    assert [s.name for s in steps] == STEPS == list(gpu_check.STEP_NAMES)
    by = {s.name: s.argv for s in steps}
    for name in HARNESS_STEPS:  # through the harness: the working tree, one round, every core, records in OUT
        i = by[name].index(name)
        assert by[name][i - 2: i] == ["-m", "benchmarks"]
        assert by[name][-8:] == ["--from-tree", "--rounds", "1", "--threads", str(os.cpu_count()), "-v", "--out",
                                 f"OUT/{name}.jsonl"]
    assert sum(s.budget_s for s in steps) <= gpu_check.DEADLINE_S <= 8 * 60


def test_traceback_of_a_step_output() -> None:
    text = "noise\nTraceback (most recent call last):\n  File \"x\", line 1\n    boom()\nValueError: bad\nafter\n"
    want = "Traceback (most recent call last):\n  File \"x\", line 1\n    boom()\nValueError: bad"
    assert gpu_check.traceback_of(text) == want
    assert gpu_check.traceback_of("no error here") is None


def test_output_fits_the_device_tool(dry_run: tuple[Path, str]) -> None:
    """At most 8 plain files, no folders, names of letters, digits and ._- only, 16 MiB each at most."""
    out, _ = dry_run
    entries = list(out.iterdir())
    assert len(entries) <= 8 and {p.name for p in entries} <= set(gpu_check.FILES)
    for p in entries:
        assert p.is_file() and re.fullmatch(r"[A-Za-z0-9._-]+", p.name) and p.stat().st_size <= 16 << 20


def test_dry_spec_and_unknown_options() -> None:
    spec = gpu_check.dry_spec(gpu_check.DATASET)
    assert spec.startswith("csbm:nodes=2000,avg_degree=10,") and "communities=8" in spec and "p_intra=0.9" in spec
    assert "communities" not in gpu_check.dry_spec("csbm:nodes=10")
    kept, dropped = gpu_check.drop_options("csbm:nodes=5,communities=3,p_intra=0.5", ["nodes", "classes"])
    assert kept == "csbm:nodes=5" and dropped == ["communities", "p_intra"]
    assert gpu_check.drop_options("kronecker:scale=4", ["nodes"]) == ("kronecker:scale=4", [])


def test_summaries_of_gpu_records() -> None:
    """What only a GPU produces: gather rates and the offload engine's split H2D counters."""
    gather = [{"features": 100, "method": m, "label": m, "order": o, "median_ms": 10.0, "gbps": g, "correct": True}
              for m, o, g in (("bulk", "-", 25.0), ("uva", "sorted", 20.0), ("uva", "random", 12.5))]
    text = "\n".join(gpu_check.summarize_gather(gather))
    assert "| 100 | uva | random | 10.00 | 12.50 | 0.50 | ok |" in text
    rec = {"impl": "offload", "budget_spec": "6", "status": "ok", "chunks": 4, "median_epoch_s": 1.5,
           "h2d_bytes": 3e9, "h2d_row_bytes": 2e9, "h2d_topology_bytes": 0.9e9, "h2d_index_bytes": 0.1e9,
           "h2d_GBps": 2.0, "peak_bytes": 2**30, "final_loss": 1.0, "ratio_vs_inmemory": 1.5}
    text = "\n".join(gpu_check.summarize_offload([rec]))
    assert "offload 6 GiB" in text and "3.000 (2.000 / 0.900 / 0.100)" in text
    assert "| 1.500 | 1.50 | - |" in text
    assert gpu_check.pytest_counts("== 5 passed, 2 skipped, 270 deselected in 3.10s ==") == {
        "passed": 5, "skipped": 2, "deselected": 270}
    assert gpu_check.pytest_counts("1 failed, 4 passed in 9.0s")["failed"] == 1
    assert gpu_check.pytest_counts("6/282 tests collected (276 deselected) in 4.09s")["collected"] == 6


def test_engines_check_records_a_mismatch_and_a_traceback() -> None:
    """The engines step's verdict per engine: equal within the tolerance, a mismatch, or a failure with its
    traceback (and the next engine still runs: check returns instead of raising)."""
    pair = ge.configs("cuda", 1)["offload"]
    runs = {"cuda": [1.5, 1.4], "cpu": [1.5, 1.4 + 2e-4]}
    rec = ge.check("offload", pair, None, "cuda", 1, 1e-4, run=lambda g, c, d, r: runs[d])
    assert rec["status"] == "mismatch" and rec["max_diff"] == pytest.approx(2e-4)
    runs["cpu"] = [1.5, 1.4 + 5e-5]
    assert ge.check("offload", pair, None, "cuda", 1, 1e-4, run=lambda g, c, d, r: runs[d])["status"] == "ok"
    assert not ge.close([float("nan")], [float("nan")], 1e-4) and not ge.close([], [], 1e-4)

    def broken(g: object, c: object, d: str, r: int) -> list[float]:
        raise RuntimeError(f"no kernel image for {d}")

    rec = ge.check("hybrid", ge.configs("cuda", 1)["hybrid"], None, "cuda", 1, 1e-4, run=broken)
    assert rec["status"] == "failed" and "RuntimeError: no kernel image for cuda" in rec["traceback"]
    assert rec["devices"] == ["cpu", "cuda:0"] and rec["cpu_devices"] == ["cpu", "cpu:1"]
    text = "\n".join(gpu_check.summarize_engines([{**rec, "graph": ge.GRAPH}]))
    assert "| hybrid | sage | cpu,cuda:0 | - | - | - |" in text and "no kernel image" in text


def test_render_and_headline_of_the_recorded_runs() -> None:
    """The section and the at-a-glance row from benchmarks/results/gpu_check.jsonl: the H200 runs of 2026-11-28
    (transcribed from their summaries), each step's status and seconds as recorded."""
    records = read_records(RESULTS_DIR / "gpu_check.jsonl")
    text = bench.render(records)
    run1 = [r for r in records if r.get("session") == "h200-run1"]
    run2 = [r for r in records if r.get("session") == "h200-run2"]
    assert [r["step"] for r in run1] == ["env", "tests", "gather", "offload", "minibatch", "taskparallel", "hybrid",
                                         "distributed"]
    for r in run1:
        status = r["status"] if r["status"] == "ok" else f"**{r['status']}**"
        assert f"| {r['step']} | {status} | {r['seconds']:.1f} | {r['failure']}" in text
    assert "| tests | ok | - | (51 passed, 0 failed, 2 skipped) |" in text
    assert "Run 1 at **c175a26** (`bash benchmarks/gpu_check.sh $OUT`, 279 s in all): 4 of 8 steps passed" in text
    assert "Run 2 at **4b270cd**" in text and "3 of 4 steps passed on NVIDIA H200 (2026-11-28)" in text
    (row,) = bench.headline(records)
    assert row.what == "GPU check" and row.figure == "3 of 4 steps passed on NVIDIA H200 (2026-11-28)"
    assert list(row.records) == run2 and bench.render(records) == text  # the latest run; a pure function
    dry = [{**r, "session": "dry", "dry_run": True, "date": "2026-12-01T00:00:00+00:00"} for r in run1]
    assert bench.render(records + dry) == text  # a dry run recorded later does not displace the GPU runs
    assert "(dry run, CPU)" in bench.render(dry)


def test_cases_of_the_default_and_quick_arguments() -> None:
    ap = parser("gpu_check", bench)
    (case,) = bench.cases(ap.parse_args([]))
    assert case.name == "check" and case.timeout == gpu_check.DEADLINE_S + bench.MARGIN_S
    assert case.params == {"dir": None, "dry_run": False, "only": "", "deadline": gpu_check.DEADLINE_S,
                           "fail_step": "", "dataset": None, "commit": None}
    assert bench.driver_argv(case.params, "OUT") == ["OUT", "--deadline", str(gpu_check.DEADLINE_S)]
    (quick,) = bench.cases(ap.parse_args(["--quick", "--commit", "abc"]))
    assert quick.name == "dry run" and quick.params["dry_run"] and quick.params["only"] == bench.QUICK_STEPS
    assert bench.driver_argv(quick.params, "OUT") == ["OUT", "--deadline", str(gpu_check.DRY_DEADLINE_S),
                                                      "--dry-run", "--only", "env,engines,mover", "--commit", "abc"]
    assert "gpu_check" in registry.benchmarks()
