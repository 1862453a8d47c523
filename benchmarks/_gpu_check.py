"""`make gpu-check`'s driver: what the CUDA paths need measured, in one command within 8 minutes, the first time a
GPU is at hand (the machine's own python3 and torch; wheels in ``.whl/`` are installed where packages are missing).

    bash benchmarks/gpu_check.sh OUT             # on the GPU machine: 450 s at most (make gpu-check OUT=/path)
    bash benchmarks/gpu_check.sh OUT --dry-run   # anywhere, on the CPU, tiny sizes: a minute or two (DRY=1)
    python -m benchmarks gpu_check --from-tree [--dir OUT] [--dry-run]   # the same through the harness

The benchmark ``gpu_check`` (benchmarks/gpu_check.py) runs this driver as its one case and records its steps in
``benchmarks/results/gpu_check.jsonl``; this module is the driver itself (``python -m benchmarks._gpu_check``).

Steps, in order of value, each a subprocess with its own time budget (``Step.budget_s``). A step gets the time
left minus the budgets of the steps after it, but at least its own budget (earlier steps come first), never more
than the time left; a step with less than ``MIN_STEP_S`` left is recorded as ``not run (deadline)``. A step that
fails or runs out of time is recorded (with its traceback) and the next step runs. ``summary.md`` and
``steps.jsonl`` are rewritten after every step, so a run cut off still leaves the steps it finished.

1. ``env``: device, PCIe link, CPU, RAM, versions (``_gpu_check_env.py``; before it the driver checks the
   packages the steps import, ``REQUIRED``, and installs ``--wheels``' wheels with ``pip --target`` if some miss).
2. ``engines``: every engine (inmemory, offload, taskparallel with ``dgcn``, minibatch, hybrid, distributed with
   one rank per GPU, at most 2) trains 2 epochs on the device and on the CPU on one small graph; ok when every
   engine's losses agree within 1e-4 (``_gpu_check_engines.py``; the table goes to the summary).
3. ``offload``: ``python -m benchmarks offload`` on ``--dataset`` (default ``DATASET``, ogbn-products' size): GCN,
   2 layers, hidden 256, ``--gpu-memory 6`` GiB against the in-memory engine: epoch time, peak, H2D bytes and GB/s.
4. ``mover``: the offload engine's row mover, host to device, in GB/s against a plain copy from pinned memory
   (``_gpu_check_mover.py``: contiguous slices and gathered rows through ``prefetched``, as the engine loads).
5. ``gather``: the UVA / zero-copy gather of the minibatch engine (``python -m benchmarks gather``): pinned rows
   -> GPU, bulk copy vs pipelined CPU ``index_select`` vs the UVA Triton kernel, random and sorted ids.
6. ``taskparallel``: ``python -m benchmarks taskparallel`` on a Kronecker graph (scale 18): dgcn with T and P on
   two streams of the GPU against offload and in-memory; replication factors for 2/4/8/16 METIS parts.
7. ``hybrid``: ``python -m benchmarks hybrid`` on a 500,000-vertex csbm graph: the CPU trainer alone and beside
   the GPU, predicted against measured times; static CPU shares against DRM.
8. ``tests``: ``pytest --cuda-only`` over ``tests/`` (the tests that use a CUDA device).
9. ``distributed``: a 1-GPU NCCL run of ``gnnscale train --engine distributed`` under ``torch.distributed.run``.
10. ``minibatch``: ``python -m benchmarks minibatch`` on the products-sized graph: GraphSAGE 25,10, a quarter of
    the features on the GPU; epoch time against XGNN's 0.3 s, and the samplers compared.

The benchmark steps run through the harness (``python -m benchmarks NAME ... --from-tree --rounds 1 --threads N
-v --out OUT/NAME.jsonl``: the working tree, since the device's copy of .git is stale; torch at every core on the
GPU, one on the dry run).

Output, within the device tool's return limits (at most 8 files, no folders): ``summary.md``, ``steps.jsonl`` (one
record per step, as ``benchmarks/results/gpu_check.jsonl`` keeps them: the run's session, date, command, commit
(``--commit``), device and torch; the step's status, rc, seconds, limit, what failed, ``step_command`` and its
figures; the ``engines`` and ``mover`` records under ``data``; a failed step's ``traceback``), ``gather`` /
``offload`` / ``taskparallel`` / ``hybrid`` / ``minibatch.jsonl`` (the benchmarks' own records) and ``run.log``
(every step's output).

``--dry-run`` runs the same steps on the CPU with tiny sizes (the mover on the runtime's sim device, whose copies
read NaN until waited for; the tests step only collects), so the test suite (``tests/test_gpu_check.py``) and CI
exercise every step, and the summary lists the commands the GPU run would use.

``--fail-step NAME`` (or ``GNNSCALE_GPU_CHECK_FAIL_STEP=NAME``), a testing aid: that step's command is replaced by
one that raises, to check that its traceback is recorded and the other steps still run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks._gpu_check_env import OPTIONAL, REQUIRED, find_packages, install_wheels
from benchmarks._gpu_check_report import (  # noqa: F401  (re-exported: the summaries are tested through this module)
    DEADLINE,
    XGNN_EPOCH_S,
    Step,
    summarize_engines,
    summarize_gather,
    summarize_mover,
    summarize_offload,
    write_summary,
)
from benchmarks.harness.records import append_records, read_records

ROOT = Path(__file__).resolve().parents[1]

# The graph of the offload and mini-batch steps: ogbn-products' size (2,449,029 vertices, ~50 average degree,
# 100 features, 47 classes) with community structure, so that chunks have locality as real graphs do.
DATASET = "csbm:nodes=2449029,avg_degree=50,features=100,classes=47,communities=256,p_intra=0.9"
# --dry-run: the same spec with these options replaced (communities only where the spec has them).
DRY_SIZES = {"nodes": "2000", "avg_degree": "10", "features": "16", "classes": "4", "communities": "8"}
TP_DATASET = "kronecker:scale=18,edgefactor=16"  # the task-parallel step's graph (262,144 vertices)
TP_DRY_DATASET = "csbm:nodes=2000,features=16"
HY_DATASET = "csbm:nodes=500000,avg_degree=20,features=100,classes=47"  # the hybrid step's graph
HY_DRY_DATASET = "csbm:nodes=2000,features=16,train=0.5"
DEADLINE_S = 450.0  # the whole GPU run: 8 minutes, less the interpreter's start and the wheels' install
DRY_DEADLINE_S = 1800.0  # the dry run's (a slow CI machine): it only guards against a hang
MIN_STEP_S = 10.0  # a step with less time left is not started
FAIL_ENV = "GNNSCALE_GPU_CHECK_FAIL_STEP"
FAIL_CODE = "import sys; raise RuntimeError(f'step {sys.argv[1]} forced to fail (--fail-step, a testing aid)')"
FILES = ("summary.md", "steps.jsonl", "gather.jsonl", "offload.jsonl", "taskparallel.jsonl", "hybrid.jsonl",
         "minibatch.jsonl", "run.log")
LOG_CAP = 4 << 20  # bytes of one step's output kept in run.log (the device tool returns files up to 16 MiB)
STEP_NAMES = ("env", "engines", "offload", "mover", "gather", "taskparallel", "hybrid", "tests", "distributed",
              "minibatch")  # build_steps' order
TRACEBACK_CAP = 8000  # characters of a failed step's traceback kept in steps.jsonl and summary.md


# ------------------------------------------------------------------------------------------------ specs
def dry_spec(spec: str) -> str:
    """``spec`` with the size options of ``DRY_SIZES`` replaced (``communities`` kept only if ``spec`` has it)."""
    kind, _, rest = spec.partition(":")
    opts = dict(item.split("=", 1) for item in rest.split(",") if "=" in item)
    for k, v in DRY_SIZES.items():
        if k in opts or k != "communities":
            opts[k] = v
    return f"{kind}:" + ",".join(f"{k}={v}" for k, v in opts.items())


def drop_options(spec: str, known: list[str] | None) -> tuple[str, list[str]]:
    """``spec`` without the csbm options this checkout's generator does not know (``known``), and those dropped."""
    kind, _, rest = spec.partition(":")
    if kind != "csbm" or known is None:
        return spec, []
    items = [i for i in rest.split(",") if i]
    dropped = [i.split("=", 1)[0] for i in items if i.split("=", 1)[0] not in known]
    return f"{kind}:" + ",".join(i for i in items if i.split("=", 1)[0] in known), dropped


