"""``python -m benchmarks minibatch`` on a tiny graph: the sampler baselines draw valid uniform samples, the cases of
the default and --quick flags, the cases' runs give the sampler and engine records with their fields (read
amplification, MTEPS, 1 and 2 trainers), and render() gives the RESULTS table from the records file."""

from __future__ import annotations

import pytest
import torch

from benchmarks import minibatch as bench
from benchmarks.harness.cli import parser
from benchmarks.harness.records import RESULTS_DIR, read_records
from gnnscale.graph.generators import csbm
from gnnscale.sample import CSRTopology

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


def test_cases_of_the_default_and_quick_flags() -> None:
    args = parser("minibatch", bench).parse_args(["--device", "cpu", "--trainers", "1,2", "--rejection"])
    cases = bench.cases(args)
    assert [c.name for c in cases] == ["samplers", *(f"{k} trainer(s), feature ratio {r:g}" for k in (1, 2)
                                                     for r in (0, 0.25, 1))]
    assert {c.group for c in cases} == {bench.DEFAULT_DATASET}
    p = cases[1].params
    assert p["fanouts"] == [25, 10] and p["layers"] == 2 and p["hidden"] == 256 and p["rejection"]
    assert (p["what"], p["trainers"], p["gpu_feature_ratio"]) == ("engine", 1, 0.0)
    quick = bench.cases(parser("minibatch", bench).parse_args(["--quick", "--hidden", "32"]))
    assert [c.name for c in quick] == ["samplers", *(f"{k} trainer(s), feature ratio 0.25" for k in (1, 2))]
    assert quick[0].params["dataset"] == bench.QUICK["dataset"] and quick[0].params["fanouts"] == [5, 5]
    assert quick[0].params["hidden"] == 32  # a flag given stays as given
    with pytest.raises(SystemExit):
        bench.cases(parser("minibatch", bench).parse_args(["--gpu-feature-ratio", "2"]))


def test_runs_give_sampler_and_engine_records() -> None:
    args = parser("minibatch", bench).parse_args(
        ["--device", "cpu", "--dataset", "csbm:nodes=400,avg_degree=12,features=8", "--hidden", "8", "--fanouts",
         "5,3", "--batch-size", "64", "--gpu-feature-ratio", "0.25", "--trainers", "1,2", "--epochs", "1",
         "--warmup", "0", "--repeats", "1", "--rejection"])
    records = [r for c in bench.cases(args) for r in bench.run(c.params)]
    samplers = [r for r in records if r["kind"] == "sampler"]
    engines = [r for r in records if r["kind"] == "engine"]
    assert [r["sampler"] for r in samplers][:4] == [bench.OURS, "fetch-all-then-sample (gnnscale feae281)",
                                                   "Floyd, torch RNG (O(fanout))", "rejection, torch RNG (O(fanout))"]
    for r in samplers:
        assert r["median_sample_s"] > 0 and r["mteps"] > 0 and r["sampled_edges"] > 0 and r["ours_mteps_ratio"] > 0
        assert r["ours_speedup"] > 0 and r["device"] == "cpu" and r["device_name"]
    ours, fetch_all = samplers[0], samplers[1]
    assert ours["read_amplification"] == 1.0 and ours["ours_mteps_ratio"] == 1.0
    assert fetch_all["read_amplification"] > 1.0
    assert [r["trainers"] for r in engines] == [1, 2]
    for r in engines:
        assert r["status"] == "ok" and r["median_epoch_s"] > 0 and r["mteps"] > 0
        assert r["read_amplification"] == 1.0 and r["fetched_neighbor_entries"] == r["sampled_edges"]
        assert all(r[f"median_{k}"] >= 0 for k in bench.STAGES)
    assert engines[0]["final_loss"] == pytest.approx(engines[1]["final_loss"], rel=1e-5)
    text = bench.render([{**r, "session": "s", "round": 0} for r in records])
    assert f"| {engines[0]['final_loss']:.4f} |" in text and "csbm n=400" in text


def test_render_of_the_records_file() -> None:
    """The CPU section: per graph the runs of its latest command (3 on ego-twitter, 2 on csbm), medians."""
    records = read_records(RESULTS_DIR / "minibatch.jsonl")
    text = bench.render(records)
    shown = bench.selected(records)
    ego = [r for r in shown if r["graph"] == "ego-twitter" and r["kind"] == "engine" and r["trainers"] == 1]
    assert len(ego) == 3 and all("--rejection" in r["command"] for r in ego)
    med = sorted(r["median_epoch_s"] for r in ego)[1]
    assert f"| ego-twitter sym. | 1 | 0.25 | {med:.3f} (" in text and f"{med:.3f}" == "0.711"
    assert "| csbm n=200,000 degree 50 | fetch-all-then-sample (gnnscale feae281) | 2.226 (2.216-2.237) |" in text
    assert all(r["device"] == "cpu" for r in shown) and "cuda" not in text.lower()
