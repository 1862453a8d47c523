"""benchmarks/hybrid.py: its cases (the flags the GPU check passes keep their names and meanings, --quick fills
the rest) and render() on the real records. The engine's model and DRM are tested in tests/test_hybrid*.py."""

from __future__ import annotations

from benchmarks import hybrid as bench
from benchmarks.harness.cli import parser
from benchmarks.harness.records import RESULTS_DIR, read_records


def test_cases_of_the_default_quick_and_gpu_check_arguments() -> None:
    ap = parser("hybrid", bench)
    default = bench.cases(ap.parse_args([]))
    assert [c.params["part"] for c in default][-2:] == ["model", "drm"] and bench.ROUNDS == 1
    assert default[-1].params["dataset"] == bench.CSBM
    assert {k: default[-1].params[k] for k in bench.DEFAULTS} == bench.DEFAULTS
    quick = bench.cases(ap.parse_args(["--quick", "--hidden", "32"]))
    assert [c.params["dataset"] for c in quick] == [bench.QUICK_CSBM, bench.QUICK_CSBM]
    assert quick[0].params["hidden"] == 32 and quick[0].params["sweep"] == bench.QUICK["sweep"]
    gpu = bench.cases(ap.parse_args(["--datasets", "a", "--drm-dataset", "b", "--model-devices", "cpu;cpu,cuda:0",
                                     "--drm-devices", "cpu,cuda:0", "--slowdown", "1", "--sweep", "0.05,0.2",
                                     "--hidden", "256", "--fanouts", "25,10", "--batch-size", "1024", "--warmup",
                                     "1", "--epochs", "1", "--drm-epochs", "2", "--repeats", "1"]))
    assert [(c.params["part"], c.params["dataset"]) for c in gpu] == [("model", "a"), ("drm", "b")]
    p = gpu[1].params
    assert (p["model_devices"], p["drm_devices"], p["slowdown"], p["sweep"], p["hidden"], p["fanouts"],
            p["batch_size"], p["warmup"], p["epochs"], p["drm_epochs"], p["repeats"]) == (
        "cpu;cpu,cuda:0", "cpu,cuda:0", 1.0, "0.05,0.2", 256, "25,10", 1024, 1, 1, 2, 1)


def test_render_quotes_the_latest_run() -> None:
    recs = read_records(RESULTS_DIR / "hybrid.jsonl")
    text = bench.render(recs)
    for r in (r for r in recs if r["kind"] == "model"):
        assert f"| {r['predicted_epoch_s']:.3f} / {r['measured_epoch_s']:.3f} | {100 * r['error']:+.1f}% |" in text
    drm = next(r for r in recs if r["kind"] == "drm")
    assert f"| {drm['drm_settled_epoch_s']:.3f} |" in text and f"= {drm['drm_over_best']:.2f}x" in text
    assert f"{drm['sweep']['0.05']:.3f}" in text
