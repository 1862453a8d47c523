"""gnnscale, DGL and PyG side by side on the same graphs (issue #30): epoch time, peak memory, accuracy.

    python -m benchmarks peers --quick                            # 20K vertices, 1 round, 3 epochs
    python -m benchmarks peers                                    # 200K and 800K, 3 rounds
    python -m benchmarks peers --workloads gcn,sage,gat --sizes 800000 --epochs 3 --dgl-retain
    python -m benchmarks peers --quick --workloads gcn --no-dgl   # no DGL venv needed

Workloads (``--workloads``, default all): ``gcn``, ``sage``, ``gat``: full-graph training, 2 layers, hidden 64, at
every ``--sizes`` (gnnscale's in-memory engine, DGL, PyG on a sparse CSR ``adj_t``, GAT on ``edge_index``);
``sampling``: neighbour sampling only, SAGE fanouts 15,10, batch 1024, one epoch of training seeds (sampled edges
per second; PyG's sampler needs pyg_lib or torch_sparse); ``minibatch``: a mini-batch SAGE epoch (gnnscale
``--engine minibatch`` against DGL's NeighborSampler + DataLoader), both pinned to one core; ``offload``: GCN with
gnnscale's offload engine at 8 chunks against its own in-memory engine. The last three run at the smallest size;
an item ``<workload>-<size>`` (``gat-200K``) is that workload at that size only. Graphs: csbm with 16 communities,
5 classes, average degree 10, 128 features, seed 0, generated once (before the cases run) into ``--cache``/data as
plain ``.npy`` arrays with gnnscale's initial weights, read by every system's process.

Cases: one per (workload, system), the workload's systems a group, so the harness runs them back to back in an
order that rotates per round, each in its own process with one torch thread (the case code is
:mod:`benchmarks._peers_workers`). The DGL cases run in a venv of their own, ``--cache``/dgl-venv (DGL 2.1.0, the
newest Linux wheel, needs torch <= 2.2.1), made on first use with pip from PyPI (several GB); when DGL cannot be
set up (or ``--no-dgl``), one line says why, there are no DGL cases and every record of the run carries that line
in ``notes``. One record per run: the median epoch time (``--epochs`` epochs, the first ``--warmup`` untimed;
sampling: ``--epochs`` timed passes), peak resident memory (``VmHWM``), training peak, test accuracy.

The table, per workload and system: the median over rounds of each run's median epoch time, its range over rounds,
the ratio to DGL (to gnnscale's in-memory engine for offload; sampling: throughput over DGL's, > 1 is faster),
the ratio within each round, the largest peak resident memory and the test accuracy.

gnnscale trains with its default ``--host-allocator auto`` (on the CPU: glibc keeps freed blocks below 1 GiB for
reuse, so an epoch's ``[V, F]`` temporaries are not fresh pages the kernel faults in and zeroes; not for GAT,
whose per-edge blocks fragment a retained heap: there glibc's default). ``--dgl-retain`` runs DGL a second time
with the same setting through glibc's environment tunables (``dgl-retain``; the ratios stay against plain DGL),
so the table shows what the allocator alone is worth.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import Case, Row, split_list
from benchmarks.harness.records import gib, provenance, session_of, table

TITLE = "Speed against the peers (issue #30), CPU: gnnscale, DGL and PyG on one machine"
ROUNDS = 3
DEFAULT_CACHE = Path.home() / ".cache" / "gnnscale" / "peers"
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
WORKER = "benchmarks._peers_workers"
LEGEND = (
    "Graphs: csbm, 16 communities, 5 classes, average degree 10, 128 features; model 2 layers, hidden 64 (GAT: "
    "4 heads), dropout 0.5, Adam lr 0.01, the same initial weights everywhere. Time: median over rounds of each "
    "run's median epoch (range over rounds); sampling: sampled edges per second over one epoch of seeds. "
    "Ratio: median time / the reference's median time (DGL; offload: gnnscale in-memory), for sampling "
    "throughput / DGL's (> 1: faster); per round: the same ratio within each round (range over rounds). "
    "Peak RSS: largest `VmHWM` of the run's process (library, data and training); training peak: `VmHWM` "
    "over the resident size after set-up (reset through `/proc/self/clear_refs`).")


# ------------------------------------------------------------------------------------------------ pure parts
def _size(text: str) -> int:
    t = text.lower()
    return int(float(t[:-1]) * 1000) if t.endswith("k") else int(float(t[:-1]) * 10**6) if t.endswith("m") else int(t)


def _is_case(item: str) -> bool:
    name, _, size = item.rpartition("-")
    try:
        return name in WORKLOADS and _size(size) > 0
    except ValueError:
        return False


def _workloads(text: str) -> list[str]:
    """``--workloads``: the comma list, each a workload or ``<workload>-<size>``."""
    items = split_list(text)
    bad = [w for w in items if w not in WORKLOADS and not _is_case(w)]
    if bad or not items:
        raise argparse.ArgumentTypeError(f"{','.join(bad) or '(none)'}: choose from {','.join(WORKLOADS)}")
    return items


def size_name(nodes: int) -> str:
    return f"{nodes // 10**6}M" if nodes % 10**6 == 0 else f"{nodes // 1000}K" if nodes % 1000 == 0 else str(nodes)


def _case(w: str, n: int) -> dict[str, Any]:
    kind = "full" if w in FULL else w
    model = w if w in FULL else "gcn" if w == "offload" else "sage"
    return {"name": f"{w}-{size_name(n)}", "workload": w, "kind": kind, "model": model, "nodes": n,
            "systems": SYSTEMS[kind]}


def workload_cases(workloads: Sequence[str], sizes: Sequence[int], dgl_retain: bool = False) -> list[dict[str, Any]]:
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


def reference(case: dict[str, Any]) -> str:
    return "gnnscale" if case["kind"] == "offload" else "dgl"


def _first_line(error: str | None) -> str:
    return (error or "failed").strip().splitlines()[0] if (error or "").strip() else "failed"


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
                             "errors": sorted({_first_line(r.get("error")) for r in mine if not r.get("ok")})}
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


# ------------------------------------------------------------------------------------------------ DGL's venv
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


def not_set_up(peer: str, reason: str) -> str:
    """The one line that says a peer could not be set up and why."""
    one = " ".join(reason.split())[:300] or "unknown reason"
    return f"{peer} could not be set up: {one}; its cells are skipped"


# ------------------------------------------------------------------------------------------------ the cases
def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--workloads", type=_workloads, default=",".join(WORKLOADS),
                    help=f"comma subset of {','.join(WORKLOADS)}, or <workload>-<size> for one size only (gat-200K)")
    ap.add_argument("--sizes", default="200000,800000",
                    help=f"csbm vertices, comma list (default 200000,800000; --quick {QUICK_NODES})")
    ap.add_argument("--epochs", type=int, default=None, help="epochs per run (default 5; --quick 3)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed first epochs of each run (default 1)")
    ap.add_argument("--timeout", type=float, default=3600.0, metavar="S", help="seconds per run (default 3600)")
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help=f"data and DGL's venv (default {DEFAULT_CACHE})")
    ap.add_argument("--dgl-venv", type=Path, default=None, help="DGL's venv (default CACHE/dgl-venv)")
    ap.add_argument("--no-dgl", action="store_true", help="run no DGL case (no venv set up; the records say so)")
    ap.add_argument("--dgl-retain", action="store_true",
                    help="also run DGL with glibc keeping freed blocks (MALLOC_MMAP_THRESHOLD_ and "
                         "MALLOC_TRIM_THRESHOLD_ at 1 GiB: what gnnscale's default --host-allocator does), as "
                         "'dgl-retain'; ratios stay against plain DGL")


def _dgl(args: argparse.Namespace) -> tuple[str | None, list[str]]:
    """DGL's interpreter, or None and the line that says why there are no DGL cases."""
    if args.no_dgl:
        return None, ["DGL not run (--no-dgl); its cells are skipped"]
    venv = args.dgl_venv or args.cache / "dgl-venv"
    py, info = setup_dgl(venv, args.cache / "dgl-setup.log")
    return (str(py), []) if py is not None else (None, [not_set_up("DGL", str(info))])


