"""Run reports from ``gnnscale train --metrics FILE`` (issue #15 item 4).

A metrics file is JSON Lines: one record per finished epoch, then -- only when training ended -- one summary record
(``"summary": true``). :func:`read_run` reads one (:func:`run_from_records`: a run from records in memory, for
``TrainResult.plot``), :func:`build_panels` turns runs into plot-ready series (the function the tests check),
:func:`render_png` draws them headless and :func:`markdown` prints the same as tables, with every key a record holds
under its kind (``engines.core.schema.KINDS``: bytes moved, bytes held, counts, ...).

Text that comes from the data (run labels: dataset names and specs, file names; counter names) is drawn as plain
text, never parsed as matplotlib mathtext: a ``$`` in a dataset name is a dollar sign.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gnnscale import _compat
from gnnscale.engines.core.schema import EPOCH_KEYS, KINDS
from gnnscale.errors import ConfigError, DatasetError
from gnnscale.fsutil import atomic_file, check_output, make_parents
from gnnscale.notes import note

MIB = 2**20
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".svg", ".pdf", ".gif", ".webp", ".tif", ".tiff", ".eps", ".bmp")
"""Files ``report --format md --out`` refuses (Markdown into an image file)."""
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
    """One subplot: lines coloured by run, styled by part (split, memory kind, counter)."""

    title: str
    ylabel: str
    """The y axis label, with its unit: ``memory held (MiB)``."""
    series: list[Series] = field(default_factory=list)


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
    lines = text.splitlines()
    last = max((i for i, line in enumerate(lines, 1) if line.strip()), default=0)
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{p}:{lineno}"
        try:
            rec = json.loads(line)
        except RecursionError:  # [[[[...]]]] nested deeper than Python's stack
            raise DatasetError(f"{where}: JSON nested too deeply; expected a gnnscale train --metrics file") from None
        except json.JSONDecodeError as exc:
            if lineno == last and lineno > 1 and not text.endswith("\n"):
                # the run was killed while it wrote this line: the complete records before it still count
                note(f"{where}: skipped line {lineno}, cut short ({exc.msg}): the run was stopped while writing it")
                break
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


def run_from_records(records: Sequence[dict[str, Any]], summary: dict[str, Any] | None = None,
                     name: str = "result") -> Run:
    """A :class:`Run` of epoch records held in memory (``TrainResult.history`` and ``.summary``): what
    :func:`read_run` gives for the metrics file ``train --metrics`` writes of them; ``name`` stands for the file's.

    Raises:
        DatasetError: there is no epoch record.
    """
    if not records:
        raise DatasetError(f"{name}: no epoch records to report")
    path = Path(name)
    return Run(path=path, records=[dict(r) for r in records], summary=summary, label=_label(path, summary))


def _check_epoch_record(rec: dict[str, Any], where: str) -> None:
    epoch = rec.get("epoch")
    if not isinstance(epoch, int) or isinstance(epoch, bool):
        raise DatasetError(f"{where}: an epoch record needs an integer 'epoch', got {epoch!r}")
    for key in (*_NUMERIC, *_counters(rec)):
        v = rec.get(key)
        if v is not None and not _is_number(v):
            raise DatasetError(f"{where}: '{key}' should be a number or null, got {v!r}")
    for key, v in rec.items():  # the schema's lists: numbers (or nulls) one per device, trainer or rank
        if key in EPOCH_KEYS and EPOCH_KEYS[key].unit == "list" and v is not None and (
                not isinstance(v, list) or not all(x is None or _is_number(x) for x in v)):
            raise DatasetError(f"{where}: '{key}' should be a list of numbers or null, got {_short(v)}")


def _label(path: Path, summary: dict[str, Any] | None) -> str:
    if summary is None:
        return path.stem  # interrupted: the file name is all we know
    dataset = summary.get("dataset_spec") or summary.get("dataset")  # the full spec: csbm:nodes=...,seed=0
    parts = [str(v) for v in (summary.get("engine"), summary.get("model"), dataset) if v is not None]
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
    """The record's keys the schema gives a number (not a list; not ``-``, which may be a name) and the
    ``*_bytes`` keys it does not know: each must be a number or null."""
    return [k for k in rec if (k in EPOCH_KEYS and EPOCH_KEYS[k].unit not in ("list", "-"))
            or (k not in EPOCH_KEYS and k.endswith("_bytes") and not isinstance(rec[k], list))]


def _kind(key: str) -> str:
    """The key's kind in the schema (``engines.core.schema.KINDS``); ``other`` for a key it does not define."""
    k = EPOCH_KEYS.get(key)
    return "other" if k is None else k.kind


