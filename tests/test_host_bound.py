"""What --host-memory bounds (issue #44, item 12): the process's peak resident memory (VmHWM) at most the base
``gnnscale plan --host-memory`` prints plus the budget. Each mechanism that keeps the peak there is tested on its
own (the features' pages leave the process after validation, layer-wise evaluation steps within the budget,
offload's CPU chunks are planned in the budget, spilled pages leave after each chunk), and one subprocess per
engine checks the bound itself from VmHWM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gnnscale import TrainConfig
from gnnscale.engines import OffloadEngine
from gnnscale.engines.offload.engine import spill_window
from gnnscale.engines.sampled.eval import _steps, layerwise
from gnnscale.graph import io
from gnnscale.graph.generators import csbm
from gnnscale.nn import build_model
from gnnscale.plan.host import cpu_chunk_bytes
from gnnscale.plan.offload import plan_offload
from gnnscale.sample import CSRTopology, SampledAdjacency
from gnnscale.units import parse_budget

CPU = torch.device("cpu")
ROOT = Path(__file__).resolve().parents[1]


def _rss_of(path_part: str) -> int:
    """Resident bytes of this process's mappings whose file path contains ``path_part`` (``/proc/self/smaps``)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
                inside = len(head) >= 6 and path_part in line
            elif inside and line.startswith("Rss:"):
                total += int(head[1]) * 1024
    return total


@pytest.fixture(scope="module")
def gdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("host_bound") / "g"
    io.save(csbm(nodes=3000, features=256, avg_degree=6, seed=4), out)  # x.npy: 3 MB
    return out


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="Linux /proc")
def test_validation_leaves_none_of_the_features_resident(gdir: Path) -> None:
    g = io.open_dir(gdir)  # validation reads every feature (NaN/inf check) through the map
    assert g.x is not None and g.x.numel() * 4 == 3000 * 256 * 4
    assert _rss_of(str(gdir / "x.npy")) <= 64 << 10  # at most a page or two at the edges, not 3 MB
    assert bool(torch.isfinite(g.x[:10]).all())  # the map still reads (the pages come back from the file)


def test_layerwise_steps_hold_at_most_max_rows_input_rows() -> None:
    degree = torch.tensor([0, 5, 1, 9, 2, 2, 30, 0, 4])
    steps = _steps(9, 4, None, degree, max_rows=12)
    assert [lo for lo, _ in steps][0] == 0 and steps[-1][1] == 9
    assert all(a[1] == b[0] for a, b in zip(steps, steps[1:], strict=False))  # contiguous, every vertex once
    for lo, hi in steps:
        rows = int((degree[lo:hi] + 1).sum())
        assert hi - lo <= 4 and (rows <= 12 or hi - lo == 1)  # a hub alone is a step
    assert (6, 7) in steps
    ids = torch.tensor([1, 3, 6])
    assert _steps(3, 16, ids, degree, max_rows=11) == [(0, 1), (1, 2), (2, 3)]
    assert _steps(9, 4, None, degree, None) == [(0, 4), (4, 8), (8, 9)]


def test_layerwise_within_a_budget_computes_the_same_outputs() -> None:
    g = csbm(nodes=400, features=16, avg_degree=5, seed=1)
    assert g.x is not None and g.num_classes is not None
    model = build_model("gcn", 16, 8, g.num_classes, layers=2, dropout=0.0, heads=1, seed=0).eval()
    topo, adj = CSRTopology.from_graph(g), SampledAdjacency.from_graph(g, model.adjacency)
    x = g.x

    def run(max_rows: int | None) -> torch.Tensor:
        with torch.no_grad():
            return layerwise(model, topo, lambda ids: x[ids], g.num_nodes, adj, batch_size=64, device=CPU,
                             degree=g.in_degree(), max_rows=max_rows)

    assert torch.allclose(run(None), run(40), atol=1e-6)


def _offload(gdir: Path, host_memory: str) -> OffloadEngine:
    g = io.open_dir(gdir)
    cfg = TrainConfig(model="gcn", layers=2, hidden=16, engine="offload", epochs=1, host_memory=host_memory,
                      scratch=str(gdir.parent))
    assert g.num_classes is not None
    net = build_model("gcn", g.num_features, 16, g.num_classes, layers=2, dropout=0.5, heads=1, seed=0)
    return OffloadEngine(g, net, cfg, CPU)


def test_offload_on_a_cpu_plans_its_chunks_in_the_host_budget(gdir: Path) -> None:
    g = io.open_dir(gdir)
    free = plan_offload(g, TrainConfig(engine="offload", hidden=16), CPU)
    assert free.partition.num_chunks == 1  # without a budget: host memory is the device, one chunk
    eng = _offload(gdir, "8MB")
    assert eng.plan.budget == cpu_chunk_bytes(8_000_000) and eng.plan.partition.num_chunks > 1
    assert eng.host_plan is not None and eng.host_plan.fixed["working set"] >= eng.plan.estimate
    counted = eng.train_epoch(1)["peak_device_bytes"]  # the chunk's host allocations, counted on the CPU
    assert 0 < counted <= eng.plan.budget


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="Linux /proc")
def test_spilled_pages_leave_the_process_after_each_chunk(gdir: Path) -> None:
    eng = _offload(gdir, "1500KB")
    assert eng.spill is not None and eng.spill.spill_bytes > 256 << 10
    released: list[int] = []
    real = eng.spill.release
    eng.sweep.after_chunk = lambda: (released.append(1), real())[-1]
    eng.train_epoch(1)
    assert len(released) >= eng.plan.partition.num_chunks  # after each chunk of each pass
    resident = _rss_of("gnnscale-spill-")  # the (deleted) spill files' maps: what the last chunk touched
    assert resident <= spill_window(eng.model, eng.plan, 3000) < eng.spill.spill_bytes + eng.spill.file_bytes


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="Linux /proc")
@pytest.mark.parametrize("engine, budget", [("minibatch", "12MB"), ("offload", "8MB")])
def test_the_peak_stays_under_the_base_plus_the_budget(gdir: Path, tmp_path: Path, engine: str,
                                                       budget: str) -> None:
    """A subprocess trains from the directory under --host-memory; its VmHWM is at most the printed base plus the
    budget, and the base is what ``gnnscale plan --host-memory`` prints for it."""
    metrics = tmp_path / "m.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "gnnscale", "train", "--dataset", str(gdir), "--engine", engine, "--epochs", "1",
           "--hidden", "16", "--batch-size", "64", "--fanouts", "5,5", "--device", "cpu", "--quiet",
           "--host-memory", budget, "--scratch", str(tmp_path), "--metrics", str(metrics)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "passed the" not in p.stderr  # no warning that the peak passed the bound
    rec = json.loads(metrics.read_text().splitlines()[0])
    assert rec["disk_read_bytes"] > 0  # the features came from disk
    assert 0 < rec["host_peak_bytes"] <= rec["host_base_bytes"] + parse_budget(budget)
