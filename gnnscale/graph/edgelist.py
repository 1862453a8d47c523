"""SNAP-style edge lists: ``src dst [more columns]`` per line, ``#``/``%`` comments, plain or gzip.

What the file means is decided by the caller's options, never by its comments: a header calling the graph
undirected gets a one-line note suggesting ``symmetrize=1`` but changes nothing, and a third column is read as
an edge weight only when ``weight_column`` names it (SNAP's temporal graphs put Unix timestamps there). A SNAP
count header (``# Nodes: N Edges: M``) is a check: a file that contradicts it is an error.

Vertex ids are renumbered ``0..n-1`` in ascending order when they are not already (raw SNAP ids, gaps), with a
note, and the original ids are kept in ``Graph.node_ids``; ``keep_ids=1`` (``--keep-ids``) keeps them as given.
"""

from __future__ import annotations

import gzip
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gnnscale.errors import DatasetError
from gnnscale.graph.generators import random_split
from gnnscale.graph.graph import Graph
from gnnscale.graph.io import reading, symmetrized
from gnnscale.notes import note, warn

_NODES_HEADER = re.compile(r"\bnodes:?\s*(\d[\d,]*)", re.IGNORECASE)
_EDGES_HEADER = re.compile(r"\bedges:?\s*(\d[\d,]*)", re.IGNORECASE)
_UNDIRECTED = re.compile(r"\bundirected\b", re.IGNORECASE)
_DIRECTED = re.compile(r"\bdirected\b", re.IGNORECASE)  # not "undirected": no word boundary inside it
# integer weights above this look like Unix timestamps or ids, not weights
_ID_LIKE = 1e6
# at least this many edges whose integer weights are exactly a run min..min+E-1 look like edge ids
_ID_RUN = 8
# bytes per vertex besides its features: label, masks, CSR row pointer, degree counts and temporaries
_VERTEX_BYTES = 40


def _strip_comments(text: str) -> tuple[str, list[str]]:
    """``(text with comments blanked, comment lines)``: a line starting with ``#`` or ``%`` is a comment line, and
    ``#`` starts a comment anywhere. Newlines are kept, so line numbers stay right. Scans with ``str.find`` (one
    Python step per comment, not per line)."""
    keep: list[str] = []
    headers: list[str] = []
    pos = 0
    for i in sorted(_find_all(text, "#") + _find_all(text, "%")):
        if i < pos:
            continue  # inside a comment already removed
        start = text.rfind("\n", 0, i) + 1
        if text[i] == "%" and start != i:
            continue  # '%' is a comment only at the start of a line
        end = text.find("\n", i)
        end = len(text) if end < 0 else end
        if start == i:
            headers.append(text[i:end])
        keep.append(text[pos:i])
        pos = end
    keep.append(text[pos:])
    return "".join(keep), headers


def _find_all(text: str, ch: str) -> list[int]:
    """Positions of ``ch`` in ``text``; for ``#``, only the first of each line (the rest is comment)."""
    out, i = [], text.find(ch)
    while i >= 0:
        out.append(i)
        i = text.find(ch, text.find("\n", i) + 1 or len(text)) if ch == "#" else text.find(ch, i + 1)
    return out


def _tokens_per_line(text: str) -> np.ndarray:
    """``[lines]`` number of whitespace-separated tokens on each line of ``text`` (which ends in ``\\n``),
    vectorised over the bytes (no Python loop per line)."""
    b = np.frombuffer(text.encode("utf-8", "replace"), dtype=np.uint8)
    space = b <= 32  # ASCII control characters and blank: what str.split() splits on, and a few it keeps
    starts = np.flatnonzero(~space[1:] & space[:-1]) + 1  # a token starts where a non-space follows a space
    if b.size and not space[0]:
        starts = np.concatenate([[0], starts])
    before = np.searchsorted(starts, np.flatnonzero(b == 10))  # tokens before each newline
    return np.diff(before, prepend=0)


def _bad_line(path: Path, text: str, i: int, why: str, first_line: int = 0) -> DatasetError:
    line = text.split("\n")[i]  # error path only
    return DatasetError(f"{path}: line {first_line + i + 1}: {why}: {line.strip()!r}")


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def _skip_column_header(path: Path, text: str) -> str:
    """``text`` with its first data line blanked when that line names columns (``src dst``, ``from,to,weight``:
    none of its first two fields is a number, as pandas' and PyG's CSV readers take a header), said in a note;
    otherwise ``text`` itself. Line numbers stay those of the file."""
    return skip_column_header(path, text)[0]


