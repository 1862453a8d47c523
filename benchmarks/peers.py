"""gnnscale, DGL and PyG side by side on the same graphs (issue #30): epoch time, peak memory, accuracy.

    .venv/bin/python benchmarks/peers.py --quick                                   # 20K vertices, 1 round
    .venv/bin/python benchmarks/peers.py                                           # 200K and 800K, 3 rounds
    .venv/bin/python benchmarks/peers.py --workloads gcn,sage,gat --sizes 200000 --rounds 3 \\
        --results /tmp/peers_section.md

Workloads (``--workloads``, default all): ``gcn``, ``sage``, ``gat``: full-graph training, 2 layers, hidden 64, at
every ``--sizes`` (gnnscale's in-memory engine, DGL, PyG on a sparse CSR ``adj_t``, GAT on ``edge_index``);
``sampling``: neighbour sampling only, SAGE fanouts 15,10, batch 1024, one epoch of training seeds (sampled edges
per second; PyG's sampler needs pyg_lib or torch_sparse); ``minibatch``: a mini-batch SAGE epoch (gnnscale
``--engine minibatch`` against DGL's NeighborSampler + DataLoader), both pinned to one core; ``offload``: GCN with
gnnscale's offload engine at ``--chunks 8`` against its own in-memory engine. The last three run at the smallest
size. Graphs: csbm with 16 communities, 5 classes, average degree 10, 128 features, seed 0, generated once into
``--cache``/data as plain ``.npy`` arrays with gnnscale's initial weights, read by every system's process.

Every run is its own process with ``OMP_NUM_THREADS=1`` and ``torch.set_num_threads(1)``
(benchmarks/peers_workers.py); the DGL runs use a venv of their own, ``--cache``/dgl-venv (DGL 2.1.0, the newest
Linux wheel, needs torch <= 2.2.1), made here on first use with pip from PyPI. A peer that cannot be set up (or a
run that fails) is named in one line with the reason and the others go on. **Interleaved**: ``--rounds`` rounds;
in each, every workload runs every system once, the order rotating by one per round.

Per workload and system: the median over rounds of each run's median epoch time (``--epochs`` epochs, the first
``--warmup`` untimed; sampling: ``--epochs`` timed passes), its range over rounds, the ratio to DGL (to gnnscale's
in-memory engine for offload; sampling: throughput over DGL's, > 1 is faster), the largest peak resident memory
of the process (``VmHWM``) and the test accuracy after the epochs.

gnnscale trains with its default ``--host-allocator auto`` (on the CPU: glibc keeps freed blocks below 1 GiB for
reuse, so an epoch's ``[V, F]`` temporaries are not fresh pages the kernel faults in and zeroes; not for GAT,
whose per-edge blocks fragment a retained heap: there glibc's default). ``--dgl-retain``
runs DGL a second time with the same setting through glibc's environment tunables (``dgl-retain``; the ratios stay
against plain DGL), so the table shows what the allocator alone is worth.

gnnscale and PyG run from a clean worktree of HEAD (``git worktree``, removed afterwards) when gnnscale/ or
benchmarks/ have uncommitted changes, so the record names a clean commit; ``--from-tree`` runs the working tree
instead and marks the revision ``-dirty``. One JSON line per run and per summary is appended to ``--out``; the
table (with the machine, versions, commit, threads, rounds and this command) replaces the text between
``<!-- peers:begin -->`` and ``<!-- peers:end -->`` in ``--results`` (markers appended when absent).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

try:  # run as a script (its folder is on sys.path) or imported as benchmarks.peers
    from revisions import append_records, cpu_model, resolve, worktrees
except ImportError:  # pragma: no cover
    from benchmarks.revisions import append_records, cpu_model, resolve, worktrees

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CACHE = Path.home() / ".cache" / "gnnscale" / "peers"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "peers.jsonl"
DEFAULT_RESULTS = ROOT / "benchmarks" / "RESULTS.md"
BEGIN, END = "<!-- peers:begin -->", "<!-- peers:end -->"
WORKLOADS = ("gcn", "sage", "gat", "sampling", "minibatch", "offload")
FULL = ("gcn", "sage", "gat")
SYSTEMS = {"full": ("gnnscale", "dgl", "pyg"), "sampling": ("gnnscale", "dgl", "pyg"),
           "minibatch": ("gnnscale", "dgl"), "offload": ("gnnscale-offload", "gnnscale")}
LABELS = {"gnnscale": "gnnscale", "dgl": "DGL", "pyg": "PyG", "gnnscale-offload": "gnnscale offload, 8 chunks",
          "dgl-retain": "DGL, freed blocks kept"}
RETAIN_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}
"""``--dgl-retain``: glibc's tunables for DGL's process, the thresholds gnnscale's ``--host-allocator retain`` (its
default on the CPU) sets through ``mallopt``: freed blocks below 1 GiB stay in the heap for reuse."""
DGL_PINS = ("torch==2.2.1", "dgl==2.1.0", "numpy<2", "scipy", "networkx", "psutil", "pydantic", "requests", "tqdm",
            "pandas<2.3", "pyyaml")
DGL_NO_DEPS = ("torchdata==0.7.1",)  # dgl.graphbolt imports torchdata.datapipes (gone after 0.7), pinned torch 2.1
QUICK_NODES = 20_000


# ------------------------------------------------------------------------------------------------ pure parts
def _list(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def _size(text: str) -> int:
    t = text.lower()
    return int(float(t[:-1]) * 1000) if t.endswith("k") else int(float(t[:-1]) * 10**6) if t.endswith("m") else int(t)


def _is_case(item: str) -> bool:
    name, _, size = item.rpartition("-")
    try:
        return name in WORKLOADS and _size(size) > 0
    except ValueError:
        return False


def size_name(nodes: int) -> str:
    return f"{nodes // 10**6}M" if nodes % 10**6 == 0 else f"{nodes // 1000}K" if nodes % 1000 == 0 else str(nodes)


def _case(w: str, n: int) -> dict[str, Any]:
    kind = "full" if w in FULL else w
    model = w if w in FULL else "gcn" if w == "offload" else "sage"
    return {"name": f"{w}-{size_name(n)}", "workload": w, "kind": kind, "model": model, "nodes": n,
            "systems": SYSTEMS[kind]}


def cases(workloads: Sequence[str], sizes: Sequence[int], dgl_retain: bool = False) -> list[dict[str, Any]]:
    """``[{name, kind, model, nodes, systems}]``: the full-graph models at every size, the rest at the smallest; an
    item ``<workload>-<size>`` (``gat-200K``) is that workload at that size only."""
    out = []
    for w in workloads:
        if w in WORKLOADS:
            out += [_case(w, n) for n in (sizes if w in FULL else sizes[:1])]
        else:
            name, _, size = w.rpartition("-")
            out.append(_case(name, _size(size)))
    if dgl_retain:  # DGL once more, with the allocator setting gnnscale runs with, where DGL runs
        for c in out:
            if "dgl" in c["systems"] and c["kind"] != "sampling":
                c["systems"] = (*c["systems"], "dgl-retain")
    return out


def schedule(rounds: int, case_list: Sequence[dict[str, Any]]) -> list[tuple[int, dict[str, Any], str]]:
    """Interleaved: per round, per case, every system once; the systems' order rotates by one per round."""
    out = []
    for r in range(rounds):
        for c in case_list:
            s = list(c["systems"])
            k = r % len(s)
            out += [(r, c, system) for system in s[k:] + s[:k]]
    return out


