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

The bucketing (:class:`Buckets`), the block plan (:func:`plan_blocks`), the row-block draws (:func:`write_drawn`) and
the ``.npy`` writer (:class:`NpyFile`) are shared with :mod:`gnnscale.graph.stream_edges`, the edge lists' streaming
convert; every block either holds passes through :func:`_materialised`.
"""

from __future__ import annotations

import copy
import inspect
import shutil
import sys
from collections.abc import Callable, Iterator
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
from gnnscale.units import format_bytes, format_bytes_up

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


def plan_blocks(budget: int, nodes: int, edges: int, features: int, *, directions: int = 2,
                edge_bytes: int = _EDGE_BYTES, sort_bytes: int = _SORT_BYTES) -> Blocks:
    """Block sizes that keep the writer's resident memory near ``budget`` bytes (the vertex-sized arrays first)
    for ``edges`` input edges, each kept in ``directions`` directions, at ``edge_bytes`` per edge of a block and
    ``sort_bytes`` per edge of a bucket; DatasetError when ``budget`` cannot hold them and a 1 MiB block."""
    left = budget - _VERTEX_BYTES * nodes
    if left < MIN_BLOCK_BYTES:
        need = _VERTEX_BYTES * nodes + MIN_BLOCK_BYTES
        raise DatasetError(f"--host-memory {format_bytes(budget)} is too small to convert {nodes:,} vertices "
                           f"block by block: give at least {format_bytes_up(need)}")
    directed = directions * edges
    buckets = max(1, -(-directed * sort_bytes // left))
    return Blocks(edges=max(1, min(edges, left // edge_bytes)), buckets=max(1, min(buckets, nodes)),
                  rows=max(1, min(nodes, left // (max(features, 1) * 4 * 3))))


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
    dtype (empty without features)."""

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
    test = check_kronecker(scale, edgefactor, features, classes, full["train"], full["val"], full["test"])
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
            "spec": "kronecker:" + ",".join(f"{k}={v}" for k, v in sorted(opts.items()))
            + ":feature_dtype=bf16" * bf16,  # as load_dataset records it
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
        arrays |= write_drawn(tmp, rng, n, features, classes, blocks.rows, bf16, bar,
                              split=(full["train"], full["val"], test))
        io.write_meta(tmp, name=f"kronecker-{scale}", num_nodes=n, num_edges=num_edges, num_classes=classes,
                      arrays=arrays, feature_dtype=feature_dtype_name(torch.bfloat16 if bf16 else torch.float32),
                      meta=meta)
    nbytes = (n + 1) * 8 + num_edges * 8 + n * features * (2 if bf16 else 4) + n * 8 + len(MASK_NAMES) * n
    return Written(n, num_edges, nbytes, "bfloat16" if bf16 else "float32")


def write_drawn(tmp: Path, rng: np.random.Generator, n: int, features: int, classes: int, rows: int, bf16: bool,
                bar: tqdm, split: tuple[float, float, float] = (0.25, 0.5, 0.25)) -> dict[str, Any]:
    """Draw and write, in blocks of ``rows`` rows, what the in-memory readers draw with ``rng`` in this order:
    ``x.npy`` (``features`` standard normal float32 columns, stored as bfloat16 bits when ``bf16``; none when 0),
    ``y.npy`` (labels below ``classes``; none when 0) and the ``split`` fractions' masks (with the labels); returns
    their ``arrays`` entries for ``meta.json``."""
    arrays: dict[str, Any] = {}
    if features > 0:
        xdtype = np.dtype(np.uint16 if bf16 else np.float32)
        with NpyFile(tmp / "x.npy", xdtype, (n, features)) as fh:
            for lo in range(0, n, rows):
                xb = _materialised(rng.standard_normal((min(n - lo, rows), features), dtype=np.float32))
                if bf16:
                    xb = torch.from_numpy(xb).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
                fh.write(xb.tobytes())
                bar.update()
        arrays["x"] = {"dtype": str(xdtype), "shape": [n, features]}
    if classes > 0:
        with NpyFile(tmp / "y.npy", np.dtype(np.int64), (n,)) as fh:
            for lo in range(0, n, rows):
                fh.write(_materialised(rng.integers(0, classes, min(n - lo, rows))).tobytes())
                bar.update()
        arrays["y"] = {"dtype": "int64", "shape": [n]}
        for name, mask in zip(MASK_NAMES, random_split(n, split, rng), strict=True):
            np.save(tmp / f"{name}.npy", mask.numpy())
            arrays[name] = {"dtype": "bool", "shape": [n]}
    return arrays


class NpyFile:
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
    buckets = Buckets(tmp, n, blocks.buckets)
    for lo in range(0, m, blocks.edges):
        s, d = kronecker_edge_block(start, scale, m, lo, min(m, lo + blocks.edges))
        s, d = perm[s], perm[d]
        keep = s != d
        s, d = s[keep], d[keep]
        for row, col in ((d, s), (s, d)):  # both directions: the graph is symmetric
            buckets.add(row, col)
        bar.update()
    buckets.merge(_sorted_unique, counts, bar)
    return buckets.write(tmp, bar)