def _scalars(run: Run, kind: str) -> list[str]:
    """The run's keys of ``kind`` whose values are numbers, in first-seen order."""
    keys = dict.fromkeys(k for r in run.records for k, v in r.items() if _kind(k) == kind and not isinstance(v, list))
    return [k for k in keys if all(v is None or _is_number(v) for v in (r.get(k) for r in run.records))]


def _lists(run: Run, kind: str) -> list[str]:
    """The run's keys of ``kind`` whose values are lists of numbers, in first-seen order."""
    keys = dict.fromkeys(k for r in run.records for k, v in r.items() if _kind(k) == kind and isinstance(v, list))
    return [k for k in keys if all(v is None or (isinstance(v, list) and all(_is_number(x) for x in v))
                                   for v in (r.get(k) for r in run.records))]


def _short(v: Any, limit: int = 60) -> str:
    try:
        text = repr(v)
    except RecursionError:  # a value nested nearly as deep as the JSON parser allows
        text = f"<a {type(v).__name__} nested too deeply to show>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _num(v: Any, scale: float = 1.0) -> float:
    return float("nan") if v is None else float(v) / scale


# ------------------------------------------------------------------------------------------------ panels
def build_panels(runs: Sequence[Run]) -> list[Panel]:
    """Plot-ready panels for ``runs`` overlaid: loss, accuracy (train/val/test per run), epoch time, memory held
    (MiB: ``device``, the training device's peak -- on CPU the engine's live bytes --, ``host``, the largest rank's
    resident memory where recorded, and every other counter of the schema's kind ``held``, by its name) and, when
    any run recorded counters of the kind ``moved``, bytes moved per epoch (MB). Counters are chosen by their kind
    in the schema, never by their names; one that is null or zero in every epoch is left out. Nulls become NaN."""
    if not runs:
        raise ConfigError("a report needs at least one metrics file")
    labels = _labels(runs)
    loss = Panel("loss", "training loss")
    acc = Panel("accuracy", "accuracy")
    time_ = Panel("epoch time", "epoch time (s)")
    peak = Panel("memory held", "memory held (MiB)")
    moved = Panel("moved per epoch", "moved per epoch (MB)")
    for i, (run, label) in enumerate(zip(runs, labels, strict=True)):
        x = [int(r["epoch"]) for r in run.records]

        def col(key: str, scale: float = 1.0, run: Run = run) -> list[float]:
            return [_num(r.get(key), scale) for r in run.records]

        loss.series.append(Series(label, x, col("loss"), i))
        for split in SPLITS:
            acc.series.append(Series(f"{label} {split}", x, col(f"{split}_acc"), i, split))
        time_.series.append(Series(label, x, col("epoch_time_s"), i))
        peak.series.append(Series(f"{label} device", x, col("peak_device_bytes", MIB), i, "device"))
        if any(r.get("rank_rss_bytes") for r in run.records):
            host = [_num(max(r["rank_rss_bytes"]) if r.get("rank_rss_bytes") else None, MIB) for r in run.records]
            peak.series.append(Series(f"{label} host", x, host, i, "host"))
        for panel, kind, scale in ((peak, "held", MIB), (moved, "moved", MB)):
            for key in _scalars(run, kind):
                y = col(key, scale)
                if key == "peak_device_bytes" or all(math.isnan(v) or v == 0 for v in y):
                    continue  # drawn as "device" above; a counter that never counted anything is legend noise
                panel.series.append(Series(f"{label} {key}", x, y, i, key))
        for key in _lists(run, "moved"):  # bytes sent to each trainer (hybrid's accel_bytes): their sum
            y = [_num(sum(r[key]) if r.get(key) else None, MB) for r in run.records]
            if not all(math.isnan(v) or v == 0 for v in y):
                moved.series.append(Series(f"{label} {key} (sum)", x, y, i, f"{key} (sum)"))
    panels = [loss, acc, time_, peak]
    if moved.series:
        panels.append(moved)
    return panels


# ------------------------------------------------------------------------------------------------ figure
_STYLES = [(ls, mk) for mk in ("o", "s", "^", "D", "v", "x") for ls in ("-", "--", ":", "-.")]
"""Line style and marker of each part (split, memory kind, counter), in the order the parts first appear."""
LEGEND_COLUMNS = 4