def reference(case: dict[str, Any]) -> str:
    return "gnnscale" if case["kind"] == "offload" else "dgl"


def summarise(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (case, system) in first-seen order: median and range over rounds of the runs' medians, ratio to the
    case's reference (time / its time; sampling: throughput / its throughput), peak memory, accuracy, errors."""
    keys: list[tuple[str, str]] = []
    for r in runs:
        if (r["case"], r["system"]) not in keys:
            keys.append((r["case"], r["system"]))
    out = []
    for case, system in keys:
        mine = [r for r in runs if r["case"] == case and r["system"] == system]
        ok = [r for r in mine if r.get("ok")]
        s: dict[str, Any] = {"record": "summary", "case": case, "system": system, "kind": mine[0]["kind"],
                             "reference": mine[0]["reference"], "rounds_ok": len(ok), "rounds": len(mine),
                             "errors": sorted({r.get("error") or "failed" for r in mine if not r.get("ok")})}
        s["per_round"] = {r["round"]: r["mteps"] if r["kind"] == "sampling" else r["median_s"] for r in ok}
        if ok:
            med = [r["median_s"] for r in ok]
            s.update(median_s=statistics.median(med), min_s=min(med), max_s=max(med),
                     peak_rss_bytes=max((r.get("peak_rss_bytes") or 0) for r in ok) or None,
                     train_peak_bytes=max((r.get("train_peak_bytes") or 0) for r in ok) or None,
                     test_acc=statistics.median(r["test_acc"] for r in ok) if ok[0].get("test_acc") is not None
                     else None)
            if mine[0]["kind"] == "sampling":
                mteps = [r["mteps"] for r in ok]
                s.update(mteps=statistics.median(mteps), mteps_min=min(mteps), mteps_max=max(mteps))
        out.append(s)
    for s in out:
        ref = next((t for t in out if t["case"] == s["case"] and t["system"] == s["reference"]), None)
        if ref is None or "median_s" not in ref or "median_s" not in s:
            s["ratio"] = None
        elif s["kind"] == "sampling":
            s["ratio"] = s["mteps"] / ref["mteps"]
        else:
            s["ratio"] = s["median_s"] / ref["median_s"]
        both = sorted(set(s["per_round"]) & set(ref["per_round"] if ref else ()))
        s["round_ratios"] = [s["per_round"][k] / ref["per_round"][k] for k in both] if ref else []
    return out


def _gib(b: int | None) -> str:
    return "-" if not b else f"{b / 2**30:.2f} GiB"


def _cell(s: dict[str, Any]) -> str:
    if s["kind"] == "sampling":
        return f"{s['mteps']:.2f} M edges/s ({s['mteps_min']:.2f}-{s['mteps_max']:.2f})"
    return f"{s['median_s']:.3f} s ({s['min_s']:.3f}-{s['max_s']:.3f})"


def render_section(summaries: Sequence[dict[str, Any]], env: dict[str, Any], notes: Sequence[str]) -> str:
    """The markdown section (without the markers)."""
    lines = [
        "### Peers: gnnscale, DGL and PyG on one machine (benchmarks/peers.py)", "",
        f"Machine: {env['cpu']}; {env['threads']} torch thread per process (`OMP_NUM_THREADS={env['threads']}`, "
        f"`torch.set_num_threads({env['threads']})`), every run its own process; interleaved rounds: "
        f"{env['rounds']}; {env['epochs']} epochs per run (the first {env['warmup']} untimed). gnnscale "
        f"{env['gnnscale_rev']}; "
        f"torch {env.get('torch') or '-'} (gnnscale, PyG {env.get('pyg') or '-'}); DGL {env.get('dgl') or '-'} on "
        f"torch {env.get('dgl_torch') or '-'} in its own venv; {env['date']}.", "",
        f"Command: `{env['command']}`", "",
        "Graphs: csbm, 16 communities, 5 classes, average degree 10, 128 features; model 2 layers, hidden 64 (GAT: "
        "4 heads), dropout 0.5, Adam lr 0.01, the same initial weights everywhere. Time: median over rounds of each "
        "run's median epoch (range over rounds); sampling: sampled edges per second over one epoch of seeds. "
        "Ratio: median time / the reference's median time (DGL; offload: gnnscale in-memory), for sampling "
        "throughput / DGL's (> 1: faster); per round: the same ratio within each round (range over rounds). "
        "Peak RSS: largest `VmHWM` of the run's process (library, data and training); training peak: `VmHWM` "
        "over the resident size after set-up (reset through `/proc/self/clear_refs`).", "",
        "| workload | system | epoch time, median (range) | ratio | ratio per round | peak RSS | training peak "
        "| test acc |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        label = LABELS.get(s["system"], s["system"])
        if s["system"] == "gnnscale" and s["kind"] == "offload":
            label = "gnnscale in-memory"
        if "median_s" not in s:
            lines.append(f"| {s['case']} | {label} | failed: {'; '.join(s['errors'])[:200]} | - | - | - | - | - |")
            continue
        ref = "DGL" if s["reference"] == "dgl" else "in-memory"
        ratio = "-" if s["ratio"] is None else f"{s['ratio']:.2f}x {ref}"
        rr = s.get("round_ratios") or []
        per = "-" if not rr else f"{min(rr):.2f}-{max(rr):.2f}" if len(rr) > 1 else f"{rr[0]:.2f}"
        acc = "-" if s.get("test_acc") is None else f"{s['test_acc']:.3f}"
        miss = f" ({s['rounds_ok']}/{s['rounds']} rounds)" if s["rounds_ok"] < s["rounds"] else ""
        lines.append(f"| {s['case']} | {label} | {_cell(s)}{miss} | {ratio} | {per} | {_gib(s.get('peak_rss_bytes'))} "
                     f"| {_gib(s.get('train_peak_bytes'))} | {acc} |")
    if notes:
        lines += ["", *[f"- {n}" for n in notes]]
    return "\n".join(lines) + "\n"


def replace_section(text: str, section: str) -> str:
    """``text`` with what lies between the markers replaced by ``section`` (markers appended when absent)."""
    block = f"{BEGIN}\n{section.rstrip()}\n{END}"
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        sep = "" if not text or text.endswith("\n\n") else "\n" if text.endswith("\n") else "\n\n"
        return f"{text}{sep}{block}\n"
    return text[:start] + block + text[end + len(END):]


def not_set_up(peer: str, reason: str) -> str:
    """The one line that says a peer could not be set up and why."""
    one = " ".join(reason.split())[:300] or "unknown reason"
    return f"{peer} could not be set up: {one}; its cells are skipped"


# ------------------------------------------------------------------------------------------------ environment
def _tail(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    errs = [ln for ln in lines if ln.startswith("ERROR") or "Error" in ln]
    return (errs or lines or ["no output"])[-1].strip()


def _probe(python: Path, code: str, env: dict[str, str]) -> tuple[dict[str, Any] | None, str]:
    try:
        p = subprocess.run([str(python), "-c", code], capture_output=True, text=True, env=env, timeout=300,
                           cwd=tempfile.gettempdir())
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    if p.returncode:
        return None, _tail(p.stderr)
    return json.loads(p.stdout.strip().splitlines()[-1]), ""


DGL_PROBE = "import json, torch, dgl; print(json.dumps({'torch': torch.__version__, 'dgl': dgl.__version__}))"


def dgl_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PIP_CONSTRAINT"] = env["PIP_FIND_LINKS"] = ""  # this machine's torch cap would refuse torch 2.2.1
    return env


def setup_dgl(venv: Path, log: Path) -> tuple[Path | None, dict[str, Any] | str]:
    """DGL's venv (made and filled with pip when it does not import): ``(python, versions)`` or ``(None, why)``."""
    py = venv / "bin" / "python"
    env = dgl_env()
    if py.exists():
        info, why = _probe(py, DGL_PROBE, env)
        if info:
            return py, info
    print(f"setting up DGL in {venv} (pip from PyPI, several GB; log {log}) ...", file=sys.stderr, flush=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    steps = [[sys.executable, "-m", "venv", str(venv)],
             [str(py), "-m", "pip", "install", "--isolated", *DGL_PINS],
             [str(py), "-m", "pip", "install", "--isolated", "--no-deps", *DGL_NO_DEPS]]
    with log.open("a") as f:
        for cmd in steps:
            f.write(f"$ {shlex.join(cmd)}\n")
            f.flush()
            p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, text=True)
            if p.returncode:
                return None, f"`{shlex.join(cmd[2:])}` failed: {_tail(log.read_text()[-4000:])} (log {log})"
    info, why = _probe(py, DGL_PROBE, env)
    return (py, info) if info else (None, f"DGL installed but `import dgl` fails: {why}")


def git_state(repo: Path, rev: str = "HEAD") -> tuple[str, bool, list[str]]:
    """``(rev's full hash, dirty, changed paths)``: uncommitted changes under gnnscale/ or benchmarks/ (results
    and caches not counted); a ``rev`` other than HEAD counts as dirty (its worktree is used)."""
    sha = resolve(repo, rev)
    out = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--", "gnnscale", "benchmarks"],
                         capture_output=True, text=True, check=True).stdout
    paths = [ln[3:] for ln in out.splitlines() if ln.strip()]
    paths = [p for p in paths if not p.startswith("benchmarks/results/") and "cache" not in p]
    if sha != resolve(repo, "HEAD"):
        paths = [f"HEAD is not {rev}"]
    return sha, bool(paths), paths


@contextlib.contextmanager
def source_tree(repo: Path, sha: str, from_tree: bool, dirty: bool) -> Iterator[Path]:
    """The folder gnnscale and the workers are imported from: a clean worktree of ``sha`` when the tree is dirty."""
    if from_tree or not dirty:
        yield repo
        return
    with worktrees(repo, {"head": sha}) as (_, trees):
        yield trees["head"]


# ------------------------------------------------------------------------------------------------ runs
def child_env(src: Path | None, cache: Path, threads: int) -> dict[str, str]:
    env = dgl_env() if src is None else dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(src), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
        env["GNNSCALE_CACHE_DIR"] = str(cache / "gnnscale-cache")
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    return env


def run_child(cmd: list[str], env: dict[str, str], result: Path, timeout: float) -> dict[str, Any]:
    result.unlink(missing_ok=True)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=tempfile.gettempdir())
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout:.0f} s"}
    if result.exists():
        return json.loads(result.read_text())
    return {"ok": False, "error": f"exit {p.returncode}: {_tail(p.stderr)}"}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_NODES:,} vertices, 1 round, 3 epochs")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3; --quick 1)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma subset of {','.join(WORKLOADS)}, or "
                    "<workload>-<size> for one size only (gat-200K)")
    ap.add_argument("--sizes", default="200000,800000", help="csbm vertices, comma list (default 200000,800000)")
    ap.add_argument("--epochs", type=int, default=None, help="epochs per run (default 5; --quick 3)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed first epochs of each run (default 1)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process (default 1)")
    ap.add_argument("--timeout", type=float, default=3600.0, metavar="S", help="seconds per run (default 3600)")
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help=f"data and DGL's venv (default {DEFAULT_CACHE})")
    ap.add_argument("--dgl-venv", type=Path, default=None, help="DGL's venv (default CACHE/dgl-venv)")
    ap.add_argument("--from-tree", action="store_true", help="run the working tree even if dirty (marked -dirty)")
    ap.add_argument("--rev", default="HEAD", help="the commit whose gnnscale and workers run (default HEAD)")
    ap.add_argument("--render", default=None, metavar="SESSIONS",
                    help="run nothing: write the section from the run records of these sessions (comma list of "
                         "session ids in --out, e.g. a 200K run and a later gat-800K run); a case that several of "
                         "them ran is taken from the last listed")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON Lines file to append to")
    ap.add_argument("--results", type=Path, default=DEFAULT_RESULTS, help="markdown file for the section")
    ap.add_argument("--note", action="append", default=[], help="a line added under the table (repeatable)")
    ap.add_argument("--no-save", action="store_true", help="print the table only")
    ap.add_argument("--dgl-retain", action="store_true",
                    help="also run DGL with glibc keeping freed blocks (MALLOC_MMAP_THRESHOLD_ and "
                         "MALLOC_TRIM_THRESHOLD_ at 1 GiB: what gnnscale's default --host-allocator does), as "
                         "'dgl-retain'; ratios stay against plain DGL")
    args = ap.parse_args(argv)
    args.workloads = _list(args.workloads)
    bad = [w for w in args.workloads if w not in WORKLOADS and not _is_case(w)]
    if bad or not args.workloads:
        ap.error(f"--workloads: {','.join(bad) or '(none)'}: choose from {','.join(WORKLOADS)}")
    args.sizes = [QUICK_NODES] if args.quick else sorted(_size(s) for s in _list(args.sizes))
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.epochs = args.epochs or (3 if args.quick else 5)
    if args.from_tree and args.rev != "HEAD":
        ap.error("--from-tree runs the working tree; it cannot be combined with --rev")
    if args.rounds < 1 or args.epochs <= args.warmup or args.warmup < 0 or args.threads < 1 or not args.sizes:
        ap.error("need --rounds >= 1, --epochs > --warmup >= 0, --threads >= 1 and one size at least")
    args.dgl_venv = args.dgl_venv or args.cache / "dgl-venv"
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    command = shlex.join([".venv/bin/python", "benchmarks/peers.py", *(sys.argv[1:] if argv is None else argv)])
    if args.render:
        return render(args, command)
    sha, dirty, changed = git_state(ROOT, args.rev)
    notes: list[str] = []
    pythons: dict[str, Path | None] = {"gnnscale": Path(sys.executable), "gnnscale-offload": Path(sys.executable),
                                       "pyg": Path(sys.executable)}
    py, dgl_info = setup_dgl(args.dgl_venv, args.cache / "dgl-setup.log")
    pythons["dgl"] = py
    if py is None:
        notes.append(not_set_up("DGL", str(dgl_info)))
        print(notes[-1], file=sys.stderr)
    case_list = cases(args.workloads, args.sizes, args.dgl_retain)
    session = uuid.uuid4().hex[:12]
    with source_tree(ROOT, sha, args.from_tree, dirty) as src:
        rev = sha[:12] + ("-dirty" if dirty and src == ROOT else "")
        if dirty and src != ROOT:
            why = f"--rev {args.rev}" if args.rev != "HEAD" else f"uncommitted changes in {', '.join(changed[:5])}"
            notes.append(f"gnnscale and PyG ran from a clean worktree of {sha[:12]} ({why})")
        workers = src / "benchmarks" / "peers_workers.py"
        probe, why = _probe(Path(sys.executable), "import json, torch, torch_geometric as g; print(json.dumps("
                            "{'torch': torch.__version__, 'pyg': g.__version__}))", child_env(src, args.cache, 1))
        if probe is None:
            notes.append(not_set_up("PyG", why))
            pythons["pyg"] = None
        env = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
               "cpu": f"{cpu_model()} ({os.cpu_count()} cores)", "threads": args.threads, "rounds": args.rounds,
               "epochs": args.epochs, "warmup": args.warmup, "gnnscale_rev": rev, "gnnscale_commit": sha,
               "command": command, "session": session, "notes": notes, **(probe or {}),
               **({"dgl": dgl_info["dgl"], "dgl_torch": dgl_info["torch"]} if isinstance(dgl_info, dict) else {})}
        data: dict[int, Path] = {}
        for n in sorted({c["nodes"] for c in case_list}):
            data[n] = args.cache / "data" / f"csbm-n{n}-c16-s0"
            print(f"data: {data[n]}", file=sys.stderr, flush=True)
            subprocess.run([sys.executable, str(workers), "prepare", "--data", str(data[n]), "--nodes", str(n)],
                           env=child_env(src, args.cache, args.threads), check=True)
        runs: list[dict[str, Any]] = []
        with tempfile.TemporaryDirectory(prefix="peers-") as tmp:
            for rnd, case, system in schedule(args.rounds, case_list):
                base = {"record": "run", "round": rnd, "case": case["name"], "kind": case["kind"],
                        "system": system, "reference": reference(case), "nodes": case["nodes"]}
                runner = "dgl" if system == "dgl-retain" else system  # the worker's system; env set below
                python = pythons[runner if runner in pythons else "gnnscale"]
                if python is None:
                    runs.append({**base, "ok": False, "error": "peer not set up"})
                    continue
                result = Path(tmp) / "result.json"
                cmd = [str(python), str(workers), "run", "--system", runner, "--workload", case["kind"],
                       "--model", case["model"], "--data", str(data[case["nodes"]]), "--epochs", str(args.epochs),
                       "--warmup", str(args.warmup), "--repeats", str(args.epochs), "--result", str(result)]
                print(f"round {rnd + 1}/{args.rounds}: {case['name']} {system} ...", file=sys.stderr, flush=True)
                child = child_env(None if runner == "dgl" else src, args.cache, args.threads)
                rec = run_child(cmd, {**child, **(RETAIN_ENV if system == "dgl-retain" else {})}, result,
                                args.timeout)
                rec["system"] = system
                if rec.get("ok"):
                    rec.pop("traceback", None)
                runs.append({**base, **rec, **{k: env[k] for k in ("date", "session", "gnnscale_rev", "cpu")}})
                what = (f"{rec['median_s']:.3f} s" + (f", {rec['mteps']:.2f} M edges/s" if "mteps" in rec else "")
                        if rec.get("ok") else f"failed: {rec.get('error')}")
                print(f"    {what}", file=sys.stderr, flush=True)
                if not args.no_save:
                    append_records(args.out, [{**runs[-1], "command": command}])
    summaries = summarise(runs)
    if not args.no_save:
        append_records(args.out, [{**s, **env} for s in summaries])
    write_section(args, summaries, env, notes)
    return 0