def skip_column_header(path: Path, text: str, first_line: int = 0) -> tuple[str, bool]:
    """:func:`_skip_column_header` for a block of whole lines that follows ``first_line`` lines of the file:
    ``(text, whether the block has a line with fields)``; a reader of blocks asks each block until one has."""
    pos = 0
    while pos < len(text):
        end = text.find("\n", pos)
        end = len(text) if end < 0 else end
        fields = text[pos:end].split()
        if fields:
            if len(fields) >= 2 and not any(_is_number(f) for f in fields[:2]):
                line = first_line + text.count("\n", 0, pos) + 1
                note(f"{path.name}: line {line} ({' '.join(fields)!r}) read as column names, not an edge")
                return text[:pos] + " " * (end - pos) + text[end:], True
            return text, True
        pos = end + 1
    return text, False


@dataclass(frozen=True)
class Layout:
    """The columns of an edge list: how many its first data line has, and that line's number (1-based)."""

    cols: int
    line: int


def _parse_columns(path: Path, text: str, weight_column: int) -> tuple[np.ndarray, np.ndarray | None]:
    """``([2, E] int64 ids, [E] float64 weights or None)`` from the data lines of an edge list (comments blanked,
    so line ``i`` of ``text`` is line ``i + 1`` of the file). Columns 1 and 2 are ``src dst``; column
    ``weight_column`` (1-based, 0: none) is the edge weight; any other column is ignored, with a note."""
    ids, w, layout = parse_block(path, text, weight_column)
    if layout is None:
        raise DatasetError(f"{path}: no edges found")
    return ids, w


def parse_block(path: Path, text: str, weight_column: int, first_line: int = 0, layout: Layout | None = None
                ) -> tuple[np.ndarray, np.ndarray | None, Layout | None]:
    """:func:`_parse_columns` for a block of whole lines (comments blanked, ending in a newline) that follows
    ``first_line`` lines of the file, whose earlier blocks set ``layout`` (``None``: no data line yet; the note on
    ignored columns comes with the first). Returns the block's ids and weights (none for a block without data
    lines) and the layout. Errors name the file's line numbers."""
    counts = _tokens_per_line(text)
    tokens = text.split()
    if counts.sum() != len(tokens):  # non-ASCII whitespace: count the slow way
        counts = np.array([len(ln.split()) for ln in text.split("\n")[:-1]], dtype=np.int64)
    data = np.flatnonzero(counts)
    if data.size == 0:
        return np.zeros((2, 0), dtype=np.int64), (np.zeros(0) if weight_column else None), layout
    if layout is None:
        cols = int(counts[data[0]])
        if cols < 2:
            raise _bad_line(path, text, int(data[0]), f"expected 'src dst' and optional more columns, got {cols} "
                            "column", first_line)
        layout = Layout(cols, first_line + int(data[0]) + 1)
        first = True
    else:
        cols, first = layout.cols, False
    odd = data[counts[data] != cols]
    if odd.size:
        i = int(odd[0])
        raise _bad_line(path, text, i, f"{int(counts[i])} columns where line {layout.line} has {cols}", first_line)
    if weight_column > cols:
        raise DatasetError(f"{path}: weight_column={weight_column} but the file has {cols} columns")
    ignored = [j for j in range(3, cols + 1) if j != weight_column]
    if ignored and first:
        which = f"column {ignored[0]}" if len(ignored) == 1 else f"columns {', '.join(map(str, ignored))}"
        hint = "" if weight_column else f"; add weight_column={ignored[0]} to the spec to read it as edge weights"
        note(f"{path.name} has {cols} columns: {which} ignored (not read as edge weights){hint}")

    def column(j: int, dtype: type, what: str) -> np.ndarray:
        try:
            return np.array(tokens[j::cols], dtype=dtype)
        except (ValueError, OverflowError):  # OverflowError: an id beyond int64
            for i in data:  # error path only: find the first bad line
                try:
                    np.array(text.split("\n")[i].split()[j], dtype=dtype)
                except ValueError:
                    raise _bad_line(path, text, int(i), what, first_line) from None
                except OverflowError:  # an id beyond int64
                    raise _bad_line(path, text, int(i), f"vertex id beyond int64 (at most {2**63 - 1})",
                                    first_line) from None
            raise

    ids = np.stack([column(0, np.int64, "non-integer vertex id"), column(1, np.int64, "non-integer vertex id")])
    w = None if not weight_column else column(weight_column - 1, np.float64, "non-numeric edge weight")
    if ids.min() < 0:
        i = int(data[int(np.flatnonzero((ids < 0).any(0))[0])])
        raise _bad_line(path, text, i, f"negative vertex id {ids.min()}", first_line)
    if w is not None and not np.isfinite(w).all():
        i = int(data[int(np.flatnonzero(~np.isfinite(w))[0])])
        raise _bad_line(path, text, i, "edge weight is NaN or inf", first_line)
    return ids, w, layout


