"""Epoch times of two git revisions of gnnscale, run interleaved on one machine (issue #27: the refactoring keeps
in-memory, offload and mini-batch epoch times within 5% of before).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/revisions.py                      # db8e33a against HEAD
    .venv/bin/python benchmarks/revisions.py --base db8e33a --head 1a2b3c4 --rounds 5 --epochs 6 \\
        --engines inmemory,offload,minibatch --dataset csbm:nodes=50000,avg_degree=10,features=100

Each revision (``--base``, default db8e33a, the last commit before the refactoring; ``--head``, default HEAD) is
checked out as a detached ``git worktree`` in a temporary folder (the committed revision: the main working tree and
its uncommitted changes are neither used nor touched); the worktrees are removed at the end, on errors and on
Ctrl-C / SIGTERM too (``git worktree remove --force`` and ``git worktree prune``).

Every run is a child process ``python -m gnnscale train ... --device cpu --quiet --metrics FILE`` with the same
interpreter as this script (``--python``) and ``PYTHONPATH=<worktree>`` first, started in a neutral folder so
``python -m`` cannot pick up the current directory's package; before the first run a child of each revision prints
``gnnscale.__file__`` and the run stops if it is not inside that revision's worktree. ``OMP_NUM_THREADS`` and
``MKL_NUM_THREADS`` are ``--threads`` (default 1) and ``GNNSCALE_CACHE_DIR`` is a folder of each revision's own
(the revisions never read each other's partition plans). One model for both: GCN, 2 layers, hidden 64, seed 0, on
``--dataset``; per engine:

* ``inmemory``: the whole graph, one step per epoch;
* ``offload``: ``--chunks 4`` (one partition in 4 chunks, whatever the planner would pick);
* ``minibatch``: ``--batch-size 1024``, the default fanouts.

Each run trains ``--epochs`` epochs; ``epoch_time_s`` of the metrics lines (the training epoch, evaluation not
included) is read, the first epoch dropped as warm-up. **Interleaved**: ``--rounds`` rounds, in each round every
engine runs once per revision, base then head in even rounds (0, 2, ...) and head then base in odd ones, so load
from other processes falls on both alike.

Per engine the table gives the median over all timed epochs of all rounds for base and head, the ratio head/base
(< 1: head is faster), the range of the per-round ratios (medians of the two runs of one round: how much the
machine moved the figure) and the verdict against ``--bound`` (default 0.05): ``yes`` when head/base <= 1 + bound
(``yes (faster)`` below 1 - bound), ``**no**`` above. A run that fails (non-zero exit, timeout, no epochs: e.g. a
revision in the middle of a refactoring) is recorded with its error and the others go on; an engine without a
timed epoch on one side is reported as failed.

Appended to ``--out`` (default benchmarks/results/revisions.jsonl) as the runs finish: one JSON line per run
(``"record": "run"``), then one per engine (``"record": "summary"``), all with the environment (date, device name,
CPU, torch version the children ran, both revisions' names and full hashes, the command line, ``OMP_*``/``MKL_*``
variables) and one ``session`` id. The environment's fields are those of ``benchmarks/offload.py``'s
``environment``; that helper (and ``append_records``) are not imported because importing ``offload.py`` imports
torch, PyG and the *main tree's* gnnscale (7 s, and whatever state the working tree is in), which this script must
not depend on.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "revisions.jsonl"
DEFAULT_BASE = "db8e33a"  # the last commit before the refactoring of issue #27
DEFAULT_DATASET = "csbm:nodes=50000,avg_degree=10,features=100"  # epochs of 0.2-0.8 s on the 2-core CPU machine
ENGINES = ("inmemory", "offload", "minibatch")
SIDES = ("base", "head")
MODEL_ARGS = ("--model", "gcn", "--layers", "2", "--hidden", "64", "--seed", "0")
ENGINE_ARGS: dict[str, tuple[str, ...]] = {
    "inmemory": (),
    "offload": ("--chunks", "4"),
    "minibatch": ("--batch-size", "1024"),
}
_ENV_PREFIXES = ("OMP_", "MKL_", "MALLOC_")  # recorded: they move timings (as benchmarks/offload.py)
_CHECK = ("import json, gnnscale, torch; print(json.dumps({'file': gnnscale.__file__, 'torch': torch.__version__, "
          "'threads': torch.get_num_threads()}))")


class RevisionError(RuntimeError):
    """A revision that cannot be measured as asked (unknown, or its children import another gnnscale)."""


# ------------------------------------------------------------------------------------------------ pure parts
def _list(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default=DEFAULT_BASE, metavar="REV",
                    help=f"the reference revision (default {DEFAULT_BASE})")
    ap.add_argument("--head", default="HEAD", metavar="REV", help="the revision measured against it (default HEAD)")
    ap.add_argument("--engines", default=",".join(ENGINES), help=f"comma list of {','.join(ENGINES)} (default all)")
    ap.add_argument("--dataset", default=DEFAULT_DATASET, metavar="SPEC", help=f"default {DEFAULT_DATASET}")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    ap.add_argument("--epochs", type=int, default=6, help="epochs per run, the first dropped (default 6)")
    ap.add_argument("--bound", type=float, default=0.05, help="allowed slow-down head/base - 1 (default 0.05)")
    ap.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS and MKL_NUM_THREADS (default 1)")
    ap.add_argument("--timeout", type=float, default=900.0, metavar="S", help="seconds per run (default 900)")
    ap.add_argument("--python", default=sys.executable, help="interpreter of the runs (default: this one)")
    ap.add_argument("--repo", type=Path, default=ROOT, help="the git repository (default: this script's)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON Lines file to append to")
    ap.add_argument("--no-save", action="store_true", help="print the table only")
    args = ap.parse_args(argv)
    args.engines = _list(args.engines)
    unknown = [e for e in args.engines if e not in ENGINES]
    if unknown or not args.engines:
        ap.error(f"--engines: {','.join(unknown) or '(none)'}: choose from {','.join(ENGINES)}")
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    if args.epochs < 2:
        ap.error("--epochs must be >= 2 (the first epoch is dropped)")
    if not args.bound > 0:
        ap.error("--bound must be > 0")
    if args.threads < 1:
        ap.error("--threads must be >= 1")
    return args


@dataclass(frozen=True)
class Slot:
    """One run of the schedule: ``round`` (0-based), ``engine``, ``side`` ("base" or "head")."""

    round: int
    engine: str
    side: str


def schedule(rounds: int, engines: Sequence[str]) -> list[Slot]:
    """The interleaved order: per round, per engine, base then head (even rounds) or head then base (odd)."""
    out = []
    for r in range(rounds):
        order = SIDES if r % 2 == 0 else SIDES[::-1]
        out += [Slot(r, e, side) for e in engines for side in order]
    return out


def train_command(python: str, dataset: str, engine: str, epochs: int, metrics: Path) -> list[str]:
    """The child's command line (flags that exist in db8e33a's CLI and after it)."""
    return [python, "-m", "gnnscale", "train", "--dataset", dataset, *MODEL_ARGS, "--engine", engine,
            *ENGINE_ARGS[engine], "--epochs", str(epochs), "--device", "cpu", "--quiet", "--metrics", str(metrics)]


def child_env(worktree: Path, threads: int, cache: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default os.environ) with the worktree first on PYTHONPATH, the thread counts and a cache folder."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join([str(worktree), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    env["GNNSCALE_CACHE_DIR"] = str(cache)
    env.pop("GNNSCALE_DEVICE", None)  # --device cpu either way; HEAD's runtime would otherwise read it
    return env


def read_epoch_times(path: Path) -> list[float]:
    """``epoch_time_s`` of every epoch line of a metrics file, in order (the summary line has none)."""
    times = []
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                if not rec.get("summary") and rec.get("epoch_time_s") is not None:
                    times.append(float(rec["epoch_time_s"]))
    return times


def verdict(ratio: float, bound: float) -> str:
    if ratio > 1 + bound:
        return "**no**"
    return "yes (faster)" if ratio < 1 - bound else "yes"


def summarise(runs: Sequence[dict[str, Any]], engines: Sequence[str], bound: float) -> list[dict[str, Any]]:
    """Per engine, from run records (``engine``, ``side``, ``round``, ``ok``, ``timed_s``, ``error``): the median of
    all timed epochs per side, head/base, the per-round ratios and the verdict (``None`` and ``failed`` when a side
    has no timed epoch)."""
    out = []
    for engine in engines:
        mine = [r for r in runs if r["engine"] == engine]
        s: dict[str, Any] = {"engine": engine, "bound": bound}
        for side in SIDES:
            ok = [r for r in mine if r["side"] == side and r["ok"]]
            pooled = [t for r in ok for t in r["timed_s"]]
            s[f"{side}_median_s"] = statistics.median(pooled) if pooled else None
            s[f"{side}_epochs"] = len(pooled)
            s[f"{side}_runs_ok"] = len(ok)
            s[f"{side}_runs"] = sum(r["side"] == side for r in mine)
            s[f"{side}_errors"] = sorted({r["error"] for r in mine if r["side"] == side and not r["ok"]})
        per_round = []
        for rnd in sorted({r["round"] for r in mine}):
            med = {r["side"]: statistics.median(r["timed_s"]) for r in mine if r["round"] == rnd and r["ok"]}
            if len(med) == 2:
                per_round.append(med["head"] / med["base"])
        s["round_ratios"] = per_round
        if s["base_median_s"] and s["head_median_s"]:
            s["ratio"] = s["head_median_s"] / s["base_median_s"]
            s["within_bound"] = s["ratio"] <= 1 + bound
            s["verdict"] = verdict(s["ratio"], bound)
        else:
            s["ratio"], s["within_bound"] = None, None
            failed = [side for side in SIDES if not s[f"{side}_median_s"]]
            s["verdict"] = f"failed ({' and '.join(failed)})"
        out.append(s)
    return out


def _f(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def format_table(summaries: Sequence[dict[str, Any]], bound: float) -> str:
    lines = [f"| engine | base median (s) | head median (s) | head/base | per-round head/base | within {bound:.0%} "
             "| runs ok (base, head) |",
             "|---|---:|---:|---:|---:|---|---:|"]
    for s in summaries:
        rr = s["round_ratios"]
        spread = f"{min(rr):.3f}-{max(rr):.3f}" if rr else "-"
        lines.append(f"| {s['engine']} | {_f(s['base_median_s'], '.3f')} | {_f(s['head_median_s'], '.3f')} "
                     f"| {_f(s['ratio'], '.3f')} | {spread} | {s['verdict']} "
                     f"| {s['base_runs_ok']}/{s['base_runs']}, {s['head_runs_ok']}/{s['head_runs']} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ environment
def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "cpu"


def environment(threads: int, torch_version: str | None, revs: dict[str, dict[str, str]]) -> dict[str, Any]:
    """The fields of benchmarks/offload.py's ``environment`` for these CPU runs, plus both revisions."""
    child_vars = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    return {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "device": "cpu",
            "device_name": f"{platform.processor() or platform.machine() or 'cpu'} ({os.cpu_count()} cores, "
                           f"{threads} threads)",
            "host_cpu": f"{cpu_model()} ({os.cpu_count()} cores)", "torch": torch_version,
            "python": platform.python_version(), "revisions": revs,
            "command": shlex.join([Path(sys.executable).name, *sys.argv]),
            "env": {**{k: v for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES)}, **child_vars}}


