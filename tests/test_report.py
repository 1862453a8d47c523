"""Run reports: reading metrics files, the panels built from them, Markdown and the PNG."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from gnnscale import TrainConfig, TrainResult, _compat, train
from gnnscale.engines.core.schema import EPOCH_KEYS, KINDS, Key
from gnnscale.errors import ConfigError, DatasetError, GnnscaleError
from gnnscale.graph.generators import csbm
from gnnscale.report import Run, build_panels, draw_figure, markdown, read_run, render_png, run_from_records

# a finished offload run: three epochs with engine counters (one that never moved anything), then a summary
OFFLOAD = [
    {"epoch": 1, "loss": 1.6, "train_acc": 0.3, "val_acc": 0.25, "test_acc": 0.2, "epoch_time_s": 0.5,
     "peak_device_bytes": 2 * 2**20, "h2d_bytes": 4_000_000, "d2h_bytes": 2_000_000, "h2d_topology_bytes": 0,
     "rows_h2d": 100, "device_peak_bytes": [2 * 2**20]},
    {"epoch": 2, "loss": 1.2, "train_acc": 0.6, "val_acc": 0.55, "test_acc": 0.5, "epoch_time_s": 0.4,
     "peak_device_bytes": 3 * 2**20, "h2d_bytes": 4_000_000, "d2h_bytes": 2_000_000, "h2d_topology_bytes": 0,
     "rows_h2d": 100, "device_peak_bytes": [3 * 2**20]},
    {"epoch": 3, "loss": 0.9, "train_acc": 0.8, "val_acc": 0.5, "test_acc": 0.6, "epoch_time_s": 0.4,
     "peak_device_bytes": 3 * 2**20, "h2d_bytes": 4_000_000, "d2h_bytes": None, "h2d_topology_bytes": 0,
     "rows_h2d": 100, "device_peak_bytes": [3 * 2**20]},
    {"summary": True, "engine": "offload", "device": "cpu", "model": "gcn", "dataset": "tiny", "epochs": 3,
     "best_val_acc": 0.55, "best_by": "val", "best_epoch": 2, "test_acc_at_best_val": 0.5, "final_test_acc": 0.6,
     "config": {"partitions": 2}},
]
# an interrupted in-memory run: two epochs, nulls where nothing was measured, no summary
INTERRUPTED = [
    {"epoch": 1, "loss": 1.5, "train_acc": 0.4, "val_acc": 0.35, "test_acc": 0.3, "epoch_time_s": 0.2,
     "peak_device_bytes": None},
    {"epoch": 2, "loss": None, "train_acc": 0.5, "val_acc": 0.45, "test_acc": None, "epoch_time_s": 0.2,
     "peak_device_bytes": 2**20},
]


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture
def runs(tmp_path: Path) -> list[Run]:
    return [read_run(_write(tmp_path / "off.jsonl", OFFLOAD)), read_run(_write(tmp_path / "cut.jsonl", INTERRUPTED))]


def test_read_run_labels_and_summary(runs: list[Run]) -> None:
    off, cut = runs
    assert off.label == "offload/gcn/tiny/p2" and off.summary is not None and len(off.records) == 3
    assert cut.label == "cut" and cut.summary is None and len(cut.records) == 2  # no summary: the file stem


def test_build_panels_series_names_and_lengths(runs: list[Run]) -> None:
    panels = build_panels(runs)
    got = {p.title: [(s.name, len(s.x), len(s.y)) for s in p.series] for p in panels}
    off, cut = "offload/gcn/tiny/p2", "cut"
    assert list(got) == ["loss", "accuracy", "epoch time", "memory held", "moved per epoch"]
    assert got["loss"] == [(off, 3, 3), (cut, 2, 2)]
    assert got["accuracy"] == [(f"{off} train", 3, 3), (f"{off} val", 3, 3), (f"{off} test", 3, 3),
                               (f"{cut} train", 2, 2), (f"{cut} val", 2, 2), (f"{cut} test", 2, 2)]
    assert got["epoch time"] == [(off, 3, 3), (cut, 2, 2)]
    assert got["memory held"] == [(f"{off} device", 3, 3), (f"{cut} device", 2, 2)]  # by kind: device / host
    # peaks are memory, not movement; an all-zero counter and row counts (not bytes) stay out
    assert got["moved per epoch"] == [(f"{off} h2d_bytes", 3, 3), (f"{off} d2h_bytes", 3, 3)]


def test_build_panels_values_units_and_null_gaps(runs: list[Run]) -> None:
    panels = {p.title: p for p in build_panels(runs)}
    loss_cut = panels["loss"].series[1]
    assert loss_cut.x == [1, 2] and loss_cut.y[0] == 1.5 and math.isnan(loss_cut.y[1])
    assert math.isnan(panels["accuracy"].series[5].y[1])  # cut test_acc at epoch 2
    assert panels["accuracy"].series[1].y == [0.25, 0.55, 0.5]
    peak_off, peak_cut = panels["memory held"].series
    assert peak_off.y == [2.0, 3.0, 3.0]  # MiB
    assert math.isnan(peak_cut.y[0]) and peak_cut.y[1] == 1.0
    h2d, d2h = panels["moved per epoch"].series
    assert h2d.y == [4.0, 4.0, 4.0]  # MB
    assert d2h.y[:2] == [2.0, 2.0] and math.isnan(d2h.y[2])


def test_no_moved_panel_without_counters(tmp_path: Path) -> None:
    panels = build_panels([read_run(_write(tmp_path / "cut.jsonl", INTERRUPTED))])
    assert [p.title for p in panels] == ["loss", "accuracy", "epoch time", "memory held"]


def test_same_label_runs_get_their_file_names(tmp_path: Path) -> None:
    a = read_run(_write(tmp_path / "a.jsonl", OFFLOAD))
    b = read_run(_write(tmp_path / "b.jsonl", OFFLOAD))
    names = [s.name for s in build_panels([a, b])[0].series]
    assert names == ["offload/gcn/tiny/p2 (a)", "offload/gcn/tiny/p2 (b)"]


def test_markdown_rows_and_closing_lines(runs: list[Run]) -> None:
    md = markdown(runs)
    assert "### offload/gcn/tiny/p2" in md and "### cut" in md
    assert "| 2 | 1.2000 | 0.6000 | 0.5500 | 0.5000 | 0.400 | 3.0 |" in md
    assert "| 1 | 1.5000 | 0.4000 | 0.3500 | 0.3000 | 0.200 | n/a |" in md
    assert "| 2 | n/a | 0.5000 | 0.4500 | n/a | 0.200 | 1.0 |" in md
    table_rows = [ln for ln in md.splitlines() if ln.startswith("| ") and ln[2].isdigit() and ln.count("|") == 8]
    assert len(table_rows) == 5
    assert "best epoch 2" in md and "test accuracy 0.5000 at best val" in md
    assert "interrupted after 2 epoch record(s): best val accuracy 0.4500 at epoch 2" in md


@pytest.mark.skipif(not _compat.WITH_MATPLOTLIB, reason="matplotlib not installed")
def test_render_png_writes_a_png_atomically(runs: list[Run], tmp_path: Path) -> None:
    out = tmp_path / "report.png"
    old = os.umask(0o027)
    try:
        assert render_png(build_panels(runs), out) == out
    finally:
        os.umask(old)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 20_000  # five panels of lines and legends, not an empty canvas
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    # 2 columns x 3 rows of 6.0 x 3.6 inches, and the figure's legend below them (8 names, 4 a row: 0.3 + 2 x 0.25)
    assert (width, height) == (1200, 1160)
    assert out.stat().st_mode & 0o777 == 0o640  # the umask's mode, not tempfile's 0600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.jsonl", "off.jsonl", "report.png"]  # no temp left


@pytest.mark.skipif(not _compat.WITH_MATPLOTLIB, reason="matplotlib not installed")
def test_render_png_bad_out(runs: list[Run], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        render_png(build_panels(runs), tmp_path / "nope" / "r.png")
    with pytest.raises(ConfigError, match="is a directory"):
        render_png(build_panels(runs), tmp_path)


def test_render_png_without_matplotlib_names_the_extra(runs: list[Run], tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_compat, "WITH_MATPLOTLIB", False)
    with pytest.raises(ConfigError, match=r"pip install gnnscale\[report\]"):
        render_png(build_panels(runs), tmp_path / "r.png")
    assert not (tmp_path / "r.png").exists()


@pytest.mark.parametrize("lines, message", [
    (['{"epoch": 1, "loss": 1.0}', "{not json"], r"bad\.jsonl:2: not JSON"),
    (['{"epoch": 1, "loss": 1.0}', "", "[1, 2]"], r"bad\.jsonl:3: expected a JSON object"),
    (['{"loss": 1.0}'], r"bad\.jsonl:1: an epoch record needs an integer 'epoch'"),
    (['{"epoch": 1, "loss": "high"}'], r"bad\.jsonl:1: 'loss' should be a number or null"),
    (['{"epoch": 1, "h2d_bytes": "lots"}'], r"bad\.jsonl:1: 'h2d_bytes' should be a number or null"),
    (['{"summary": true, "engine": "inmemory"}'], r"bad\.jsonl: no epoch records"),
    ([], r"bad\.jsonl: no epoch records"),
    (['{"epoch": 1}', '{"summary": true}', '{"epoch": 2}'], r"bad\.jsonl:3: a record after the summary"),
])
def test_bad_file_raises_dataset_error_naming_the_line(tmp_path: Path, lines: list[str], message: str) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(ln + "\n" for ln in lines))
    with pytest.raises(DatasetError, match=message) as info:
        read_run(bad)
    assert "\n" not in str(info.value)


def test_missing_file_and_no_runs(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no such metrics file"):
        read_run(tmp_path / "absent.jsonl")
    with pytest.raises(GnnscaleError):
        build_panels([])
    with pytest.raises(GnnscaleError):
        markdown([])


@pytest.mark.skipif(not _compat.WITH_MATPLOTLIB, reason="matplotlib not installed")
def test_render_png_many_counters_legend_below(tmp_path: Path) -> None:
    moved = ("h2d_bytes", "h2d_row_bytes", "h2d_topology_bytes", "h2d_index_bytes", "d2h_bytes", "d2d_bytes",
             "disk_read_bytes")  # seven counters of the kind "moved"
    counters = {key: 1_000_000 * (k + 1) for k, key in enumerate(moved)}
    records = [{"epoch": e, "loss": 1.0, "train_acc": 0.5, "val_acc": 0.5, "test_acc": 0.5, "epoch_time_s": 0.1,
                "peak_device_bytes": 2**20, **counters} for e in (1, 2)]
    panels = build_panels([read_run(_write(tmp_path / "many.jsonl", records))])
    assert len(panels[-1].series) == 7
    data = render_png(panels, tmp_path / "many.png").read_bytes()
    # the figure's legend below the panels, 4 names a row: 1 run + 3 splits + device + 7 counters = 3 rows,
    # 10.8 + 0.3 + 3 x 0.25 inches at 100 dpi
    assert int.from_bytes(data[20:24], "big") == 1185


def test_cli_report_png_and_markdown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gnnscale.cli import main

    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert main(["train", "--dataset", "csbm:nodes=300,features=8", "--epochs", "3", "--quiet", "--metrics",
                 str(a)]) == 0
    assert main(["train", "--dataset", "csbm:nodes=300,features=8", "--epochs", "2", "--engine", "offload",
                 "--partitions", "2", "--quiet", "--metrics", str(b)]) == 0
    capsys.readouterr()
    png = tmp_path / "r.png"
    assert main(["report", str(a), str(b), "--out", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "wrote" in capsys.readouterr().out
    assert main(["report", str(a), str(b), "--format", "md"]) == 0
    md = capsys.readouterr().out
    assert md.count("| 1 |") >= 2 and "offload" in md
    assert main(["report", str(a)]) == 2  # png without --out
    assert capsys.readouterr().err.startswith("error: report --format png needs --out")


# ------------------------------------------------------------------------------------ counters by their kind (#44)
def _kind_tables(md: str) -> dict[str, list[str]]:
    """The Markdown's tables after the first of a run: their title line (``bytes held (MiB):``) -> their keys."""
    lines = md.splitlines()
    return {lines[i]: [c.strip() for c in lines[i + 2].strip("|").split("|")][1:]
            for i in range(len(lines) - 2) if lines[i].endswith(":") and lines[i + 2].startswith("| epoch |")}