def sampling_notes(summaries: Sequence[dict[str, Any]]) -> list[str]:
    return [f"PyG sampling skipped: {s['errors'][0]} (pyg-lib has no PyPI distribution; torch-sparse is on PyPI only "
            "as source to compile against torch)"
            for s in summaries if s["system"] == "pyg" and s["kind"] == "sampling" and s["errors"]][:1]


def write_section(args: argparse.Namespace, summaries: Sequence[dict[str, Any]], env: dict[str, Any],
                  notes: Sequence[str]) -> None:
    section = render_section(summaries, env, [*notes, *sampling_notes(summaries), *args.note])
    print("\n" + section)
    if not args.no_save:
        text = args.results.read_text() if args.results.exists() else ""
        args.results.write_text(replace_section(text, section))
        print(f"wrote the peers section to {args.results}", file=sys.stderr)


def latest_runs(runs: Sequence[dict[str, Any]], sessions: Sequence[str]) -> list[dict[str, Any]]:
    """Each case's runs from the last of ``sessions`` (in their listed order) that ran it: a later session's
    rerun of a case replaces the earlier session's rounds of that case instead of merging with them."""
    order = {s: i for i, s in enumerate(sessions)}
    last: dict[str, int] = {}
    for r in runs:
        last[r["case"]] = max(last.get(r["case"], -1), order[r["session"]])
    return [r for r in runs if order[r["session"]] == last[r["case"]]]


