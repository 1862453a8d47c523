"""Host -> GPU row gathers: bulk copy vs CPU index_select + staging vs the zero-copy (UVA) Triton kernel.

    python -m benchmarks gather
    python -m benchmarks gather --rows-total 4000000 --rows 500000 --features 128 --reps 5
    python -m benchmarks gather --uva-configs 32x128x4,64x128x8,16x256x4 --out /tmp/g.jsonl
    python -m benchmarks gather --quick

One case per feature width F (``--features``): a pinned host tensor ``[--rows-total, F]`` float32 and ``--rows``
distinct random row ids, once in random order and once sorted ascending (what the offload engine passes).
Methods, all writing one ``[rows, F]`` device buffer:

* ``bulk``: ``out.copy_(host[:rows], non_blocking=True)``, the same payload as one contiguous pinned copy: the
  PCIe ceiling the gathers are measured against (no ids, so no order).
* ``index_select``: :func:`gnnscale.store.gather_rows` with ``method="index_select"``, pipelined over ``--pieces``
  pieces with two pinned staging buffers: the CPU gathers piece ``i + 1`` while piece ``i`` is copied; an event per
  buffer keeps the CPU from overwriting a buffer still being read.
* ``uva``: ``method="uva"``, the Triton kernel reading pinned host memory directly (ids already on the GPU).
  ``--uva-configs RxFxW,...`` also times other ``BLOCK_R x BLOCK_F x num_warps`` tilings.

Each (method, order) runs ``--warmup`` untimed then ``--reps`` timed repetitions between CUDA events on the current
stream (so CPU work inside the pipelined path counts); the table gives the median time and the payload rate
``rows * F * 4 bytes / time`` in GB/s (10^9). Every result is checked bit for bit against ``host[rows]`` once.
One record per (F, method, order, config). Without CUDA a case records that it was skipped, and why.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from benchmarks.harness import Case, latest_session, split_list
from benchmarks.harness.graphs import device_name
from benchmarks.harness.records import provenance, table
from gnnscale.store import gather_rows, triton_available
from gnnscale.store.gather import _gather_uva, _uva_blocks

TITLE = "Host -> GPU row gathers: bulk copy, index_select + staging, the UVA Triton kernel"
ROUNDS = 1  # each case already times --reps repetitions (the GPU check's time is short)
DEFAULTS = {"rows_total": 16_000_000, "rows": 2_000_000, "features": "100,128,256", "reps": 10}
QUICK = {"rows_total": 1_000_000, "rows": 100_000, "features": "100", "reps": 3}
_FILL_CHUNK = 1 << 16  # rows per chunk when filling the host tensor
_MASK30 = (1 << 30) - 1


def make_host(rows_total: int, features: int) -> Tensor:
    """Pinned ``[rows_total, F]`` float32 whose bit patterns are distinct small integers (finite, never NaN)."""
    host = torch.empty(rows_total, features, dtype=torch.float32, pin_memory=True)  # [N, F]
    bits = host.view(torch.int32)
    pattern = torch.arange(_FILL_CHUNK * features, dtype=torch.int32).view(_FILL_CHUNK, features)
    for s in range(0, rows_total, _FILL_CHUNK):
        e = min(s + _FILL_CHUNK, rows_total)
        offset = (s * features) & _MASK30  # pattern + offset < 2^31: no int32 overflow
        torch.bitwise_and(pattern[: e - s] + offset, _MASK30, out=bits[s:e])
    return host


def time_cuda(fn: Callable[[], object], reps: int, warmup: int) -> list[float]:
    """Milliseconds per call between CUDA events on the current stream, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