def append_records(out: Path, records: list[dict[str, Any]]) -> None:
    """Append ``records`` to the JSON Lines file ``out`` (as benchmarks/offload.py's helper)."""
    if records:
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("a") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)


# ------------------------------------------------------------------------------------------------ git and children
def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def resolve(repo: Path, rev: str) -> str:
    try:
        return _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except subprocess.CalledProcessError:
        raise RevisionError(f"{rev!r} is not a commit of {repo}") from None


class _Terminated(Exception):
    pass


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminated(f"signal {signum}")


@contextlib.contextmanager
def worktrees(repo: Path, hashes: dict[str, str]) -> Iterator[tuple[Path, dict[str, Path]]]:
    """A temporary folder with one detached worktree per side; removed (and pruned) however the block ends."""
    tmp = Path(tempfile.mkdtemp(prefix="gnnscale-revisions-"))
    made: list[Path] = []
    old = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        paths = {}
        for side, sha in hashes.items():
            path = tmp / side
            subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", "-q", str(path), sha], check=True)
            made.append(path)
            paths[side] = path
        yield tmp, paths
    finally:
        for path in made:
            subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(path)], check=False)
        subprocess.run(["git", "-C", str(repo), "worktree", "prune"], check=False)
        shutil.rmtree(tmp, ignore_errors=True)
        signal.signal(signal.SIGTERM, old)


