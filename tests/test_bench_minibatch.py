"""benchmarks/minibatch.py on a tiny graph: the sampler baselines draw valid uniform samples, and one run writes the
sampler and engine records with their fields (read amplification, MTEPS, 1 and 2 trainers)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from gnnscale.graph.generators import csbm
from gnnscale.sample import CSRTopology

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import minibatch as bench  # noqa: E402

FANOUTS = (5, 3)


@pytest.fixture(scope="module")
def topo() -> CSRTopology:
    return CSRTopology.from_graph(csbm(nodes=400, avg_degree=12, features=8, seed=1))  # GraphSAGE's adjacency


@pytest.mark.parametrize("draw", [bench.floyd_positions, bench.rejection_positions])
def test_torch_rng_positions_are_uniform_subsets(draw: bench.PositionFn) -> None:
    gen = torch.Generator().manual_seed(0)
    rows = 20000
    pos = draw(torch.full((rows,), 5, dtype=torch.int64), 2, gen)  # 2 of 5: 10 pairs, each 1/10
    assert pos.shape == (rows, 2) and bool((pos[:, 0] < pos[:, 1]).all()) and int(pos.max()) < 5
    pairs = torch.bincount(pos[:, 0] * 5 + pos[:, 1], minlength=25).double() / rows
    assert torch.allclose(pairs[pairs > 0], torch.full((10,), 0.1, dtype=torch.float64), atol=0.015)


@pytest.mark.parametrize("name", ["ours", "fetch_all", "floyd", "rejection"])
def test_samplers_give_valid_blocks(topo: CSRTopology, name: str) -> None:
    seeds = torch.arange(0, 400, 7)
    gen = torch.Generator().manual_seed(0)
    blocks, fetched = {
        "ours": lambda: bench.sample_ours(topo, seeds, FANOUTS, 3),
        "fetch_all": lambda: bench.sample_fetch_all(topo, seeds, FANOUTS, gen),
        "floyd": lambda: bench.sample_torch_rng(topo, seeds, FANOUTS, bench.floyd_positions, gen),
        "rejection": lambda: bench.sample_torch_rng(topo, seeds, FANOUTS, bench.rejection_positions, gen),
    }[name]()
    assert torch.equal(blocks[-1].src_ids[: blocks[-1].num_dst], seeds)
    edges = 0
    for block, fanout in zip(reversed(blocks), FANOUTS, strict=True):
        dst = block.src_ids[: block.num_dst]
        deg = topo.indptr[dst + 1] - topo.indptr[dst]
        assert torch.equal(block.indptr[1:] - block.indptr[:-1], deg.clamp(max=fanout))
        for i in range(0, block.num_dst, 5):  # every sampled source is a distinct in-neighbour entry
            nbrs = block.src_ids[block.indices[block.indptr[i] : block.indptr[i + 1]]]
            full = topo.indices[topo.indptr[dst[i]] : topo.indptr[dst[i] + 1]]
            assert bool(torch.isin(nbrs, full).all())
            assert nbrs.unique().numel() == nbrs.numel() or full.unique().numel() < full.numel()
        edges += block.num_edges
    assert fetched == edges if name != "fetch_all" else fetched > edges


def test_benchmark_writes_sampler_and_engine_records(tmp_path: Path) -> None:
    out = tmp_path / "minibatch.jsonl"
    rc = bench.main(["--device", "cpu", "--dataset", "csbm:nodes=400,avg_degree=12,features=8", "--hidden", "8",
                     "--fanouts", "5,3", "--batch-size", "64", "--gpu-feature-ratio", "0.25", "--trainers", "1,2",
                     "--epochs", "1", "--warmup", "0", "--repeats", "1", "--rejection", "--out", str(out)])
    assert rc == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    samplers = [r for r in records if r["kind"] == "sampler"]
    engines = [r for r in records if r["kind"] == "engine"]
    assert [r["sampler"] for r in samplers][:4] == [bench.OURS, "fetch-all-then-sample (gnnscale feae281)",
                                                   "Floyd, torch RNG (O(fanout))", "rejection, torch RNG (O(fanout))"]
    for r in samplers:
        assert r["median_sample_s"] > 0 and r["mteps"] > 0 and r["sampled_edges"] > 0 and r["ours_mteps_ratio"] > 0
        assert r["ours_speedup"] > 0 and r["torch"] and r["command"]
    ours, fetch_all = samplers[0], samplers[1]
    assert ours["read_amplification"] == 1.0 and ours["ours_mteps_ratio"] == 1.0
    assert fetch_all["read_amplification"] > 1.0
    assert [r["trainers"] for r in engines] == [1, 2]
    for r in engines:
        assert r["status"] == "ok" and r["median_epoch_s"] > 0 and r["mteps"] > 0
        assert r["read_amplification"] == 1.0 and r["fetched_neighbor_entries"] == r["sampled_edges"]
        assert all(r[f"median_{k}"] >= 0 for k in bench.STAGES)
    assert engines[0]["final_loss"] == pytest.approx(engines[1]["final_loss"], rel=1e-5)