# ------------------------------------------------------------------------------------------------ steps
def bench(name: str, dry: bool, out: Path, python: str, *flags: str) -> list[str]:
    """``python -m benchmarks NAME``: one round of the working tree (the device's copy of .git is stale), its own
    output shown, its records appended to ``OUT/NAME.jsonl``; torch at one thread on the dry run, at every core on
    the GPU (as the benchmarks ran there before the harness)."""
    threads = "1" if dry else str(os.cpu_count() or 1)
    return [python, "-m", "benchmarks", name, *flags, "--from-tree", "--rounds", "1", "--threads", threads, "-v",
            "--out", str(out / f"{name}.jsonl")]


def build_steps(args: argparse.Namespace, out: Path, python: str, spec: str, scratch: Path) -> list[Step]:
    """The steps in order of value; ``scratch``: where the records that go into steps.jsonl are written first."""
    dry = args.dry_run
    dev = ["--device", "cpu"] if dry else ["--device", "cuda"]
    epochs = ["--warmup", "0", "--epochs", "1"] if dry else ["--warmup", "1", "--epochs", "2"]
    py = [python]
    engines = [*py, "-m", "benchmarks._gpu_check_engines", *dev, "--out", str(scratch / "engines.jsonl")]
    if dry:
        engines += ["--threads", "1"]
    offload = bench("offload", dry, out, python, *dev, "--dataset", spec, "--models", "gcn", "--layers", "2",
                    "--hidden", "16" if dry else "256", "--chunks", "", "--gpu-memory", "1MB" if dry else "6",
                    "--skip-pyg", *epochs)
    mover = [*py, "-m", "benchmarks._gpu_check_mover", "--device", "sim:0" if dry else "cuda",
             "--out", str(scratch / "mover.jsonl")]
    mover += ["--rows-total", "4096", "--features", "16", "--reps", "2"] if dry else ["--rows-total", "2000000"]
    gather = bench("gather", dry, out, python, *(
        ["--rows-total", "4096", "--rows", "512", "--features", "100", "--reps", "2", "--warmup", "1"] if dry
        else ["--rows-total", "8000000", "--rows", "1000000", "--features", "100,256", "--reps", "5", "--warmup",
              "2"]))
    # two device threads on the one GPU (T tasks and P tasks, each on its own stream) against offload and inmemory
    taskparallel = bench("taskparallel", dry, out, python, *dev, "--devices", "cpu,cpu" if dry else "cuda:0,cuda:0",
                         "--dataset", TP_DRY_DATASET if dry else TP_DATASET, "--parts", "2" if dry else "2,4,8,16",
                         "--warmup", "1", "--repeats", "1" if dry else "3")
    # the CPU trainer beside the GPU: the model's prediction per stage, a static sweep and DRM
    hybrid = bench("hybrid", dry, out, python, "--datasets", HY_DRY_DATASET if dry else HY_DATASET,
                   "--drm-dataset", HY_DRY_DATASET if dry else HY_DATASET, "--model-devices",
                   "cpu;cpu,cpu:1" if dry else "cpu;cpu,cuda:0", "--drm-devices", "cpu,cpu:1" if dry else "cpu,cuda:0",
                   "--slowdown", "3" if dry else "1", "--sweep", "0.2,0.5" if dry else "0.05,0.2",
                   "--hidden", "16" if dry else "256", "--fanouts", "5,5" if dry else "25,10",
                   "--batch-size", "64" if dry else "1024", "--warmup", "0" if dry else "1", "--epochs", "1",
                   "--drm-epochs", "2", "--repeats", "1")
    # the dry run collects two modules' CUDA tests (the whole suite's collection alone takes half a minute)
    tests = [*py, "-m", "pytest", "-p", "no:cacheprovider", "--cuda-only"]
    tests += ([str(ROOT / "tests" / "test_gather.py"), str(ROOT / "tests" / "test_runtime.py"), "--collect-only",
               "-q"] if dry else [str(ROOT / "tests"), "-q", "-rfEs", "--durations=10"])
    # NCCL: one rank on the GPU under torch's launcher (the dry run: one gloo rank on the CPU)
    distributed = [python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
                   "-m", "gnnscale", "train", "--engine", "distributed", "--dataset",
                   HY_DRY_DATASET if dry else HY_DATASET, "--model", "sage", "--epochs", "2", "--quiet",
                   "--device", "cpu" if dry else "cuda", "--batch-size", "64" if dry else "1024"]
    minibatch = bench("minibatch", dry, out, python, *dev, "--dataset", spec, "--model", "sage",
                      "--hidden", "16" if dry else "256", "--fanouts", "5,5" if dry else "25,10",
                      "--batch-size", "64" if dry else "1024", "--gpu-feature-ratio", "0.25", "--repeats", "1",
                      *epochs)
    # budgets: the H200 run of 2026-11-28 (benchmarks/results/gpu_check.jsonl) and its cuts; see the issue #46 report
    return [
        Step("env", 20, [*py, "-m", "benchmarks._gpu_check_env"], what="device, versions, PCIe link"),
        Step("engines", 60, engines, "engines.jsonl", "every engine, 2 epochs on the device = on the CPU (1e-4)",
             embed=True),
        Step("offload", 75, offload, "offload.jsonl", "offload engine under a 6 GiB budget vs in-memory, products "
             "size"),
        Step("mover", 25, mover, "mover.jsonl", "the row mover's host -> device GB/s vs a plain pinned copy",
             embed=True),
        Step("gather", 30, gather, "gather.jsonl", "minibatch UVA / zero-copy gather: bulk, index_select, UVA"),
        Step("taskparallel", 40, taskparallel, "taskparallel.jsonl",
             "task-parallel engine (dgcn, T and P on two streams) vs offload and in-memory; replication factors"),
        Step("hybrid", 70, hybrid, "hybrid.jsonl",
             "hybrid engine (CPU + GPU trainers): predicted vs measured stages, static splits vs DRM"),
        Step("tests", 50, tests, what="the CUDA tests of every engine (pytest --cuda-only)"),
        Step("distributed", 20, distributed, what="distributed engine: a 1-GPU NCCL run under torchrun"),
        Step("minibatch", 50, minibatch, "minibatch.jsonl",
             f"mini-batch engine epoch time (goal {XGNN_EPOCH_S} s, XGNN); samplers compared"),
    ]


