"""gpu-check's environment: the packages the steps need (installed from carried wheels when missing) and the
``env`` step's probe of the device, link, host and versions (``python -m benchmarks._gpu_check_env`` prints them
as one JSON line; run as a subprocess, so the driver holds no CUDA context)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# (import name, distribution name, why); the optional ones only change what is measured
REQUIRED = [("torch", "torch", "everything"), ("numpy", "numpy", "gnnscale"), ("scipy", "scipy", "gnnscale"),
            ("torch_geometric", "torch_geometric", "gnnscale, PyG baselines"),
            ("pymetis", "pymetis", "gnnscale partitioning"), ("tqdm", "tqdm", "gnnscale"),
            ("psutil", "psutil", "benchmarks (host RSS)"), ("pytest", "pytest", "tests step"),
            ("pytest_timeout", "pytest-timeout", "tests step (a deadlocked pipeline fails instead of hanging)")]
OPTIONAL = [("triton", "triton", "UVA gather kernel"), ("cupy", "cupy", "informative only")]

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


if __name__ == "__main__":
    print(json.dumps(probe_env()))