def _kind_of(md: str) -> dict[str, str]:
    """Each key of the Markdown's kind tables -> the kind its table is titled by."""
    titles = {text: kind for kind, text in KINDS.items()}
    return {key: titles.get(title.split(" (")[0].rstrip(":"), "other")
            for title, keys in _kind_tables(md).items() for key in keys}


HOST_MEMORY = [
    {"epoch": e, "loss": 1.0, "train_acc": 0.5, "val_acc": 0.5, "test_acc": 0.5, "epoch_time_s": 0.1,
     "peak_device_bytes": 2**20, "h2d_bytes": 3_000_000, "disk_read_bytes": 5_000_000, "anon_rss_bytes": 400 * 2**20,
     "host_rows_ram_bytes": 8 * 2**20, "spill_bytes": 16 * 2**20, "rows_reused_bytes": 1_000_000, "rows_h2d": 10,
     "feature_hit_rate": 0.25, "device_peak_bytes": [2**20, 2**19], "accel_bytes": [1_000_000, 500_000],
     "foo_bytes": 7}
    for e in (1, 2)
]


def test_panels_group_counters_by_their_kind_in_the_schema(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Resident memory (anon_rss_bytes), buffers and spill files are held, not moved: they are drawn with the
    memory, and the bytes-moved panel holds traffic only (no row volume, no key the schema does not know)."""
    run = read_run(_write(tmp_path / "h.jsonl", HOST_MEMORY))
    parts = {p.title: [s.part for s in p.series] for p in build_panels([run])}
    assert parts["moved per epoch"] == ["h2d_bytes", "disk_read_bytes", "accel_bytes (sum)"]
    moved = {s.part: s.y for s in build_panels([run])[4].series}
    assert moved["accel_bytes (sum)"] == [1.5, 1.5]  # MB, the list's sum
    assert parts["memory held"] == ["device", "anon_rss_bytes", "host_rows_ram_bytes", "spill_bytes"]
    held = {s.part: s.y for s in build_panels([run])[3].series}
    assert held["anon_rss_bytes"] == [400.0, 400.0]  # MiB
    # the schema decides, not the key's name: give disk_read_bytes the kind "held" and it moves panel and table
    monkeypatch.setitem(EPOCH_KEYS, "disk_read_bytes", Key("bytes", "a test's counter", "none", kind="held"))
    parts = {p.title: [s.part for s in p.series] for p in build_panels([run])}
    assert parts["moved per epoch"] == ["h2d_bytes", "accel_bytes (sum)"] and "disk_read_bytes" in parts["memory held"]
    assert _kind_of(markdown([run]))["disk_read_bytes"] == "held"


def test_markdown_shows_every_key_under_its_kind(tmp_path: Path) -> None:
    """Every key of the schema a record holds is in the Markdown, in the table of its kind, in that kind's unit."""
    unit_values = {"bytes": 3_000_000, "s": 0.25, "fraction": 0.5, "count": 7, "rows": 7, "list": [1_048_576, 0]}
    rec = {name: ("micrograph" if k.kind == "setting" else 1.5) if k.unit == "-" else unit_values[k.unit]
           for name, k in EPOCH_KEYS.items()}
    rec["epoch"] = 1
    run = read_run(_write(tmp_path / "all.jsonl", [rec, {**rec, "epoch": 2}, {"epoch": 3, "foo": "a|b"}]))
    kinds = _kind_of(markdown([run]))
    main = {"epoch", "loss", "train_acc", "val_acc", "test_acc", "epoch_time_s", "peak_device_bytes"}
    assert kinds == {**{n: k.kind for n, k in EPOCH_KEYS.items() if n not in main}, "foo": "other"}
    tables = _kind_tables(markdown([run]))
    rows = {title: [ln for ln in markdown([run]).split(title)[1].split("\n\n")[1].splitlines()[2:]]
            for title in tables}
    moved = next(t for t in tables if t.startswith(KINDS["moved"]))
    held = next(t for t in tables if t.startswith(KINDS["held"]))
    assert moved.endswith("(MB):") and held.endswith("(MiB):")
    h2d = tables[moved].index("h2d_bytes")
    assert rows[moved][0].strip("|").split("|")[1 + h2d].strip() == "3.000"  # 3e6 bytes in MB
    rss = tables[held].index("anon_rss_bytes")
    assert rows[held][0].strip("|").split("|")[1 + rss].strip() == "2.9"  # 3e6 bytes in MiB
    peaks = tables[held].index("device_peak_bytes")
    assert rows[held][1].strip("|").split("|")[1 + peaks].strip() == "1.0, 0.0"  # a list: its values
    assert "| 1 | n/a |" in markdown([run]) and "| 3 | a\\|b |" in markdown([run])  # a key new in epoch 3


def test_markdown_of_a_host_memory_run_shows_disk_and_spill(tmp_path: Path) -> None:
    md = markdown([read_run(_write(tmp_path / "h.jsonl", HOST_MEMORY))])
    kinds = _kind_of(md)
    assert {k: kinds[k] for k in ("disk_read_bytes", "h2d_bytes", "anon_rss_bytes", "spill_bytes",
                                  "host_rows_ram_bytes", "rows_reused_bytes", "rows_h2d", "foo_bytes")} == {
        "disk_read_bytes": "moved", "h2d_bytes": "moved", "anon_rss_bytes": "held", "spill_bytes": "held",
        "host_rows_ram_bytes": "held", "rows_reused_bytes": "volume", "rows_h2d": "count", "foo_bytes": "other"}


# ------------------------------------------------------------------------------------ hostile metrics files (#44)
def test_deeply_nested_json_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gnnscale.cli import main

    bad = tmp_path / "deep.jsonl"
    bad.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(DatasetError, match=r"deep\.jsonl:1: JSON nested too deeply"):
        read_run(bad)
    deep_field = tmp_path / "field.jsonl"
    deep_field.write_text('{"epoch": 1, "loss": 1.0}\n{"epoch": 2, "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    with pytest.raises(DatasetError, match=r"field\.jsonl:2: JSON nested too deeply"):
        read_run(deep_field)
    assert main(["report", str(bad), "--format", "md"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "nested too deeply" in err[0]
    # as deep as the parser takes: read, tabulated (the nesting shown cut short) and drawn
    ok = _write(tmp_path / "ok.jsonl", [{**OFFLOAD[0], "x": json.loads("[" * 500 + "1" + "]" * 500)}])
    assert main(["report", str(ok), "--format", "md"]) == 0
    assert "| 1 | [[[[" in capsys.readouterr().out and build_panels([read_run(ok)])


@pytest.mark.skipif(not _compat.WITH_MATPLOTLIB, reason="matplotlib not installed")
def test_text_from_the_data_is_drawn_as_plain_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A dataset named ``$\\frac{1}{$`` is a name, not broken mathtext: labels, legend and title are plain text."""
    from gnnscale.cli import main

    name = "$\\frac{1}{$"
    path = _write(tmp_path / "d.jsonl", [*OFFLOAD[:3], {**OFFLOAD[3], "dataset": name}])
    run = read_run(path)
    assert run.label == f"offload/gcn/{name}/p2"
    fig = draw_figure(build_panels([run]), title=f"runs on {name}")
    texts = {t.get_text(): t for t in fig.legends[0].get_texts()}
    assert run.label in texts and not any(t.get_parse_math() for t in texts.values())
    assert fig._suptitle is not None and not fig._suptitle.get_parse_math()
    assert not any(ax.title.get_parse_math() or ax.yaxis.label.get_parse_math() for ax in fig.axes)
    assert main(["report", str(path), "--out", str(tmp_path / "cli.png")]) == 0
    assert (tmp_path / "cli.png").read_bytes()[:4] == b"\x89PNG" and capsys.readouterr().err == ""


# ------------------------------------------------------------------------------------ TrainResult (#44)
@pytest.fixture(scope="module")
def result() -> TrainResult:
    g = csbm(nodes=200, avg_degree=4, features=8, classes=3, seed=0)
    return train(g, TrainConfig(engine="offload", partitions=2, epochs=3, hidden=8), "cpu")


@pytest.mark.skipif(not _compat.WITH_MATPLOTLIB, reason="matplotlib not installed")
def test_train_result_plot_draws_the_reports_panels(result: TrainResult, tmp_path: Path) -> None:
    """``result.plot()`` is ``gnnscale report`` of the run's metrics file, from the records in memory."""
    from gnnscale.cli.common import _MetricsWriter

    writer = _MetricsWriter(str(tmp_path / "m.jsonl"))  # the metrics file train --metrics writes
    for record in (*result.history, result.summary):
        writer.write(record)
    writer.close()
    panels = build_panels([read_run(tmp_path / "m.jsonl")])
    assert [p.title for p in panels][-1] == "moved per epoch"  # offload's counters are in it
    fig = result.plot(tmp_path / "sub" / "r.png")
    assert [ax.get_title() for ax in fig.axes] == [p.title for p in panels]
    assert [[ln.get_ydata().tolist() for ln in ax.get_lines()] for ax in fig.axes] == \
        [[pytest.approx(s.y, nan_ok=True) for s in p.series] for p in panels]
    assert [t.get_text() for t in fig.legends[0].get_texts()][0] == read_run(tmp_path / "m.jsonl").label
    assert (tmp_path / "sub" / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(DatasetError, match="no epoch records"):
        run_from_records([], None)


def test_train_result_repr_is_one_short_line(result: TrainResult) -> None:
    text = repr(result)
    assert "\n" not in text and len(text) < 300 and "tensor" not in text, text
    assert text.startswith("TrainResult(engine='offload', model='gcn'")
    assert f"epochs=3, best_epoch={result.summary['best_epoch']}" in text
    assert f"final_test_acc={result.history[-1]['test_acc']:.4f}" in text