def run_step(step: Step, timeout: float, env: dict[str, str], log: Path) -> tuple[int | None, float, str]:
    """Run ``step.argv`` in its own process group; returns (rc or None on timeout, seconds, its output)."""
    t0 = time.monotonic()
    with tempfile.TemporaryFile(mode="w+b") as buf:
        proc = subprocess.Popen(step.argv, cwd=ROOT, env=env, stdout=buf, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc: int | None = proc.wait(timeout=max(timeout, 1.0))
        except subprocess.TimeoutExpired:
            rc = None
            for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 30)):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(timeout=wait)
                    break
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    continue
        seconds = time.monotonic() - t0
        buf.seek(0)
        raw = buf.read()
    text = raw.decode("utf-8", "replace")
    kept = text if len(raw) <= LOG_CAP else f"[... {len(raw) - LOG_CAP} bytes cut ...]\n" + text[-LOG_CAP:]
    with log.open("a") as f:
        f.write(f"\n===== step {step.name}: {shlex.join(step.argv)}\n{kept}\n===== step {step.name}: "
                f"{'timeout' if rc is None else f'rc {rc}'} after {seconds:.1f} s (limit {timeout:.0f} s)\n")
    return rc, seconds, text


NO_CUDA = re.compile(r"needs CUDA|requires CUDA|no CUDA|CUDA (is )?not available", re.I)  # gather's dry run
_PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed|warnings?)")