def _prepare(data: Path, nodes: int) -> None:
    from benchmarks._peers_workers import prepare

    print(f"data: {data}", file=sys.stderr, flush=True)
    prepare(data, nodes)


def cases(args: argparse.Namespace) -> list[Case]:
    """One case per (workload, system), grouped by workload; DGL's cases in DGL's venv. Sets up DGL and writes the
    graphs (once) here, in the parent, so no case process pays for it."""
    sizes = [QUICK_NODES] if args.quick else sorted(_size(s) for s in split_list(args.sizes))
    epochs = args.epochs or (3 if args.quick else 5)
    if not sizes or args.warmup < 0 or epochs <= args.warmup:
        raise SystemExit("error: peers: need one size at least and --epochs > --warmup >= 0")
    plan = workload_cases(args.workloads, sizes, args.dgl_retain)
    dgl, notes = _dgl(args)
    for line in notes:
        print(line, file=sys.stderr, flush=True)
    data = {n: args.cache / "data" / f"csbm-n{n}-c16-s0" for n in sorted({c["nodes"] for c in plan})}
    for n, path in data.items():
        _prepare(path, n)
    out = []
    for c in plan:
        for system in c["systems"]:
            peer = system.startswith("dgl")
            if peer and dgl is None:
                continue
            params = {"record": "run", "kind": c["kind"], "model": c["model"], "system": system,
                      "reference": reference(c), "nodes": c["nodes"], "data": str(data[c["nodes"]]),
                      "epochs": epochs, "warmup": args.warmup, "repeats": epochs, "notes": notes}
            env = (RETAIN_ENV if system == "dgl-retain" else {}) if peer else {
                "GNNSCALE_CACHE_DIR": str(args.cache / "gnnscale-cache")}
            out.append(Case(f"{c['name']}:{system}", params, group=c["name"], module=WORKER,
                            python=dgl if peer else None, env=dict(env), timeout=args.timeout))
    return out