def weights_look_like_ids(w: np.ndarray) -> str | None:
    """Why the weights ``w`` look like timestamps or ids rather than weights, or ``None``: all integers and
    either some beyond ``1e6`` in size (Unix timestamps, ids) or, with at least 8 edges, exactly the distinct
    integers ``min..min+E-1`` (edge ids, line numbers)."""
    if w.size == 0:
        return None
    integral = bool((w == np.round(w)).all())
    return ids_like(integral, float(np.abs(w).max()) if integral else 0.0, float(w.min()), float(w.max()),
                    int(w.size), lambda: int(np.unique(w).size))


def ids_like(integral: bool, top: float, lo: float, hi: float, size: int, distinct: Callable[[], int]
             ) -> str | None:
    """:func:`weights_look_like_ids` from the weights' summary: all integers, largest size, min, max, count, and a
    function counting the distinct values (called only when the others leave it open)."""
    if size == 0 or not integral:
        return None
    if top > _ID_LIKE:
        return f"integers up to {top:,.0f}"
    if size >= _ID_RUN and hi - lo == size - 1 and distinct() == size:
        return f"the distinct integers {lo:.0f}..{hi:.0f}, one per edge"
    return None


def warn_weights(path: Path, weight_column: int, why: str | None) -> None:
    """The one-line warning for weights that look like timestamps or ids (``why``; nothing when ``None``)."""
    if why is not None:
        warn(f"the edge weights in column {weight_column} of {path.name} look like timestamps or ids ({why}), "
             "not weights; check weight_column")


@dataclass
class Headers:
    """What an edge list's comment lines say: the largest ``Nodes:`` and ``Edges:`` counts, the first line calling
    the graph undirected, and whether any says directed."""

    nodes: int | None = None
    edges: int | None = None
    undirected: str | None = None
    directed: bool = False

    def read(self, lines: list[str]) -> None:
        for line in lines:
            n_h, e_h = _header_count(line, _NODES_HEADER), _header_count(line, _EDGES_HEADER)
            self.nodes = n_h if n_h is not None and (self.nodes is None or n_h > self.nodes) else self.nodes
            self.edges = e_h if e_h is not None and (self.edges is None or e_h > self.edges) else self.edges
            if self.undirected is None and _UNDIRECTED.search(line) is not None:
                self.undirected = line.strip()
            self.directed = self.directed or _DIRECTED.search(line) is not None

    def check_edges(self, path: Path, lines: int) -> None:
        """A ``# Edges:`` count that is not the number of edge lines is an error naming both."""
        if self.edges is not None and self.edges != lines:
            raise DatasetError(f"{path}: the header says {self.edges:,} edges but the file has {lines:,} edge "
                               "lines; fix or remove the header line (SNAP's Edges counts the lines)")

    def note_undirected(self, path: Path, symmetrize: bool | None) -> None:
        """Without ``symmetrize``, the note that a header line calls the graph undirected."""
        if self.undirected is not None and not self.directed and symmetrize is None:
            u = self.undirected
            shown = u if len(u) <= 60 else u[:57] + "..."
            note(f"a header line of {path.name} says 'undirected' ({shown!r}); its edges are loaded as listed, one "
                 "direction each: add symmetrize=1 to the spec to load both directions")