def pytest_counts(text: str) -> dict[str, int]:
    """Counts from pytest's last summary line (``-q`` run or ``--collect-only -q``)."""
    counts: dict[str, int] = {}
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for line in reversed(lines):
        m = re.search(r"(\d+)(?:/(\d+))? tests? collected", line)
        if m:
            counts["collected"] = int(m.group(1))
        if m or re.search(r"\b(passed|failed|skipped|error|errors|deselected|no tests ran)\b in [\d.]+s", line):
            for n, kind in _PYTEST_COUNT.findall(line):
                counts[kind.rstrip("s") if kind in ("errors", "warnings") else kind] = int(n)
            break
    return counts


def traceback_of(text: str) -> str | None:
    """The last Python traceback in a step's output, to its exception line (capped), or None."""
    at = text.rfind("Traceback (most recent call last):")
    if at < 0:
        return None
    lines = text[at:].splitlines()
    end = next((i for i, ln in enumerate(lines[1:], 1) if ln and not ln.startswith((" ", "\t"))), len(lines) - 1)
    tb = "\n".join(lines[: end + 1])
    return tb if len(tb) <= TRACEBACK_CAP else tb[:1000] + "\n[...]\n" + tb[-(TRACEBACK_CAP - 1000):]


def judge(step: Step, rc: int | None, text: str, out: Path, scratch: Path, dry: bool) -> tuple[str, dict[str, Any]]:
    """The step's status (ok, failed, timeout) and its figures for steps.jsonl."""
    facts: dict[str, Any] = {}
    if step.name == "env":
        lines = [ln for ln in text.strip().splitlines() if ln.startswith("{")]
        if lines:
            facts["env"] = json.loads(lines[-1])
    elif step.name == "tests":
        facts["counts"] = pytest_counts(text)
        facts["failed_tests"] = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", text, re.M)))
    elif step.name == "distributed":
        facts["lines"] = [ln for ln in text.splitlines() if ln.startswith(("distributed:", "engine distributed",
                                                                            "test accuracy", "ready to train"))]
    elif step.jsonl:
        records = read_records((scratch if step.embed else out) / step.jsonl)
        if step.embed:
            facts["data"] = records
        facts["records"] = len(records)
        facts["records_not_ok"] = sum(r.get("ok") is False or r.get("status", "ok") != "ok"
                                      or r.get("correct") is False or r.get("exact") is False for r in records)
        if dry and rc is not None and step.name == "gather" and NO_CUDA.search(text) \
                and not any(r.get("ok", True) for r in records):  # its run raised or returned nothing: no CUDA
            facts["note"] = "no CUDA here: nothing measured (the flags were checked)"
            return "ok", facts
    if rc is None:
        return "timeout", facts
    if rc != 0:
        return "failed", facts
    if step.name == "env" and "env" not in facts:
        return "failed", facts
    if step.name == "tests":
        c = facts["counts"]
        if dry:
            good = c.get("collected", 0) > 0
        else:
            good = c.get("passed", 0) > 0 and not c.get("failed") and not c.get("error")
        return ("ok" if good else "failed"), facts
    if step.jsonl and not facts["records"]:
        return "failed", facts
    return "ok", facts


