"""Run a benchmark's cases: each its own process with one thread, interleaved rounds, one record per run."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from benchmarks.harness.cases import Case, schedule
from benchmarks.harness.machine import ROOT, host_cpu, resolve, source_tree, worktrees
from benchmarks.harness.records import append_records

HARNESS_FIELDS = ("benchmark", "case", "round", "rounds", "session", "date", "command", "gnnscale_rev", "clean",
                  "host_cpu", "threads", "python", "torch", "pyg", "dgl", "numpy", "loadavg_1m", "wall_s",
                  "peak_rss_bytes", "ok", "error", "env")
"""What the harness adds to every record a case returns (a case's own field of the same name wins, except
``ok``, ``case``, ``round`` and ``session``)."""
_ENV_PREFIXES = ("OMP_", "MKL_", "MALLOC_", "CUDA_VISIBLE", "PYTORCH_CUDA_ALLOC", "GNNSCALE_")


def child_env(src: Path, threads: int, case: Case) -> dict[str, str]:
    """The environment of a case's process: this one's, ``src`` first on PYTHONPATH (only ``src`` for a peer's
    own interpreter), ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` = ``threads``, then the case's own variables."""
    env = dict(os.environ)
    if case.python:
        env.pop("VIRTUAL_ENV", None)
        env["PYTHONPATH"] = str(src)
    else:
        env["PYTHONPATH"] = os.pathsep.join([str(src), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    env.update(case.env)
    return env


def _tail(text: str, lines: int = 3) -> str:
    return " | ".join(ln.strip() for ln in text.strip().splitlines()[-lines:]) or "(no output)"


def run_one(case: Case, module: str, src: Path, threads: int, tmp: Path, verbose: bool,
            extra: dict[str, Any]) -> dict[str, Any]:
    """One case's process: ``{"ok", "records" | "error", "versions", "wall_s", "loadavg_1m", ...}``."""
    spec, result, log = tmp / "spec.json", tmp / "result.json", tmp / "child.log"
    result.unlink(missing_ok=True)
    spec.write_text(json.dumps({"module": module, "params": {**case.params, **extra}, "threads": threads}))
    cmd = [case.python or sys.executable, "-m", "benchmarks.harness.child", str(spec), str(result)]
    load, t0 = os.getloadavg()[0], time.perf_counter()
    with log.open("w") as f:
        try:
            p = subprocess.run(cmd, env=child_env(src, threads, case), cwd=tmp, timeout=case.timeout,
                               stdout=None if verbose else f, stderr=None if verbose else subprocess.STDOUT)
            code = p.returncode
        except subprocess.TimeoutExpired:
            code = None
    out: dict[str, Any] = {"loadavg_1m": load, "wall_s": time.perf_counter() - t0}
    if result.exists():
        return {**json.loads(result.read_text()), **out}
    why = f"timed out after {case.timeout:.0f} s" if code is None else f"exit {code}: {_tail(log.read_text())}"
    return {"ok": False, "error": why, **out}


@contextlib.contextmanager
def revision_trees(cases: list[Case]) -> Iterator[dict[str, Path]]:
    """A clean worktree per distinct ``Case.rev``."""
    revs = list(dict.fromkeys(c.rev for c in cases if c.rev))
    if not revs:
        yield {}
        return
    hashes = {rev: resolve(ROOT, rev) for rev in revs}
    with worktrees(ROOT, {f"rev{i}": sha for i, sha in enumerate(hashes.values())}) as trees:
        yield {rev: trees[f"rev{i}"] for i, rev in enumerate(revs)}


def run_benchmark(name: str, module: ModuleType, args: argparse.Namespace, command: str,
                  out: Path | None) -> list[dict[str, Any]]:
    """Every case of ``module`` in ``args.rounds`` interleaved rounds; the records (appended to ``out`` as each
    run ends, unless ``out`` is None)."""
    cases = module.cases(args)
    if not cases:
        raise SystemExit(f"error: {name}: no case to run")
    rounds = args.rounds or (1 if args.quick else getattr(module, "ROUNDS", 3))
    session = uuid.uuid4().hex[:12]
    records: list[dict[str, Any]] = []
    describe = getattr(module, "describe", None)
    with source_tree(ROOT, args.from_tree) as (src, rev, why), revision_trees(cases) as revs, \
            tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as tmp:
        if why:
            print(f"{name}: running a clean worktree of {rev} ({why})", file=sys.stderr, flush=True)
        base = {"benchmark": name, "rounds": rounds, "session": session, "command": command, "gnnscale_rev": rev,
                "clean": not rev.endswith("-dirty"), "host_cpu": host_cpu(), "threads": args.threads,
                "python": sys.version.split()[0],
                "env": {k: v for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES)}}
        plan = schedule(rounds, cases)
        for i, (rnd, case) in enumerate(plan):
            print(f"[{i + 1}/{len(plan)}] round {rnd + 1}/{rounds}: {case.name} ...", file=sys.stderr, flush=True)
            extra = {"_src": str(revs[case.rev])} if case.rev else {}
            res = run_one(case, case.module or f"benchmarks.{name}", src, args.threads, Path(tmp), args.verbose,
                          extra)
            if args.verbose and not res["ok"] and res.get("traceback"):  # -v: a failed case's traceback too
                print(res["traceback"].rstrip(), file=sys.stderr, flush=True)
            date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
            head = {**base, **res.get("versions", {}), "date": date, "loadavg_1m": res["loadavg_1m"],
                    "wall_s": res["wall_s"], "peak_rss_bytes": res.get("peak_rss_bytes")}
            own = {"case": case.name, "round": rnd, "session": session, "ok": res["ok"]}
            got = [{**head, **r, **own} for r in res["records"]] if res["ok"] else [
                {**head, **case.params, **own, "error": res["error"]}]
            records += got
            for r in got:
                text = (describe(r) if describe and r["ok"] else None) or (
                    f"ok ({r['wall_s']:.1f} s)" if r["ok"] else f"failed: {r['error']}")
                print(f"    {text}", file=sys.stderr, flush=True)
            if out is not None:
                append_records(out, got)
    if out is not None:
        print(f"appended {len(records)} records to {out}", file=sys.stderr)
    return records
