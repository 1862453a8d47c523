"""Graphs bigger than host memory (issue #29): convert a Kronecker graph with the streaming writer, then train one
epoch of each engine from its directory with ``--host-memory`` (the disk tier), and the same engine on a graph that
fits in RAM with and without ``--host-memory`` to give the slowdown of reading from disk.

    # convert (the time and peak resident memory of the writer):
    .venv/bin/python benchmarks/disk_scale.py convert --dir /data/k25 \
        --spec kronecker:scale=25,features=200,train=0.01,val=0.001,test=0.002
    # one epoch from disk:
    .venv/bin/python benchmarks/disk_scale.py train --dir /data/k25 --engine minibatch --model sage --host-memory 4GiB
    # the slowdown on a graph that fits: the same run with and without --host-memory, interleaved rounds:
    .venv/bin/python benchmarks/disk_scale.py train --dir /data/k22 --engine minibatch --model sage \
        --host-memory 4GiB --pair --rounds 3

Every command runs ``python -m gnnscale`` in a subprocess under ``/usr/bin/time -v`` (the child's wall time and
peak resident set size, its VmHWM; where /usr/bin/time is missing, ``resource``'s children's peak) with
``OMP_NUM_THREADS`` as given (default 1). A training run writes ``--metrics`` to a temporary file: the record
keeps the epoch's keys (epoch_time_s, disk_read_bytes, host_cache_hits/misses, anon_rss_bytes, spill_bytes,
host_base_bytes, host_peak_bytes, ...; with --host-memory ``host_bound_bytes`` = base + budget and
``within_bound``: the peak RSS at most that), the summary's timings (load_s, prepare_s, training_s, eval_s,
wall_s) and the process's peak RSS. Records (``"kind": "convert"`` or ``"train"``) are appended to ``--out``
(default benchmarks/results/disk_scale.jsonl) with the environment (date,
device, git revision and whether the tree was clean, command). The page cache is not dropped between runs (that
needs root): a run's disk reads may come from it; ``anon_rss_bytes`` is what the process itself holds.
"""

from __future__ import annotations

import argparse
import json
import os
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

import torch

from gnnscale.units import parse_budget

try:  # run as a script (its folder is on sys.path) or imported as benchmarks.disk_scale
    from offload import append_records, environment
except ImportError:  # pragma: no cover
    from benchmarks.offload import append_records, environment

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "disk_scale.jsonl"
TIME = shutil.which("time") and Path("/usr/bin/time")
_KEYS = ("loss", "epoch_time_s", "disk_read_bytes", "host_cache_hits", "host_cache_misses", "anon_rss_bytes",
         "spill_bytes", "host_rows_ram_bytes", "chunks", "h2d_bytes", "peak_device_bytes", "val_acc", "test_acc",
         "host_base_bytes", "host_peak_bytes")