def run(params: dict[str, Any]) -> dict[str, Any]:
    """One case (the cases name :mod:`benchmarks._peers_workers` as their module; this is the same)."""
    from benchmarks._peers_workers import run as run_case

    return run_case(params)


def describe(r: dict[str, Any]) -> str:
    return f"{r['median_s']:.3f} s" + (f", {r['mteps']:.2f} M edges/s" if "mteps" in r else "")


# ------------------------------------------------------------------------------------------------ rendering
def _case_of(r: dict[str, Any]) -> str:
    """The workload case of a run record: the harness names a case ``<case>:<system>``, the older records
    ``<case>``."""
    return str(r["case"]).removesuffix(f":{r['system']}")


def select_runs(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The run records the table shows: among the sessions that ran :data:`ROUNDS` rounds (all sessions when none
    did), each workload case from the latest session that ran it (its rounds only, never merged with another
    session's)."""
    runs = [{**r, "case": _case_of(r), "host_cpu": r.get("host_cpu") or r.get("cpu")}
            for r in records if r.get("record") == "run"]
    rounds: dict[str, set[int]] = {}
    for r in runs:
        rounds.setdefault(session_of(r), set()).add(r["round"])
    runs = [r for r in runs if len(rounds[session_of(r)]) == ROUNDS] or runs
    last = {r["case"]: session_of(r) for r in runs}
    return [r for r in runs if session_of(r) == last[r["case"]]]


def _cell(s: dict[str, Any]) -> str:
    if s["kind"] == "sampling":
        return f"{s['mteps']:.2f} M edges/s ({s['mteps_min']:.2f}-{s['mteps_max']:.2f})"
    return f"{s['median_s']:.3f} s ({s['min_s']:.3f}-{s['max_s']:.3f})"


def _row(s: dict[str, Any]) -> list[str]:
    label = LABELS.get(s["system"], s["system"])
    if s["system"] == "gnnscale" and s["kind"] == "offload":
        label = "gnnscale in-memory"
    if "median_s" not in s:
        return [s["case"], label, f"failed: {'; '.join(s['errors'])[:200]}", "-", "-", "-", "-", "-"]
    ref = "DGL" if s["reference"] == "dgl" else "in-memory"
    ratio = "-" if s["ratio"] is None else f"{s['ratio']:.2f}x {ref}"
    rr = s.get("round_ratios") or []
    per = "-" if not rr else f"{min(rr):.2f}-{max(rr):.2f}" if len(rr) > 1 else f"{rr[0]:.2f}"
    acc = "-" if s.get("test_acc") is None else f"{s['test_acc']:.3f}"
    miss = f" ({s['rounds_ok']}/{s['rounds']} rounds)" if s["rounds_ok"] < s["rounds"] else ""
    return [s["case"], label, f"{_cell(s)}{miss}", ratio, per, gib(s.get("peak_rss_bytes")),
            gib(s.get("train_peak_bytes")), acc]


def _uniq(runs: Sequence[dict[str, Any]], key: str, where: Any = bool) -> str:
    return ", ".join(dict.fromkeys(str(r[key]) for r in runs if r.get(key) is not None and where(r))) or "-"


def _setup(runs: Sequence[dict[str, Any]]) -> str:
    """Threads, rounds, epochs and the peers' versions of ``runs``, and the sessions they come from."""
    ok = [r for r in runs if r.get("ok") and "epoch_times_s" in r and r["kind"] != "sampling"]
    epochs = {r["case"]: len(r["epoch_times_s"]) + len(r.get("warmup_times_s") or []) for r in ok}
    common = Counter(epochs.values()).most_common(1)[0][0] if epochs else "-"
    odd = ", ".join(f"{c}: {e}" for c, e in epochs.items() if e != common)
    warm = ", ".join(dict.fromkeys(str(len(r.get("warmup_times_s") or [])) for r in ok)) or "-"
    sessions: dict[str, dict[str, Any]] = {}
    for r in runs:
        sessions.setdefault(session_of(r), {"cases": [], "rounds": set()})
        sessions[session_of(r)]["rounds"].add(r["round"])
        if r["case"] not in sessions[session_of(r)]["cases"]:
            sessions[session_of(r)]["cases"].append(r["case"])
    dgl = [r for r in runs if r.get("dgl")]
    return (f"{_uniq(runs, 'threads')} torch thread per process, every run its own process; interleaved rounds: "
            f"{'/'.join(str(len(s['rounds'])) for s in sessions.values())}; {common} epochs per run"
            f"{f' ({odd})' if odd else ''}, the first {warm} untimed. PyG {_uniq(runs, 'pyg')}"
            + (f"; DGL {_uniq(dgl, 'dgl')} on torch {_uniq(dgl, 'torch')} in its own venv" if dgl else "")
            + f". Each workload's rows come from "
            f"the latest session that ran it with {ROUNDS} rounds (any session when none did): "
            + "; ".join(f"{k} ({', '.join(s['cases'])})" for k, s in sessions.items()) + ".")


def render(records: list[dict[str, Any]]) -> str:
    runs = select_runs(records)
    if not runs:
        return "No run records.\n"
    summaries = summarise(runs)
    head = ["workload", "system", "epoch time, median (range)", "ratio", "ratio per round", "peak RSS",
            "training peak", "test acc"]
    notes = [n for r in runs for n in r.get("notes") or []]
    notes += [f"PyG sampling skipped: {s['errors'][0]} (pyg-lib has no PyPI distribution; torch-sparse is on PyPI "
              "only as source to compile against torch)"
              for s in summaries
              if s["system"] == "pyg" and s["kind"] == "sampling" and "pyg_lib" in str(s["errors"])][:1]
    body = [provenance(runs), _setup(runs), LEGEND, table(head, (_row(s) for s in summaries))]
    if notes:
        body.append("\n".join(f"- {n}" for n in dict.fromkeys(notes)))
    return "\n\n".join(body) + "\n"


# ------------------------------------------------------------------------------------------------ at a glance
def _span(values: Sequence[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.2f}" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}-{hi:.2f}"


def _full_figure(summaries: Sequence[dict[str, Any]], peer: str) -> tuple[str, list[tuple[str, str]]] | None:
    """gnnscale's full-graph epoch time over ``peer``'s, across the full-graph cases both finished."""
    by = {(s["case"], s["system"]): s for s in summaries}
    pairs = [(c, by[c, "gnnscale"]["median_s"] / by[c, peer]["median_s"])
             for c in dict.fromkeys(s["case"] for s in summaries if s["kind"] == "full")
             if "median_s" in by.get((c, "gnnscale"), {}) and "median_s" in by.get((c, peer), {})]
    if not pairs:
        return None
    models = "/".join(dict.fromkeys(c.rpartition("-")[0].upper() for c, _ in pairs))
    sizes = sorted({_size(c.rpartition("-")[2]) for c, _ in pairs})
    span = size_name(sizes[0]) + (f"-{size_name(sizes[-1])}" if len(sizes) > 1 else "")
    name = LABELS[peer]
    return (f"{models} {span}: {_span([q for _, q in pairs])}x {name}'s epoch time",
            [(c, s) for c, _ in pairs for s in ("gnnscale", peer)])


def headline(records: list[dict[str, Any]]) -> list[Row]:
    """gnnscale against DGL (full-graph epochs; mini-batch epoch and sampling throughput) and against PyG
    (full-graph epochs), on the runs the table shows."""
    runs = select_runs(records)
    summaries = summarise(runs)

    def recs(keys: Sequence[tuple[str, str]]) -> tuple[dict[str, Any], ...]:
        return tuple(r for r in runs if (r["case"], r["system"]) in set(keys))

    rows = []
    parts, keys = [], []
    for kind, what in (("minibatch", "mini-batch SAGE epoch {q:.2f}x DGL's time"),
                       ("sampling", "neighbour sampling {q:.2f}x DGL's throughput")):
        for s in summaries:
            if s["kind"] == kind and s["system"] == "gnnscale" and s.get("ratio") is not None:
                parts.append(f"{s['case']}: " + what.format(q=s["ratio"]))
                keys += [(s["case"], "gnnscale"), (s["case"], "dgl")]
    for peer in ("dgl", "pyg"):
        got = _full_figure(summaries, peer)
        if got:
            rows.append(Row(f"gnnscale against {LABELS[peer]}: full-graph training epoch (CPU, 1 thread)", got[0],
                            recs(got[1])))
        if peer == "dgl" and parts:
            rows.append(Row("gnnscale against DGL: mini-batch training and sampling (CPU, 1 thread)",
                            "; ".join(parts), recs(keys)))
    return rows
