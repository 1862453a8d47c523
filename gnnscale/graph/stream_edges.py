"""Streaming convert of edge lists: ``gnnscale convert --dataset edgelist:FILE[:opts]`` writes the directory without
holding the graph in memory, byte for byte the one ``io.save(load_dataset(spec))`` writes (every option of
:func:`edgelist.read_edgelist`: ``keep_ids``, ``weight_column``, ``symmetrize``, ``coalesce``, a column-name header,
comments, ``# Nodes:``/``# Edges:`` headers), with the same notes and warnings on stderr.

Two passes over the edges. The first reads the text in blocks of whole lines (sized from ``host_memory``), parses
each with the reader's own column parser (:func:`edgelist.parse_block`), merges the blocks' distinct ids into one
sorted vertex-sized array, and appends the parsed ids (and float32 weights) to raw temporary files. The second
reads those back in blocks, renumbers the ids (``np.searchsorted`` into the distinct ids) and buckets the edges by
destination (:class:`stream.Buckets`; with ``symmetrize``, the reversed edges as a second side); each bucket is then
sorted and merged as ``Graph.from_edge_index`` and ``Graph.symmetrize`` do (duplicates, self-loops, weights), and
the features, labels and masks are drawn in row blocks (:func:`stream.write_drawn`). All temporary files live in
the output's partial folder: nothing is left on failure or Ctrl-C.

Resident memory: one text block (about ``_TEXT_BYTES`` per byte of text while it is parsed), the distinct ids
(8 bytes a vertex, and their merge's temporaries), then the blocks :func:`stream.plan_blocks` sizes. Where several
kinds of error are in one file, the streamed read names the first in the file's order (the in-memory read may name
another kind first); a file with one error gets the same message.
"""

from __future__ import annotations

import errno
import gzip
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from gnnscale.errors import DatasetError, GraphError
from gnnscale.graph import edgelist, io, stream
from gnnscale.graph.datasets import _options, _resolve, _split_arg, _take_feature_dtype
from gnnscale.graph.graph import MASK_NAMES, feature_dtype_name
from gnnscale.graph.graph import feature_dtype as graph_feature_dtype
from gnnscale.notes import note
from gnnscale.units import format_bytes

_TEXT_BYTES = 16  # resident bytes per character of a text block being parsed (its tokens as Python strings)
_MIN_TEXT = 1 << 16
_EDGE_BYTES = 112  # per edge of a pass-2 block: raw ids and weights, renumbered ids, keys, bucket order
_SORT_BYTES = 96  # per edge of a bucket being merged: keys, weights, torch's sort and its permutation, ranks


@dataclass(frozen=True)
class Spec:
    """An ``edgelist:FILE[:opts]`` spec as :func:`load_dataset` reads it: the file, ``read_edgelist``'s options, the
    features' dtype name and the spec recorded in ``meta.json``."""

    path: Path
    opts: dict[str, Any]
    dtype: str | None
    text: str


def edgelist_spec(spec: str, root: str | Path | None = None, seed: int = 0, keep_ids: bool = False,
                  feature_dtype: str | None = None) -> Spec | None:
    """The :class:`Spec` of an ``edgelist:`` spec (options, seed and ``keep_ids`` as :func:`load_dataset` reads
    them); ``None`` for any other spec."""
    spec, spec_dtype = _take_feature_dtype(spec.strip())
    kind, _, rest = spec.partition(":")
    if kind.lower() != "edgelist" or Path(spec).is_dir():
        return None
    arg, opt_text = _split_arg(rest)
    if not arg:
        raise DatasetError(f"dataset spec {spec!r} needs an argument: edgelist:<file>")
    name = feature_dtype if spec_dtype is None else spec_dtype
    try:
        graph_feature_dtype(name or "fp32")
    except GraphError as exc:
        raise DatasetError(str(exc)) from None
    opts = {"seed": seed, "keep_ids": keep_ids, **_options(edgelist.read_edgelist, opt_text)}
    return Spec(_resolve(arg, None if root is None else str(root)), opts, name, spec)


