"""The sampled engines on sim devices from the command line (issue #46): ``--device sim:0``, ``--devices
sim:0,sim:1``, ``--devices cpu,sim:0`` and ranks on ``sim:LOCAL_RANK`` (``--ranks 2 --device sim``) train the same
losses as their CPU runs. The sim device is the runtime's test mode: the CLI takes it only where
``$GNNSCALE_SIM_DEVICES`` is set."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gnnscale.runtime as rt

ROOT = Path(__file__).resolve().parents[1]
DATA = ["--dataset", "csbm:nodes=1500", "--epochs", "2", "--hidden", "16", "--batch-size", "256"]


def _run(tmp_path: Path, name: str, args: list[str], sim: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop(rt.SIM_DEVICES_ENV, None)
    if sim:
        env[rt.SIM_DEVICES_ENV] = "2"
    return subprocess.run([sys.executable, "-m", "gnnscale", "train", *DATA, *args,
                           "--metrics", str(tmp_path / f"{name}.jsonl")],
                          capture_output=True, text=True, env=env, timeout=600)


def _losses(tmp_path: Path, name: str, args: list[str]) -> list[float]:
    out = _run(tmp_path, name, args)
    assert out.returncode == 0, out.stderr[-2000:]
    assert ("sim:0" in out.stdout) == (name == "sim")  # the run says it trained on the sim device
    records = [json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r and r.get("epoch") is not None]
    assert len(losses) == 2
    return losses


@pytest.mark.parametrize(("engine", "cpu", "sim"), [
    ("minibatch", ["--device", "cpu"], ["--device", "sim:0"]),
    ("minibatch", ["--devices", "cpu,cpu"], ["--devices", "sim:0,sim:1"]),
    ("hybrid", ["--devices", "cpu,cpu:1", "--drm", "off"], ["--devices", "cpu,sim:0", "--drm", "off"]),
    ("distributed", ["--ranks", "2", "--device", "cpu"], ["--ranks", "2", "--device", "sim"]),
], ids=["minibatch-sim0", "minibatch-2sims", "hybrid-cpu-sim0", "distributed-2ranks"])
def test_the_cli_trains_on_sim_devices_as_on_the_cpu(tmp_path: Path, engine: str, cpu: list[str],
                                                     sim: list[str]) -> None:
    on_cpu = _losses(tmp_path, "cpu", ["--engine", engine, *cpu])
    on_sim = _losses(tmp_path, "sim", ["--engine", engine, *sim])
    assert on_sim == pytest.approx(on_cpu, rel=1e-5)


def test_the_cli_refuses_a_sim_device_outside_a_test(tmp_path: Path) -> None:
    out = _run(tmp_path, "refused", ["--engine", "minibatch", "--device", "sim:0"], sim=False)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith("error: --device sim:0: the sim device is the runtime's")
    assert not (tmp_path / "refused.jsonl").exists()
