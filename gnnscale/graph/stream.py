"""Streaming convert: write a converted directory (:mod:`gnnscale.graph.io`'s format) without holding the graph in
memory, for ``kronecker[:opts]`` specs.

Edges are generated a block at a time (:func:`generators.kronecker_edge_block`: the same seeded numbers as
:func:`generators.kronecker`), permuted, split by destination range into temporary bucket files in the output's
temporary folder, then each bucket is sorted, its duplicates merged, and appended to ``indices.npy``; features and
labels are drawn and written in row blocks. The directory is byte for byte the one ``io.save(load_dataset(spec))``
writes (``tests/test_stream_convert.py``). Resident memory: the blocks, sized from ``host_memory``, plus a few
vertex-sized arrays (the permutation, the degrees, labels' and masks' draws: about 40 bytes a vertex). Arrays are
written through file writes at their ``.npy`` offset (the file made by ``np.lib.format.open_memmap``), so the written
pages do not count as the process's resident memory.
"""

from __future__ import annotations

import copy
import inspect
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
from tqdm import tqdm

from gnnscale.errors import DatasetError
from gnnscale.graph import io
from gnnscale.graph.datasets import kronecker_spec
from gnnscale.graph.generators import check_kronecker, kronecker, kronecker_edge_block, random_split
from gnnscale.graph.graph import MASK_NAMES, feature_dtype_name
from gnnscale.graph.graph import feature_dtype as graph_feature_dtype
from gnnscale.units import format_bytes

_EDGE_BYTES = 96  # per generated edge of a block: uniforms, ids, permuted ids, keys, bucket order (with slack)
_SORT_BYTES = 40  # per edge of a bucket being sorted: keys, the merge's mask and copy, rows, columns
_VERTEX_BYTES = 40  # vertex-sized arrays held throughout: permutation, degrees, one label block's split draws
MIN_BLOCK_BYTES = 1 << 20


def _materialised(arr: np.ndarray) -> np.ndarray:
    """Every block the writer holds passes through here (tests wrap it to record the largest)."""
    return arr


@dataclass(frozen=True)
class Blocks:
    """How the writer cuts its work: generated edges per block, destination buckets, feature rows per block."""

    edges: int
    buckets: int
    rows: int