def run(cmd: list[str], threads: int) -> dict[str, Any]:
    """Run ``cmd``; its wall seconds, peak RSS (bytes), exit status and the tail of its stderr."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    timed = [str(TIME), "-v", *cmd] if TIME is not None and TIME.exists() else cmd
    t0 = time.perf_counter()
    p = subprocess.run(timed, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr)
    peak = int(m.group(1)) * 1024 if m else resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    err = [line for line in p.stderr.splitlines() if not line.startswith("\t")]
    return {"wall_s": wall, "peak_rss_bytes": peak, "rc": p.returncode, "stderr_tail": err[-5:],
            "stdout_tail": p.stdout.splitlines()[-3:]}


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def convert(args: argparse.Namespace) -> list[dict[str, Any]]:
    out = Path(args.dir)
    cmd = [sys.executable, "-m", "gnnscale", "convert", "--dataset", args.spec, "--out", str(out)]
    if args.host_memory:
        cmd += ["--host-memory", args.host_memory]
    r = run(cmd, args.threads)
    rec: dict[str, Any] = {"kind": "convert", "spec": args.spec, "dir": str(out), "cmd": cmd[1:], **r}
    if r["rc"] == 0:
        meta = json.loads((out / "meta.json").read_text())
        rec |= {"nodes": meta.get("num_nodes"), "edges": meta.get("num_edges"), "dir_bytes": dir_bytes(out),
                "free_disk_bytes_after": shutil.disk_usage(out).free}
    print(f"convert {args.spec}: rc {r['rc']}, {r['wall_s']:.0f} s, peak RSS {r['peak_rss_bytes'] / 2**30:.2f} GiB"
          + (f", {rec['dir_bytes'] / 1e9:.1f} GB" if r["rc"] == 0 else f": {r['stderr_tail']}"))
    return [rec]


def train_once(args: argparse.Namespace, host_memory: str | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        metrics = Path(tmp) / "m.jsonl"
        cmd = [sys.executable, "-m", "gnnscale", "train", "--dataset", args.dir, "--engine", args.engine,
               "--model", args.model, "--epochs", str(args.epochs), "--metrics", str(metrics), "--quiet",
               *args.extra]
        if host_memory is not None:
            cmd += ["--host-memory", host_memory]
            if args.scratch is not None:
                cmd += ["--scratch", args.scratch]
        r = run(cmd, args.threads)
        lines = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
    epochs = [x for x in lines if not x.get("summary")]
    summary = next((x for x in lines if x.get("summary")), {})
    last = epochs[-1] if epochs else {}
    rec = {"kind": "train", "dir": args.dir, "engine": args.engine, "model": args.model, "epochs": args.epochs,
           "host_memory": host_memory, "scratch": args.scratch if host_memory else None, "cmd": cmd[1:], **r,
           **{k: last.get(k) for k in _KEYS},
           "timings": summary.get("timings"), "epoch_times_s": [x.get("epoch_time_s") for x in epochs]}
    if host_memory is not None and rec.get("host_base_bytes") is not None:  # the bound --host-memory promises
        rec["host_bound_bytes"] = rec["host_base_bytes"] + parse_budget(host_memory)
        rec["within_bound"] = rec["peak_rss_bytes"] <= rec["host_bound_bytes"]
    hits, misses = rec.get("host_cache_hits"), rec.get("host_cache_misses")
    seen = (hits or 0) + (misses or 0)
    rec["host_cache_hit_ratio"] = (hits or 0) / seen if seen else None
    return rec


def _row(r: dict[str, Any]) -> str:
    def g(v: Any, scale: float = 1.0, spec: str = ".2f") -> str:
        return "-" if v is None else format(v / scale, spec)
    t = r.get("timings") or {}
    return (f"| {r['engine']} {r['model']} | {r['host_memory'] or 'in RAM'} | {r['rc']} | "
            f"{g(r['epoch_time_s'], 1, '.1f')} | {g(t.get('eval_s'), 1, '.1f')} | {g(t.get('prepare_s'), 1, '.1f')} | "
            f"{g(r['wall_s'], 1, '.0f')} | "
            f"{g(r['disk_read_bytes'], 1e9)} | {g(r['host_cache_hit_ratio'], 1, '.3f')} | "
            f"{g(r['anon_rss_bytes'], 2**30)} | {g(r['peak_rss_bytes'], 2**20, '.0f')} | "
            f"{g(r.get('host_base_bytes'), 2**20, '.0f')} | {g(r.get('host_bound_bytes'), 2**20, '.0f')} | "
            f"{g(r['spill_bytes'], 1e9)} | {g(r['loss'], 1, '.4f')} |")


def train(args: argparse.Namespace) -> list[dict[str, Any]]:
    recs: list[dict[str, Any]] = []
    print("| engine | host memory | rc | epoch s | eval s | prepare s | wall s | disk read GB | cache hit ratio | "
          "anon RSS GiB | VmHWM MiB | base MiB | base + budget MiB | spill GB | loss |")
    print("|---|---|---|" + "---:|" * 12)
    for rnd in range(args.rounds):
        for hm in ([args.host_memory, None] if args.pair else [args.host_memory]):
            rec = train_once(args, hm) | {"round": rnd}
            recs.append(rec)
            print(_row(rec), flush=True)
            if rec["rc"] != 0:
                print(f"  failed: {rec['stderr_tail']}")
    if args.pair:
        disk = [r["epoch_time_s"] for r in recs if r["host_memory"] and r["epoch_time_s"]]
        ram = [r["epoch_time_s"] for r in recs if not r["host_memory"] and r["epoch_time_s"]]
        if disk and ram:
            ratio = statistics.median(disk) / statistics.median(ram)
            print(f"median epoch: from disk {statistics.median(disk):.2f} s, in RAM {statistics.median(ram):.2f} s: "
                  f"{ratio:.2f}x ({len(disk)} rounds)")
            recs.append({"kind": "pair", "dir": args.dir, "engine": args.engine, "model": args.model,
                         "median_disk_s": statistics.median(disk), "median_ram_s": statistics.median(ram),
                         "ratio": ratio, "rounds": len(disk)})
    return recs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    c = sub.add_parser("convert", help="gnnscale convert SPEC into DIR, timed")
    c.add_argument("--spec", required=True)
    t = sub.add_parser("train", help="one epoch (or --epochs) of an engine from DIR")
    t.add_argument("--engine", default="minibatch")
    t.add_argument("--model", default="sage")
    t.add_argument("--epochs", type=int, default=1)
    t.add_argument("--scratch", default=None, help="--scratch DIR for the runs with --host-memory")
    t.add_argument("--pair", action="store_true", help="each round also without --host-memory (in RAM)")
    t.add_argument("--rounds", type=int, default=1)
    t.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more train flags, last")
    for p in (c, t):
        p.add_argument("--dir", required=True, help="the graph directory (convert: a new one)")
        p.add_argument("--host-memory", default=None if p is c else "4GiB")
        p.add_argument("--threads", type=int, default=1)
        p.add_argument("--out", type=Path, default=DEFAULT_OUT)
        p.add_argument("--no-save", action="store_true")
    args = ap.parse_args(argv)
    env = environment(torch.device("cpu"))
    recs = convert(args) if args.what == "convert" else train(args)
    if not args.no_save:
        append_records(args.out, [r | {"env": env} for r in recs])
    return 0 if all(r.get("rc", 0) == 0 for r in recs) else 1


if __name__ == "__main__":
    sys.exit(main())