def render(args: argparse.Namespace, command: str) -> int:
    """``--render``: the section from the records of earlier sessions in ``--out`` (their commands listed)."""
    sessions = _list(args.render)
    recs = [json.loads(ln) for ln in args.out.read_text().splitlines() if ln.strip()]
    recs = [r for r in recs if r.get("session") in sessions]
    runs = latest_runs([r for r in recs if r.get("record") == "run"], sessions)
    heads = {r["session"]: r for r in recs if r.get("record") == "summary"}  # carry the sessions' environment
    missing = [s for s in sessions if s not in heads]
    if missing or not runs:
        print(f"error: no finished session {','.join(missing) or args.render} in {args.out}", file=sys.stderr)
        return 2
    first = heads[sessions[0]]
    revs = sorted({heads[s]["gnnscale_rev"] for s in sessions})
    env = {**first, "gnnscale_rev": " and ".join(revs), "rounds": "/".join(str(heads[s]["rounds"]) for s in sessions),
           "command": "`, then `".join(heads[s]["command"] for s in sessions) + f"`; table: `{command}"}
    notes = [n for s in sessions for n in heads[s].get("notes", [])
             if not n.startswith("PyG sampling") and "clean worktree" not in n]
    if not any(r.endswith("-dirty") for r in revs):
        notes.append(f"gnnscale and PyG ran from commit {env['gnnscale_rev']} (a clean worktree of it where the shared "
                     "working tree had uncommitted changes)")
    write_section(args, summarise(runs), env, list(dict.fromkeys(notes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