def check_revision(python: str, worktree: Path, cwd: Path, env: dict[str, str]) -> dict[str, Any]:
    """What a child of this revision imports: ``{"file", "torch", "threads"}``, or ``{"error"}`` when gnnscale
    does not import; RevisionError when it imports one from outside ``worktree``."""
    p = subprocess.run([python, "-c", _CHECK], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        return {"error": _tail(p.stderr or p.stdout)}
    info = json.loads(p.stdout.strip().splitlines()[-1])
    if not Path(info["file"]).resolve().is_relative_to(worktree.resolve()):
        raise RevisionError(f"a child with PYTHONPATH={worktree} imports gnnscale from {info['file']}, not from the "
                            "worktree: its timings would be of the wrong code")
    return info


def _tail(text: str, lines: int = 3) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:]) or "(no output)"


def run_one(cmd: list[str], cwd: Path, env: dict[str, str], metrics: Path, timeout: float) -> dict[str, Any]:
    """One training run: its epoch times, timed ones (first dropped), ``ok`` and the error if not."""
    metrics.unlink(missing_ok=True)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        error = None if p.returncode == 0 else f"exit {p.returncode}: {_tail(p.stderr or p.stdout)}"
    except subprocess.TimeoutExpired:
        error = f"timed out after {timeout:.0f} s"
    times = read_epoch_times(metrics)
    if error is None and len(times) < 2:
        error = f"{len(times)} epoch records in the metrics"
    return {"ok": error is None, "error": error, "epoch_times_s": times, "timed_s": times[1:] if error is None else [],
            "median_s": statistics.median(times[1:]) if error is None else None,
            "wall_s": time.perf_counter() - t0, "load_avg_1m": load}