def plan_blocks(budget: int, nodes: int, edges: int, features: int) -> Blocks:
    """Block sizes that keep the writer's resident memory near ``budget`` bytes (the vertex-sized arrays first);
    DatasetError when ``budget`` cannot hold them and a 1 MiB block."""
    left = budget - _VERTEX_BYTES * nodes
    if left < MIN_BLOCK_BYTES:
        need = _VERTEX_BYTES * nodes + MIN_BLOCK_BYTES
        raise DatasetError(f"--host-memory {format_bytes(budget)} is too small to convert {nodes:,} vertices "
                           f"block by block: give at least {format_bytes(need)}")
    directed = 2 * edges
    buckets = max(1, -(-directed * _SORT_BYTES // left))
    return Blocks(edges=max(1, min(edges, left // _EDGE_BYTES)), buckets=min(buckets, nodes),
                  rows=max(1, min(nodes, left // (features * 4 * 3))))


def is_streamable(spec: str) -> bool:
    """Whether :func:`convert` writes ``spec`` block by block (``kronecker[:opts]``)."""
    return kronecker_spec(spec) is not None


def estimate_bytes(scale: int, edgefactor: int, features: int, itemsize: int) -> tuple[int, int]:
    """Upper bounds of the directory's bytes and of the temporary buckets' (both: every generated edge kept)."""
    n, m = 1 << scale, edgefactor << scale
    out = (n + 1) * 8 + 2 * m * 8 + n * features * itemsize + n * 8 + len(MASK_NAMES) * n
    return out, 2 * m * 8


@dataclass(frozen=True)
class Written:
    """What :func:`convert` wrote: vertices, edges, the arrays' bytes (as ``Graph.nbytes()['total']``), features'
    dtype."""

    nodes: int
    edges: int
    nbytes: int
    feature_dtype: str


def convert(spec: str, out: Path | str, *, host_memory: int, seed: int = 0, feature_dtype: str | None = None,
            show: bool = False) -> Written:
    """Write ``spec`` (a ``kronecker[:opts]`` spec, options and seed as :func:`load_dataset` reads them) to the new
    directory ``out``, atomically (a temporary sibling renamed at the end, removed on any failure or Ctrl-C), in
    blocks sized so that resident memory stays near ``host_memory`` bytes; a tqdm bar on stderr when ``show``."""
    parsed = kronecker_spec(spec, seed, feature_dtype)
    if parsed is None:
        raise DatasetError(f"{spec!r}: the streaming convert writes kronecker[:opts] specs only")
    opts, dtype_name = parsed
    full = {k: p.default for k, p in inspect.signature(kronecker).parameters.items()} | opts
    scale, edgefactor, features, classes = full["scale"], full["edgefactor"], full["features"], full["classes"]
    check_kronecker(scale, edgefactor, features, classes, full["train"], full["val"])
    bf16 = graph_feature_dtype(dtype_name) == torch.bfloat16
    out = Path(out)
    if out.exists():
        raise DatasetError(f"output directory {out} already exists; choose a new path")
    if not out.parent.exists():
        raise DatasetError(f"parent directory {out.parent} does not exist")
    size, scratch = estimate_bytes(scale, edgefactor, features, 2 if bf16 else 4)
    free = shutil.disk_usage(out.parent).free
    if free < size + scratch:
        raise DatasetError(f"not enough disk space in {out.parent}: converting {spec} needs up to "
                           f"{format_bytes(size + scratch)} ({format_bytes(size)} of output, "
                           f"{format_bytes(scratch)} of temporary buckets) and {format_bytes(free)} is free")
    n, m = 1 << scale, edgefactor << scale
    blocks = plan_blocks(host_memory, n, m, features)
    steps = -(-m // blocks.edges) + 2 * blocks.buckets + 2 * -(-n // blocks.rows)
    meta = {"made_up": ["features", "labels"],
            "spec": "kronecker:" + ",".join(f"{k}={v}" for k, v in sorted(opts.items())),
            "seed": int(opts["seed"]), "generated": ["graph", "features", "labels", "split"]}
    with io.partial_dir(out) as tmp, tqdm(total=steps, desc="convert", unit="block", file=sys.stderr,
                                          disable=not show, leave=False) as bar:
        start = np.random.default_rng(opts["seed"]).bit_generator
        after = copy.deepcopy(start)
        after.advance(scale * m)  # type: ignore[attr-defined]  # where kronecker's rng is after the R-MAT levels
        rng = np.random.Generator(after)
        perm = rng.permutation(n)
        counts = np.zeros(n, dtype=np.int64)
        num_edges = _write_edges(tmp, start, perm, scale, m, blocks, counts, bar)
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        del counts, perm
        np.save(tmp / "indptr.npy", indptr)
        del indptr
        arrays: dict[str, Any] = {"indptr": {"dtype": "int64", "shape": [n + 1]},
                                  "indices": {"dtype": "int64", "shape": [num_edges]}}
        xdtype = np.dtype(np.uint16 if bf16 else np.float32)
        with _npy(tmp / "x.npy", xdtype, (n, features)) as fh:
            for lo in range(0, n, blocks.rows):
                xb = _materialised(rng.standard_normal((min(n - lo, blocks.rows), features), dtype=np.float32))
                if bf16:
                    xb = torch.from_numpy(xb).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
                fh.write(xb.tobytes())
                bar.update()
        arrays["x"] = {"dtype": str(xdtype), "shape": [n, features]}
        with _npy(tmp / "y.npy", np.dtype(np.int64), (n,)) as fh:
            for lo in range(0, n, blocks.rows):
                fh.write(_materialised(rng.integers(0, classes, min(n - lo, blocks.rows))).tobytes())
                bar.update()
        arrays["y"] = {"dtype": "int64", "shape": [n]}
        split = (full["train"], full["val"], 1.0 - full["train"] - full["val"])
        for name, mask in zip(MASK_NAMES, random_split(n, split, rng), strict=True):
            np.save(tmp / f"{name}.npy", mask.numpy())
            arrays[name] = {"dtype": "bool", "shape": [n]}
        io.write_meta(tmp, name=f"kronecker-{scale}", num_nodes=n, num_edges=num_edges, num_classes=classes,
                      arrays=arrays, feature_dtype=feature_dtype_name(torch.bfloat16 if bf16 else torch.float32),
                      meta=meta)
    nbytes = (n + 1) * 8 + num_edges * 8 + n * features * xdtype.itemsize + n * 8 + len(MASK_NAMES) * n
    return Written(n, num_edges, nbytes, "bfloat16" if bf16 else "float32")


class _npy:
    """A new ``.npy`` file of ``dtype`` and ``shape`` (made by ``open_memmap``: the same header ``np.save``
    writes), opened for writing its data in order from the start."""

    def __init__(self, path: Path, dtype: np.dtype, shape: tuple[int, ...]):
        mm = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)
        self.offset = int(mm.offset)
        del mm
        self.path = path

    def __enter__(self) -> BinaryIO:
        self.fh: BinaryIO = open(self.path, "r+b")  # noqa: SIM115 (closed by __exit__)
        self.fh.seek(self.offset)
        return self.fh

    def __exit__(self, *exc: object) -> None:
        self.fh.close()


def _write_edges(tmp: Path, start: np.random.BitGenerator, perm: np.ndarray, scale: int, m: int, blocks: Blocks,
                 counts: np.ndarray, bar: tqdm) -> int:
    """Generate the edges into buckets by destination range, then sort and merge each bucket into
    ``indices.npy`` (in-neighbour CSR, as ``Graph.from_edge_index(..., coalesce=True)`` builds it); fills the
    in-degrees ``counts``; returns the number of edges."""
    n = perm.shape[0]
    rows_per = -(-n // blocks.buckets)
    paths = [tmp / f"bucket-{b}.bin" for b in range(blocks.buckets)]
    files = [open(p, "wb") for p in paths]  # noqa: SIM115 (closed below, the folder removed on failure)
    try:
        for lo in range(0, m, blocks.edges):
            s, d = kronecker_edge_block(start, scale, m, lo, min(m, lo + blocks.edges))
            s, d = perm[s], perm[d]
            keep = s != d
            s, d = s[keep], d[keep]
            for row, col in ((d, s), (s, d)):  # both directions: the graph is symmetric
                for b, keys in _bucketed(row, col, rows_per, n, blocks.buckets):
                    files[b].write(keys.tobytes())
            bar.update()
    finally:
        for f in files:
            f.close()
    sizes = []
    for b, p in enumerate(paths):  # sort and merge each bucket in place, counting its rows' degrees
        keys = _materialised(np.fromfile(p, dtype=np.int64))
        keys.sort()
        if keys.size:
            keys = keys[np.concatenate(([True], keys[1:] != keys[:-1]))]
        rows = keys // n
        lo = b * rows_per
        hi = min(n, lo + rows_per)
        counts[lo:hi] = np.bincount(rows, minlength=hi - lo)
        (keys - rows * n).tofile(p)
        sizes.append(keys.size)
        bar.update()
    with _npy(tmp / "indices.npy", np.dtype(np.int64), (sum(sizes),)) as fh:
        for p in paths:
            fh.write(_materialised(np.fromfile(p, dtype=np.int64)).tobytes())
            p.unlink()
            bar.update()
    return sum(sizes)


def _bucketed(row: np.ndarray, col: np.ndarray, rows_per: int, n: int, buckets: int
              ) -> Iterator[tuple[int, np.ndarray]]:
    """``(bucket, keys)`` for the edges ``col -> row``: key ``(row - bucket's first row) * n + col`` (int64)."""
    row = row.astype(np.int64, copy=False)
    b = row // rows_per
    keys = _materialised((row - b * rows_per) * n + col)
    if buckets == 1:
        yield 0, keys
        return
    order = np.argsort(b, kind="stable")
    keys = keys[order]
    cuts = np.searchsorted(b[order], np.arange(buckets + 1))
    for i in range(buckets):
        if cuts[i + 1] > cuts[i]:
            yield i, keys[cuts[i] : cuts[i + 1]]