def check_weight_column(weight_column: int) -> None:
    if weight_column < 0 or weight_column in (1, 2):
        raise DatasetError(f"weight_column={weight_column}: columns 1 and 2 are the source and destination ids; "
                           "give the number of the weight column (3 or more), or 0 for no weights")


def _header_count(line: str, pattern: re.Pattern[str]) -> int | None:
    m = pattern.search(line)
    return None if m is None else int(m.group(1).replace(",", ""))


def _number_vertices(path: Path, ids: np.ndarray, nodes: int | None, keep_ids: bool) -> tuple[int, np.ndarray | None]:
    """``(vertex count, original ids or None)``; renumbers ``ids`` in place to ``0..n-1`` (ascending order of the
    original ids) unless they are kept: with ``keep_ids``, or when they already are ``0..n-1`` or fit the
    ``0..nodes-1`` of a ``# Nodes:`` header (whose vertices beyond them are isolated). A header ``nodes`` smaller
    than the distinct ids is an error naming both."""
    top = int(ids.max())
    kept = kept_count(path, top, nodes, keep_ids)
    if kept is not None:
        return kept, None
    if top < 4 * ids.size + 1024:  # ids of a moderate range: a table of the ids seen, O(E + max id)
        seen = np.zeros(top + 1, dtype=bool)
        seen[ids.ravel()] = True
        uniq = np.flatnonzero(seen)
        if uniq.size < top + 1:
            ids[...] = (np.cumsum(seen) - 1)[ids]
    else:  # raw ids far beyond the edge count (SNAP crawls): sort them
        uniq, inverse = np.unique(ids, return_inverse=True)
        ids[...] = inverse.reshape(ids.shape)
    k = int(uniq.size)
    if not renumbered(path, top, k, nodes):
        return k, None
    return k, uniq.astype(np.int64)


def kept_count(path: Path, top: int, nodes: int | None, keep_ids: bool) -> int | None:
    """The vertex count when the ids (largest ``top``) stay as given: with ``keep_ids`` (an error when beyond a
    ``# Nodes:`` header's count), or when they fit the header's ``0..nodes-1``; ``None`` when the distinct ids
    decide."""
    if keep_ids:
        if nodes is not None and top >= nodes:
            raise DatasetError(f"{path}: the header says {nodes:,} nodes but the file has vertex id {top:,}, beyond "
                               f"0..{nodes - 1:,} (ids kept as given); fix the header, or drop --keep-ids")
        return max(nodes or 0, top + 1)
    if nodes is not None and top < nodes:
        return nodes
    return None


def renumbered(path: Path, top: int, k: int, nodes: int | None) -> bool:
    """Whether ``k`` distinct ids, largest ``top``, are renumbered ``0..k-1`` (said in notes); a header's
    ``nodes`` below ``k`` is an error."""
    if nodes is not None and k > nodes:
        raise DatasetError(f"{path}: the header says {nodes:,} nodes but the file names {k:,} distinct vertex ids; "
                           "fix or remove the header line")
    if k == top + 1:
        return False
    note(f"remapped {k:,} vertex ids (max id {top:,}) to 0..{k - 1}; --keep-ids (keep_ids=1) keeps them")
    if nodes is not None and k < nodes:
        note(f"the header of {path.name} says {nodes:,} nodes; its edges name {k:,}: the other {nodes - k:,} (with "
             "no edges, ids unknown) are not in the file and left out")
    return True


def _check_memory(path: Path, n: int, features: int, keep_ids: bool) -> None:
    """A vertex count whose vertex data cannot fit in this machine's memory is one error (not an allocator
    traceback), naming what ``--keep-ids`` asked for."""
    need = n * (4 * max(features, 0) + _VERTEX_BYTES)
    try:
        have = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return
    if need > have:
        how = "the ids kept as given (--keep-ids)" if keep_ids else "the ids"
        raise DatasetError(f"{path}: {how} make {n:,} vertices, whose vertex data (about {need / 2**30:,.1f} GiB) "
                           f"exceeds this machine's memory ({have / 2**30:,.1f} GiB); without --keep-ids the "
                           "vertices are numbered 0..n-1")


