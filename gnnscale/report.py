"""Run reports from ``gnnscale train --metrics FILE`` (issue #15 item 4).

A metrics file is JSON Lines: one record per finished epoch, then -- only when training ended -- one summary record
(``"summary": true``). :func:`read_run` reads one, :func:`build_panels` turns runs into plot-ready series (the
function the tests check), :func:`render_png` draws them headless and :func:`markdown` prints the same as tables.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gnnscale import _compat
from gnnscale.errors import ConfigError, DatasetError
from gnnscale.fsutil import atomic_file

MIB = 2**20
MB = 1e6
SPLITS = ("train", "val", "test")
# fields every epoch record is expected to carry (numbers, or null where not measured / not finite)
_NUMERIC = ("loss", "train_acc", "val_acc", "test_acc", "epoch_time_s", "peak_device_bytes")


@dataclass
class Run:
    """One metrics file: its epoch records in order, the summary record if training ended, and a legend label."""

    path: Path
    records: list[dict[str, Any]]
    summary: dict[str, Any] | None
    label: str


@dataclass
class Series:
    """One line of a panel: ``y[i]`` at epoch ``x[i]``; NaN where the record had null (a gap in the plot)."""

    name: str
    x: list[int]
    y: list[float]
    run: int
    """Index of the run in the list given to :func:`build_panels`."""
    part: str = ""
    """What within the run: a split (``train``) or a counter (``h2d_bytes``); empty for one line per run."""


@dataclass
class Panel:
    """One subplot."""

    title: str
    ylabel: str
    series: list[Series] = field(default_factory=list)
    color_by: Literal["run", "part"] = "run"
    """Lines of one colour share a run (line style then tells the part) or a part (line style tells the run)."""


# ------------------------------------------------------------------------------------------------ reading
def read_run(path: str | os.PathLike[str]) -> Run:
    """Read one metrics file written by ``gnnscale train --metrics``.

    Raises:
        DatasetError: the file is missing, a line is not a JSON object, a record lacks an integer ``epoch`` or has
            a non-numeric metric, or there is no epoch record; the message names the file and line.
    """
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise DatasetError(f"{p}: no such metrics file") from None
    except IsADirectoryError:
        raise DatasetError(f"{p}: is a directory, not a metrics file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{p}: cannot read metrics file ({exc})") from None
    records: list[dict[str, Any]] = []
    summary: dict[str, Any] | None = None
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{p}:{lineno}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{where}: not JSON ({exc.msg}); expected a gnnscale train --metrics file") from None
        if not isinstance(rec, dict):
            raise DatasetError(f"{where}: expected a JSON object, got {type(rec).__name__}")
        if summary is not None:
            raise DatasetError(f"{where}: a record after the summary record")
        if rec.get("summary") is True:
            summary = rec
            continue
        _check_epoch_record(rec, where)
        records.append(rec)
    if not records:
        raise DatasetError(f"{p}: no epoch records; expected a gnnscale train --metrics file")
    return Run(path=p, records=records, summary=summary, label=_label(p, summary))


def _check_epoch_record(rec: dict[str, Any], where: str) -> None:
    epoch = rec.get("epoch")
    if not isinstance(epoch, int) or isinstance(epoch, bool):
        raise DatasetError(f"{where}: an epoch record needs an integer 'epoch', got {epoch!r}")
    for key in (*_NUMERIC, *_counters(rec)):
        v = rec.get(key)
        if v is not None and not _is_number(v):
            raise DatasetError(f"{where}: '{key}' should be a number or null, got {v!r}")


def _label(path: Path, summary: dict[str, Any] | None) -> str:
    if summary is None:
        return path.stem  # interrupted: the file name is all we know
    parts = [str(summary[k]) for k in ("engine", "model", "dataset") if summary.get(k) is not None]
    config = summary.get("config") or {}
    if summary.get("engine") == "offload" and isinstance(config, dict) and config.get("partitions"):
        parts.append(f"p{config['partitions']}")
    return "/".join(parts) or path.stem


def _labels(runs: Sequence[Run]) -> list[str]:
    """Each run's label, with its file name added where two runs would otherwise share one."""
    labels = [r.label for r in runs]
    return [f"{lab} ({r.path.stem})" if labels.count(lab) > 1 and lab != r.path.stem else lab
            for lab, r in zip(labels, runs, strict=True)]


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _counters(rec: dict[str, Any]) -> list[str]:
    """Byte counters of movement in a record: ``*_bytes`` scalars, peaks (memory, not movement) left out."""
    return [k for k, v in rec.items() if k.endswith("_bytes") and "peak" not in k and not isinstance(v, list)]


