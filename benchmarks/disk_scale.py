"""Graphs bigger than host memory (issues #29, #44): convert, train from disk under --host-memory, vs RAM.

Graphs bigger than host memory (issues #29, #44): convert a Kronecker graph with the streaming writer, then train
an engine from its directory with ``--host-memory`` (the disk tier), beside the same run in RAM.

    # convert (the time and peak resident memory of the writer), then one epoch from disk:
    python -m benchmarks disk_scale --dir /data/k25 --convert-only \
        --spec kronecker:scale=25,features=200,train=0.01,val=0.001,test=0.002
    python -m benchmarks disk_scale --dir /data/k25 --engine minibatch --model sage --host-memory 4GiB
    # the slowdown on a graph that fits: the same run with and without --host-memory, interleaved rounds:
    python -m benchmarks disk_scale --dir /data/k22 --engine minibatch --model sage --host-memory 4GiB --pair \
        --rounds 3
    python -m benchmarks disk_scale --dir /tmp/hm/k18 --engine minibatch --model gcn --host-memory 320MiB \
        --scratch /tmp/hm --pair --extra --batch-size 128

Cases: with ``--spec``, ``convert`` (``gnnscale convert --dataset SPEC --out DIR``; DIR must not exist) and then
the training cases, or ``--convert-only``; ``disk`` (``gnnscale train --dataset DIR --host-memory ...``) and with
``--pair`` ``ram`` (the same without ``--host-memory``), one group, so each round runs both. ``--quick`` converts a
Kronecker graph of scale 12 into a temporary folder (replaced on each quick run) and trains minibatch SAGE from it,
paired. Every case runs ``python -m gnnscale`` under ``/usr/bin/time -v`` (the child's wall time and peak resident
set size, its VmHWM; where /usr/bin/time is missing, ``resource``'s children's peak). A training run writes
``--metrics`` to a temporary file: the record keeps the epoch's keys (epoch_time_s, disk_read_bytes,
host_cache_hits/misses, anon_rss_bytes, spill_bytes, host_base_bytes, host_peak_bytes, ...; with --host-memory
``host_bound_bytes`` = base + budget and ``within_bound``: the peak RSS at most that), the summary's timings
(load_s, prepare_s, training_s, eval_s, wall_s) and the process's peak RSS. Records: ``"kind": "convert"`` or
``"train"`` (the script before the harness also wrote ``"pair"`` records; the disk/RAM table is computed from the
training runs). The page cache is not dropped between runs (that needs root): a run's disk reads may come from it;
``anon_rss_bytes`` is what the process itself holds.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import Case, Row, fmt
from benchmarks.harness.records import gib, provenance, session_of, table

TITLE = "Graphs bigger than host memory (issues #29 and #44), CPU"
ROUNDS = 1
TIME = Path("/usr/bin/time")
QUICK_DIR = Path(tempfile.gettempdir()) / "gnnscale-bench-disk-scale-quick"
QUICK_SPEC = "kronecker:scale=12,features=32"
_KEYS = ("loss", "epoch_time_s", "disk_read_bytes", "host_cache_hits", "host_cache_misses", "anon_rss_bytes",
         "spill_bytes", "host_rows_ram_bytes", "chunks", "h2d_bytes", "peak_device_bytes", "val_acc", "test_acc",
         "host_base_bytes", "host_peak_bytes")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--dir", default=None, help="the graph directory (with --spec: a new one; --quick: a temporary)")
    ap.add_argument("--spec", default=None, help="convert this dataset spec into --dir first")
    ap.add_argument("--convert-only", action="store_true", help="with --spec: no training case")
    ap.add_argument("--convert-host-memory", default=None, help="convert's --host-memory (default: gnnscale's)")
    ap.add_argument("--engine", default="minibatch")
    ap.add_argument("--model", default="sage")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--host-memory", default="4GiB", help="train's --host-memory (default 4GiB)")
    ap.add_argument("--scratch", default=None, help="--scratch DIR for the runs with --host-memory")
    ap.add_argument("--pair", action="store_true", help="each round also without --host-memory (in RAM)")
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more train flags, last")


def cases(args: argparse.Namespace) -> list[Case]:
    """``convert`` (with ``--spec``), then ``disk`` and with ``--pair`` ``ram``, one group."""
    quick = args.quick and args.dir is None
    if args.dir is None and not quick:
        raise SystemExit("error: disk_scale: --dir is required (or --quick)")
    folder = str(QUICK_DIR) if quick else args.dir
    spec = QUICK_SPEC if quick else args.spec
    out = []
    if spec:
        out.append(Case("convert", {"kind": "convert", "spec": spec, "dir": folder, "replace": quick,
                                    "host_memory": args.convert_host_memory}, timeout=6 * 3600))
        if args.convert_only:
            return out
    train = {"kind": "train", "dir": folder, "engine": args.engine, "model": args.model, "epochs": args.epochs,
             "scratch": args.scratch, "extra": list(args.extra)}
    out.append(Case("disk", {**train, "host_memory": args.host_memory}, group="train", timeout=6 * 3600))
    if args.pair or quick:
        out.append(Case("ram", {**train, "host_memory": None}, group="train", timeout=6 * 3600))
    return out


def timed(cmd: list[str]) -> dict[str, Any]:
    """Run ``cmd`` (the harness set its threads); its wall seconds, peak RSS (bytes), exit status and output tails."""
    wrapped = [str(TIME), "-v", *cmd] if TIME.exists() else cmd
    t0 = time.perf_counter()
    p = subprocess.run(wrapped, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr)
    peak = int(m.group(1)) * 1024 if m else resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    err = [line for line in p.stderr.splitlines() if not line.startswith("\t")]
    return {"wall_s": wall, "peak_rss_bytes": peak, "rc": p.returncode, "stderr_tail": err[-5:],
            "stdout_tail": p.stdout.splitlines()[-3:]}


def convert(p: dict[str, Any]) -> dict[str, Any]:
    out = Path(p["dir"])
    if p.get("replace") and out.exists():
        shutil.rmtree(out)
    cmd = [sys.executable, "-m", "gnnscale", "convert", "--dataset", p["spec"], "--out", str(out)]
    if p.get("host_memory"):
        cmd += ["--host-memory", p["host_memory"]]
    r = timed(cmd)
    rec: dict[str, Any] = {"kind": "convert", "spec": p["spec"], "dir": str(out), "cmd": cmd[1:], **r}
    if r["rc"] == 0:
        meta = json.loads((out / "meta.json").read_text())
        rec |= {"nodes": meta.get("num_nodes"), "edges": meta.get("num_edges"),
                "dir_bytes": sum(f.stat().st_size for f in out.iterdir() if f.is_file()),
                "free_disk_bytes_after": shutil.disk_usage(out).free}
    return rec


def train_once(p: dict[str, Any]) -> dict[str, Any]:
    from gnnscale.units import parse_budget

    hm = p["host_memory"]
    with tempfile.TemporaryDirectory() as tmp:
        metrics = Path(tmp) / "m.jsonl"
        cmd = [sys.executable, "-m", "gnnscale", "train", "--dataset", p["dir"], "--engine", p["engine"],
               "--model", p["model"], "--epochs", str(p["epochs"]), "--metrics", str(metrics), "--quiet",
               *p["extra"]]
        if hm is not None:
            cmd += ["--host-memory", hm, *(["--scratch", p["scratch"]] if p["scratch"] else [])]
        r = timed(cmd)
        lines = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
    epochs = [x for x in lines if not x.get("summary")]
    summary = next((x for x in lines if x.get("summary")), {})
    last = epochs[-1] if epochs else {}
    meta_path = Path(p["dir"]) / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    rec = {"kind": "train", "dir": p["dir"], "nodes": meta.get("num_nodes"), "edges": meta.get("num_edges"),
           "engine": p["engine"], "model": p["model"], "epochs": p["epochs"], "host_memory": hm,
           "scratch": p["scratch"] if hm else None, "cmd": cmd[1:], **r, **{k: last.get(k) for k in _KEYS},
           "timings": summary.get("timings"), "epoch_times_s": [x.get("epoch_time_s") for x in epochs]}
    if hm is not None and rec.get("host_base_bytes") is not None:  # the bound --host-memory promises
        rec["host_bound_bytes"] = rec["host_base_bytes"] + parse_budget(hm)
        rec["within_bound"] = rec["peak_rss_bytes"] <= rec["host_bound_bytes"]
    hits, misses = rec.get("host_cache_hits"), rec.get("host_cache_misses")
    seen = (hits or 0) + (misses or 0)
    rec["host_cache_hit_ratio"] = (hits or 0) / seen if seen else None
    return rec


def run(params: dict[str, Any]) -> dict[str, Any]:
    """One convert or one training run, in a ``python -m gnnscale`` process of its own."""
    from benchmarks.harness.graphs import device_name

    rec = convert(params) if params["kind"] == "convert" else train_once(params)
    return {**rec, "device": "cpu", "device_name": device_name("cpu")}


def describe(r: dict[str, Any]) -> str:
    what = f"rc {r['rc']}, {r['wall_s']:.0f} s, peak RSS {gib(r['peak_rss_bytes'])}"
    return what if r["kind"] == "convert" else f"{what}, epoch {fmt(r.get('epoch_time_s'), '.2f')} s"


# ------------------------------------------------------------------------------------------------------- rendering
def flat(r: dict[str, Any]) -> dict[str, Any]:
    """A record with the old script's nested ``env`` (date, commit, command, ...) lifted to the top level."""
    env = r.get("env")
    if isinstance(env, dict) and "date" in env:
        return {**env, **{k: v for k, v in r.items() if k != "env"}}
    return r


