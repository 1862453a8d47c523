"""Offload's deduplicated communication (HongTu §5-6): rows loaded per layer pass by dedup mode and chunker.

    python -m benchmarks offload_dedup --device cpu
    python -m benchmarks offload_dedup --layouts 4x8,1x16 --dedup none,reuse,full --chunker range,metis
    python -m benchmarks offload_dedup --device cuda --dataset kronecker:scale=20,edgefactor=16 --epochs 5 --warmup 2
    python -m benchmarks offload_dedup --quick

The offload benchmark (``python -m benchmarks offload``: the same flags, cases and records) on a Kronecker graph,
for each ``--layouts`` ``PxC`` (``P`` level-1 partitions of ``C`` forced chunks each; default ``4x8,1x16``), every
``--dedup`` mode (``none``, ``reuse``, ``full``) and ``--chunker`` (``range``, ``metis``), with the in-memory
engine and PyG (``--skip-pyg``; only with the first layout, where partitions share rows) as references. The cases
of one layout are one group. Records: ``benchmarks/results/offload_dedup.jsonl``; each carries the engine's row
counters (``rows_ori`` = HongTu's ``V_ori``, what ``none`` moves; ``rows_h2d`` loaded host -> device;
``rows_reused`` kept in a transition buffer from the previous batch; ``rows_d2d`` assembled from another
partition's buffer), the plan's ``dedup``/``chunker``/``reorganized`` and the timings.
"""

from __future__ import annotations

import argparse
from typing import Any

from benchmarks import offload
from benchmarks.harness import Case, split_list
from benchmarks.harness.records import fmt, provenance, session_of, table

TITLE = "Offload: deduplicated communication (HongTu §5-6)"
RESULTS = "offload_dedup"
ROUNDS = 1
DEFAULTS = {**offload.DEFAULTS, "dataset": "kronecker:scale=16,edgefactor=16", "hidden": 64, "chunks": "",
            "dedup": "none,reuse,full", "chunker": "range,metis", "epochs": 3}
QUICK = {"dataset": "kronecker:scale=10,edgefactor=8", "dedup": "none,full", "chunker": "range", "epochs": 1,
         "pyg": "sparse", "layouts": "2x4"}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    offload.add_flags(ap, DEFAULTS)
    ap.add_argument("--layouts", default="4x8,1x16", metavar="PxC",
                    help="partitions x chunks per partition, comma list (default 4x8,1x16; PyG with the first only)")


def layouts(text: str) -> list[tuple[int, int]]:
    try:
        return [(int(p), int(c)) for p, c in (item.lower().split("x") for item in split_list(text))]
    except ValueError:
        raise SystemExit(f"error: --layouts: {text!r}: expected PxC,... (e.g. 4x8,1x16)") from None


def cases(args: argparse.Namespace) -> list[Case]:
    s = offload.settings(args, DEFAULTS, QUICK)
    lay = layouts(QUICK["layouts"] if args.quick and args.layouts == "4x8,1x16" else args.layouts)
    out: list[Case] = []
    for i, (p, c) in enumerate(lay):
        out += offload.model_cases({**s, "partitions": p, "pyg": s["pyg"] if i == 0 else [], "gpu_memory": ""},
                                   [c], prefix=f"{p}x{c} ")
    return out


def run(params: dict[str, Any]) -> dict[str, Any]:
    return offload.run(params)


def describe(r: dict[str, Any]) -> str:
    return offload.describe(r)


def _per_pass(r: dict[str, Any], key: str) -> float | None:
    passes = r.get("layer_passes")
    return None if not passes or r.get(key) is None else r[key] / passes / max(r["nodes"], 1)


def latest_layouts(records: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Per (partitions, chunks) layout, in first-seen order, the records of its latest run."""
    groups = offload.runs(records, lambda r: (r.get("model"), r.get("partitions"), r.get("chunks_requested")
                                               if r.get("impl") == "offload" else None))
    last: dict[tuple[Any, Any], str] = {}
    for g in groups:
        for r in g:
            if r["impl"] == "offload":
                last[(r.get("partitions"), r.get("chunks_requested"))] = session_of(r)
    out = []
    for (p, c), sess in last.items():
        out.append([r for g in groups for r in g if session_of(r) == sess and r.get("partitions") == p
                    and (r["impl"] != "offload" or r.get("chunks_requested") == c)])
    return out


def _volume_row(r: dict[str, Any]) -> list[str]:
    reorg = "-" if r.get("reorganized") is None else "yes" if r["reorganized"] else "no"
    h2d, ori = _per_pass(r, "rows_h2d"), _per_pass(r, "rows_ori")
    return [f"{r.get('partitions')} x {r.get('chunks_requested')}", str(r.get("dedup")), str(r.get("chunker")),
            reorg, fmt(ori), fmt(h2d), fmt(None if not ori or h2d is None else h2d / ori),
            fmt(_per_pass(r, "rows_reused")), fmt(_per_pass(r, "rows_d2d")),
            fmt(None if r.get("h2d_bytes") is None else r["h2d_bytes"] / 1e9),
            fmt(None if r.get("rows_h2d_bytes") is None else r["rows_h2d_bytes"] / 1e9)]


def _time_row(r: dict[str, Any], rat: tuple[float | None, float | None] | None) -> list[str]:
    off = r["impl"] == "offload"
    head = [offload.impl_label(r) if not off else "offload", str(r.get("dedup")) if off else "",
            str(r.get("chunker")) if off else ""]
    if offload.failure(r):
        return [*head, offload.failure(r) or "", *[""] * 6]
    peak, est = offload.device_peak(r), r.get("plan_estimate_bytes")
    return [*head, f"{r['median_epoch_s']:.3f}", fmt(r.get("h2d_GBps"), ".2f", ""),
            *(fmt(x, ".2f", "") for x in (rat or (None, None))), offload.mib(peak), offload.mib(est),
            fmt(est / peak if est and peak else None, ".1f", "")]


VOLUME = ["partitions x chunks", "dedup", "chunker", "reorganized", "ori/\\|V\\|", "h2d/\\|V\\|", "h2d/ori",
          "reused/\\|V\\|", "pulled/\\|V\\|", "H2D GB/epoch", "rows part (GB)"]
TIMES = ["implementation", "dedup", "chunker", "median epoch (s)", "H2D GB/s", "/ inmemory", "/ PyG",
         "device peak (MiB)", "estimate (MiB)", "estimate / peak"]


def render(records: list[dict[str, Any]]) -> str:
    groups = latest_layouts(records)
    shown = [r for g in groups for r in g]
    vol = [_volume_row(r) for r in shown if r["impl"] == "offload" and r.get("status") == "ok"]
    parts = [provenance(shown),
             "Per partitions x chunks layout, the records of its latest run (the last record of each "
             "configuration). Rows per layer pass over |V|: ori = HongTu's V_ori (what `none` moves), h2d = loaded "
             "host -> device, reused = kept from the previous batch, pulled = assembled from another partition's "
             "buffer; H2D GB/epoch: every byte moved host -> device, rows part: the source-row loads.",
             f"Row volumes per layer pass (deterministic):\n\n{table(VOLUME, vol)}"]
    for rows in groups:
        rat, ref = offload.ratios(rows)
        r0 = rows[0]
        parts.append(f"Epoch times, {r0.get('partitions')} partition(s) x {r0.get('chunks_requested') or '-'} "
                     f"chunks, {offload.caption(rows)} (/ PyG: against `{ref or '-'}`):\n\n"
                     f"{table(TIMES, [_time_row(r, rat.get(id(r))) for r in rows])}")
    return "\n\n".join(parts) + "\n"
