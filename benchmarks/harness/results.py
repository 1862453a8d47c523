"""RESULTS.md, written from benchmarks/results/*.jsonl alone: ``python -m benchmarks results [--check]``.

The top is the at-a-glance table: each benchmark's ``headline(records)`` rows, in :data:`FIRST` order then by
name, each with the commands and commits of the records it comes from. Then one section per benchmark with
records: its ``TITLE`` and ``render(records)``. Nothing else goes in, so a figure cannot drift from its record;
the narrative of earlier sessions is in HISTORY.md.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import registry
from benchmarks.harness.records import RESULTS_DIR, Row, read_records, table

RESULTS_MD = Path(__file__).resolve().parents[1] / "RESULTS.md"
FIRST = ("gpu_check", "peers", "offload", "revisions", "disk_scale", "inmemory_scaling", "accuracy", "sampled_accuracy",
         "bf16_accuracy")
"""The order of the at-a-glance rows and of the sections: these first (the issue's headline figures: the GPU
check, against DGL and PyG, offload against in-memory, scale, accuracy), then the rest by name."""
HEADER = """# Benchmark results

Written by `python -m benchmarks results` from the records in `benchmarks/results/*.jsonl`; do not edit by hand
(a test checks that regenerating changes nothing). Each benchmark runs with `python -m benchmarks NAME`
(`--list` lists them; docs/benchmarks.md says how). Earlier sessions' notes and superseded figures:
[HISTORY.md](HISTORY.md).
"""


def _cell(values: list[str], most: int = 3) -> str:
    vals = list(dict.fromkeys(v for v in values if v))
    more = f" (+{len(vals) - most} more)" if len(vals) > most else ""
    return "; ".join(vals[:most]) + more if vals else "-"


def _row(row: Row) -> list[str]:
    cmds = _cell([f"`{r['command']}`" for r in row.records if r.get("command")], most=1)
    commits = _cell([str(r.get("gnnscale_rev") or "") for r in row.records])
    return [row.what, row.figure, cmds, commits]


def ordered() -> list[str]:
    names = list(registry.benchmarks())
    return [n for n in FIRST if n in names] + sorted(n for n in names if n not in FIRST)


def generate(results_dir: Path = RESULTS_DIR) -> str:
    """The whole of RESULTS.md."""
    rows: list[Row] = []
    sections: list[str] = []
    for name in ordered():
        module = registry.load(name)
        recs: list[dict[str, Any]] = read_records(results_dir / f"{getattr(module, 'RESULTS', name)}.jsonl")
        if not recs:
            continue
        if hasattr(module, "headline"):
            rows += module.headline(recs)
        body = module.render(recs).strip()
        sections.append(f"## {module.TITLE}\n\n`python -m benchmarks {name}` · records: "
                        f"`benchmarks/results/{getattr(module, 'RESULTS', name)}.jsonl`\n\n{body}\n")
    glance = table(["what", "figure", "command", "commit"], (_row(r) for r in rows))
    return f"{HEADER}\n## At a glance\n\n{glance}\n\n" + "\n".join(sections)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks results", description=__doc__)
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when RESULTS.md is not up to date")
    ap.add_argument("--out", type=Path, default=RESULTS_MD, help=f"default {RESULTS_MD}")
    args = ap.parse_args(argv)
    text = generate()
    if args.check:
        if not args.out.exists() or args.out.read_text() != text:
            print(f"{args.out} is not what `python -m benchmarks results` writes from benchmarks/results/",
                  file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0