# ------------------------------------------------------------------------------------------------ main
def step_timeout(budget: float, later: float, left: float, dry: bool) -> float | None:
    """A step's limit: the time left less the later steps' budgets, at least its own budget (the steps come in
    order of value), at most the time left; None when less than ``MIN_STEP_S`` is left (not started). The dry
    run's steps get at least 120 s each, within its deadline."""
    if left < MIN_STEP_S:
        return None
    return min(left, max(budget, 120.0 if dry else 0.0, left - later))


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks._gpu_check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, nargs="?", help="folder for summary.md and the JSON Lines files")
    ap.add_argument("--dry-run", action="store_true", help="CPU (and the sim device), tiny sizes")
    ap.add_argument("--dataset", default=DATASET, help=f"graph of the offload/minibatch steps (default {DATASET})")
    ap.add_argument("--only", default="", help="comma list of steps to run (default all); env always runs")
    ap.add_argument("--deadline", type=float, default=None,
                    help=f"seconds for the whole run (default {DEADLINE_S:.0f}; dry run {DRY_DEADLINE_S:.0f})")
    ap.add_argument("--fail-step", default=os.environ.get(FAIL_ENV, ""), metavar="NAME",
                    help=f"testing aid: replace step NAME's command by one that raises (default ${FAIL_ENV})")
    ap.add_argument("--python", default=sys.executable, help="interpreter of the steps")
    ap.add_argument("--wheels", type=Path, default=ROOT / ".whl", help="wheels to install when packages are missing")
    ap.add_argument("--site", type=Path, default=Path(tempfile.gettempdir()) / "gnnscale-site",
                    help="pip --target folder for those wheels")
    ap.add_argument("--commit", default=None,
                    help="the commit the tree is, recorded as gnnscale_rev (default: git's HEAD, -dirty when changed; "
                         "name it where the copy of .git is stale, as on a lent device)")
    ap.add_argument("--command", default=None, help="the command to record (default: this one)")
    args = ap.parse_args(argv)
    if args.out is None:
        ap.error("OUT is required")
    args.only = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = (args.only | ({args.fail_step} if args.fail_step else set())) - set(STEP_NAMES)
    if unknown:
        ap.error(f"--only / --fail-step: unknown steps {', '.join(sorted(unknown))}")
    if args.command is None:
        args.command = shlex.join(["python3", "-m", "benchmarks._gpu_check", *(sys.argv[1:] if argv is None
                                                                               else argv)])
    return args


