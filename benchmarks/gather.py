"""Host -> GPU row gathers: bulk copy vs CPU index_select + staging vs the zero-copy (UVA) Triton kernel.

    PYTHONPATH=. python3 benchmarks/gather.py
    PYTHONPATH=. python3 benchmarks/gather.py --rows-total 4000000 --rows 500000 --features 128 --reps 5
    PYTHONPATH=. python3 benchmarks/gather.py --uva-configs 32x128x4,64x128x8,16x256x4 --out /tmp/g.jsonl

A pinned host tensor ``[--rows-total, F]`` float32 (F from ``--features``) and ``--rows`` distinct random row ids,
once in random order and once sorted ascending (what the offload engine passes). Methods, all writing one
``[rows, F]`` device buffer:

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
One JSON line per (F, method, order, config) is appended to ``--out``. Without CUDA it prints why and exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from gnnscale.store import gather_rows, triton_available
from gnnscale.store.gather import _gather_uva, _uva_blocks

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "gather.jsonl"
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


def environment() -> dict[str, Any]:
    """What the numbers depend on: date, GPU, host, versions and the gnnscale git revision."""
    rev = None
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        cmd = ["git", "-C", str(Path(__file__).resolve().parent), "describe", "--always", "--dirty"]
        rev = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()
    triton_version = None
    if triton_available():
        import triton

        triton_version = triton.__version__
    return {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "device": "cuda",
            "device_name": torch.cuda.get_device_name(), "host": f"{platform.processor() or 'cpu'} "
            f"({os.cpu_count()} cores, {torch.get_num_threads()} torch threads)", "torch": torch.__version__,
            "cuda": torch.version.cuda, "triton": triton_version, "gnnscale_rev": rev}


def bench_width(f: int, args: argparse.Namespace, orders: dict[str, Tensor], configs: list[tuple[int, int, int]],
                dev: torch.device, common: dict[str, Any]) -> list[dict[str, Any]]:
    """Time every (method, order) for feature width ``f``; print a table, return one record per case."""
    host = make_host(args.rows_total, f)  # [N, F] pinned
    out = torch.empty(args.rows, f, dtype=torch.float32, device=dev)  # [rows, F]
    payload = args.rows * f * 4
    print(f"\nF={f}: host {host.numel() * 4 / 2**30:.1f} GiB pinned, payload {payload / 2**20:.0f} MiB")
    print(f"  {'method':<28}{'order':<8}{'median ms':>11}{'GB/s':>9}{'min ms':>9}{'max ms':>9}  check")

    # (label, order, extra record fields, call, ids or None for the bulk copy)
    cases: list[tuple[str, str, dict[str, Any], Callable[[], object], Tensor | None]] = []
    cases.append(("bulk", "-", {}, lambda: out.copy_(host[: args.rows], non_blocking=True), None))
    pipe = PipelinedIndexSelect(host, args.rows, args.pieces)
    for order, idx in orders.items():
        cases.append((f"index_select/{args.pieces}", order, {"pieces": args.pieces},
                      lambda idx=idx: pipe(idx, out), idx))
    if triton_available():
        r0, f0 = _uva_blocks(f)
        for order, idx in orders.items():
            idx_dev = idx.to(dev)
            cases.append((f"uva {r0}x{f0}x4", order, {"block_r": r0, "block_f": f0, "num_warps": 4},
                          lambda i=idx_dev: gather_rows(host, i, out, method="uva"), idx))
            for r, bf, w in configs:
                cases.append((f"uva {r}x{bf}x{w}", order, {"block_r": r, "block_f": bf, "num_warps": w},
                              lambda i=idx_dev, r=r, bf=bf, w=w: _gather_uva(host, i, out, r, bf, w), idx))

    records = []
    for label, order, extra, fn, idx in cases:
        out.fill_(float("nan"))
        ms = time_cuda(fn, args.reps, args.warmup)
        ref = host[: args.rows] if idx is None else host.index_select(0, idx)  # [rows, F]
        ok = torch.equal(out.cpu().view(torch.int32), ref.view(torch.int32))  # bit-exact
        med = statistics.median(ms)
        gbps = payload / (med / 1e3) / 1e9
        print(f"  {label:<28}{order:<8}{med:>11.2f}{gbps:>9.2f}{min(ms):>9.2f}{max(ms):>9.2f}  "
              f"{'ok' if ok else 'MISMATCH'}")
        records.append({**common, "bench": "gather", "method": label.split()[0].split("/")[0], "label": label,
                        "order": order, "features": f, "rows": args.rows, "rows_total": args.rows_total,
                        "dtype": "float32", "payload_bytes": payload, "median_ms": med, "gbps": gbps,
                        "times_ms": ms, "reps": args.reps, "warmup": args.warmup, "correct": ok, **extra})
    return records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows-total", type=int, default=16_000_000, help="rows of the pinned host tensor")
    ap.add_argument("--rows", type=int, default=2_000_000, help="distinct rows gathered per call")
    ap.add_argument("--features", default="100,128,256", help="comma-separated feature widths F (float32)")
    ap.add_argument("--reps", type=int, default=10, help="timed repetitions (median reported)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed repetitions first (Triton compiles here)")
    ap.add_argument("--pieces", type=int, default=8, help="pipeline pieces of the index_select path")
    ap.add_argument("--uva-configs", default="", help="extra uva tilings BLOCK_RxBLOCK_FxWARPS, comma-separated")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON Lines file to append to")
    ap.add_argument("--no-save", action="store_true", help="print the table only")
    args = ap.parse_args(argv)

    if not torch.cuda.is_available():
        print("benchmarks/gather.py needs CUDA: it measures host -> GPU gathers; no GPU here, nothing to do.")
        return 0
    if not 0 < args.rows <= args.rows_total:
        raise SystemExit("--rows must be in [1, --rows-total]")
    features = [int(f) for f in args.features.split(",") if f.strip()]
    configs = parse_configs(args.uva_configs)
    dev = torch.device("cuda", torch.cuda.current_device())
    common = environment()
    print(f"{common['device_name']}, host {common['host']}; torch {common['torch']} (CUDA {common['cuda']}), "
          f"triton {common['triton']}, gnnscale {common['gnnscale_rev']}")
    print(f"gather {args.rows:,} of {args.rows_total:,} pinned float32 rows; median of {args.reps} after "
          f"{args.warmup} warm-up; GB/s = payload rows*F*4 / time")
    if not triton_available():
        print("triton is not importable: the uva rows are skipped (pip install triton)")

    g = torch.Generator().manual_seed(args.seed)
    perm = torch.randperm(args.rows_total, generator=g)[: args.rows]  # [rows] int64, distinct
    orders = {"random": perm, "sorted": perm.sort().values}
    records: list[dict[str, Any]] = []
    for f in features:
        records += bench_width(f, args, orders, configs, dev, common)
        torch.cuda.empty_cache()
        with contextlib.suppress(AttributeError):  # give the cached pinned blocks back (a private torch API)
            torch._C._host_emptyCache()

    if not args.no_save and records:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("a") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in records)
        print(f"\nappended {len(records)} records to {args.out}")
    return 0 if all(r["correct"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