def draw_figure(panels: Sequence[Panel], *, dpi: int = 100, title: str | None = None) -> Any:
    """A matplotlib ``Figure`` of ``panels`` in a grid of two columns, for a paper: every line coloured by its run
    and styled by its part, epochs as whole numbers on every x axis, units in the y labels, and one legend for
    the whole figure below the panels (runs by colour, then parts by line style), never over a curve.

    Headless: matplotlib's Agg canvas directly, never pyplot (no display needed, the caller's backend left alone).

    Raises:
        ConfigError: matplotlib is not installed, or there is nothing to draw.
    """
    if not _compat.WITH_MATPLOTLIB:
        raise ConfigError("the PNG report needs matplotlib: pip install gnnscale[report] (or --format md)")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    if not panels:
        raise ConfigError("nothing to draw: no panels")
    ncols = 2 if len(panels) > 1 else 1
    nrows = math.ceil(len(panels) / ncols)
    runs: dict[int, str] = {}  # run index -> its label (the loss panel names every run by its label alone)
    for panel in panels:
        for s in panel.series:
            runs.setdefault(s.run, s.name[: len(s.name) - len(s.part)].rstrip() if s.part else s.name)
    parts = list(dict.fromkeys(s.part for p in panels for s in p.series if s.part))
    style = {part: _STYLES[k % len(_STYLES)] for k, part in enumerate(parts)}
    style[""] = ("-", "o")
    entries = len(runs) + len(parts)
    legend_rows = math.ceil(entries / LEGEND_COLUMNS)
    foot = 0.3 + 0.25 * legend_rows  # inches below the panels for the legend
    height = 3.6 * nrows + foot
    fig = Figure(figsize=(6.0 * ncols, height), dpi=dpi)
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(nrows, ncols)
    cells = [grid[k // ncols, k % ncols] for k in range(len(panels))]
    if len(panels) % ncols:  # an odd last panel takes the whole row
        cells[-1] = grid[nrows - 1, :]
    nruns = 1 + max(runs, default=0)
    for cell, panel in zip(cells, panels, strict=True):
        ax = fig.add_subplot(cell)
        for s in panel.series:
            ls, mk = style[s.part]
            # earlier runs drawn wider, so a later run that matches one (same losses) leaves it visible as a halo
            wide = (nruns - 1 - s.run) / max(nruns - 1, 1)
            ax.plot(s.x, s.y, ls, color=f"C{s.run % 10}", marker=mk, markersize=2.5 + 2.5 * wide,
                    linewidth=1.2 + 2.0 * wide, alpha=0.55 if wide else 0.9)
        ax.set_title(panel.title, parse_math=False)
        ax.set_xlabel("epoch")
        ax.set_ylabel(panel.ylabel, parse_math=False)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs are whole numbers
        ax.grid(True, alpha=0.3)
    handles = [Line2D([], [], color=f"C{r % 10}", linewidth=2.5) for r in runs]
    handles += [Line2D([], [], color="0.3", linestyle=style[p][0], marker=style[p][1])  # type: ignore[arg-type]
                for p in parts]
    legend = fig.legend(handles, [*runs.values(), *parts], loc="lower center", ncol=min(LEGEND_COLUMNS, entries),
                        fontsize="small", frameon=False, bbox_to_anchor=(0.5, 0.0))
    for text in legend.get_texts():  # labels are data (dataset names, file names): plain text, never mathtext
        text.set_parse_math(False)
    if title:
        fig.suptitle(title, parse_math=False)
    fig.tight_layout(rect=(0.0, foot / height, 1.0, 1.0))
    return fig


def render_png(panels: Sequence[Panel], out: str | os.PathLike[str], *, dpi: int = 100,
               title: str | None = None) -> Path:
    """Draw ``panels`` (:func:`draw_figure`) and write a PNG to ``out`` atomically, with the umask's mode.

    Raises:
        ConfigError: matplotlib is not installed, or ``out`` is a directory or in a directory that does not exist.
    """
    if not _compat.WITH_MATPLOTLIB:
        raise ConfigError("the PNG report needs matplotlib: pip install gnnscale[report] (or --format md)")
    out = Path(out)
    if out.is_dir():
        raise ConfigError(f"--out {out} is a directory")
    if not out.parent.is_dir():
        raise ConfigError(f"--out {out}: directory {out.parent} does not exist")
    return save_png(draw_figure(panels, dpi=dpi, title=title), out, dpi=dpi)


def plot_records(records: Sequence[dict[str, Any]], summary: dict[str, Any] | None = None,
                 out: str | os.PathLike[str] | None = None, *, dpi: int = 100) -> Any:
    """The figure ``gnnscale report`` draws of one run (:func:`build_panels`, :func:`draw_figure`), from its epoch
    records and summary in memory (``TrainResult.plot``); written as a PNG to ``out`` too when given.

    Raises:
        ConfigError: matplotlib is not installed, or ``out`` cannot be written.
        DatasetError: there is no epoch record.
    """
    panels = build_panels([run_from_records(records, summary)])
    if out is not None:
        out = check_output(out, "out")
    fig = draw_figure(panels, dpi=dpi)
    if out is not None:
        save_png(fig, make_parents(out), dpi=dpi)
    return fig


def save_png(fig: Any, out: str | os.PathLike[str], *, dpi: int = 100) -> Path:
    """Write the figure ``fig`` to ``out`` as a PNG atomically, with the umask's mode."""
    out = Path(out)
    with atomic_file(out) as fh:
        fig.savefig(fh, format="png", dpi=dpi, pil_kwargs={"optimize": True})
    return out


# ------------------------------------------------------------------------------------------------ Markdown
def markdown(runs: Sequence[Run]) -> str:
    """The report as Markdown: per run a heading, a table with one row per epoch (loss, accuracies, epoch time,
    peak MiB), a closing line with the best epoch and the test accuracy there, then every other key the records
    hold, one table per kind of the schema (``engines.core.schema.KINDS``: bytes moved in MB, bytes held in MiB, row
    volumes in MB, counts, seconds, fractions and rates, settings; ``other`` for keys it does not define), one row
    per epoch and one column per key, lists as their values one after another."""
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
        out += _kind_tables(run)
    return "\n".join(out)


_KIND_UNITS = {"moved": ("MB", MB), "volume": ("MB", MB), "held": ("MiB", MIB), "time": ("s", 1.0)}
"""The unit each kind's cells are in, and the bytes (or seconds) per unit."""
_KIND_FORMATS = {"moved": ".3f", "volume": ".3f", "held": ".1f", "time": ".3f", "ratio": ".4f"}
_MAIN_TABLE = frozenset(("epoch", *_NUMERIC))
"""Keys of the first table (peak_device_bytes is its peak MiB)."""


def _kind_tables(run: Run) -> list[str]:
    """One Markdown table per kind of the run's keys beyond the first table."""
    groups: dict[str, list[str]] = {kind: [] for kind in (*KINDS, "other")}
    for key in dict.fromkeys(k for r in run.records for k in r if k not in _MAIN_TABLE):  # first-seen order
        groups[_kind(key)].append(key)
    out: list[str] = []
    for kind, keys in groups.items():
        if not keys:
            continue
        unit = _KIND_UNITS.get(kind, ("", 1.0))[0]
        title = KINDS.get(kind, "other keys (not in the schema)")
        out += [f"{title}{f' ({unit})' if unit else ''}:", ""]
        out.append("| epoch | " + " | ".join(k.replace("|", "\\|") for k in keys) + " |")
        out.append("|---:|" + "---:|" * len(keys))
        for r in run.records:
            out.append(f"| {r['epoch']} | " + " | ".join(_kind_cell(r.get(k), kind) for k in keys) + " |")
        out.append("")
    return out


def _kind_cell(v: Any, kind: str) -> str:
    """A value of ``kind`` in its unit (a list: its values, comma-separated); ``|`` escaped for the table."""
    if isinstance(v, list):  # one level: what is nested deeper is shown as text (and may be deep: no recursion)
        return ", ".join(_short(x, 40) if isinstance(x, (list, dict)) else _kind_cell(x, kind) for x in v) or "-"
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    if not _is_number(v):
        return (" ".join(v.split()) if isinstance(v, str) else _short(v, 40)).replace("|", "\\|")
    scale = _KIND_UNITS.get(kind, ("", 1.0))[1]
    if kind in _KIND_FORMATS:
        return format(v / scale, _KIND_FORMATS[kind])
    return str(v) if isinstance(v, int) else format(v, ".4g")


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