def _num(v: Any, scale: float = 1.0) -> float:
    return float("nan") if v is None else float(v) / scale


# ------------------------------------------------------------------------------------------------ panels
def build_panels(runs: Sequence[Run]) -> list[Panel]:
    """Plot-ready panels for ``runs`` overlaid: loss, accuracy (train/val/test per run), epoch time, peak memory
    (MiB) and, when any run recorded movement counters, bytes moved per epoch (MB). Nulls become NaN."""
    if not runs:
        raise ConfigError("a report needs at least one metrics file")
    labels = _labels(runs)
    loss = Panel("loss", "training loss")
    acc = Panel("accuracy", "accuracy")
    time_ = Panel("epoch time", "seconds")
    peak = Panel("peak device memory", "MiB")
    moved = Panel("moved per epoch", "MB", color_by="part")
    for i, (run, label) in enumerate(zip(runs, labels, strict=True)):
        x = [int(r["epoch"]) for r in run.records]

        def col(key: str, scale: float = 1.0, run: Run = run) -> list[float]:
            return [_num(r.get(key), scale) for r in run.records]

        loss.series.append(Series(label, x, col("loss"), i))
        for split in SPLITS:
            acc.series.append(Series(f"{label} {split}", x, col(f"{split}_acc"), i, split))
        time_.series.append(Series(label, x, col("epoch_time_s"), i))
        peak.series.append(Series(label, x, col("peak_device_bytes", MIB), i))
        keys = dict.fromkeys(k for r in run.records for k in _counters(r))  # first-seen order
        for key in keys:
            y = col(key, MB)
            if all(math.isnan(v) or v == 0 for v in y):
                continue  # a counter that never moved anything is noise in the legend
            moved.series.append(Series(f"{label} {key}", x, y, i, key))
    panels = [loss, acc, time_, peak]
    if moved.series:
        panels.append(moved)
    return panels