def is_streamable(spec: str) -> bool:
    """Whether ``spec`` is an ``edgelist:`` spec, which :func:`convert` writes block by block."""
    head = _take_feature_dtype(spec.strip())[0]
    return head.partition(":")[0].lower() == "edgelist" and not Path(head).is_dir()


def plan_text(budget: int) -> int:
    """Characters of text per first-pass block: a quarter of ``budget`` at ``_TEXT_BYTES`` per character."""
    return max(_MIN_TEXT, budget // 4 // _TEXT_BYTES)


def _text_blocks(path: Path, size: int) -> Iterator[tuple[str, int]]:
    """``(text, lines before it)``: blocks of about ``size`` characters of whole lines (newlines as text mode reads
    them); read errors are one :class:`DatasetError` naming the file."""
    with io.reading(path):
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as fh:  # type: ignore[operator]
            line = 0
            while True:
                text = fh.read(size)
                if not text:
                    return
                if not text.endswith("\n"):
                    text += fh.readline()
                yield text, line
                line += text.count("\n")


def _unique_sorted(parts: list[np.ndarray]) -> np.ndarray:
    """The distinct values of ``parts``, sorted (each part sorted: a stable sort merges the runs)."""
    a = np.concatenate(parts)
    a.sort(kind="stable")
    return a[np.concatenate(([True], a[1:] != a[:-1]))] if a.size else a


class _Distinct:
    """The distinct ids of the blocks added, as one sorted array: each block's sorted distinct ids are kept aside
    and merged into the array when they add up to its size (each id merged O(log) times, not once a block)."""

    def __init__(self) -> None:
        self.merged = np.zeros(0, dtype=np.int64)
        self.pending: list[np.ndarray] = []
        self.size = 0

    def add(self, ids: np.ndarray) -> None:
        block = _unique_sorted([np.sort(ids, axis=None)])
        self.pending.append(block)
        self.size += block.size
        if self.size - self.merged.size >= self.merged.size:
            self.ids()

    def ids(self) -> np.ndarray:
        if self.pending:
            self.merged = _unique_sorted([self.merged, *self.pending])
            self.pending, self.size = [], self.merged.size
        return self.merged


def _past_budget(budget: int, distinct: _Distinct) -> bool:
    """Whether the distinct ids so far surely leave ``budget`` too little for the blocks (:func:`stream.plan_blocks`):
    by a lower bound of their count (``size`` counts an id of several unmerged blocks more than once; merging
    them here would cost a pass over all ids per block). Past it, the first pass only counts the ids (beyond the
    budget, but 8 of the 40 bytes a vertex the writer would need), so that the refusal names the graph's vertex
    count and a budget that is enough."""
    least = max([distinct.merged.size, *(b.size for b in distinct.pending)])
    try:
        stream.plan_blocks(budget, least, 1, 1)
    except DatasetError:
        return True
    return False


class _Weights:
    """Running summary of the weights, for :func:`edgelist.ids_like`."""

    def __init__(self) -> None:
        self.integral, self.top, self.lo, self.hi = True, 0.0, np.inf, -np.inf

    def add(self, w: np.ndarray) -> None:
        if w.size == 0:
            return
        self.integral = self.integral and bool((w == np.round(w)).all())
        if self.integral:
            self.top = max(self.top, float(np.abs(w).max()))
        self.lo, self.hi = min(self.lo, float(w.min())), max(self.hi, float(w.max()))


@dataclass
class _Pass1:
    edges: int
    top: int
    uniq: np.ndarray | None  # the distinct ids, sorted (None with keep_ids)
    headers: edgelist.Headers


def _first_pass(spec: Spec, tmp: Path, budget: int, bar: tqdm) -> tuple[_Pass1, _Weights | None]:
    """Parse the file block by block into ``tmp/raw-src.bin``, ``raw-dst.bin`` (int64) and ``raw-w.bin`` (float32),
    merging the distinct ids; the reader's notes and errors, in its order."""
    path, weight_column = spec.path, int(spec.opts.get("weight_column", 0))
    keep_ids = bool(spec.opts.get("keep_ids", False))
    headers = edgelist.Headers()
    layout: edgelist.Layout | None = None
    seen_fields = False
    edges, top, over = 0, -1, False
    distinct = None if keep_ids else _Distinct()
    weights = _Weights() if weight_column else None
    with open(tmp / "raw-src.bin", "wb") as fs, open(tmp / "raw-dst.bin", "wb") as fd, \
            open(tmp / "raw-w.bin", "wb") as fw:
        for text, first_line in _text_blocks(path, plan_text(budget)):
            text, lines = edgelist._strip_comments(text)
            headers.read(lines)
            if "," in text:
                text = text.replace(",", " ")
            if not text.endswith("\n"):
                text += "\n"
            if not seen_fields:
                text, seen_fields = edgelist.skip_column_header(path, text, first_line)
            ids, w, layout = edgelist.parse_block(path, text, weight_column, first_line, layout)
            del text
            ids = stream._materialised(ids)
            if ids.shape[1]:
                edges += ids.shape[1]
                top = max(top, int(ids.max()))
                if not over:
                    fs.write(ids[0].tobytes())
                    fd.write(ids[1].tobytes())
                if distinct is not None:
                    distinct.add(ids)
                    over = over or _past_budget(budget, distinct)
                if w is not None and weights is not None:
                    weights.add(w)
                    fw.write(w.astype(np.float32).tobytes())
            bar.update()
    if layout is None:
        raise DatasetError(f"{path}: no edges found")
    if distinct is not None and over:  # refused with the graph's vertex count, not the count when the budget ran out
        stream.plan_blocks(budget, distinct.ids().size, 1, 1)
    return _Pass1(edges, top, None if distinct is None else distinct.ids(), headers), weights


def _distinct_weights(tmp: Path, lo: float, size: int, block: int) -> int:
    """How many distinct values the raw weights hold, for weights that are integers in ``lo..lo+size-1`` (so at
    most about 2e6 of them: a table of that size)."""
    seen = np.zeros(size, dtype=bool)
    raw = np.memmap(tmp / "raw-w.bin", dtype=np.float32, mode="r") if size else np.zeros(0, np.float32)
    for a in range(0, raw.shape[0], block):
        seen[(np.asarray(raw[a : a + block], dtype=np.float64) - lo).astype(np.int64)] = True
    del raw
    return int(seen.sum())


def _csr_merge(keys: np.ndarray, w: np.ndarray | None, coalesce: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """One side of a bucket sorted (and merged with ``coalesce``) exactly as ``graph.csr.coo_to_csr`` does: NumPy's
    sort without weights, else torch's stable sort, duplicates' weights summed by ``index_add_``."""
    if w is None:
        keys.sort()
        if coalesce and keys.size:
            keys = keys[np.concatenate(([True], keys[1:] != keys[:-1]))]
        return keys, None
    key, perm = torch.sort(torch.from_numpy(keys), stable=True)
    weight = torch.from_numpy(w)[perm]
    del perm
    if coalesce and key.numel():
        key, inverse = torch.unique_consecutive(key, return_inverse=True)
        merged = torch.zeros(key.numel(), dtype=weight.dtype)
        merged.index_add_(0, inverse, weight)
        weight = merged
    return key.numpy(), weight.numpy()


def _rank(keys: np.ndarray) -> np.ndarray:
    """For sorted ``keys``: how many equal keys precede each (``graph.csr.rank_in_run``)."""
    pos = np.arange(keys.size)
    start = np.ones(keys.size, dtype=bool)
    start[1:] = keys[1:] != keys[:-1]
    return pos - np.maximum.accumulate(np.where(start, pos, 0))


class _Merge:
    """A bucket's merge for the reader's options; counts the edges before symmetrising."""

    def __init__(self, coalesce: bool, symmetrize: bool):
        self.coalesce, self.symmetrize, self.listed = coalesce, symmetrize, 0

    def __call__(self, sides: list[tuple[np.ndarray, np.ndarray | None]]) -> tuple[np.ndarray, np.ndarray | None]:
        k0, w0 = _csr_merge(*sides[0], self.coalesce)
        self.listed += k0.size
        if not self.symmetrize:
            return k0, w0
        # Graph.symmetrize: copy r of u -> v is kept once if either direction has an r-th copy, the larger weight
        k1, w1 = _csr_merge(*sides[1], self.coalesce)
        k = np.concatenate([k0, k1])
        r = np.concatenate([_rank(k0), _rank(k1)])
        order = np.lexsort((r, k))
        k, r = k[order], r[order]
        first = np.ones(k.size, dtype=bool)
        first[1:] = (k[1:] != k[:-1]) | (r[1:] != r[:-1])
        w = None
        if w0 is not None and w1 is not None:
            w = np.concatenate([w0, w1])[order]
            w = np.maximum.reduceat(w, np.flatnonzero(first)) if w.size else w
        return k[first], w


def convert(spec: str, out: Path | str, *, host_memory: int, root: str | Path | None = None, seed: int = 0,
            keep_ids: bool = False, feature_dtype: str | None = None, show: bool = False) -> stream.Written:
    """Write the ``edgelist:`` spec ``spec`` to the new directory ``out`` block by block (see the module docstring),
    atomically, resident memory near ``host_memory`` bytes; a tqdm bar on stderr when ``show``."""
    parsed = edgelist_spec(spec, root, seed, keep_ids, feature_dtype)
    if parsed is None:
        raise DatasetError(f"{spec!r}: this streaming convert writes edgelist:<file> specs only")
    edgelist.check_weight_column(int(parsed.opts.get("weight_column", 0)))
    out = Path(out)
    if out.exists():
        raise DatasetError(f"output directory {out} already exists; choose a new path")
    if not out.parent.exists():
        raise DatasetError(f"parent directory {out.parent} does not exist")
    try:
        with io.partial_dir(out) as tmp, tqdm(total=None, desc="convert", unit="block", file=sys.stderr,
                                              disable=not show, leave=False) as bar:
            return _convert(parsed, out, tmp, host_memory, bar)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        raise DatasetError(f"not enough disk space in {out.parent} to convert {parsed.path.name}") from None


@dataclass(frozen=True)
class _Options:
    """The options of a spec that shape the output: made-up features and classes, weights, merging, dtype."""

    features: int
    classes: int
    weight_column: int
    coalesce: bool
    symmetrize: bool | None
    bf16: bool

    @classmethod
    def of(cls, spec: Spec) -> _Options:
        opts = spec.opts
        features, classes = int(opts.get("features", 64)), int(opts.get("classes", 16))
        weight_column, coalesce = int(opts.get("weight_column", 0)), bool(opts.get("coalesce", False))
        symmetrize: bool | None = opts.get("symmetrize")
        bf16 = graph_feature_dtype(spec.dtype or "fp32") == torch.bfloat16
        return cls(features, classes, weight_column, coalesce, symmetrize, bf16)


def _convert(spec: Spec, out: Path, tmp: Path, budget: int, bar: tqdm) -> stream.Written:
    o = _Options.of(spec)
    first, weights = _first_pass(spec, tmp, budget, bar)
    m = first.edges
    n, uniq = _vertex_count(spec, tmp, first, weights)
    blocks = _plan(spec, o, out, budget, n, m, uniq is not None, bar)
    if uniq is not None:
        np.save(tmp / "node_ids.npy", uniq)
    buckets = _bucket_pass(o, tmp, n, m, uniq, blocks, bar)
    del uniq
    num_edges, listed = _merge_pass(o, tmp, n, buckets, bar)
    return _finish(spec, o, tmp, n, num_edges, listed, first.headers, blocks, bar)


def _vertex_count(spec: Spec, tmp: Path, first: _Pass1, weights: _Weights | None) -> tuple[int, np.ndarray | None]:
    """After the first pass, the reader's checks and notes in its order; the vertex count and the distinct ids the
    edges are renumbered by (``None``: ids kept as they are). Drops ``first.uniq``."""
    path, opts = spec.path, spec.opts
    m = first.edges
    if weights is not None:
        distinct = lambda: _distinct_weights(tmp, weights.lo, m, 1 << 20)  # noqa: E731
        edgelist.warn_weights(path, int(opts.get("weight_column", 0)),
                              edgelist.ids_like(weights.integral, weights.top, weights.lo, weights.hi, m, distinct))
    first.headers.check_edges(path, m)
    nodes = first.headers.nodes
    n = edgelist.kept_count(path, first.top, nodes, bool(opts.get("keep_ids", False)))
    uniq = None
    if n is None:
        assert first.uniq is not None
        n = int(first.uniq.size)
        uniq = first.uniq if edgelist.renumbered(path, first.top, n, nodes) else None
    first.uniq = None
    return n, uniq


def _plan(spec: Spec, o: _Options, out: Path, budget: int, n: int, m: int, renumbered: bool,
          bar: tqdm) -> stream.Blocks:
    """The second pass's blocks for ``budget``; refused where the output's disk has too little room; the bar's
    total set."""
    features, classes, weight_column = o.features, o.classes, o.weight_column
    sides = 2 if o.symmetrize else 1
    blocks = stream.plan_blocks(budget, n, m, features, directions=sides, edge_bytes=_EDGE_BYTES,
                                sort_bytes=_SORT_BYTES)
    itemsize = 2 if o.bf16 else 4
    most = sides * m
    size = ((n + 1) * 8 + most * (8 + 4 * bool(weight_column)) + n * max(features, 0) * itemsize
            + (n * 8 + len(MASK_NAMES) * n) * (classes > 0) + n * 8 * renumbered)
    scratch = most * (8 + 4 * bool(weight_column))
    free = shutil.disk_usage(out.parent).free
    if free < size + scratch:
        raise DatasetError(f"not enough disk space in {out.parent}: converting {spec.path.name} needs up to "
                           f"{format_bytes(size + scratch)} ({format_bytes(size)} of output, "
                           f"{format_bytes(scratch)} of temporary buckets) and {format_bytes(free)} is free")
    bar.total = bar.n + -(-m // blocks.edges) + (2 + bool(weight_column)) * blocks.buckets
    bar.total += (features > 0) * -(-n // blocks.rows) + (classes > 0) * -(-n // blocks.rows)
    bar.refresh()
    return blocks


def _raw_paths(tmp: Path) -> dict[str, Path]:
    """The first pass's raw files: ids (``src``, ``dst``) and weights (``w``)."""
    return {name: tmp / f"raw-{name}.bin" for name in ("src", "dst", "w")}


def _bucket_pass(o: _Options, tmp: Path, n: int, m: int, uniq: np.ndarray | None, blocks: stream.Blocks,
                 bar: tqdm) -> stream.Buckets:
    """Read the raw files back in blocks, renumber the ids by ``uniq`` (unless ``None``) and bucket the edges by
    destination (with ``symmetrize``, the reversed edges as a second side)."""
    buckets = stream.Buckets(tmp, n, blocks.buckets, sides=2 if o.symmetrize else 1, weighted=bool(o.weight_column))
    raw = _raw_paths(tmp)
    for lo in range(0, m, blocks.edges):
        count = min(blocks.edges, m - lo)
        src = stream._materialised(np.fromfile(raw["src"], dtype=np.int64, count=count, offset=8 * lo))
        dst = stream._materialised(np.fromfile(raw["dst"], dtype=np.int64, count=count, offset=8 * lo))
        w = (stream._materialised(np.fromfile(raw["w"], dtype=np.float32, count=count, offset=4 * lo))
             if o.weight_column else None)
        if uniq is not None:
            src, dst = np.searchsorted(uniq, src), np.searchsorted(uniq, dst)
        buckets.add(dst, src, w)
        if o.symmetrize:
            buckets.add(src, dst, w, side=1)
        bar.update()
    return buckets


def _merge_pass(o: _Options, tmp: Path, n: int, buckets: stream.Buckets, bar: tqdm) -> tuple[int, int]:
    """Drop the raw files, merge each bucket and write ``indptr``, ``indices`` (and weights): ``(edges written,
    edges listed before symmetrising)``."""
    for p in _raw_paths(tmp).values():
        p.unlink()
    counts = np.zeros(n, dtype=np.int64)
    merge = _Merge(o.coalesce, bool(o.symmetrize))
    buckets.merge(merge, counts, bar)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    del counts
    np.save(tmp / "indptr.npy", indptr)
    del indptr
    return buckets.write(tmp, bar), merge.listed


def _finish(spec: Spec, o: _Options, tmp: Path, n: int, num_edges: int, listed: int, headers: edgelist.Headers,
            blocks: stream.Blocks, bar: tqdm) -> stream.Written:
    """The reader's notes, the drawn features, labels and masks, and ``meta.json``."""
    path, opts = spec.path, spec.opts
    features, classes, weight_column, bf16 = o.features, o.classes, o.weight_column, o.bf16
    meta: dict[str, Any] = {}
    made_up = (["features"] if features > 0 else []) + (["labels"] if classes > 0 else [])
    if made_up:
        meta["made_up"] = made_up
    if weight_column:
        meta["edge_weight"] = f"column {weight_column} of {path.name}"
    if o.symmetrize:
        meta["symmetrized_from_edges"] = listed
        note(f"symmetrised {path.name}: {listed:,} -> {num_edges:,} edges")
    else:
        headers.note_undirected(path, o.symmetrize)
    parts = (["features"] if features > 0 else []) + (["labels", "split"] if classes > 0 else [])
    if parts:
        meta["seed"] = int(opts["seed"])
        meta["generated"] = parts
    meta["spec"] = spec.text + ":feature_dtype=bf16" * (bf16 and features > 0)  # as load_dataset records it
    arrays: dict[str, Any] = {"indptr": {"dtype": "int64", "shape": [n + 1]},
                              "indices": {"dtype": "int64", "shape": [num_edges]}}
    if weight_column:
        arrays["edge_weight"] = {"dtype": "float32", "shape": [num_edges]}
    rng = np.random.default_rng(int(opts["seed"]))
    arrays |= stream.write_drawn(tmp, rng, n, max(features, 0), max(classes, 0), blocks.rows, bf16, bar)
    has_ids = (tmp / "node_ids.npy").exists()
    if has_ids:
        arrays["node_ids"] = {"dtype": "int64", "shape": [n]}
    dtype = None if features <= 0 else feature_dtype_name(torch.bfloat16 if bf16 else torch.float32)
    io.write_meta(tmp, name=path.name.split(".")[0], num_nodes=n, num_edges=num_edges,
                  num_classes=classes if classes > 0 else None, arrays=arrays, feature_dtype=dtype, meta=meta)
    nbytes = ((n + 1) * 8 + num_edges * (8 + 4 * bool(weight_column)) + n * max(features, 0) * (2 if bf16 else 4)
              + (n * 8 + len(MASK_NAMES) * n) * (classes > 0))
    return stream.Written(n, num_edges, nbytes, "" if features <= 0 else "bfloat16" if bf16 else "float32")