def _status(r: dict[str, Any]) -> str:
    return "ok" if r["rc"] == 0 else "killed (OOM)" if r["rc"] in (137, -9) else \
        "stopped" if r["rc"] == -15 else f"failed (rc {r['rc']})"


def _mib(v: int | None) -> str:
    return fmt(None if v is None else v / 2**20, ".0f")


def _train_rows(recs: list[dict[str, Any]], sizes: dict[str, str]) -> list[list[str]]:
    rows = []
    for r in recs:
        t = r.get("timings") or {}
        within = r.get("within_bound")
        rows.append([f"`{r['dir']}` ({sizes.get(r['dir'], '-')})", f"{r['engine']} {r['model']}",
                     r["host_memory"] or "RAM", r["gnnscale_rev"], _status(r), fmt(r.get("epoch_time_s"), ".1f"),
                     fmt(t.get("eval_s"), ".1f"), fmt(t.get("ready_s"), ".1f"), fmt(r["wall_s"], ".0f"),
                     fmt(None if r.get("disk_read_bytes") is None else r["disk_read_bytes"] / 1e9, ".2f"),
                     fmt(r.get("host_cache_hit_ratio"), ".3f"), gib(r.get("anon_rss_bytes")),
                     _mib(r["peak_rss_bytes"]), _mib(r.get("host_bound_bytes")),
                     "-" if within is None else "yes" if within else "**no**",
                     fmt(None if r.get("spill_bytes") is None else r["spill_bytes"] / 1e9, ".2f"),
                     fmt(r.get("loss"), ".4f")])
    return rows