# ------------------------------------------------------------------------------------------------ PNG
def render_png(panels: Sequence[Panel], out: str | os.PathLike[str], *, dpi: int = 100,
               title: str | None = None) -> Path:
    """Draw ``panels`` in a grid (two columns) and write a PNG to ``out`` atomically, with the umask's mode.

    Headless: uses matplotlib's Agg canvas directly, never pyplot, so no display is needed and the caller's
    matplotlib backend is left alone.

    Raises:
        ConfigError: matplotlib is not installed, or ``out`` is a directory or in a directory that does not exist.
    """
    if not _compat.WITH_MATPLOTLIB:
        raise ConfigError("the PNG report needs matplotlib: pip install gnnscale[report] (or --format md)")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out = Path(out)
    if out.is_dir():
        raise ConfigError(f"--out {out} is a directory")
    if not out.parent.is_dir():
        raise ConfigError(f"--out {out}: directory {out.parent} does not exist")
    if not panels:
        raise ConfigError("nothing to draw: no panels")
    ncols = 2 if len(panels) > 1 else 1
    nrows = math.ceil(len(panels) / ncols)
    # the last panel (counters: many lines) with many lines gets its legend below it, three names a row, in
    # room added at the foot of the figure; another panel with many lines gets a two-column legend inside
    many = 6
    foot = math.ceil(len(panels[-1].series) / 3) if len(panels[-1].series) > many else 0
    fig = Figure(figsize=(6.0 * ncols, 3.6 * nrows + 0.25 * foot + (0.3 if foot else 0.0)), dpi=dpi)
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(nrows, ncols)
    # an odd last panel takes the whole row: room for a long legend beside it
    cells = [grid[k // ncols, k % ncols] for k in range(len(panels))]
    if len(panels) % ncols:
        cells[-1] = grid[nrows - 1, :]
    nruns = 1 + max((s.run for p in panels for s in p.series), default=0)
    colors = [f"C{k}" for k in range(10)]
    styles = ["-", "--", ":", "-."]
    for cell, panel in zip(cells, panels, strict=True):
        ax = fig.add_subplot(cell)
        parts = list(dict.fromkeys(s.part for s in panel.series))
        here = list(dict.fromkeys(s.run for s in panel.series))  # runs with a line in this panel
        for s in panel.series:
            k = parts.index(s.part)
            if panel.color_by == "run":
                color, style = colors[s.run % 10], styles[k % 4]
            else:
                color, style = colors[k % 10], styles[here.index(s.run) % 4]
            # earlier runs drawn wider, so a later run that matches one (same losses) leaves it visible as a halo
            wide = (nruns - 1 - s.run) / max(nruns - 1, 1)
            ax.plot(s.x, s.y, style, color=color, label=s.name, marker="o", markersize=2.5 + 2.5 * wide,
                    linewidth=1.2 + 2.0 * wide, alpha=0.55 if wide else 0.9)
        ax.set_title(panel.title)
        ax.set_xlabel("epoch")
        ax.set_ylabel(panel.ylabel)
        ax.grid(True, alpha=0.3)
        if panel is panels[-1] and foot:
            ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3)
        elif panel.series:
            ax.legend(fontsize="small" if len(panel.series) <= many else "x-small", ncol=1 + (len(panel.series) > many))
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    with atomic_file(out) as fh:
        fig.savefig(fh, format="png", dpi=dpi, pil_kwargs={"optimize": True})
    return out


# ------------------------------------------------------------------------------------------------ Markdown
def markdown(runs: Sequence[Run]) -> str:
    """The report as Markdown: per run a heading, a table with one row per epoch (loss, accuracies, epoch time,
    peak MiB) and a closing line with the best epoch and the test accuracy there."""
    if not runs:
        raise ConfigError("a report needs at least one metrics file")
    out: list[str] = []
    for run, label in zip(runs, _labels(runs), strict=True):
        out.append(f"### {label}")
        out.append("")
        out.append(f"`{run.path}`" + ("" if run.summary else " (no summary record: the run did not finish)"))
        out.append("")
        out.append("| epoch | loss | train acc | val acc | test acc | epoch s | peak MiB |")
        out.append("|---:|---:|---:|---:|---:|---:|---:|")
        for r in run.records:
            cells = [
                str(r["epoch"]),
                _cell(r.get("loss"), ".4f"),
                *(_cell(r.get(f"{s}_acc"), ".4f") for s in SPLITS),
                _cell(r.get("epoch_time_s"), ".3f"),
                _cell(None if r.get("peak_device_bytes") is None else r["peak_device_bytes"] / MIB, ".1f"),
            ]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
        out.append(_closing(run))
        out.append("")
    return "\n".join(out)


def _cell(v: Any, fmt: str) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def _closing(run: Run) -> str:
    s = run.summary
    if s is not None:
        by = s.get("best_by") or "val"
        best = s.get("best_val_acc")
        at = f" (best {by} accuracy {_cell(best, '.4f')})" if best is not None else f" (best by {by} accuracy)"
        return (f"**{s.get('engine', '?')}** on {s.get('device', '?')}: best epoch {s.get('best_epoch', '?')}{at}, "
                f"test accuracy {_cell(s.get('test_acc_at_best_val'), '.4f')} at best {by}, "
                f"final {_cell(s.get('final_test_acc'), '.4f')}")
    # no summary: say what the finished epochs show, from the records themselves
    scored = [r for r in run.records if _is_number(r.get("val_acc"))]
    if not scored:
        return f"interrupted after {len(run.records)} epoch record(s); no validation accuracy recorded"
    best_rec = max(scored, key=lambda r: r["val_acc"])  # first maximum, as train.py picks it
    return (f"interrupted after {len(run.records)} epoch record(s): best val accuracy "
            f"{best_rec['val_acc']:.4f} at epoch {best_rec['epoch']}, test accuracy there "
            f"{_cell(best_rec.get('test_acc'), '.4f')}")