def read_edgelist(
    path: Path | str,
    features: int = 64,
    classes: int = 16,
    seed: int = 0,
    symmetrize: bool | None = None,
    weight_column: int = 0,
    coalesce: bool = False,
    keep_ids: bool = False,
) -> Graph:
    """SNAP-style edge list (plain or .gz), read by column: ``#``/``%`` comment lines, then ``src dst`` and
    optionally more columns per line (0-based ids), separated by whitespace or commas; ``#`` starts a comment
    anywhere. Every data line must have the same number of columns (at least two); anything else is an error
    naming the line.

    What the file means is said by the options, never by its comments:

    * ``weight_column=K`` (1-based, ``K >= 3``) reads column ``K`` as the edge weights (``meta["edge_weight"]``
      says where they came from; weights that look like timestamps or ids get a one-line warning). Without it
      (``0``, the default) the graph is unweighted and any column past the second is ignored, with a one-line
      note: SNAP's temporal graphs put Unix timestamps in the third column.
    * ``symmetrize=1`` adds the reverse of every edge (as PyG's ``to_undirected``, but a pair listed both ways
      stays one pair and keeps the larger weight), said in a one-line note ``symmetrised FILE: E -> E' edges``.
      A header calling the graph undirected (SNAP's ``# Undirected graph: ...``; a header that also says
      *directed* does not count) only gets a note suggesting ``symmetrize=1``; without it each edge is loaded
      once, as listed.
    * ``coalesce=1`` merges an edge listed twice (summing weights); otherwise it is two edges (a multi-edge).

    Vertex ids: ids that are not ``0..n-1`` (raw SNAP ids up to tens of millions, gaps) are renumbered ``0..n-1``
    in ascending order, said in a one-line note, and the original ids kept in ``Graph.node_ids`` (saved by
    ``convert``, written by ``predict``); ``keep_ids=1`` keeps them as given (``max id + 1`` vertices).

    A SNAP count header ``# Nodes: N Edges: M`` is a check: ``M`` must be the number of edge lines (before
    ``symmetrize``), and the file may name at most ``N`` vertices; a contradiction is one error naming both
    numbers. Ids within ``0..N-1`` are kept, the header's vertices beyond them isolated.

    Features, labels and a 25/50/25 split are random and seeded, as for ``kronecker``; ``meta["made_up"]`` lists
    them (``features``, ``labels``), and training says so.
    """
    path = Path(path)
    check_weight_column(weight_column)
    headers = Headers()
    with reading(path):
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as fh:  # type: ignore[operator]
            text = fh.read()
        text, lines = _strip_comments(text)
        headers.read(lines)
        if "," in text:
            text = text.replace(",", " ")
        if not text.endswith("\n"):
            text += "\n"
        ids, w = _parse_columns(path, _skip_column_header(path, text), weight_column)
    if w is not None:
        warn_weights(path, weight_column, weights_look_like_ids(w))
    headers.check_edges(path, ids.shape[1])
    n, node_ids = _number_vertices(path, ids, headers.nodes, bool(keep_ids))
    _check_memory(path, n, features, bool(keep_ids))
    rng = np.random.default_rng(seed)
    try:
        x = rng.standard_normal((n, features), dtype=np.float32) if features > 0 else None
        y = torch.from_numpy(rng.integers(0, classes, n)) if classes > 0 else None
    except MemoryError:
        raise DatasetError(f"{path}: not enough memory for the made-up features of {n:,} vertices") from None
    masks = random_split(n, (0.25, 0.5, 0.25), rng) if y is not None else (None, None, None)
    made_up = (["features"] if x is not None else []) + (["labels"] if y is not None else [])
    meta: dict[str, object] = {"made_up": made_up} if made_up else {}
    if w is not None:
        meta["edge_weight"] = f"column {weight_column} of {path.name}"
    g = Graph.from_edge_index(
        ids,
        n,
        coalesce=coalesce,
        edge_weight=None if w is None else torch.from_numpy(w.astype(np.float32)),
        x=None if x is None else torch.from_numpy(x),
        y=y,
        train_mask=masks[0],
        val_mask=masks[1],
        test_mask=masks[2],
        num_classes=classes if classes > 0 else None,
        name=path.name.split(".")[0],
        meta=meta,
        node_ids=None if node_ids is None else torch.from_numpy(node_ids),
    )
    if symmetrize:
        return symmetrized(g, path.name)
    headers.note_undirected(path, symmetrize)
    return g
