"""Where a run's time went (issue #28, item 11): the summary record's ``timings`` split the wall time into parts
that do not overlap (load, preparation, training, evaluation, checkpoints) and the rest (``other_s``), so the
parts sum to ``wall_s``; ``gnnscale train`` prints the same split on its last timing line."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from gnnscale import TrainConfig, train
from gnnscale.cli.main import main
from gnnscale.engines.core.schema import TIMING_KEYS, WALL_PARTS
from gnnscale.graph.generators import csbm

SPEC = "csbm:nodes=200,features=8,classes=3"


def _check_parts(t: dict[str, float]) -> None:
    assert set(WALL_PARTS) <= set(t), sorted(t)
    assert all(t[k] >= 0 for k in (*WALL_PARTS, "wall_s")), {k: t[k] for k in WALL_PARTS}
    assert sum(t[k] for k in WALL_PARTS) == pytest.approx(t["wall_s"], abs=1e-3)
    assert set(t) <= set(TIMING_KEYS), sorted(set(t) - set(TIMING_KEYS))


def test_the_summary_parts_sum_to_the_wall_time(tmp_path: Path) -> None:
    g = csbm(nodes=200, features=8, classes=3, seed=0)
    slow = 0.05

    def on_epoch(rec: dict[str, Any]) -> None:  # the caller's time: neither training nor evaluation
        time.sleep(slow)

    result = train(g, TrainConfig(epochs=2, hidden=8), "cpu", on_epoch=on_epoch, timings={"load_s": 0.25},
                   checkpoint=tmp_path / "ck")
    t = result.summary["timings"]
    _check_parts(t)
    assert t["load_s"] == 0.25  # the caller's load is part of the wall time
    assert t["wall_s"] == pytest.approx(t["load_s"] + result.summary["total_time_s"], abs=1e-6)
    assert t["training_s"] == pytest.approx(sum(r["epoch_time_s"] for r in result.history), abs=1e-6)
    assert t["checkpoint_s"] > 0 and t["eval_s"] > 0 and t["prepare_s"] > 0
    assert t["other_s"] >= 2 * slow  # the callbacks' sleeps are in no named part
    assert t["ready_s"] == pytest.approx(t["load_s"] + t["prepare_s"], abs=1e-6)


def test_the_printed_line_lists_the_parts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m = tmp_path / "m.jsonl"
    assert main(["train", "--dataset", SPEC, "--epochs", "2", "--hidden", "8", "--device", "cpu", "--quiet",
                 "--metrics", str(m), "--checkpoint", str(tmp_path / "ck")]) == 0
    out = capsys.readouterr().out
    summary = json.loads(m.read_text().splitlines()[-1])
    t = summary["timings"]
    _check_parts(t)
    line = next(ln for ln in out.splitlines() if " epochs in " in ln)
    num = r"(\d+\.\d)s"
    pattern = (rf"2 epochs in {num} wall: load {num}, preparation {num}, training {num} \(2 epochs\), "
               rf"evaluation {num}, checkpoints {num}, other {num}$")
    found = re.search(pattern, line)
    assert found, line
    printed = [float(x) for x in found.groups()]
    assert printed == [round(t[k], 1) for k in ("wall_s", *WALL_PARTS)]
    ready = next(ln for ln in out.splitlines() if ln.startswith("ready to train in "))
    assert re.search(rf"ready to train in {num}: load {num}, preparation {num}", ready), ready