# ------------------------------------------------------------------------------------------------ main
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    repo = args.repo.resolve()
    hashes = {"base": resolve(repo, args.base), "head": resolve(repo, args.head)}
    revs = {side: {"rev": getattr(args, side), "hash": sha} for side, sha in hashes.items()}
    session = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    print(f"base {args.base} = {hashes['base'][:12]}, head {args.head} = {hashes['head'][:12]}; {args.dataset}; "
          f"engines {','.join(args.engines)}; {args.rounds} rounds x {args.epochs} epochs (first dropped); "
          f"{args.threads} thread(s)", flush=True)
    runs: list[dict[str, Any]] = []
    with worktrees(repo, hashes) as (tmp, trees):
        envs = {side: child_env(trees[side], args.threads, tmp / f"cache-{side}") for side in SIDES}
        checks = {side: check_revision(args.python, trees[side], tmp, envs[side]) for side in SIDES}
        for side in SIDES:
            c = checks[side]
            print(f"  {side}: " + (f"gnnscale from {c['file']}, torch {c['torch']}, {c['threads']} thread(s)"
                                   if "error" not in c else f"gnnscale does not import: {c['error']}"), flush=True)
        torch_version = next((c["torch"] for c in checks.values() if "torch" in c), None)
        env = environment(args.threads, torch_version, revs)
        for i, slot in enumerate(schedule(args.rounds, args.engines)):
            metrics = tmp / f"metrics-{slot.side}.jsonl"
            cmd = train_command(args.python, args.dataset, slot.engine, args.epochs, metrics)
            res: dict[str, Any]
            if "error" in checks[slot.side]:
                res = {"ok": False, "error": f"gnnscale does not import: {checks[slot.side]['error']}",
                       "epoch_times_s": [], "timed_s": [], "median_s": None, "wall_s": 0.0, "load_avg_1m": None}
            else:
                res = run_one(cmd, tmp, envs[slot.side], metrics, args.timeout)
            rec = {"record": "run", "session": session, "round": slot.round, "engine": slot.engine,
                   "side": slot.side, "rev": hashes[slot.side], "position": i, "dataset": args.dataset,
                   "epochs": args.epochs, "train_args": cmd[3:-2], **res, **env}
            runs.append(rec)
            print(f"  round {slot.round} {slot.engine:<9} {slot.side}: "
                  + (f"median {res['median_s']:.3f} s of {len(res['timed_s'])}" if res["ok"] else
                     f"FAILED {res['error']}") + f"  ({res['wall_s']:.0f} s wall)", flush=True)
            if not args.no_save:
                append_records(args.out, [rec])
    summaries = summarise(runs, args.engines, args.bound)
    print(f"\nbase {hashes['base'][:12]} ({args.base}), head {hashes['head'][:12]} ({args.head}); "
          f"{env['device_name']}, torch {torch_version}; median epoch over {args.rounds} rounds x "
          f"{args.epochs - 1} timed epochs\n")
    print(format_table(summaries, args.bound))
    for s in summaries:
        for side in SIDES:
            for err in s[f"{side}_errors"]:
                print(f"\n{s['engine']} {side} failed: {err}")
    if not args.no_save:
        append_records(args.out, [{"record": "summary", "session": session, "dataset": args.dataset,
                                   "epochs": args.epochs, "rounds": args.rounds, **s, **env} for s in summaries])
        print(f"\nappended {len(runs)} run and {len(summaries)} summary records to {args.out}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except RevisionError as e:
        sys.exit(f"error: {e}")
    except (KeyboardInterrupt, _Terminated):
        print("\ninterrupted: the worktrees are removed; the runs that finished are in --out", file=sys.stderr)
        sys.exit(130)
