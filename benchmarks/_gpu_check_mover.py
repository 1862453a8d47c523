"""gpu-check step ``mover``: the offload engine's row mover (:class:`gnnscale.engines.core.mover.RowMover`), host to
device, in GB/s, against a plain copy of the same bytes from pinned memory (``Tensor.copy_``).

    PYTHONPATH=. python3 -m benchmarks._gpu_check_mover --device cuda --out mover.jsonl
    PYTHONPATH=. python3 -m benchmarks._gpu_check_mover --device sim:0 --rows-total 4096 ... # the dry run

A step of the GPU check (``benchmarks/_gpu_check.py``), not a benchmark of its own: its records go into the
check's ``steps.jsonl``.

One pinned host table of ``--rows-total`` rows of ``--features`` float32, moved in ``--pieces`` pieces of
``rows-total / pieces`` rows each way, median of ``--reps`` passes (after ``--warmup``), each pass timed from
its first issue to a device synchronisation:

* ``pinned copy``: ``dst.copy_(table[lo:hi], non_blocking=True)`` into preallocated device buffers: the link's
  rate, the baseline;
* ``mover slice``: :meth:`RowMover.slice` (contiguous row ranges) issued through :meth:`RowMover.prefetched`, as
  the offload engine loads its chunks: the copy stream, one event and two waits per piece;
* ``mover rows``: :meth:`RowMover.rows` of each piece's worth of random row ids (``--gather index_select``: a CPU
  gather into pinned staging and a copy; ``uva``: the Triton kernel reading pinned memory, when Triton is there),
  through ``prefetched`` as well: the halo rows of a chunk.

Every record: the method, bytes per pass, the median seconds, GB/s, the ratio to the pinned copy, the mover's own
byte count (equal to the bytes by construction: a check of its counters) and whether the moved rows are exact. On
the sim device (the dry run) the copies are deferred and read NaN until waited for, so the same code runs and the
checks still bite; its rates mean nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness.records import append_records
from gnnscale import runtime as rt
from gnnscale.engines.core.mover import RowMover
from gnnscale.store import triton_available


def timed(fn: Callable[[], list[torch.Tensor]], device: rt.Device, reps: int, warmup: int
          ) -> tuple[float, list[torch.Tensor]]:
    """Median seconds of ``fn`` (synchronised), and the last call's tensors."""
    times, out = [], []
    for i in range(warmup + reps):
        rt.synchronize(device)
        t0 = time.perf_counter()
        out = fn()
        rt.synchronize(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def measure(device: rt.Device, rows_total: int, features: int, pieces: int, reps: int, warmup: int,
            gathers: list[str], seed: int = 0) -> list[dict[str, Any]]:
    gen = torch.Generator().manual_seed(seed)
    host = rt.pinned_empty((rows_total, features), dtype=torch.float32, device=device)
    host.uniform_(generator=gen)
    step = rows_total // pieces
    ranges = [(i * step, (i + 1) * step) for i in range(pieces)]
    ids = [torch.randperm(rows_total, generator=gen)[:step] for _ in range(pieces)]
    nbytes = pieces * step * features * 4
    records: list[dict[str, Any]] = []

    def record(method: str, seconds: float, moved: int | None, exact: bool) -> None:
        base = records[0]["seconds"] if records else seconds
        records.append({"kind": "mover", "method": method, "device": rt.device_key(device),
                        "rows_total": rows_total, "features": features, "pieces": pieces, "bytes": nbytes,
                        "seconds": seconds, "gbps": nbytes / seconds / 1e9 if seconds > 0 else None,
                        "over_pinned_copy": base / seconds if seconds > 0 else None, "mover_bytes": moved,
                        "counted_ok": moved is None or moved == nbytes, "exact": exact})

    # the baseline: plain copies from pinned memory into buffers made beforehand
    dst = [rt.empty((step, features), dtype=torch.float32, device=device) for _ in ranges]

    def plain() -> list[torch.Tensor]:
        for buf, (lo, hi) in zip(dst, ranges, strict=True):
            rt.copy_async(buf, host[lo:hi])
        return dst

    seconds, out = timed(plain, device, reps, warmup)
    record("pinned copy", seconds, None, all(torch.equal(rt.to_host(o, blocking=True), host[lo:hi])
                                             for o, (lo, hi) in zip(out, ranges, strict=True)))

    for gather in ["slice", *gathers]:
        mover = RowMover(device, gather="index_select" if gather == "slice" else gather)
        if gather == "slice":
            def load(i: int, m: RowMover = mover) -> torch.Tensor:
                return m.slice(host, *ranges[i])
            want = [host[lo:hi] for lo, hi in ranges]
        else:
            dev_ids = [mover.gather_ids(r) for r in ids]
            mover.reset_counters()  # the UVA gather's ids are moved once, beforehand

            def load(i: int, m: RowMover = mover, d: list[Any] = dev_ids) -> torch.Tensor:
                return m.rows(host, ids[i], d[i])
            want = [host.index_select(0, r) for r in ids]

        def run(m: RowMover = mover, f: Callable[[int], torch.Tensor] = load) -> list[torch.Tensor]:
            m.reset_counters()
            with m.compute():
                return list(m.prefetched(f, pieces))  # each piece is handed out once its copy landed

        seconds, out = timed(run, device, reps, warmup)
        moved = sum(v for k, v in mover.moved.items() if k == "row")
        exact = all(torch.equal(rt.to_host(o, blocking=True), w) for o, w in zip(out, want, strict=True))
        record("mover slice" if gather == "slice" else f"mover rows ({gather})", seconds, moved, exact)
    return records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N, or sim:0 (the dry run)")
    ap.add_argument("--rows-total", type=int, default=2_000_000, help="rows of the pinned host table")
    ap.add_argument("--features", type=int, default=256, help="float32 features per row")
    ap.add_argument("--pieces", type=int, default=8, help="pieces (chunks) per pass")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--gather", default="auto", help="row gathers to time: auto (index_select, and uva when "
                    "Triton is there on CUDA), or a comma list")
    ap.add_argument("--out", type=Path, required=True, help="JSON Lines file to append to")
    args = ap.parse_args(argv)
    device = rt.resolve_device(args.device)
    if args.gather == "auto":
        gathers = ["index_select"]
        if not rt.is_sim(device) and rt.needs_pinning(device) and triton_available():
            gathers.append("uva")
    else:
        gathers = [g for g in args.gather.split(",") if g]
    records = measure(device, args.rows_total, args.features, args.pieces, args.reps, args.warmup, gathers)
    append_records(args.out, records)
    bad = 0
    for r in records:
        ok = r["exact"] and r["counted_ok"]
        bad += not ok
        print(f"{r['method']:<24} {r['seconds'] * 1e3:9.2f} ms  {r['gbps']:8.2f} GB/s  "
              f"{r['over_pinned_copy']:.2f}x the pinned copy  {'ok' if ok else 'WRONG'}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