def tree_rev() -> str:
    """HEAD's short hash, ``-dirty`` when gnnscale/ or benchmarks/ changed (as the harness names a revision)."""
    from benchmarks.harness.machine import changed_paths, resolve

    try:
        return resolve(ROOT, "HEAD")[:12] + ("-dirty" if changed_paths(ROOT) else "")
    except Exception:  # noqa: BLE001  (no git, or no repository: a copy of the tree)
        return "unknown"


def packages(args: argparse.Namespace, env: dict[str, str]) -> tuple[dict[str, str | None], str]:
    """The packages the steps need as ``args.python`` sees them, after installing the carried wheels when some miss
    (``env``'s PYTHONPATH then names their folder); and pip's log."""
    pkgs = find_packages(args.python, env)
    missing = [m for m, _, _ in REQUIRED if pkgs.get(m) is None]
    install_log = ""
    if missing and args.wheels.is_dir() and any(args.wheels.glob("*.whl")):
        print(f"missing {', '.join(missing)}: installing the wheels of {args.wheels} into {args.site}", flush=True)
        install_log = install_wheels(args.python, args.wheels, args.site, env)
        env["PYTHONPATH"] = os.pathsep.join([str(args.site), env["PYTHONPATH"]])
        pkgs = find_packages(args.python, env)
        missing = [m for m, _, _ in REQUIRED if pkgs.get(m) is None]
    print("packages (needed by):")
    for m, dist, why in REQUIRED + OPTIONAL:
        kind = "required" if (m, dist, why) in REQUIRED else "optional"
        print(f"  {m:<16}{pkgs.get(m) or 'MISSING':<16}{kind}: {why}")
    if missing:
        print(f"MISSING: {', '.join(missing)}: steps needing them will fail (carry wheels in .whl/, see README)")
    return pkgs, install_log