def _sorted_unique(sides: list[tuple[np.ndarray, np.ndarray | None]]) -> tuple[np.ndarray, np.ndarray | None]:
    keys = sides[0][0]
    keys.sort()
    if keys.size:
        keys = keys[np.concatenate(([True], keys[1:] != keys[:-1]))]
    return keys, None


Merge = Callable[[list[tuple[np.ndarray, np.ndarray | None]]], tuple[np.ndarray, np.ndarray | None]]


class Buckets:
    """Edges ``col -> row`` bucketed by destination range into temporary files of ``folder``, in the order added:
    per bucket and side (``sides``: groups a merge tells apart, e.g. the listed and the reversed edges), a file of
    keys (int64 ``(row - bucket's first row) * n + col``) and, when ``weighted``, one of float32 weights. Then
    :meth:`merge` sorts and merges each bucket (the writer holds one bucket at a time) and :meth:`write` appends
    them to ``indices.npy`` (and ``edge_weight.npy``)."""

    def __init__(self, folder: Path, n: int, count: int, sides: int = 1, weighted: bool = False):
        self.n, self.count, self.sides, self.weighted = n, count, sides, weighted
        self.rows_per = -(-n // count) if n else 1
        self.keys = [[folder / f"bucket-{b}-{s}.bin" for s in range(sides)] for b in range(count)]
        self.weights = [[p.with_suffix(".w") for p in side] for side in self.keys]
        for side in self.keys + (self.weights if weighted else []):
            for p in side:
                p.touch()
        self.sizes = [0] * count

    def add(self, row: np.ndarray, col: np.ndarray, weight: np.ndarray | None = None, side: int = 0) -> None:
        """Append the edges ``col[i] -> row[i]`` (weights ``weight``, float32) to their buckets' files of ``side``."""
        for b, keys, w in _bucketed(row, col, self.rows_per, self.n, self.count, weight):
            with open(self.keys[b][side], "ab") as fh:
                fh.write(keys.tobytes())
            if w is not None:
                with open(self.weights[b][side], "ab") as fh:
                    fh.write(w.astype(np.float32, copy=False).tobytes())

    def load(self, b: int) -> list[tuple[np.ndarray, np.ndarray | None]]:
        """Bucket ``b``'s ``(keys, weights or None)`` per side, in the order added."""
        return [(_materialised(np.fromfile(k, dtype=np.int64)),
                 _materialised(np.fromfile(w, dtype=np.float32)) if self.weighted else None)
                for k, w in zip(self.keys[b], self.weights[b], strict=True)]

    def merge(self, fn: Merge, counts: np.ndarray, bar: tqdm) -> None:
        """Replace each bucket by ``fn(its sides)`` (sorted keys and their weights): its columns (and weights) in
        side 0's files, the other sides' removed; fills the rows' in-degrees ``counts``."""
        for b in range(self.count):
            keys, w = fn(self.load(b))
            rows = keys // self.n
            lo = b * self.rows_per
            hi = min(self.n, lo + self.rows_per)
            counts[lo:hi] = np.bincount(rows, minlength=hi - lo)
            (keys - rows * self.n).tofile(self.keys[b][0])
            if w is not None:
                w.astype(np.float32, copy=False).tofile(self.weights[b][0])
            for s in range(1, self.sides):
                self.keys[b][s].unlink()
                self.weights[b][s].unlink(missing_ok=True)
            self.sizes[b] = keys.size
            bar.update()

    def write(self, folder: Path, bar: tqdm) -> int:
        """Append the merged buckets to ``folder/indices.npy`` (and ``edge_weight.npy`` when weighted), removing
        their files; returns the number of edges."""
        total = sum(self.sizes)
        outs: list[tuple[str, list[list[Path]], np.dtype[Any]]] = [("indices", self.keys, np.dtype(np.int64))]
        outs += [("edge_weight", self.weights, np.dtype(np.float32))] if self.weighted else []
        for name, paths, dtype in outs:
            with NpyFile(folder / f"{name}.npy", dtype, (total,)) as fh:
                for side in paths:
                    fh.write(_materialised(np.fromfile(side[0], dtype=dtype)).tobytes())
                    side[0].unlink()
                    bar.update()
        return total


def _bucketed(row: np.ndarray, col: np.ndarray, rows_per: int, n: int, buckets: int,
              weight: np.ndarray | None = None) -> Iterator[tuple[int, np.ndarray, np.ndarray | None]]:
    """``(bucket, keys, weights)`` for the edges ``col -> row``: key ``(row - bucket's first row) * n + col``
    (int64), in the order given within each bucket."""
    row = row.astype(np.int64, copy=False)
    b = row // rows_per
    keys = _materialised((row - b * rows_per) * n + col)
    if buckets == 1:
        yield 0, keys, weight
        return
    order = _materialised(np.argsort(b, kind="stable"))
    keys = keys[order]
    w = None if weight is None else weight[order]
    cuts = np.searchsorted(b[order], np.arange(buckets + 1))
    for i in range(buckets):
        if cuts[i + 1] > cuts[i]:
            yield i, keys[cuts[i] : cuts[i + 1]], None if w is None else w[cuts[i] : cuts[i + 1]]
