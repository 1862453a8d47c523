"""`make gpu-check`: everything the CUDA paths need measured, in one command, the first time a GPU is at hand.

    PYTHONPATH=. python3 benchmarks/gpu_check.py OUT            # on the GPU machine: about 9 minutes at most
    PYTHONPATH=. python3 benchmarks/gpu_check.py OUT --dry-run  # anywhere, on CPU, tiny sizes: a few seconds
    make gpu-check OUT=/path [DRY=1]

Steps, each a subprocess with its own time budget (what one step leaves unused goes to the later ones; the whole
run ends within ``--deadline`` seconds, 530 by default); a step that fails or runs out of time is recorded and the
others still run:

* ``env``: device name and memory, PCIe link (``nvidia-smi``), CPU, RAM, versions of torch / CUDA / PyG / Triton /
  CuPy / pymetis, which options the csbm generator knows. Before it, the driver checks that the packages the
  steps import are there (``REQUIRED``), and if some are missing and ``--wheels`` (default ``.whl/``) holds wheels,
  installs them with ``pip install --no-index --no-deps --target --site`` and puts that folder on ``PYTHONPATH``.
* ``tests``: ``pytest --cuda-only`` over ``tests/`` (``tests/conftest.py``: the tests parametrised with a cuda
  device, skipped without CUDA, or naming cuda); pass / fail / skip counts.
* ``gather``: ``benchmarks/gather.py``: pinned host rows -> GPU, bulk copy vs pipelined CPU ``index_select`` vs
  the UVA Triton kernel, random and sorted ids, GB/s.
* ``offload``: ``benchmarks/offload.py`` on ``--dataset`` (default ``DATASET``, the products-sized locality
  graph): GCN, 2 layers, hidden 256, ``--gpu-memory 6`` and ``24`` GiB, against the in-memory engine and PyG's
  ``GCNConv`` on a sparse ``adj_t`` in the same run.
* ``minibatch``: ``benchmarks/minibatch.py`` on the same graph: GraphSAGE, fanouts 25,10, batch 1024, a quarter
  and all of the features on the GPU; epoch time against XGNN's 0.3 s at products scale.
* ``taskparallel``: ``benchmarks/taskparallel.py`` on a Kronecker graph (scale 18): dgcn with its T and P tasks on
  two device threads of the one GPU (each its own stream) against the offload engine (gcn, ``--dedup none``) and
  the in-memory engine: epoch time and per-device peaks; replication factors for 2/4/8/16 METIS parts.
* ``hybrid``: ``benchmarks/hybrid.py`` on a 500,000-vertex csbm graph: GraphSAGE with the CPU trainer alone and
  beside the GPU (``cpu,cuda:0``): predicted against measured stage and epoch times, the split and MTEPS; a sweep
  of static CPU shares against DRM.
* ``distributed``: a 1-GPU NCCL smoke run of ``--engine distributed`` under torch's launcher (``torchrun``) on
  the hybrid step's graph, two epochs; its plan, timing and accuracy lines go to the summary (no file of its own).

Output, within the device tool's return limits (at most 8 files, no sub-folders): ``summary.md`` (a table per step
with the key figures and the exact commands), ``steps.jsonl`` (one line per step: status, return code, seconds,
command, the step's figures), ``gather.jsonl`` / ``offload.jsonl`` / ``minibatch.jsonl`` / ``taskparallel.jsonl`` /
``hybrid.jsonl`` (the benchmarks' own records) and ``run.log`` (every step's output). The summary is printed at
the end as well.

``--dry-run`` runs the same steps on CPU with tiny sizes (a 2,000-vertex graph, one epoch, the test step only
collecting the tests) and prints the commands the GPU run would use, so the driver is exercised by the test suite
(``tests/test_gpu_check.py``) and cannot rot.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"

# The graph of the offload and mini-batch steps: ogbn-products' size (2,449,029 vertices, ~50 average degree,
# 100 features, 47 classes) with community structure, so that chunks have locality as real graphs do.
DATASET = "csbm:nodes=2449029,avg_degree=50,features=100,classes=47,communities=256,p_intra=0.9"
# --dry-run: the same spec with these options replaced (communities only where the spec has them).
DRY_SIZES = {"nodes": "2000", "avg_degree": "10", "features": "16", "classes": "4", "communities": "8"}
TP_DATASET = "kronecker:scale=18,edgefactor=16"  # the task-parallel step's graph (262,144 vertices)
TP_DRY_DATASET = "csbm:nodes=2000,features=16"
HY_DATASET = "csbm:nodes=500000,avg_degree=20,features=100,classes=47"  # the hybrid step's graph
HY_DRY_DATASET = "csbm:nodes=2000,features=16,train=0.5"
XGNN_EPOCH_S = 0.3  # XGNN's mini-batch epoch time at products scale, the goal of the minibatch step
DEADLINE_S = 530.0  # the whole run, on the device's 10-minute limit per command

# (import name, distribution name, why); the optional ones only change what is measured
REQUIRED = [("torch", "torch", "everything"), ("numpy", "numpy", "gnnscale"), ("scipy", "scipy", "gnnscale"),
            ("torch_geometric", "torch_geometric", "gnnscale, PyG baselines"),
            ("pymetis", "pymetis", "gnnscale partitioning"), ("tqdm", "tqdm", "gnnscale"),
            ("psutil", "psutil", "benchmarks (host RSS)"), ("pytest", "pytest", "tests step"),
            ("pytest_timeout", "pytest-timeout", "tests step (a deadlocked pipeline fails instead of hanging)")]
OPTIONAL = [("triton", "triton", "UVA gather kernel"), ("cupy", "cupy", "informative only")]
FILES = ("summary.md", "steps.jsonl", "gather.jsonl", "offload.jsonl", "minibatch.jsonl", "taskparallel.jsonl",
         "hybrid.jsonl", "run.log")
LOG_CAP = 4 << 20  # bytes of one step's output kept in run.log (the device tool returns files up to 16 MiB)
H2D_PARTS = ("h2d_row_bytes", "h2d_topology_bytes", "h2d_index_bytes")


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


# ------------------------------------------------------------------------------------------------ packages
_PKG_SCRIPT = """
import importlib.metadata as md, importlib.util as iu, json, sys
out = {}
for mod, dist in json.loads(sys.argv[1]):
    spec = iu.find_spec(mod)
    if spec is None:
        out[mod] = None
        continue
    try:
        out[mod] = md.version(dist)
    except md.PackageNotFoundError:
        out[mod] = "present"