def _pairs(recs: list[dict[str, Any]]) -> list[list[str]]:
    """Per run (session) and (dir, engine, model) with both: median epoch from disk, in RAM, and their ratio."""
    groups: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    for r in recs:
        groups.setdefault((session_of(r), r["dir"], r["engine"], r["model"]), []).append(r)
    rows = []
    for (_, folder, engine, model), rs in groups.items():
        disk = [r["epoch_time_s"] for r in rs if r["host_memory"] and r.get("epoch_time_s")]
        ram = [r["epoch_time_s"] for r in rs if not r["host_memory"] and r.get("epoch_time_s")]
        if disk and ram:
            d, m = statistics.median(disk), statistics.median(ram)
            rows.append([f"`{folder}`", f"{engine} {model}", rs[0]["gnnscale_rev"],
                         ", ".join(f"{x:.1f}" for x in disk), ", ".join(f"{x:.1f}" for x in ram), f"{d:.2f}",
                         f"{m:.2f}", f"**{d / m:.2f}x**"])
    return rows


def _sizes(recs: list[dict[str, Any]]) -> dict[str, str]:
    out = {}
    for r in recs:
        if r.get("nodes") is not None:
            out[r["dir"]] = f"{r['nodes']:,} vertices, {r['edges']:,} edges"
    return out


