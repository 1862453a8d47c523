"""``python -m benchmarks``: run a benchmark, list them, or write RESULTS.md from the records.

    python -m benchmarks --list
    python -m benchmarks NAME [--quick] [--rounds N] [--threads N] [NAME's own flags]
    python -m benchmarks results [--check]
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks.harness import registry
from benchmarks.harness.records import RESULTS_DIR
from benchmarks.harness.results import main as results_main
from benchmarks.harness.runner import run_benchmark


def parser(name: str, module: object) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=f"python -m benchmarks {name}", description=module.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    h = ap.add_argument_group("harness")
    h.add_argument("--quick", action="store_true", help="a small, fast version (1 round unless --rounds)")
    h.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default: the benchmark's; --quick 1)")
    h.add_argument("--threads", type=int, default=1, help="torch threads per case process (default 1)")
    h.add_argument("--from-tree", action="store_true",
                   help="run the working tree even with uncommitted changes (the revision is marked -dirty); by "
                        "default such a tree runs from a clean worktree of HEAD")
    h.add_argument("--out", default=None, help=f"JSON Lines file to append to (default {RESULTS_DIR}/NAME.jsonl)")
    h.add_argument("--no-save", action="store_true", help="record nothing")
    h.add_argument("-v", "--verbose", action="store_true", help="show the case processes' own output")
    if hasattr(module, "add_arguments"):
        module.add_arguments(ap)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if argv[0] == "--list":
        for name, doc in registry.benchmarks().items():
            print(f"{name:22s} {doc}")
        return 0
    if argv[0] == "results":
        return results_main(argv[1:])
    name = argv[0]
    try:
        module = registry.load(name)
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 2
    args = parser(name, module).parse_args(argv[1:])
    if args.threads < 1 or (args.rounds is not None and args.rounds < 1):
        print("error: --threads and --rounds must be >= 1", file=sys.stderr)
        return 2
    default = RESULTS_DIR / f"{getattr(module, 'RESULTS', name)}.jsonl"
    out = None if args.no_save else Path(args.out) if args.out else default
    command = shlex.join(["python", "-m", "benchmarks", *argv])
    records = run_benchmark(name, module, args, command, out)
    print(module.render(records))
    return 0 if all(r["ok"] for r in records) else 1