def failure_of(status: str, facts: dict[str, Any], tb: str | None, tail: str, seconds: float) -> str:
    """What failed, in one line: the step table's last column (empty when nothing did)."""
    if status in ("ok", DEADLINE):
        return ""
    if status == "timeout":
        return f"timed out after {seconds:.0f} s"
    if facts.get("failed_tests"):
        return f"{len(facts['failed_tests'])} failed: " + ", ".join(facts["failed_tests"][:5])
    lines = (tb or tail).strip().splitlines()
    return lines[-1].strip()[:300] if lines else "no output"


def execute(step: Step, args: argparse.Namespace, timeout: float, env: dict[str, str], out: Path, scratch: Path,
            log: Path) -> dict[str, Any]:
    """Run one step (``--fail-step``: a command that raises instead); its result, without the run's fields."""
    run = step
    if step.name == args.fail_step:  # the testing aid: the same step, whose command raises
        run = Step(step.name, step.budget_s, [args.python, "-c", FAIL_CODE, step.name], step.jsonl)
    rc, seconds, text = run_step(run, timeout, env, log)
    status, facts = judge(step, rc, text, out, scratch, args.dry_run)
    tail = "\n".join(text.strip().splitlines()[-25:])
    tb = traceback_of(text) if status != "ok" else None
    print(f"  -> {status} ({seconds:.1f} s)" + (f"\n{tb or tail}" if status != "ok" else ""), flush=True)
    return {"status": status, "rc": rc, "seconds": round(seconds, 2), "timeout_s": round(timeout, 1),
            "failure": failure_of(status, facts, tb, tail, seconds), **facts,
            **({"tail": tail} if status != "ok" else {}), **({"traceback": tb} if tb else {}),
            **({"note": f"forced to fail: --fail-step {step.name}"} if run is not step else {})}


