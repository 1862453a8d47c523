"""The GPU check (`make gpu-check`): env, engines, CUDA tests and the GPU benchmarks in 450 s; one record per step.

    bash benchmarks/gpu_check.sh OUT                 # on a lent GPU machine (make gpu-check OUT=/path)
    bash benchmarks/gpu_check.sh OUT --dry-run       # every step on the CPU, tiny sizes (make gpu-check DRY=1)
    python -m benchmarks gpu_check --from-tree [--dir OUT] [--dry-run] [--only STEPS] [--commit SHA]
    python -m benchmarks gpu_check --quick --from-tree   # a dry run of the env, engines and mover steps

The driver (``benchmarks/_gpu_check.py``, whose docstring lists the steps, their budgets and outputs) runs the
steps in order of value, each a process with its own limit within the deadline, and writes ``OUT/summary.md`` and
``OUT/steps.jsonl`` after every step. Through the harness it is this benchmark's one case: its ``steps.jsonl``
records (a run's session, date, command, commit, device and torch; each step's status, seconds and what failed)
are this benchmark's records, appended to ``benchmarks/results/gpu_check.jsonl``; a run on a lent machine through
``gpu_check.sh`` leaves the same records in ``OUT/steps.jsonl``, to append there. The section shows the step
tables of the GPU runs of the latest day with a GPU run (dry runs only when there is none); the at-a-glance row
counts the latest run's steps that passed.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.harness import Case, Row, read_records
from benchmarks.harness.records import fmt, provenance, session_of, table

TITLE = "GPU check"
ROUNDS = 1  # one run of the check is one session of steps; it has its own deadline
QUICK_STEPS = "env,engines,mover"
MARGIN_S = 300.0  # the case's timeout past the check's deadline: the interpreter, the wheels, the summary
OWN = ("session", "command", "gnnscale_rev", "date", "benchmark")  # the harness's fields, not the driver's


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--dir", default=None, help="the check's output folder (summary.md, steps.jsonl, the "
                    "benchmarks' records, run.log; default: a temporary folder)")
    ap.add_argument("--dry-run", action="store_true", help="every step on the CPU (and the sim device), tiny sizes")
    ap.add_argument("--only", default="", help=f"comma list of steps (default all; --quick: {QUICK_STEPS})")
    ap.add_argument("--deadline", type=float, default=None, help="seconds for the whole check (default the driver's)")
    ap.add_argument("--fail-step", default="", metavar="NAME", help="testing aid: step NAME's command raises")
    ap.add_argument("--dataset", default=None, help="graph of the offload and minibatch steps (default the driver's)")
    ap.add_argument("--commit", default=None, help="the commit the tree is, when .git is stale")


def cases(args: argparse.Namespace) -> list[Case]:
    """One case: the whole check (``--quick``: a dry run of the env, engines and mover steps)."""
    from benchmarks._gpu_check import DEADLINE_S, DRY_DEADLINE_S

    dry = args.dry_run or args.quick
    deadline = args.deadline if args.deadline is not None else DRY_DEADLINE_S if dry else DEADLINE_S
    params = {"dir": args.dir, "dry_run": dry, "only": args.only or (QUICK_STEPS if args.quick else ""),
              "deadline": deadline, "fail_step": args.fail_step, "dataset": args.dataset, "commit": args.commit}
    return [Case("dry run" if dry else "check", params, timeout=deadline + MARGIN_S)]


def driver_argv(params: dict[str, Any], out: str) -> list[str]:
    """The driver's command line for a case's params."""
    argv = [out, "--deadline", str(params["deadline"])]
    argv += ["--dry-run"] if params.get("dry_run") else []
    for flag in ("only", "fail_step", "dataset", "commit"):
        if params.get(flag):
            argv += [f"--{flag.replace('_', '-')}", str(params[flag])]
    return argv


def run(params: dict[str, Any]) -> list[dict[str, Any]]:
    """The check, in this process's children; its steps' records (the harness names the run)."""
    from benchmarks._gpu_check import main

    out = params.get("dir") or tempfile.mkdtemp(prefix="gnnscale-gpu-check-")
    main(driver_argv(params, out))
    records = read_records(Path(out) / "steps.jsonl")
    if not records:
        raise RuntimeError(f"the check wrote no step records in {out}")
    return [{k: v for k, v in r.items() if k not in OWN} | {"dir": str(out)} for r in records]


def describe(r: dict[str, Any]) -> str:
    return f"{r['step']}: {r['status']} ({fmt(r.get('seconds'), '.1f')} s)" + (
        f": {r['failure']}" if r.get("failure") else "")


def runs(records: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The check's runs (sessions) in order: the GPU runs, or the dry runs when there is no GPU run."""
    steps = [r for r in records if r.get("step") and r.get("ok", True)]
    gpu = [r for r in steps if not r.get("dry_run")]
    by: dict[str, list[dict[str, Any]]] = {}
    for r in gpu or steps:
        by.setdefault(session_of(r), []).append(r)
    return list(by.values())


def passed(run: list[dict[str, Any]]) -> str:
    """``N of M steps passed on DEVICE (date)``."""
    ok = sum(r["status"] == "ok" for r in run)
    return f"{ok} of {len(run)} steps passed on {run[0].get('device_name') or '?'} ({str(run[0].get('date'))[:10]})"


def _total(run: list[dict[str, Any]]) -> str:
    total = max((r.get("run_s") or r.get("elapsed_s") or 0 for r in run), default=0)
    return f", {total:.0f} s in all" if total else ""


def _what(r: dict[str, Any]) -> str:
    """What failed; for a tests step, its counts too."""
    c = r.get("counts") or {}
    counts = ", ".join(f"{c[k]} {k}" for k in ("passed", "failed", "error", "skipped", "collected") if k in c)
    return "; ".join(x for x in (r.get("failure") or "", f"({counts})" if counts else "") if x)


def render(records: list[dict[str, Any]]) -> str:
    every = runs(records)
    if not every:
        return "No step records."
    day = str(every[-1][0].get("date"))[:10]
    shown = [run for run in every if str(run[0].get("date"))[:10] == day]
    parts = [provenance([r for run in shown for r in run]),
             "One table per run of the check on that day (status and seconds per step; what failed, in short). "
             "The runs' summaries and the benchmarks' own figures are in their records."]
    for i, run in enumerate(shown, 1):
        head = run[0]
        dry = " (dry run, CPU)" if head.get("dry_run") else ""
        rows = [[r["step"], r["status"] if r["status"] == "ok" else f"**{r['status']}**", fmt(r.get("seconds"), ".1f"),
                 _what(r)] for r in run]
        parts += [f"Run {i}{dry} at **{head.get('gnnscale_rev')}** (`{head.get('command')}`{_total(run)}): "
                  f"{passed(run)}.", table(["step", "status", "s", "what failed"], rows)]
    return "\n\n".join(parts) + "\n"


def headline(records: list[dict[str, Any]]) -> list[Row]:
    every = runs(records)
    return [Row("GPU check", passed(every[-1]), tuple(every[-1]))] if every else []
