"""The distributed engine (HopGNN): micrograph against model-centric training, network bytes and accuracy.

Model-centric (DistDGL) against micrograph training: network and remote feature bytes, local hit rate, epoch time
and accuracy, per dataset and rank count, with the single-process mini-batch engine as the reference.

    python -m benchmarks distributed
    python -m benchmarks distributed --ranks 2 --epochs 5 \\
        --datasets 'edgelist:../shared/datasets/snap/web-cnr-2000.txt.gz:symmetrize=1'
    python -m benchmarks distributed --ranks 2,3,4 --batch-size 512 --datasets csbm:nodes=100000
    python -m benchmarks distributed --merge off
    python -m benchmarks distributed --ranks 2,4 --batch-size 25 --epochs 25 --datasets npz:...   # accuracy

Per dataset (``--datasets``, ';'-separated specs; default Amazon Computers, the gnn-benchmark npz with its
standard 20-per-class split, and web-cnr-2000 symmetrised, whose features and labels the edge-list reader
synthesises: accuracy there is chance, about 1/16) and per rank count (``--ranks``, default ``2,4``), three cases,
one group (their order rotates per round), each launching one training with the same ``--epochs`` (default 3),
``--seed`` (0), ``--model`` (sage) and ``--batch-size`` (per rank; gnnscale's default unless given)::

    python -m gnnscale train --engine distributed --ranks R --strategy model-centric --metrics FILE --quiet ...
    python -m gnnscale train --engine distributed --ranks R --strategy micrograph --metrics FILE --quiet ...
    python -m gnnscale train --engine minibatch --batch-size R*B --metrics FILE --quiet ...

The micrograph run keeps the engine's defaults unless ``--pregather``/``--merge`` say otherwise (``--pregather on
--merge auto``: epoch 1 is warm-up, epoch 2 the baseline, then one time step more is merged each epoch while
epochs get at least 5% faster; at ``R`` = 2 one merge leaves one time step, in which every model trains all its
roots where it is: model-centric's traffic). The mini-batch run trains the same global batches on one process
(``R x B`` seeds per step; the distributed engine's iteration equals its step, so its losses are the reference).
Every training process gets ``OMP_NUM_THREADS`` = the harness's ``--threads`` (default 1: R ranks share the
machine's cores) and ``--device cpu`` unless ``--device`` says otherwise; partition plans go to one
``GNNSCALE_CACHE_DIR`` (``--cache-dir``; the first strategy partitions with METIS, the others reuse the plan;
neither is in the epoch time).

Each case records its run (``run``: command, per-epoch records of rank 0's ``--metrics``, counters summed over
ranks, and ``digest``: the figures over its epochs) with the dataset's size and its whole feature matrix's bytes
(``N x F x 4``). The render pairs the three runs of a (dataset, R) as one row (:func:`compare`; the records written
before the harness are such rows already):

* total network bytes per epoch (``network_bytes``: every byte the ranks received in training, as the comm layer
  counted it -- feature rows and their id requests, model migrations, gradient all-reduces) of each strategy and
  their ratio micrograph / model-centric (the issue's bound: <= 0.4); the remote feature bytes (``remote_bytes``),
  migration bytes and the rest; the miss rate ``1 - local_hit_rate`` (pooled over the epochs; model-centric
  should be about ``1 - 1/R``, micrograph much lower on METIS parts); micrograph's time steps per iteration;
* the final test accuracy of each and micrograph - model-centric in points (the issue's bound: within 0.5), and
  the largest per-epoch loss difference to the mini-batch engine (they compute the same steps);
* per rank the feature bytes it holds (``rank_feature_bytes``), its fetched-row cache peak and RSS (in the records).

A training that fails makes its case fail (the harness records the error; the exit status is then 1).
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
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

from benchmarks.harness import Case
from benchmarks.harness.records import provenance, session_of, table
from gnnscale.config import TrainConfig

TITLE = "Distributed training (HopGNN): micrograph vs model-centric, CPU"
ROUNDS = 1  # each case trains for several epochs; one round is what the records before the harness hold
ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "datasets"
AMAZON = SHARED / "gnn-benchmark" / "amazon_electronics_computers.npz"
WEB_CNR = SHARED / "snap" / "web-cnr-2000.txt.gz"
DEFAULT_DATASETS = f"npz:{AMAZON};edgelist:{WEB_CNR}:symmetrize=1"
QUICK_DATASET = "csbm:nodes=2000,avg_degree=10,features=32"
STRATEGIES = ("model-centric", "micrograph")
RUNS = (*STRATEGIES, "minibatch")
REMOTE_BOUND = 0.4
"""micrograph / model-centric bytes must be at most this (the issue's bound; checked on the total network bytes)."""
DEFAULT_BATCH = next(int(f.default) for f in fields(TrainConfig) if f.name == "batch_size")  # type: ignore[call-overload]
"""gnnscale's default --batch-size (the distributed runs' per-rank batch when --batch-size is not given)."""
ACC_POINTS = 0.5
"""micrograph's final test accuracy must be within this many points of model-centric's (the issue's bound)."""
ACCURACY_EPOCHS = 10
"""The accuracy table shows the runs of at least this many epochs (all runs when there are none)."""
GRAPH_NAMES = {"amazon_electronics_computers": "Amazon Computers"}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--datasets", default=None,
                    help=f"';'-separated dataset specs (default {DEFAULT_DATASETS}; --quick: {QUICK_DATASET})")
    ap.add_argument("--ranks", default=None, help="rank counts (comma list; default 2,4; --quick: 2)")
    ap.add_argument("--epochs", type=int, default=None, help="epochs per training (default 3; --quick: 2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default="sage")
    ap.add_argument("--batch-size", type=int, default=None,
                    help=f"seeds per rank (the mini-batch reference: R times this; default {DEFAULT_BATCH}; "
                         "--quick: 64)")
    ap.add_argument("--pregather", choices=["on", "off"], default="on", help="the micrograph run's --pregather")
    ap.add_argument("--merge", default="auto", help="the micrograph run's --merge: off, auto (default) or K")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--timeout", type=float, default=1200, help="seconds one training run may take")
    ap.add_argument("--cache-dir", default=None,
                    help="GNNSCALE_CACHE_DIR of the trainings (default: $GNNSCALE_CACHE_DIR, else a folder of the "
                         "system's temporary directory named after the benchmark)")


def cache_env(args: argparse.Namespace, name: str) -> dict[str, str]:
    """The ``GNNSCALE_CACHE_DIR`` every case of a benchmark shares (so they partition once), unless one is set."""
    if args.cache_dir:
        return {"GNNSCALE_CACHE_DIR": str(args.cache_dir)}
    if os.environ.get("GNNSCALE_CACHE_DIR"):
        return {}
    return {"GNNSCALE_CACHE_DIR": str(Path(tempfile.gettempdir()) / f"gnnscale-bench-{name}-cache")}


def cases(args: argparse.Namespace) -> list[Case]:
    q = args.quick
    specs = [s.strip() for s in (args.datasets or (QUICK_DATASET if q else DEFAULT_DATASETS)).split(";") if s.strip()]
    ranks = [int(s) for s in (args.ranks or ("2" if q else "2,4")).split(",") if s.strip()]
    if not specs or not ranks or min(ranks) < 1:
        raise SystemExit("error: need at least one dataset and rank counts >= 1")
    missing = [str(f) for f in map(_file_of, specs) if f is not None and not f.exists()]
    if missing:
        raise SystemExit(f"error: dataset file(s) missing: {', '.join(missing)} (pass --datasets)")
    config = {"epochs": args.epochs or (2 if q else 3), "seed": args.seed, "model": args.model,
              "batch_size": args.batch_size or (64 if q else None), "pregather": args.pregather,
              "merge": args.merge, "device": args.device}
    if config["epochs"] < 1:
        raise SystemExit("error: need --epochs >= 1")
    env = cache_env(args, "distributed")
    return [Case(f"{spec} R={r} {name}",
                 {"dataset": spec, "ranks": r, "strategy": name, "config": config, "timeout": args.timeout},
                 group=f"{spec} R={r}", env=env, timeout=args.timeout + 600)
            for spec in specs for r in ranks for name in RUNS]


def _file_of(spec: str) -> Path | None:
    """The input file of a file-backed spec (``npz:``/``edgelist:``), to fail before anything runs."""
    kind, _, rest = spec.partition(":")
    if kind in ("npz", "edgelist") and rest:
        return Path(rest.split(":")[0])
    return None


def dataset_facts(spec: str, seed: int) -> dict[str, Any]:
    """The graph's size and its whole feature matrix's bytes (``N x F x 4``), loaded as the children load it."""
    from gnnscale.graph.datasets import load_dataset

    g = load_dataset(spec, None, seed=seed)
    assert g.x is not None
    n, f = g.num_nodes, int(g.x.shape[1])
    facts = {"graph": g.name, "nodes": n, "edges": g.num_edges, "features": f, "classes": g.num_classes,
             "train_vertices": int(g.train_mask.sum()) if g.train_mask is not None else None,
             "feature_dtype": str(g.x.dtype).removeprefix("torch."), "whole_feature_bytes": n * f * 4}
    del g
    return facts


def command(config: dict[str, Any], spec: str, ranks: int, strategy: str | None, metrics: Path) -> list[str]:
    """The ``gnnscale train`` command of one run: ``strategy`` None (or ``minibatch``) is the mini-batch
    reference."""
    cmd = [sys.executable, "-m", "gnnscale", "train", "--dataset", spec, "--model", config["model"],
           "--epochs", str(config["epochs"]), "--seed", str(config["seed"]), "--device", config["device"],
           "--metrics", str(metrics), "--quiet"]
    batch = config.get("batch_size")
    if strategy in (None, "minibatch"):
        return cmd + ["--engine", "minibatch", "--batch-size", str(ranks * (batch or DEFAULT_BATCH))]
    cmd += ["--engine", "distributed", "--ranks", str(ranks), "--strategy", strategy]
    if strategy == "micrograph":
        cmd += ["--pregather", config["pregather"], "--merge", config["merge"]]
    if batch is not None:
        cmd += ["--batch-size", str(batch)]
    return cmd


def train_run(cmd: list[str], env: dict[str, str], metrics: Path, timeout: float) -> dict[str, Any]:
    """Run one ``gnnscale train ... --metrics FILE``: its epoch records and summary, or why it failed."""
    metrics.unlink(missing_ok=True)
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        return {"ok": False, "command": shlex.join(cmd), "returncode": None, "wall_s": time.perf_counter() - t0,
                "error": f"timed out after {timeout:.0f} s", "stderr_tail": err[-4000:]}
    wall = time.perf_counter() - t0
    out: dict[str, Any] = {"command": shlex.join(cmd), "returncode": p.returncode, "wall_s": wall,
                           "stdout": p.stdout[-2000:]}
    if p.returncode != 0 or not metrics.exists():
        return {**out, "ok": False, "error": f"exit status {p.returncode}", "stderr_tail": p.stderr[-4000:]}
    recs = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    epochs = [r for r in recs if not r.get("summary")]
    summary: dict[str, Any] = next((r for r in recs if r.get("summary")), {})
    return {**out, "ok": True, "epochs": epochs, "summary": summary, "stderr_tail": p.stderr[-1000:]}


def run(params: dict[str, Any]) -> dict[str, Any]:
    """One training of a (dataset, R) comparison, with the dataset's facts."""
    from benchmarks.harness.graphs import device_name

    spec, ranks, name, config = params["dataset"], params["ranks"], params["strategy"], params["config"]
    facts = {"dataset": spec, **dataset_facts(spec, config["seed"])}
    with tempfile.TemporaryDirectory(prefix="gnnscale-bench-dist-") as work:
        metrics = Path(work) / f"{facts['graph']}-{ranks}-{name}.jsonl"
        res = train_run(command(config, spec, ranks, name, metrics), dict(os.environ), metrics,
                        float(params["timeout"]))
    if not res["ok"]:
        raise RuntimeError(f"{res['error']}: {res['command']}\n{res.get('stderr_tail', '')[-1500:]}")
    res["digest"] = digest(res)
    res.pop("stdout", None)
    res.pop("stderr_tail", None)
    res["summary"] = {k: res["summary"].get(k) for k in ("engine_detail", "timings", "total_time_s")}
    return {"kind": "distributed-run", **facts, "ranks": ranks, "strategy": name, "config": config,
            "device": config["device"], "device_name": device_name(config["device"]), "run": res}


def digest(res: dict[str, Any]) -> dict[str, Any]:
    """One run's figures over its epochs."""
    ep = res["epochs"]
    d: dict[str, Any] = {
        "epoch_times": [r["epoch_time_s"] for r in ep],
        "median_epoch_s": statistics.median(r["epoch_time_s"] for r in ep),
        "losses": [r["loss"] for r in ep],
        "test_accs": [r.get("test_acc") for r in ep],
        "final_test_acc": res["summary"].get("final_test_acc", ep[-1].get("test_acc")),
        "batches": ep[-1].get("batches"),
        "load_s": res["summary"].get("timings", {}).get("load_s"),
        "ready_s": res["summary"].get("timings", {}).get("ready_s"),
        "wall_s": res["wall_s"],
    }
    if "remote_bytes" not in ep[0]:  # the mini-batch reference
        return d
    needed = sum(r["needed_rows"] for r in ep)
    d.update({
        "network_bytes_per_epoch": statistics.mean(r["network_bytes"] for r in ep),
        "network_bytes": [r["network_bytes"] for r in ep],
        "remote_bytes_per_epoch": statistics.mean(r["remote_bytes"] for r in ep),
        "remote_rows_per_epoch": statistics.mean(r["remote_rows"] for r in ep),
        "remote_bytes": [r["remote_bytes"] for r in ep],
        "local_hit_rates": [r["local_hit_rate"] for r in ep],
        "miss_rate": 1 - sum(r["local_rows"] for r in ep) / needed if needed else None,
        "migration_bytes_per_epoch": statistics.mean(r["migration_bytes"] for r in ep),
        "time_steps": [r["time_steps"] for r in ep],
        "merges": [r["merges"] for r in ep],
        "stage_s": {k: statistics.mean(r[k] for r in ep) for k in
                    ("sample_s", "fetch_s", "train_s", "migrate_s", "sync_s")},
        "rank_feature_bytes": ep[-1]["rank_feature_bytes"],
        "rank_cache_peak_bytes": [max(r["rank_cache_peak_bytes"][i] for r in ep)
                                  for i in range(len(ep[-1]["rank_cache_peak_bytes"]))],
        "rank_rss_bytes": ep[-1]["rank_rss_bytes"],
    })
    return d


def _max_diff(a: list[float], b: list[float]) -> float | None:
    return max(abs(x - y) for x, y in zip(a, b, strict=True)) if a and len(a) == len(b) else None


def compare(facts: dict[str, Any], ranks: int, runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The (dataset, R) row: both strategies' figures, their ratios and the checks."""
    row: dict[str, Any] = {"ranks": ranks, **facts,
                           "runs": {k: v for k, v in runs.items()}}
    ok = {k: v["ok"] for k, v in runs.items()}
    mc = runs["model-centric"].get("digest") if ok["model-centric"] else None
    mg = runs["micrograph"].get("digest") if ok["micrograph"] else None
    mb = runs["minibatch"].get("digest") if ok["minibatch"] else None
    notes: list[str] = []
    if mc and mg:
        ratio = mg["remote_bytes_per_epoch"] / mc["remote_bytes_per_epoch"] if mc["remote_bytes_per_epoch"] else None
        acc = (None if mc["final_test_acc"] is None or mg["final_test_acc"] is None
               else 100 * (mg["final_test_acc"] - mc["final_test_acc"]))
        by_epoch = [g / m if m else None for g, m in zip(mg["remote_bytes"], mc["remote_bytes"], strict=False)]
        net = (mg["network_bytes_per_epoch"] / mc["network_bytes_per_epoch"]
               if mc["network_bytes_per_epoch"] else None)
        row.update({"network_ratio": net, "network_ok": net is not None and net <= REMOTE_BOUND,
                    "remote_ratio": ratio, "remote_ok": ratio is not None and ratio <= REMOTE_BOUND,
                    "remote_ratio_by_epoch": by_epoch,
                    "epoch_ratio": mg["median_epoch_s"] / mc["median_epoch_s"],
                    "acc_diff_points": acc, "acc_ok": acc is not None and abs(acc) <= ACC_POINTS,
                    "loss_diff_max": _max_diff(mc["losses"], mg["losses"])})
    for name, d in (("model-centric", mc), ("micrograph", mg)):
        if d is None:
            continue
        whole = facts["whole_feature_bytes"]
        held = d["rank_feature_bytes"]
        d["max_feature_share_x_r"] = max(held) * ranks / whole
        if sum(held) != whole:
            notes.append(f"{name}: rank_feature_bytes sum to {sum(held):,}, not N x F x 4 = {whole:,}")
        if len(held) != ranks:
            notes.append(f"{name}: {len(held)} rank_feature_bytes entries for {ranks} ranks")
        if mb is not None:
            d["over_minibatch"] = d["median_epoch_s"] / mb["median_epoch_s"]
            d["loss_diff_vs_minibatch"] = _max_diff(d["losses"], mb["losses"])
    if mc is not None and mc["miss_rate"] is not None and abs((1 - mc["miss_rate"]) - 1 / ranks) > 0.1:
        notes.append(f"model-centric local hit rate {1 - mc['miss_rate']:.3f}, far from 1/R = {1 / ranks:.3f}")
    if mc and mg and mg["miss_rate"] is not None and mc["miss_rate"] is not None \
            and mg["miss_rate"] >= mc["miss_rate"]:
        notes.append(f"micrograph misses {mg['miss_rate']:.3f} of its rows, not fewer than model-centric's "
                     f"{mc['miss_rate']:.3f}")
    if mc and mc["migration_bytes_per_epoch"]:
        notes.append("model-centric reports migration bytes")
    if mg and mg["batches"] and ranks > 1 and any(t <= 1 for t in mg["time_steps"]):
        merged = [e + 1 for e, t in enumerate(mg["time_steps"]) if t <= 1]
        notes.append(f"micrograph ran one time step per iteration in epoch(s) {merged} (merges "
                     f"{mg['merges']}): every model trained all its roots on one rank, model-centric's traffic")
    if mg and mg["batches"] and any(t > ranks for t in mg["time_steps"]):
        notes.append(f"micrograph time steps {mg['time_steps']} exceed R")
    for name, r in runs.items():
        if not r["ok"]:
            notes.append(f"{name} failed ({r['error']}): {r['command']}")
    row["notes"] = notes
    return row


def describe(r: dict[str, Any]) -> str:
    d = r["run"]["digest"]
    net = "" if "network_bytes_per_epoch" not in d else (
        f", network {d['network_bytes_per_epoch'] / 2**20:.2f} MiB/epoch, miss rate {d['miss_rate']:.3f}, "
        f"steps {d['time_steps']}")
    return (f"{r['strategy']}: epochs {', '.join(f'{t:.3f}' for t in d['epoch_times'])} s, test acc "
            f"{d['final_test_acc']:.4f}{net}")


_PROVENANCE = ("date", "command", "gnnscale_rev", "host_cpu", "device_name", "torch", "pyg", "session", "env")


def pair(group: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The row of one (dataset, R) comparison from its three run records (:func:`compare`); None when none ran."""
    done = [r for r in group if r.get("ok") and r.get("run")]
    if not done:
        return None
    first = done[0]
    facts = {k: first[k] for k in ("dataset", "graph", "nodes", "edges", "features", "classes", "train_vertices",
                                   "feature_dtype", "whole_feature_bytes")}
    runs: dict[str, dict[str, Any]] = {}
    for name in RUNS:
        rec = next((r for r in group if r.get("strategy") == name), None)
        if rec is not None and rec.get("ok") and rec.get("run"):
            runs[name] = json.loads(json.dumps(rec["run"]))  # compare() annotates the digests: a copy
        else:
            runs[name] = {"ok": False, "error": (rec or {}).get("error", "not run"), "command": name}
    row = compare(facts, first["ranks"], runs)
    return {**{k: first.get(k) for k in _PROVENANCE}, "kind": "distributed", "config": first["config"], **row}


def rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (dataset, R) comparison, in file order: the records written before the harness are rows; the
    harness's run records are paired per (session, round, dataset, R)."""
    out: list[dict[str, Any]] = []
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in records:
        if r.get("kind") == "distributed" and "runs" in r:
            out.append(r)
        elif r.get("benchmark") == "distributed" and r.get("strategy") in RUNS:
            key = (session_of(r), r.get("round"), r.get("dataset"), r.get("ranks"))
            if key not in groups:
                groups[key] = []
                out.append({"_group": key})
            groups[key].append(r)
    paired = [pair(groups[r["_group"]]) if "_group" in r else r for r in out]
    return [r for r in paired if r is not None]


def config_of(row: dict[str, Any]) -> dict[str, Any]:
    """The micrograph run's settings (``config`` of a harness row; parsed from the command of an older one)."""
    if row.get("config"):
        c = dict(row["config"])
    else:
        argv = shlex.split(row["runs"]["micrograph"]["command"])
        flags = {a: argv[i + 1] for i, a in enumerate(argv[:-1]) if a.startswith("--")}
        c = {"epochs": int(flags["--epochs"]), "seed": int(flags.get("--seed", 0)), "model": flags["--model"],
             "batch_size": int(flags["--batch-size"]) if "--batch-size" in flags else None,
             "pregather": flags.get("--pregather", "on"), "merge": flags.get("--merge", "auto")}
    c["batch_size"] = c.get("batch_size") or DEFAULT_BATCH
    return c


def graph_of(row: dict[str, Any]) -> str:
    """A file's graph by its name (its path differs between runs), a generated one by its spec."""
    if str(row.get("dataset", "")).startswith(("npz:", "edgelist:")) or not row.get("dataset"):
        return GRAPH_NAMES.get(row["graph"], row["graph"])
    return str(row["dataset"])


def _setting(row: dict[str, Any]) -> tuple[Any, ...]:
    c = config_of(row)
    return (c["model"], c["seed"], c["epochs"], c["batch_size"], c["pregather"], c["merge"])


def select(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The latest row per (graph, R, setting: model, seed, epochs, batch, pregather, merge), in file order."""
    latest: dict[tuple[Any, ...], int] = {}
    all_rows = rows(records)
    for i, r in enumerate(all_rows):
        latest[(graph_of(r), r["ranks"], *_setting(r))] = i
    return [all_rows[i] for i in sorted(latest.values())]


def _digests(r: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    def get(name: str) -> dict[str, Any]:
        x = r["runs"][name]
        return x.get("digest", {}) if x["ok"] else {}
    return get("model-centric"), get("micrograph"), get("minibatch")


def _mib(v: float | None, spec: str = ".2f") -> str:
    return "-" if v is None else format(v / 2**20, spec)


def _small(v: float | None) -> str:
    return "-" if v is None else f"{v:.4f}" if v < 0.1 else f"{v:.3f}"


def _steps(values: list[float]) -> str:
    """``[2, 2, 1, 1, 1]`` -> ``2, 2, then 1``; ``[2, 2, 2]`` -> ``2``."""
    if not values:
        return "-"
    v = [f"{x:g}" for x in values]
    if len(set(v)) == 1:
        return v[0]
    k = len(v)
    while k > 1 and v[k - 2] == v[-1]:
        k -= 1
    return ", ".join(v[:k - 1] + [f"then {v[-1]}"]) if len(v) - k >= 1 else ", ".join(v)


def _label(r: dict[str, Any]) -> str:
    c = config_of(r)
    return f"merge {c['merge']}, {c['epochs']} epochs, batch {c['batch_size']}"


def communication_row(r: dict[str, Any]) -> list[str]:
    mc, mg, _ = _digests(r)
    net = r.get("network_ratio")
    per = [g / m for g, m in zip(mg.get("network_bytes", []), mc.get("network_bytes", []), strict=False) if m]
    per_s = (", ".join(f"{x:.3f}" for x in per) if len(per) <= 5 else
             f"{statistics.median(per):.3f} [{min(per):.3f} - {max(per):.3f}]") if per else "-"

    def rest(d: dict[str, Any]) -> float | None:
        if "network_bytes_per_epoch" not in d:
            return None
        return d["network_bytes_per_epoch"] - d["remote_bytes_per_epoch"] - d["migration_bytes_per_epoch"]

    ratio = "-" if net is None else f"**{net:.3f}**" if net <= REMOTE_BOUND else f"{net:.3f}"
    return [graph_of(r), str(r["ranks"]), _label(r),
            _mib(mc.get("network_bytes_per_epoch")), _mib(mg.get("network_bytes_per_epoch")), ratio, per_s,
            _mib(mc.get("remote_bytes_per_epoch")), _mib(mg.get("remote_bytes_per_epoch")),
            _small(r.get("remote_ratio")), _mib(mg.get("migration_bytes_per_epoch")), _mib(rest(mc)),
            _mib(rest(mg)), _small(mc.get("miss_rate")), _small(mg.get("miss_rate")),
            _steps(mg.get("time_steps", []))]


def accuracy_rows(sel: list[dict[str, Any]]) -> list[list[str]]:
    """Per (graph, R, batch, epochs): the final test accuracy of each strategy and merge setting, and mb's."""
    long = [r for r in sel if config_of(r)["epochs"] >= ACCURACY_EPOCHS] or sel
    keys = list(dict.fromkeys((graph_of(r), r["ranks"], config_of(r)["batch_size"], config_of(r)["epochs"])
                              for r in long))
    out = []
    for graph, ranks, batch, epochs in keys:
        rs = [r for r in long if (graph_of(r), r["ranks"], config_of(r)["batch_size"], config_of(r)["epochs"])
              == (graph, ranks, batch, epochs)]

        def acc(name: str, merge: str | None = None, rs: list[dict[str, Any]] = rs) -> str:
            vals = [_digests(r)[RUNS.index(name)].get("final_test_acc") for r in rs
                    if merge is None or config_of(r)["merge"] == merge]
            vals = [v for v in vals if v is not None]
            return f"{vals[-1]:.4f}" if vals else "-"

        diffs = [f"{r['acc_diff_points']:+.2f}" for r in rs if r.get("acc_diff_points") is not None]
        loss = [d.get("loss_diff_vs_minibatch") for r in rs for d in _digests(r)[:2]]
        loss = [x for x in loss if x is not None]
        out.append([graph, str(ranks), f"{batch} ({ranks * batch})", str(epochs),
                    acc("model-centric"), acc("micrograph", "auto"), acc("micrograph", "off"), acc("minibatch"),
                    ", ".join(dict.fromkeys(diffs)) or "-", f"{max(loss):.1e}".replace("e-0", "e-") if loss else "-"])
    return out


def render(records: list[dict[str, Any]]) -> str:
    sel = select(records)
    if not sel:
        return "No comparison ran.\n"
    comm = table(["graph", "R", "run (micrograph merge, epochs, batch per rank)", "network MiB MC",
                  "network MiB MG", f"**MG / MC, total** (<= {REMOTE_BOUND})", "per epoch", "feature MiB MC",
                  "feature MiB MG", "feature MG / MC", "migration MiB MG", "rest MiB MC", "rest MiB MG", "miss MC",
                  "miss MG", "MG time steps per iteration"], map(communication_row, sel))
    acc = table(["graph", "R", "batch per rank (global)", "epochs", "MC", "MG, merge auto", "MG, merge off", "mb",
                 "MG - MC (points)", "largest loss difference to mb"], accuracy_rows(sel))
    return (f"{provenance(sel)}\n\nThe latest comparison per (graph, R, setting). **Total network bytes per epoch** "
            f"(summed over ranks, mean over epochs; MC = model-centric, MG = micrograph; *feature*: remote feature "
            f"rows; *rest*: network - feature - migration; *per epoch*: each epoch's ratio, or over more than 5 "
            f"their median [min - max]; miss = 1 - local hit rate):\n\n{comm}\n\n**Accuracy** (test accuracy after "
            f"the last epoch; the runs of at least {ACCURACY_EPOCHS} epochs when there are any; mb = the mini-batch "
            f"engine on the same global batches):\n\n{acc}\n")