print(json.dumps(out))
"""


def find_packages(python: str, env: dict[str, str]) -> dict[str, str | None]:
    """Version (or None when missing) of every REQUIRED and OPTIONAL package, as ``python`` with ``env`` sees it."""
    pairs = [[m, d] for m, d, _ in REQUIRED + OPTIONAL]
    proc = subprocess.run([python, "-c", _PKG_SCRIPT, json.dumps(pairs)], env=env, capture_output=True, text=True,
                          timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"cannot run {python}: {proc.stderr.strip()}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def install_wheels(python: str, wheels: Path, site: Path, env: dict[str, str]) -> str:
    """``pip install --no-index --no-deps --target site wheels/*.whl``; returns pip's output."""
    files = sorted(str(p) for p in wheels.glob("*.whl"))
    cmd = [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
           "--upgrade", "--target", str(site), *files]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    log = f"$ {shlex.join(cmd)}\nrc {proc.returncode}\n{proc.stdout}{proc.stderr}"
    if proc.returncode != 0:  # one wheel for another platform fails them all: then one at a time
        for wheel in files:
            one = subprocess.run([*cmd[: -len(files)], wheel], env=env, capture_output=True, text=True, timeout=120)
            log += f"{Path(wheel).name}: rc {one.returncode} {one.stderr.strip()[-300:]}\n"
    return log


# ------------------------------------------------------------------------------------------------ env probe
def probe_env() -> dict[str, Any]:
    """Facts the numbers depend on; run in a subprocess (``--probe-env``) so the driver holds no CUDA context."""
    import inspect
    import platform
    import shutil

    import torch

    facts: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(),
                             "cpu_count": os.cpu_count(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
                             "cuda_available": torch.cuda.is_available()}
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            facts["cpu_model"] = line.split(":", 1)[1].strip()
            break
    if Path("/proc/meminfo").exists():
        mem = Path("/proc/meminfo").read_text().split()
        facts["host_memory_gib"] = round(int(mem[mem.index("MemTotal:") + 1]) / 2**20, 1)
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        free, total = torch.cuda.mem_get_info(0)
        facts.update({"device_count": torch.cuda.device_count(), "device_name": p.name,
                      "device_memory_gib": round(total / 2**30, 2), "device_free_gib": round(free / 2**30, 2),
                      "capability": f"{p.major}.{p.minor}", "multiprocessors": p.multi_processor_count})
    if shutil.which("nvidia-smi"):
        q = "name,driver_version,memory.total,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current"
        proc = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30)
        facts["nvidia_smi"] = (proc.stdout or proc.stderr).strip()
    import importlib.metadata as md

    for mod in ("torch_geometric", "triton", "cupy", "numpy", "scipy", "pymetis"):
        try:
            version = getattr(__import__(mod), "__version__", None)
            if version is None:
                try:
                    version = md.version(mod)
                except md.PackageNotFoundError:
                    version = "present"
            facts[mod] = version
        except Exception as exc:  # noqa: BLE001  (a broken install is a fact too)
            facts[mod] = f"not importable: {type(exc).__name__}: {exc}"[:200]
    try:
        import torch_geometric.typing as pyg_typing

        facts["pyg_torch_sparse"] = bool(pyg_typing.WITH_TORCH_SPARSE)
    except Exception:  # noqa: BLE001
        facts["pyg_torch_sparse"] = None
    from gnnscale.graph import generators
    from gnnscale.store import triton_available

    facts["csbm_options"] = list(inspect.signature(generators.csbm).parameters)
    facts["gnnscale_triton_available"] = bool(triton_available())
    proc = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True,
                          text=True)
    facts["gnnscale_rev"] = proc.stdout.strip() or None
    return facts


# ------------------------------------------------------------------------------------------------ steps
@dataclass
class Step:
    name: str
    budget_s: float  # on the GPU; the dry run gives every step the same generous time
    argv: list[str]
    jsonl: str | None = None  # the file under OUT its records go to
    what: str = ""
    result: dict[str, Any] = field(default_factory=dict)


def build_steps(args: argparse.Namespace, out: Path, python: str, spec: str) -> list[Step]:
    dry = args.dry_run
    dev = ["--device", "cpu", "--threads", "1"] if dry else ["--device", "cuda"]
    epochs = ["--warmup", "0", "--epochs", "1"] if dry else ["--warmup", "1", "--epochs", "3"]
    py = [python]
    tests = [*py, "-m", "pytest", "-p", "no:cacheprovider", "--cuda-only", str(ROOT / "tests")]
    tests += ["--collect-only", "-q"] if dry else ["-q", "-rfEs", "--durations=10"]
    gather = [*py, str(BENCH / "gather.py"), "--out", str(out / "gather.jsonl")]
    gather += (["--rows-total", "4096", "--rows", "512", "--features", "100", "--reps", "2", "--warmup", "1"] if dry
               else ["--rows-total", "16000000", "--rows", "2000000", "--features", "100,256", "--reps", "10",
                     "--warmup", "2"])
    offload = [*py, str(BENCH / "offload.py"), *dev, "--dataset", spec, "--models", "gcn", "--layers", "2",
               "--hidden", "16" if dry else "256", "--chunks", "", "--gpu-memory", "1MB,24" if dry else "6,24",
               "--pyg", "sparse", *epochs, "--out", str(out / "offload.jsonl")]
    minibatch = [*py, str(BENCH / "minibatch.py"), *dev, "--dataset", spec, "--model", "sage",
                 "--hidden", "16" if dry else "256", "--fanouts", "5,5" if dry else "25,10",
                 "--batch-size", "64" if dry else "1024", "--gpu-feature-ratio", "0.25,1", *epochs,
                 "--out", str(out / "minibatch.jsonl")]
    # two device threads on the one GPU (T tasks and P tasks, each on its own stream) against offload and inmemory
    taskparallel = [*py, str(BENCH / "taskparallel.py"), *dev, "--devices", "cpu,cpu" if dry else "cuda:0,cuda:0",
                    "--dataset", TP_DRY_DATASET if dry else TP_DATASET, "--parts", "2" if dry else "2,4,8,16",
                    "--warmup", "1", "--repeats", "1" if dry else "3", "--out", str(out / "taskparallel.jsonl")]
    # the CPU trainer beside the GPU: the model's prediction per stage, a static sweep and DRM
    hybrid = [*py, str(BENCH / "hybrid.py"), "--datasets", HY_DRY_DATASET if dry else HY_DATASET,
              "--drm-dataset", HY_DRY_DATASET if dry else HY_DATASET, "--model-devices",
              "cpu;cpu,cpu:1" if dry else "cpu;cpu,cuda:0", "--drm-devices", "cpu,cpu:1" if dry else "cpu,cuda:0",
              "--slowdown", "3" if dry else "1", "--sweep", "0.2,0.5" if dry else "0.02,0.05,0.1,0.2",
              "--hidden", "16" if dry else "256", "--fanouts", "5,5" if dry else "25,10",
              "--batch-size", "64" if dry else "1024", "--warmup", "0" if dry else "1", "--epochs", "1",
              "--drm-epochs", "2", "--repeats", "1", "--out", str(out / "hybrid.jsonl")]
    if dry:
        hybrid += ["--threads", "1"]
    # NCCL smoke run: one rank on the GPU under torch's launcher (the dry run: two gloo ranks on the CPU)
    distributed = [python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2" if dry else "1",
                   "-m", "gnnscale", "train", "--engine", "distributed", "--dataset",
                   HY_DRY_DATASET if dry else HY_DATASET, "--model", "sage", "--epochs", "2", "--quiet",
                   "--device", "cpu" if dry else "cuda", "--batch-size", "64" if dry else "1024"]
    return [
        Step("env", 30, [*py, str(Path(__file__).resolve()), "--probe-env"], what="device, versions, PCIe link"),
        Step("tests", 100, tests, what="the CUDA tests of every engine (pytest --cuda-only)"),
        Step("gather", 70, gather, "gather.jsonl", "host -> GPU row gathers: bulk, index_select, UVA; GB/s"),
        Step("offload", 110, offload, "offload.jsonl",
             "offload engine at 6 and 24 GiB vs in-memory and PyG GCNConv on sparse adj_t"),
        Step("minibatch", 100, minibatch, "minibatch.jsonl",
             f"mini-batch engine epoch time (goal {XGNN_EPOCH_S} s, XGNN)"),
        Step("taskparallel", 40, taskparallel, "taskparallel.jsonl",
             "task-parallel engine (dgcn, T and P on two streams) vs offload and in-memory; replication factors"),
        Step("hybrid", 50, hybrid, "hybrid.jsonl",
             "hybrid engine (CPU + GPU trainers): predicted vs measured stages, static splits vs DRM, MTEPS"),
        Step("distributed", 30, distributed, what="distributed engine: a 1-GPU NCCL smoke run under torchrun"),
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


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


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


def judge(step: Step, rc: int | None, text: str, out: Path, dry: bool) -> tuple[str, dict[str, Any]]:
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
        records = read_jsonl(out / step.jsonl)
        facts["records"] = len(records)
        facts["records_not_ok"] = sum(r.get("status", "ok") != "ok" or r.get("correct") is False for r in records)
        if step.name == "gather" and not records and "needs CUDA" in text:
            facts["note"] = "no CUDA here: nothing measured (the flags were checked)"
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
    if step.jsonl and not facts["records"] and not (dry and step.name == "gather"):
        return "failed", facts
    return "ok", facts


# ------------------------------------------------------------------------------------------------ summary
def _f(v: Any, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    return lines + ["| " + " | ".join(r) + " |" for r in rows]


def summarize_env(facts: dict[str, Any]) -> list[str]:
    keys = ["device_name", "device_memory_gib", "capability", "nvidia_smi", "torch", "torch_cuda", "torch_geometric",
            "pyg_torch_sparse", "triton", "gnnscale_triton_available", "cupy", "numpy", "scipy", "pymetis",
            "cpu_model", "cpu_count", "host_memory_gib", "python", "gnnscale_rev"]
    env = facts.get("env", {})
    return _table(["fact", "value"], [[k, f"`{env[k]}`"] for k in keys if k in env])


def summarize_tests(facts: dict[str, Any]) -> list[str]:
    c = facts.get("counts", {})
    kinds = ["collected", "passed", "failed", "error", "skipped", "deselected"]
    lines = _table(kinds, [[str(c.get(k, "-")) for k in kinds]])
    if facts.get("failed_tests"):
        lines += ["", "Failed: " + ", ".join(f"`{t}`" for t in facts["failed_tests"])]
    return lines


def summarize_gather(records: list[dict[str, Any]]) -> list[str]:
    rows = []
    for r in records:
        base = next((b for b in records if b["features"] == r["features"] and b["method"] == "bulk"), None)
        rows.append([str(r["features"]), r["label"], r["order"], _f(r["median_ms"], ".2f"), _f(r["gbps"], ".2f"),
                     _f(r["gbps"] / base["gbps"] if base and base["gbps"] else None, ".2f"),
                     "ok" if r["correct"] else "MISMATCH"])
    return _table(["F", "method", "ids", "median ms", "GB/s", "/ bulk", "check"], rows)


def _h2d(r: dict[str, Any]) -> str:
    """H2D GB per epoch: rows / topology / index when the engine splits them, else the total."""
    if r.get("h2d_bytes") is None:
        return "-"
    parts = [r.get(k) for k in H2D_PARTS]
    total = f"{r['h2d_bytes'] / 1e9:.3f}"
    if any(p is not None for p in parts):
        return total + " (" + " / ".join(_f(None if p is None else p / 1e9) for p in parts) + ")"
    return total


def summarize_offload(records: list[dict[str, Any]]) -> list[str]:
    rows = []
    for r in records:
        budget = str(r.get("budget_spec") or "")
        label = r["impl"] + (f" {budget}" + (" GiB" if budget.replace(".", "").isdigit() else "") if budget else "")
        if r.get("status") != "ok":
            rows.append([label, "-", r.get("status", "?") + ": " + str(r.get("reason", ""))[:80]] + ["-"] * 7)
            continue
        rows.append([label, str(r.get("chunks", "-")), _f(r["median_epoch_s"]), _f(r.get("ratio_vs_inmemory"), ".2f"),
                     _f(r.get("ratio_vs_pyg"), ".2f"), _h2d(r), _f(r.get("h2d_GBps"), ".2f"),
                     _f(None if r.get("peak_bytes") is None else r["peak_bytes"] / 2**20, ".0f"),
                     _f(r.get("h2d_over_ori"), ".3f"), _f(r.get("final_loss"), ".4f")])
    head = ["impl", "chunks", "median epoch (s)", "/ inmemory", "/ pyg", "H2D GB/epoch (rows / topology / index)",
            "H2D GB/s", "peak MiB", "h2d/ori", "loss"]
    lines = _table(head, rows)
    if records:
        r0 = records[0]
        lines += ["", f"Graph `{r0.get('dataset')}`: {r0.get('nodes')} vertices, {r0.get('edges')} edges; "
                  f"PyG baseline: `{r0.get('pyg_baseline')}`; device `{r0.get('device_name')}`."]
    return lines


def summarize_minibatch(records: list[dict[str, Any]]) -> list[str]:
    samplers = [r for r in records if r.get("kind") == "sampler"]
    lines: list[str] = []
    if samplers:
        lines += _table(["sampler (one epoch's batches)", "s", "MTEPS", "entries / sampled", "ours faster by"],
                        [[r["sampler"], _f(r["median_sample_s"]), _f(r["mteps"], ".1f"),
                          _f(r["read_amplification"], ".2f"), _f(r["ours_speedup"], ".2f")] for r in samplers])
        lines.append("")
    rows = []
    for r in (r for r in records if r.get("kind") != "sampler"):
        head = [_f(r.get("gpu_feature_ratio"), "g")]
        if r.get("status") != "ok":
            rows.append(head + [r.get("status", "?") + ": " + str(r.get("reason", ""))[:80]] + ["-"] * 8)
            continue
        rows.append(head + [_f(r["median_epoch_s"]), _f(r["median_epoch_s"] / XGNN_EPOCH_S, ".2f"),
                            _f(r.get("median_sample_s")), _f(r.get("median_extract_s")), _f(r.get("median_train_s")),
                            _f(r.get("mteps"), ".1f"), _f(r.get("feature_hit_rate"), ".3f"),
                            _f(r["h2d_bytes"] / 1e6, ".1f"), str(r.get("batches", "-"))])
    head = ["GPU feature ratio", "median epoch (s)", f"/ {XGNN_EPOCH_S} s (XGNN)", "sample s", "extract s",
            "train s", "MTEPS", "feature hit", "H2D MB", "batches"]
    return lines + _table(head, rows)


def summarize_taskparallel(records: list[dict[str, Any]]) -> list[str]:
    engines = [r for r in records if r.get("kind") == "engine"]
    rows = [[r.get("engine", "?"), r.get("model", "?"), str(len(r.get("devices") or [])),
             _f(r.get("mean_epoch_s")), _f(r.get("min_epoch_s")),
             ", ".join(f"{b / 2**20:.1f}" for b in r.get("device_peak_bytes") or []) or "-",
             _f(r.get("final_loss"), ".4f")] for r in engines]
    lines = _table(["engine", "model", "devices", "mean epoch (s)", "min (s)", "per-device peak MiB", "loss"], rows)
    reps = [r for r in records if r.get("kind") == "replication"]
    if reps:
        lines += [""] + _table(
            ["parts", "data-parallel alpha", "NeutronTask Table 2", "P group", "P-group alpha"],
            [[str(r["parts"]), _f(r.get("data_parallel_replication"), ".2f"),
              _f(r.get("neutrontask_table2_papers100m"), ".2f"), str(r.get("p_group_size", "-")),
              _f(r.get("p_group_replication"), ".2f")] for r in reps])
    return lines


def summarize_hybrid(records: list[dict[str, Any]]) -> list[str]:
    rows = [[r["devices"], ", ".join(f"{s:.3f}" for s in r["split"]), _f(r["predicted_epoch_s"]),
             _f(r["measured_epoch_s"]), _f(100 * r["error"], "+.1f"), _f(r.get("mteps"), ".1f"),
             _f(r["hybrid_over_minibatch"], ".2f")] for r in records if r.get("kind") == "model"]
    lines = _table(["devices", "split", "predicted epoch (s)", "measured (s)", "error %", "MTEPS",
                    "/ minibatch"], rows)
    for r in (r for r in records if r.get("kind") == "drm"):
        sweep = ", ".join(f"{k}: {v:.3f}" for k, v in r["sweep"].items())
        lines += ["", f"static CPU shares (s per epoch): {sweep}; DRM from 0.5 settled by iteration "
                      f"{r['settled_iteration']} at CPU share {r['drm_final_share']:.3f}, last epoch "
                      f"{r['drm_epoch_times'][-1]:.3f} s = {r['drm_last_over_best']:.2f}x the best static split"]
    return lines


SUMMARIZERS: dict[str, Callable[[list[dict[str, Any]]], list[str]]] = {
    "gather": summarize_gather, "offload": summarize_offload, "minibatch": summarize_minibatch,
    "taskparallel": summarize_taskparallel, "hybrid": summarize_hybrid}


def write_summary(out: Path, steps: list[Step], header: list[str]) -> str:
    lines = [*header, ""]
    lines += _table(["step", "status", "seconds", "limit (s)", "what"],
                    [[s.name, s.result.get("status", "not run"), _f(s.result.get("seconds"), ".1f"),
                      _f(s.result.get("timeout_s"), ".0f"), s.what] for s in steps])
    for s in steps:
        res = s.result
        lines += ["", f"## {s.name}: {res.get('status', 'not run')}", "", "```", shlex.join(s.argv), "```", ""]
        if not res:
            continue
        if res.get("note"):
            lines += [res["note"], ""]
        try:  # a record missing a field must not cost the summary of the other steps
            if s.name == "env":
                lines += summarize_env(res)
            elif s.name == "tests":
                lines += summarize_tests(res)
            elif s.name == "distributed":
                lines += [f"- {ln}" for ln in res.get("lines", [])] or ["(no output lines)"]
            elif s.jsonl:
                recs = read_jsonl(out / s.jsonl)
                lines += SUMMARIZERS[s.name](recs) if recs else ["(no records)"]
        except Exception as exc:  # noqa: BLE001
            lines += [f"(summary of this step failed: {type(exc).__name__}: {exc}; see {s.jsonl or 'steps.jsonl'})"]
        if res.get("status") != "ok" and res.get("tail"):
            lines += ["", "Last lines of its output:", "", "```", res["tail"], "```"]
    text = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(text)
    return text


# ------------------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, nargs="?", help="folder for summary.md and the JSON Lines files")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes, test step only collects")
    ap.add_argument("--dataset", default=DATASET, help=f"graph of the offload/minibatch steps (default {DATASET})")
    ap.add_argument("--only", default="", help="comma list of steps to run (default all); env always runs")
    ap.add_argument("--deadline", type=float, default=DEADLINE_S, help="seconds for the whole run")
    ap.add_argument("--python", default=sys.executable, help="interpreter of the steps")
    ap.add_argument("--wheels", type=Path, default=ROOT / ".whl", help="wheels to install when packages are missing")
    ap.add_argument("--site", type=Path, default=Path(tempfile.gettempdir()) / "gnnscale-site",
                    help="pip --target folder for those wheels")
    ap.add_argument("--probe-env", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.probe_env:
        print(json.dumps(probe_env()))
        return 0
    if args.out is None:
        ap.error("OUT is required")
    t_start = time.monotonic()
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    mode = "DRY RUN (CPU, tiny sizes)" if args.dry_run else "GPU run"
    print(f"gnnscale gpu-check: {mode}; output in {out}", flush=True)

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("GNNSCALE_CACHE_DIR", tempfile.mkdtemp(prefix="gnnscale-gpucheck-"))
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

    # the env step runs first: it says which csbm options this checkout knows
    files = [f for f in FILES if not only or f in ("summary.md", "steps.jsonl", "run.log")
             or f.removesuffix(".jsonl") in only]
    for f in files:
        (out / f).unlink(missing_ok=True)
    log = out / "run.log"
    log.write_text(install_log)
    spec = dry_spec(args.dataset) if args.dry_run else args.dataset
    steps = build_steps(args, out, args.python, spec)
    selected = [s for s in steps if not only or s.name in only or s.name == "env"]
    unknown = only - {s.name for s in steps}
    if unknown:
        ap.error(f"--only: unknown steps {', '.join(sorted(unknown))}")
    warnings: list[str] = []
    run_spec, dropped = spec, []
    for i, step in enumerate(selected):
        later = sum(s.budget_s for s in selected[i + 1:])
        left = args.deadline - (time.monotonic() - t_start)
        timeout = left - later if not args.dry_run else max(left - later, 120.0)
        if step.name in ("offload", "minibatch") and dropped:  # options the generator lacks are dropped, loudly
            step.argv[step.argv.index("--dataset") + 1] = run_spec
        print(f"\n[{time.monotonic() - t_start:6.1f} s] step {step.name} (limit {timeout:.0f} s): "
              f"{shlex.join(step.argv)}", flush=True)
        rc, seconds, text = run_step(step, timeout, env, log)
        status, facts = judge(step, rc, text, out, args.dry_run)
        tail = "\n".join(text.strip().splitlines()[-25:])
        step.result = {"step": step.name, "status": status, "rc": rc, "seconds": round(seconds, 2),
                       "timeout_s": round(timeout, 1), "command": shlex.join(step.argv), "dry_run": args.dry_run,
                       **facts, **({"tail": tail} if status != "ok" else {})}
        with (out / "steps.jsonl").open("a") as f:
            f.write(json.dumps(step.result) + "\n")
        print(f"  -> {status} ({seconds:.1f} s)" + (f"\n{tail}" if status != "ok" else ""), flush=True)
        if step.name == "env":
            run_spec, dropped = drop_options(spec, step.result.get("env", {}).get("csbm_options"))
            if dropped:
                warnings.append(f"WARNING: this checkout's csbm generator has no option {', '.join(dropped)}: the "
                                f"offload and minibatch steps ran on `{run_spec}` instead of `{spec}`")
                print(warnings[-1], flush=True)

        # rewritten after every step: a run cut off (the device's limit) still leaves the steps it finished
        text = write_summary(out, steps if not only else selected, summary_header(args, mode, spec, pkgs, warnings,
                                                                                  selected, t_start))
    text = write_summary(out, steps if not only else selected,
                         summary_header(args, mode, spec, pkgs, warnings, selected, t_start))
    print("\n" + text)
    return 0 if all(s.result.get("status") == "ok" for s in selected) else 1


def summary_header(args: argparse.Namespace, mode: str, spec: str, pkgs: dict[str, str | None], warnings: list[str],
                   selected: list[Step], t_start: float) -> list[str]:
    env_facts = selected[0].result.get("env", {})
    header = [f"# gnnscale gpu-check: {mode}", "",
              f"Device `{env_facts.get('device_name', 'no CUDA device')}`, torch {env_facts.get('torch')}, "
              f"gnnscale `{env_facts.get('gnnscale_rev')}`; {time.monotonic() - t_start:.0f} s in all. Graph of "
              f"the offload and minibatch steps: `{spec}`.", "",
              "Packages: " + ", ".join(f"{m} {pkgs.get(m) or 'MISSING'}" for m, _, _ in REQUIRED + OPTIONAL) + "."]
    if warnings:
        header += [""] + [f"**{w}**" for w in warnings]
    if args.dry_run:
        full = build_steps(argparse.Namespace(dry_run=False), Path("OUT"), "python3", args.dataset)
        header += ["", "A dry run measures nothing: on a GPU these commands run instead (OUT: the output folder):",
                   "", "```", *(shlex.join(s.argv).replace(str(ROOT) + "/", "") for s in full), "```"]
    return header


if __name__ == "__main__":
    sys.exit(main())