class PipelinedIndexSelect:
    """``out = host[idx]`` by CPU gathers into two alternating pinned staging buffers, each copied asynchronously."""

    def __init__(self, host: Tensor, rows: int, pieces: int):
        self.host = host
        self.piece = max(1, -(-rows // max(1, pieces)))
        self.staging = [torch.empty(self.piece, host.shape[1], dtype=host.dtype, pin_memory=True) for _ in range(2)]
        self.copied = [torch.cuda.Event(), torch.cuda.Event()]  # never recorded: synchronize() returns at once

    def __call__(self, idx: Tensor, out: Tensor) -> None:
        stream = torch.cuda.current_stream()
        for i, s in enumerate(range(0, idx.numel(), self.piece)):
            b = i % 2
            self.copied[b].synchronize()  # the copy that last read staging[b] is done
            gather_rows(self.host, idx[s:s + self.piece], out[s:s + self.piece], method="index_select",
                        staging=self.staging[b])
            self.copied[b].record(stream)


def parse_configs(text: str) -> list[tuple[int, int, int]]:
    """``"32x128x4,64x128x8"`` -> ``[(32, 128, 4), (64, 128, 8)]`` (BLOCK_R x BLOCK_F x num_warps, powers of 2)."""
    configs = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        r, f, w = (int(v) for v in item.lower().split("x"))
        if any(v <= 0 or v & (v - 1) for v in (r, f, w)):
            raise SystemExit(f"--uva-configs: {item!r}: every value must be a power of two")
        configs.append((r, f, w))
    return configs


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--rows-total", type=int, default=DEFAULTS["rows_total"], help="rows of the pinned host tensor")
    ap.add_argument("--rows", type=int, default=DEFAULTS["rows"], help="distinct rows gathered per call")
    ap.add_argument("--features", default=DEFAULTS["features"], help="comma-separated feature widths F (float32)")
    ap.add_argument("--reps", type=int, default=DEFAULTS["reps"], help="timed repetitions (median reported)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed repetitions first (Triton compiles here)")
    ap.add_argument("--pieces", type=int, default=8, help="pipeline pieces of the index_select path")
    ap.add_argument("--uva-configs", default="", help="extra uva tilings BLOCK_RxBLOCK_FxWARPS, comma-separated")
    ap.add_argument("--seed", type=int, default=0)


def cases(args: argparse.Namespace) -> list[Case]:
    s = {k: QUICK[k] if args.quick and getattr(args, k) == v else getattr(args, k) for k, v in DEFAULTS.items()}
    if not 0 < s["rows"] <= s["rows_total"]:
        raise SystemExit("error: --rows must be in [1, --rows-total]")
    common = {"rows_total": s["rows_total"], "rows": s["rows"], "reps": s["reps"], "warmup": args.warmup,
              "pieces": args.pieces, "configs": parse_configs(args.uva_configs), "seed": args.seed}
    return [Case(f"F={f}", {**common, "features": int(f)}) for f in split_list(s["features"])]


def _methods(p: dict[str, Any], host: Tensor, out: Tensor, orders: dict[str, Tensor], dev: torch.device
             ) -> list[tuple[str, str, dict[str, Any], Callable[[], object], Tensor | None]]:
    """(label, order, extra record fields, call, ids or None for the bulk copy) of every timed method."""
    rows, f = p["rows"], host.shape[1]
    cases: list[tuple[str, str, dict[str, Any], Callable[[], object], Tensor | None]] = []
    cases.append(("bulk", "-", {}, lambda: out.copy_(host[:rows], non_blocking=True), None))
    pipe = PipelinedIndexSelect(host, rows, p["pieces"])
    for order, idx in orders.items():
        cases.append((f"index_select/{p['pieces']}", order, {"pieces": p["pieces"]},
                      lambda idx=idx: pipe(idx, out), idx))
    if triton_available():
        r0, f0 = _uva_blocks(f)
        for order, idx in orders.items():
            idx_dev = idx.to(dev)
            cases.append((f"uva {r0}x{f0}x4", order, {"block_r": r0, "block_f": f0, "num_warps": 4},
                          lambda i=idx_dev: gather_rows(host, i, out, method="uva"), idx))
            for r, bf, w in p["configs"]:
                cases.append((f"uva {r}x{bf}x{w}", order, {"block_r": r, "block_f": bf, "num_warps": w},
                              lambda i=idx_dev, r=r, bf=bf, w=w: _gather_uva(host, i, out, r, bf, w), idx))
    return cases


def run(params: dict[str, Any]) -> list[dict[str, Any]]:
    """Time every (method, order) for one feature width: one record each (one ``skipped`` record without CUDA)."""
    f = params["features"]
    if not torch.cuda.is_available():
        return [{"features": f, "status": "skipped", "reason": "no CUDA: this measures host -> GPU gathers"}]
    dev = torch.device("cuda", torch.cuda.current_device())
    g = torch.Generator().manual_seed(params["seed"])
    perm = torch.randperm(params["rows_total"], generator=g)[: params["rows"]]  # [rows] int64, distinct
    orders = {"random": perm, "sorted": perm.sort().values}
    host = make_host(params["rows_total"], f)  # [N, F] pinned
    out = torch.empty(params["rows"], f, dtype=torch.float32, device=dev)  # [rows, F]
    payload = params["rows"] * f * 4
    triton = None
    if triton_available():
        import triton as _triton
        triton = _triton.__version__
    common = {"device": "cuda", "device_name": device_name("cuda"), "cuda": torch.version.cuda, "triton": triton,
              "bench": "gather", "features": f, "rows": params["rows"], "rows_total": params["rows_total"],
              "dtype": "float32", "payload_bytes": payload, "reps": params["reps"], "warmup": params["warmup"]}
    records = []
    for label, order, extra, fn, idx in _methods(params, host, out, orders, dev):
        out.fill_(float("nan"))
        ms = time_cuda(fn, params["reps"], params["warmup"])
        ref = host[: params["rows"]] if idx is None else host.index_select(0, idx)  # [rows, F]
        ok = torch.equal(out.cpu().view(torch.int32), ref.view(torch.int32))  # bit-exact
        med = statistics.median(ms)
        records.append({**common, "method": label.split()[0].split("/")[0], "label": label, "order": order,
                        "median_ms": med, "gbps": payload / (med / 1e3) / 1e9, "times_ms": ms, "correct": ok,
                        "status": "ok", **extra})
    del host
    torch.cuda.empty_cache()
    with contextlib.suppress(AttributeError):  # give the cached pinned blocks back (a private torch API)
        torch._C._host_emptyCache()
    return records


def describe(r: dict[str, Any]) -> str:
    if r.get("status") == "skipped":
        return f"F={r['features']}: skipped ({r['reason']})"
    return f"F={r['features']} {r['label']} {r['order']}: {r['median_ms']:.2f} ms, {r['gbps']:.2f} GB/s"


def _method(r: dict[str, Any]) -> str:
    label = r["label"]
    if r["method"] == "bulk":
        return "bulk copy"
    if r["method"] == "index_select":
        return f"`index_select`, {r.get('pieces', label.split('/')[-1])} pieces, then copy"
    return f"UVA Triton kernel {label.split()[-1]}"


def render(records: list[dict[str, Any]]) -> str:
    recs = latest_session(records, lambda r: r.get("median_ms") is not None or r.get("status") == "skipped")
    # the last round's record of each (F, method, order)
    timed = list({(r["features"], r["label"], r["order"]): r for r in recs if r.get("median_ms") is not None}.values())
    if not timed:
        why = next((r["reason"] for r in recs if r.get("reason")), "no record")
        return f"{provenance(recs)}\n\nNot measured: {why}.\n"
    bulk = {r["features"]: r["gbps"] for r in timed if r["method"] == "bulk"}
    rows = [[r["features"], _method(r), r["order"], f"{r['median_ms']:.2f}", f"{r['gbps']:.2f}",
             f"{r['gbps'] / bulk[r['features']]:.2f}" if r["features"] in bulk else "-",
             "ok" if r.get("correct") else "**MISMATCH**"] for r in timed]
    r0 = timed[0]
    return (f"{provenance(recs)}\n\nThe latest run: {r0['rows']:,} of {r0['rows_total']:,} pinned float32 rows per "
            f"gather, median of {r0['reps']} after {r0['warmup']} warm-up; GB/s = payload rows x F x 4 / time; / bulk: "
            f"against the bulk copy of the same width.\n\n"
            f"{table(['F', 'method', 'ids', 'median ms', 'GB/s', '/ bulk', 'check'], rows)}\n")