def main(argv: list[str] | None = None) -> int:
    """The check: steps.jsonl gets one record per step as it ends (the fields of benchmarks/results/gpu_check.jsonl:
    the run's session, date, command, commit, device and torch, the step's status, seconds and what failed)."""
    args = parse(argv)
    deadline = args.deadline if args.deadline is not None else DRY_DEADLINE_S if args.dry_run else DEADLINE_S
    t_start = time.monotonic()
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="gnnscale-gpucheck-records-"))
    spec = dry_spec(args.dataset) if args.dry_run else args.dataset
    steps = build_steps(args, out, args.python, spec, scratch)
    mode = "DRY RUN (CPU, tiny sizes)" if args.dry_run else "GPU run"
    print(f"gnnscale gpu-check: {mode}; output in {out}", flush=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("GNNSCALE_CACHE_DIR", tempfile.mkdtemp(prefix="gnnscale-gpucheck-"))
    env.pop(FAIL_ENV, None)
    pkgs, install_log = packages(args, env)
    for f in FILES:
        if not args.only or f in ("summary.md", "steps.jsonl", "run.log") or f.removesuffix(".jsonl") in args.only:
            (out / f).unlink(missing_ok=True)
    log = out / "run.log"
    log.write_text(install_log)
    selected = [s for s in steps if not args.only or s.name in args.only or s.name == "env"]
    warnings: list[str] = []
    base = {"benchmark": "gpu_check", "session": uuid.uuid4().hex[:12],
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "command": args.command,
            "gnnscale_rev": args.commit or tree_rev(), "dry_run": args.dry_run, "ok": True}
    for i, step in enumerate(selected):
        left = deadline - (time.monotonic() - t_start)
        timeout = step_timeout(step.budget_s, sum(s.budget_s for s in selected[i + 1:]), left, args.dry_run)
        at = f"\n[{time.monotonic() - t_start:6.1f} s] step {step.name}"
        if timeout is None:
            print(f"{at}: {DEADLINE}", flush=True)
            res: dict[str, Any] = {"status": DEADLINE, "rc": None, "seconds": None, "failure": ""}
        else:
            print(f"{at} (limit {timeout:.0f} s): {shlex.join(step.argv)}", flush=True)
            res = execute(step, args, timeout, env, out, scratch, log)
        if step.name == "env":
            facts = res.get("env", {})
            base.update(device_name=facts.get("device_name") or "no CUDA device", torch=facts.get("torch"))
            spec_warning(spec, facts, selected, warnings)
        step.result = {**base, "step": step.name, **res, "step_command": shlex.join(step.argv),
                       "elapsed_s": round(time.monotonic() - t_start, 1)}
        append_records(out / "steps.jsonl", [step.result])
        write_summary(out, selected, summary_header(args, mode, spec, pkgs, warnings, selected, t_start))
    print("\n" + (out / "summary.md").read_text())
    bad = [s.name for s in selected if s.result.get("status") not in ("ok", DEADLINE)]
    skipped = [s.name for s in selected if s.result.get("status") == DEADLINE]
    print(f"gpu-check: {len(selected) - len(bad) - len(skipped)} of {len(selected)} steps ok"
          + (f"; failed: {', '.join(bad)}" if bad else "") + (f"; {DEADLINE}: {', '.join(skipped)}" if skipped else "")
          + f"; {time.monotonic() - t_start:.0f} s; summary in {out / 'summary.md'}")
    return 1 if bad else 0


def spec_warning(spec: str, env: dict[str, Any], selected: list[Step], warnings: list[str]) -> None:
    """Options this checkout's csbm generator lacks are dropped from the offload and minibatch steps, loudly."""
    run_spec, dropped = drop_options(spec, env.get("csbm_options"))
    if dropped:
        for s in selected:
            if s.name in ("offload", "minibatch"):
                s.argv[s.argv.index("--dataset") + 1] = run_spec
        warnings.append(f"WARNING: this checkout's csbm generator has no option {', '.join(dropped)}: the "
                        f"offload and minibatch steps ran on `{run_spec}` instead of `{spec}`")
        print(warnings[-1], flush=True)


def summary_header(args: argparse.Namespace, mode: str, spec: str, pkgs: dict[str, str | None], warnings: list[str],
                   selected: list[Step], t_start: float) -> list[str]:
    first = selected[0].result
    env_facts = first.get("env", {})
    header = [f"# gnnscale gpu-check: {mode}", "",
              f"Device `{env_facts.get('device_name', 'no CUDA device')}`, torch {env_facts.get('torch')}, "
              f"gnnscale `{first.get('gnnscale_rev')}`; {time.monotonic() - t_start:.0f} s so far. Graph of "
              f"the offload and minibatch steps: `{spec}`.", "",
              "Packages: " + ", ".join(f"{m} {pkgs.get(m) or 'MISSING'}" for m, _, _ in REQUIRED + OPTIONAL) + "."]
    if args.fail_step:
        header += ["", f"**Step `{args.fail_step}` was forced to fail (--fail-step, a testing aid).**"]
    if warnings:
        header += [""] + [f"**{w}**" for w in warnings]
    if args.dry_run:
        full = build_steps(argparse.Namespace(dry_run=False), Path("OUT"), "python3", args.dataset, Path("SCRATCH"))
        header += ["", "A dry run measures nothing: on a GPU these commands run instead (OUT: the output folder):",
                   "", "```", *(shlex.join(s.argv).replace(str(ROOT) + "/", "") for s in full), "```"]
    return header


if __name__ == "__main__":
    sys.exit(main())
