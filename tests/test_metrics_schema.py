"""One counter schema: every key an engine writes into a training record is in
:data:`gnnscale.engines.core.schema.EPOCH_KEYS` (one meaning, one unit), ``h2d_bytes`` is the sum of its parts in every
engine that writes it, and docs/metrics.md is the schema's own page."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gnnscale import TrainConfig, train
from gnnscale.cli.common import _MetricsWriter
from gnnscale.engines.core.schema import EPOCH_KEYS, H2D_PARTS, KINDS, markdown
from gnnscale.graph.generators import csbm
from gnnscale.report import markdown as report_markdown
from gnnscale.report import read_run

DOC = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"

RUNS: dict[str, dict[str, Any]] = {
    "inmemory": {},
    "offload": {"chunks": 2, "partitions": 2, "devices": ("cpu", "cpu:1")},
    "taskparallel": {"model": "dgcn", "devices": ("cpu", "cpu:1", "cpu:2")},
    "minibatch": {"batch_size": 64, "devices": ("cpu", "cpu:1")},
    "hybrid": {"batch_size": 64, "devices": ("cpu", "cpu:1"), "drm": "off"},
}


@pytest.fixture(scope="module")
def records() -> dict[str, dict[str, Any]]:
    g = csbm(nodes=240, features=8, classes=3, seed=0)
    out = {}
    for engine, options in RUNS.items():
        result = train(g, TrainConfig(engine=engine, epochs=1, hidden=8, **options), "cpu")
        assert result.engine == engine
        out[engine] = result.history[-1]
    return out


@pytest.mark.parametrize("engine", list(RUNS))
def test_every_key_an_engine_writes_is_in_the_schema(records: dict[str, dict[str, Any]], engine: str) -> None:
    unknown = sorted(set(records[engine]) - set(EPOCH_KEYS))
    assert unknown == [], f"{engine} writes keys the schema does not define"


@pytest.mark.parametrize("engine", list(RUNS))
def test_every_value_an_engine_writes_has_its_units_type(records: dict[str, dict[str, Any]], engine: str) -> None:
    """A ``list`` key holds a list of numbers, a key of any other unit but ``-`` a number or null."""
    number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
    wrong = {k: v for k, v in records[engine].items() if EPOCH_KEYS[k].unit != "-" and not (
        (isinstance(v, list) and all(number(x) for x in v)) if EPOCH_KEYS[k].unit == "list" else
        (v is None or number(v)))}
    assert wrong == {}, f"{engine} writes values that are not of their key's unit"


@pytest.mark.parametrize("engine", list(RUNS))
def test_h2d_bytes_is_the_sum_of_its_parts(records: dict[str, dict[str, Any]], engine: str) -> None:
    rec = records[engine]
    if "h2d_bytes" not in rec:
        assert not any(k in rec for k in H2D_PARTS), f"{engine} writes parts of h2d_bytes without the sum"
        return
    assert rec["h2d_bytes"] == sum(rec.get(k, 0) for k in H2D_PARTS), {k: rec.get(k) for k in ("h2d_bytes",
                                                                                              *H2D_PARTS)}
    if engine in ("offload", "taskparallel"):  # they stream from host memory; the others may hold it all
        assert rec["h2d_bytes"] > 0 and rec["h2d_row_bytes"] > 0 and rec["h2d_topology_bytes"] > 0


@pytest.mark.parametrize("engine", list(RUNS))
def test_report_markdown_shows_every_key_an_engine_writes_under_its_kind(records: dict[str, dict[str, Any]],
                                                                         engine: str, tmp_path: Path) -> None:
    """``gnnscale report --format md`` of the engine's metrics file: each key in the first table or in the table
    titled by the key's kind."""
    rec = records[engine]
    writer = _MetricsWriter(str(tmp_path / "m.jsonl"))  # the file train --metrics writes
    writer.write(rec)
    writer.close()
    md = report_markdown([read_run(tmp_path / "m.jsonl")]).splitlines()
    titles = [i for i, line in enumerate(md) if line.endswith(":") and i + 2 < len(md) and md[i + 2].startswith("|")]
    under = {c.strip(): md[i].split(" (")[0].rstrip(":") for i in titles for c in md[i + 2].strip("|").split("|")}
    first = {"epoch", "loss", "train_acc", "val_acc", "test_acc", "epoch_time_s", "peak_device_bytes"}
    assert {k: under.get(k) for k in rec if k not in first} == {k: KINDS[EPOCH_KEYS[k].kind] for k in rec
                                                                if k not in first}


def test_every_key_has_a_unit_and_a_meaning() -> None:
    units = {"bytes", "s", "rows", "count", "fraction", "list", "-"}
    for name, key in EPOCH_KEYS.items():
        assert key.unit in units, name
        assert len(key.meaning) > 8 and key.written_by, name
        if name.endswith("_bytes"):
            assert key.unit in ("bytes", "list"), name
        if name.endswith("_s"):
            assert key.unit in ("s", "list"), name
        assert key.kind in KINDS, name
        if key.unit == "bytes":  # bytes are moved (traffic), held (memory) or a row volume, never just "bytes"
            assert key.kind in ("moved", "held", "volume"), name


def test_docs_metrics_is_generated_from_the_schema() -> None:
    assert DOC.read_text() == markdown(), "regenerate: python -m gnnscale.engines.core.schema > docs/metrics.md"