def render(records: list[dict[str, Any]]) -> str:
    recs = [flat(r) for r in records if r.get("kind") in ("convert", "train") and r.get("rc") is not None]
    conv = [r for r in recs if r["kind"] == "convert"]
    train = [r for r in recs if r["kind"] == "train"]
    sizes = _sizes(recs)
    c_rows = [[f"`{r['spec']}`", f"`{r['dir']}`", r["gnnscale_rev"], _status(r), f"{r['wall_s']:.0f}",
               gib(r["peak_rss_bytes"]), fmt(None if r.get("dir_bytes") is None else r["dir_bytes"] / 1e9, ".1f"),
               sizes.get(r["dir"], "-")] for r in conv]
    t_head = ["graph", "engine", "host memory", "commit", "status", "epoch s", "eval s", "ready s", "wall s",
              "disk read GB", "cache hit ratio", "anon RSS", "VmHWM MiB", "base + budget MiB", "within",
              "spill GB", "loss"]
    return (f"{provenance(recs)}\n\nEvery run recorded, in the order run (one `python -m gnnscale` process each, "
            "under `/usr/bin/time -v`; VmHWM is its peak resident set).\n\n**Conversions** (`gnnscale convert`)\n\n"
            + table(["spec", "dir", "commit", "status", "wall s", "peak RSS", "GB written", "graph"], c_rows)
            + "\n\n**Training from the directory** (`--host-memory`: the disk tier; RAM: no budget)\n\n"
            + table(t_head, _train_rows(train, sizes))
            + "\n\n**From disk against RAM** (the runs of one command with and without `--host-memory`)\n\n"
            + table(["graph", "engine", "commit", "epoch s, disk", "epoch s, RAM", "median disk", "median RAM",
                     "disk / RAM"], _pairs(train)) + "\n")


def headline(records: list[dict[str, Any]]) -> list[Row]:
    """The largest graph trained (exit 0) from disk: its latest run."""
    recs = [flat(r) for r in records if r.get("kind") in ("convert", "train")]
    sizes = {r["dir"]: (r["nodes"], r["edges"], r.get("dir_bytes")) for r in recs if r.get("nodes") is not None}
    ok = [r for r in recs if r["kind"] == "train" and r.get("rc") == 0 and r.get("host_memory")
          and r.get("epoch_time_s") and r["dir"] in sizes]
    if not ok:
        return []
    top = max(sizes[r["dir"]][0] for r in ok)
    r = [x for x in ok if sizes[x["dir"]][0] == top][-1]
    n, e, b = sizes[r["dir"]]
    on_disk = "" if b is None else f", {b / 1e9:.1f} GB on disk"
    return [Row("Scale: the largest graph trained from disk",
                f"{n:,} vertices, {e:,} edges{on_disk}: {r['engine']} {r['model']}, epoch {r['epoch_time_s']:.1f} s, "
                f"peak RSS {gib(r['peak_rss_bytes'])} (anonymous {gib(r.get('anon_rss_bytes'))}) with "
                f"--host-memory {r['host_memory']}", (r,))]
