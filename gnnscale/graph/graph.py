"""The one Graph type of gnnscale: in-neighbour CSR topology plus vertex data.

Convention: edge ``u -> v`` means ``v`` aggregates ``u`` (PyG's ``source_to_target`` flow). The CSR is indexed by
destination: the in-neighbours of ``v`` are ``indices[indptr[v]:indptr[v+1]]``. Every engine reads this one type.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
from torch import Tensor

from gnnscale._compat import require
from gnnscale.errors import GraphError
from gnnscale.graph.csr import coo_to_csr, csr_rows, rank_in_run
from gnnscale.graph.mapped import mapped_file, release_pages
from gnnscale.graph.pyg_data import MASK_NAMES, pyg_arguments, vertex_data

# The feature dtypes a Graph holds, by the names meta.json, ``--feature-dtype`` and the ``feature_dtype`` dataset
# option use (``bf16`` and ``fp32`` are accepted too: :func:`feature_dtype`).
FEATURE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_FEATURE_DTYPE_ALIASES = {"fp32": "float32", "f32": "float32", "bf16": "bfloat16"}
# NaN/inf checks read features in slabs of this many rows, so a memory-mapped matrix is never loaded whole.
_CHECK_ROWS = 1 << 16
_CHECK_BYTES = 4 << 20
# degree and self-loop statistics read the edges in slabs of this many
_STAT_EDGES = 1 << 22


PROVENANCE = ("spec", "converted_from")
"""The keys of ``Graph.meta`` that say where the data was loaded from, not what it is."""


@dataclass(eq=False)
class Graph:
    """A graph in in-neighbour CSR with float32 features, integer labels and train/val/test masks.

    Construct with :meth:`from_edge_index`, :meth:`from_scipy` or :meth:`from_pyg` rather than directly; the
    constructor validates whatever it is given and raises :class:`~gnnscale.errors.GraphError` on bad input.

    Duplicate edges: every entry point keeps multi-edges as given (an edge listed three times is three in-edges,
    as in PyG's ``edge_index``) unless asked to ``coalesce``; :meth:`stats` counts them (``duplicate_edges``).
    """

    indptr: Tensor
    """``[num_nodes + 1]`` int64 row pointers, indexed by destination vertex."""
    indices: Tensor
    """``[num_edges]`` int64 or int32 source vertex of each in-edge."""
    x: Tensor | None = None
    """``[num_nodes, num_features]`` float32 features, or bfloat16 ones (half the bytes on disk, in host memory and
    on the bus; every engine upcasts them to float32 for the model); may be backed by a memory-mapped file."""
    y: Tensor | None = None
    """``[num_nodes]`` int64 labels in ``[0, num_classes)``, or ``-1`` for an unlabelled vertex (the OGB/PyG
    convention), allowed only outside every mask."""
    train_mask: Tensor | None = None
    val_mask: Tensor | None = None
    test_mask: Tensor | None = None
    edge_weight: Tensor | None = None
    """``[num_edges]`` float32 weight of each in-edge, in CSR order; ``None`` means all ones."""
    name: str = "graph"
    num_classes: int | None = None
    """Number of classes; inferred as ``y.max() + 1`` when omitted (so ``-1`` labels do not count)."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Free-form provenance (dataset spec, generator parameters); saved by :func:`gnnscale.graph.io.save`."""
    node_ids: Tensor | None = None
    """``[num_nodes]`` int64 original id of each vertex, where a reader renumbered them to ``0..n-1`` (an edge
    list's raw ids, in ascending order); ``None``: the vertices' ids are ``0..n-1``."""

    def __post_init__(self) -> None:
        if self.y is not None and self.num_classes is None and self.y.numel() > 0:
            self.num_classes = int(self.y.max()) + 1
        self.validate()

    # ------------------------------------------------------------------ sizes
    @property
    def class_names(self) -> list[str] | None:
        """The name of each class (``class_names[c]``) when the labels were given as strings; else ``None``."""
        names = self.meta.get("class_names")
        return None if names is None else list(names)

    @property
    def num_nodes(self) -> int:
        return int(self.indptr.numel()) - 1

    @property
    def num_edges(self) -> int:
        return int(self.indices.numel())

    @property
    def num_features(self) -> int:
        return 0 if self.x is None else int(self.x.shape[1])

    def in_degree(self) -> Tensor:
        """``[num_nodes]`` number of in-edges of each vertex."""
        return self.indptr[1:] - self.indptr[:-1]

    def out_degree(self) -> Tensor:
        """``[num_nodes]`` number of out-edges of each vertex (read in slabs of edges: a memory-mapped graph is
        never loaded whole)."""
        out = torch.zeros(self.num_nodes, dtype=torch.int64)
        for lo in range(0, self.num_edges, _STAT_EDGES):
            out += torch.bincount(self.indices[lo : lo + _STAT_EDGES].long(), minlength=self.num_nodes)
        return out

    def num_self_loops(self) -> int:
        """Edges ``v -> v``, counted in slabs of edges (no ``[num_edges]`` temporary)."""
        loops = 0
        for lo in range(0, self.num_edges, _STAT_EDGES):
            idx = self.indices[lo : lo + _STAT_EDGES].long()
            dst = torch.searchsorted(self.indptr, torch.arange(lo, lo + idx.numel()), right=True) - 1
            loops += int((idx == dst).sum())
        return loops

    def dst_index(self) -> Tensor:
        """``[num_edges]`` destination vertex of each edge, in CSR order."""
        return csr_rows(self.indptr)

    def edge_index(self) -> Tensor:
        """``[2, num_edges]`` COO edges ``(source, destination)`` in CSR order, PyG's convention."""
        return torch.stack([self.indices.long(), self.dst_index()])

    # ------------------------------------------------------------ validation
    def validate(self) -> None:
        """Check every invariant; raise :class:`GraphError` naming the first one broken."""
        ip, ind = self.indptr, self.indices
        if ip.dim() != 1 or ip.numel() < 1:
            raise GraphError("indptr must be a 1-D tensor of length num_nodes + 1")
        if ip.dtype != torch.int64:
            raise GraphError(f"indptr must be int64, got {ip.dtype}")
        if ind.dim() != 1 or ind.dtype not in (torch.int64, torch.int32):
            raise GraphError(f"indices must be a 1-D int64 or int32 tensor, got {ind.dtype} {tuple(ind.shape)}")
        n = self.num_nodes
        if n == 0:
            raise GraphError("the graph is empty (0 vertices)")
        if int(ip[0]) != 0 or int(ip[-1]) != ind.numel():
            raise GraphError(f"indptr must run from 0 to num_edges={ind.numel()}, got {int(ip[0])}..{int(ip[-1])}")
        if n > 1 and bool((ip[1:] < ip[:-1]).any()):
            raise GraphError("indptr must be non-decreasing")
        if ind.numel():
            lo, hi = int(ind.min()), int(ind.max())
            if lo < 0:
                raise GraphError(f"negative vertex id {lo} in edges")
            if hi >= n:
                raise GraphError(f"vertex id {hi} in edges is out of range for {n} vertices")
        if self.edge_weight is not None:
            if self.edge_weight.shape != (ind.numel(),):
                raise GraphError(
                    f"edge_weight has shape {tuple(self.edge_weight.shape)}, expected ({ind.numel()},)"
                )
            if not bool(torch.isfinite(self.edge_weight).all()):
                raise GraphError("edge_weight contains NaN or inf")
        if self.x is not None:
            if self.x.dim() != 2 or self.x.shape[0] != n:
                raise GraphError(f"features have shape {tuple(self.x.shape)}, expected ({n}, num_features)")
            if self.x.layout != torch.strided:
                raise GraphError(f"features are a {self.x.layout} tensor; give dense ones (x.to_dense(), or "
                                 "Graph.from_pyg, which densifies them)")
            if self.x.dtype not in FEATURE_DTYPES.values():
                raise GraphError(f"features must be float32 (or bfloat16, stored at half the bytes), got "
                                 f"{self.x.dtype}")
            mapped = mapped_file(self.x) is not None  # a converted directory's x.npy: read it, keep none of it
            row_bytes = max(1, self.x.shape[1] * self.x.element_size())
            step = max(1, min(_CHECK_ROWS, _CHECK_BYTES // row_bytes))  # the check's temporaries stay small
            for start in range(0, n, step):
                ok = torch.isfinite(self.x[start : start + step])
                if mapped:  # the pages read leave the process (--host-memory bounds it; issue #44)
                    release_pages(self.x, start * row_bytes, step * row_bytes)
                if not bool(ok.all()):
                    bad = ~ok.all(dim=1)
                    row = start + int(torch.nonzero(bad)[0])
                    col = int(torch.nonzero(~ok[row - start])[0])
                    value = float(self.x[row, col])
                    last = min(n, start + step) - 1
                    raise GraphError(f"features contain NaN or inf: first at row {row}, column {col} ({value}); "
                                     f"{int(bad.sum())} bad row(s) among rows {start}..{last}")
        unlabelled = False
        if self.y is not None:
            if self.y.shape != (n,):
                raise GraphError(f"labels have shape {tuple(self.y.shape)}, expected ({n},)")
            if self.y.dtype != torch.int64:
                raise GraphError(f"labels must be int64, got {self.y.dtype}")
            c = self.num_classes
            if c is None or c < 1:
                raise GraphError(f"num_classes must be >= 1, got {c}")
            lo, hi = int(self.y.min()), int(self.y.max())
            if lo < -1 or hi >= c:
                raise GraphError(f"labels must lie in [0, {c}) or be -1 (unlabelled), found {lo if lo < -1 else hi}")
            unlabelled = lo < 0
        for mname in MASK_NAMES:
            m = getattr(self, mname)
            if m is None:
                continue
            if m.dtype != torch.bool:
                raise GraphError(f"{mname} must be a bool tensor, got {m.dtype}")
            if m.shape != (n,):
                raise GraphError(f"{mname} has shape {tuple(m.shape)}, expected ({n},) (one entry per vertex)"
                                 + ("; a mask of several splits (PyG's [N, k]): pick one with mask[:, i] or "
                                    "Graph.from_pyg(data, split=i)" if m.dim() == 2 and m.shape[0] == n else ""))
            if self.y is None and bool(m.any()):
                raise GraphError(f"{mname} selects vertices but the graph has no labels")
            if unlabelled and self.y is not None:
                k = int((self.y[m] < 0).sum())
                if k:
                    first = int(torch.nonzero(m & (self.y < 0))[0])
                    raise GraphError(f"{mname} selects {k} unlabelled vertices (label -1), the first is vertex "
                                     f"{first}; a mask may select labelled vertices only")
        if self.node_ids is not None and (self.node_ids.shape != (n,) or self.node_ids.dtype != torch.int64):
            raise GraphError(f"node_ids must be an int64 tensor of shape ({n},), got {self.node_ids.dtype} "
                             f"{tuple(self.node_ids.shape)}")

    # ---------------------------------------------------------- constructors
    @classmethod
    def from_edge_index(
        cls,
        edge_index: Tensor | np.ndarray,
        num_nodes: int | None = None,
        *,
        edge_weight: Tensor | np.ndarray | None = None,
        coalesce: bool = False,
        **data: Any,
    ) -> Graph:
        """Build from ``[2, E]`` COO edges ``(source, destination)``.

        Args:
            edge_index: edges, PyG convention (row 0 = source, row 1 = destination).
            num_nodes: number of vertices; defaults to ``max id + 1`` (or the feature rows when given).
            edge_weight: optional ``[E]`` weights.
            coalesce: merge duplicate edges (summing their weights), like PyG's ``coalesce``. Without it (the
                default, as in every entry point), duplicates stay as multi-edges.
            **data: ``x``, ``y``, masks, ``name``, ``num_classes``, ``meta`` as for :class:`Graph`; ``x``, ``y``
                and the masks may be numpy arrays (as PyG users hold them). Features are converted to float32
                quietly, as :meth:`from_pyg` does (float64 numpy features are the common case; bfloat16 stays);
                labels of any integer type to int64, and string labels to classes ``0..C-1`` in sorted order, the
                names kept as :attr:`class_names`.
        """
        data = vertex_data(data)
        ei = torch.as_tensor(np.asarray(edge_index) if isinstance(edge_index, np.ndarray) else edge_index)
        if ei.dim() != 2 or ei.shape[0] != 2:
            raise GraphError(f"edge_index must have shape [2, num_edges], got {tuple(ei.shape)}")
        if ei.dtype.is_floating_point or ei.dtype == torch.bool:
            raise GraphError(f"edge_index must hold integers, got {ei.dtype}")
        ei = ei.long()
        if num_nodes is None:
            x = data.get("x")
            num_nodes = int(x.shape[0]) if x is not None else (int(ei.max()) + 1 if ei.numel() else 0)
        if ei.numel():
            lo, hi = int(ei.min()), int(ei.max())
            if lo < 0:
                raise GraphError(f"negative vertex id {lo} in edge_index")
            if hi >= num_nodes:
                raise GraphError(f"vertex id {hi} in edge_index is out of range for {num_nodes} vertices")
        w = None if edge_weight is None else torch.as_tensor(edge_weight, dtype=torch.float32)
        if w is not None and w.shape != (ei.shape[1],):
            raise GraphError(f"edge_weight has shape {tuple(w.shape)}, expected ({ei.shape[1]},)")
        indptr, indices, w = coo_to_csr(ei[0], ei[1], num_nodes, w, coalesce)
        return cls(indptr=indptr, indices=indices, edge_weight=w, **data)

    @classmethod
    def from_scipy(
        cls, adj: sp.spmatrix | sp.sparray, *, weighted: bool = False, coalesce: bool = False, **data: Any
    ) -> Graph:
        """Build from a square scipy sparse adjacency where ``adj[u, v] != 0`` is the edge ``u -> v``; repeated
        entries of a COO/CSR matrix are multi-edges unless ``coalesce``."""
        if adj.ndim != 2 or adj.shape[0] != adj.shape[1]:
            raise GraphError(f"adjacency must be square, got shape {adj.shape}")
        coo = sp.coo_matrix(adj)
        ei = np.vstack([coo.row, coo.col]).astype(np.int64)
        w = coo.data.astype(np.float32) if weighted else None
        return cls.from_edge_index(ei, adj.shape[0], edge_weight=w, coalesce=coalesce, **data)

    @classmethod
    def from_pyg(cls, data: Any, name: str = "pyg", coalesce: bool = False, split: int | None = None) -> Graph:
        """Build from a ``torch_geometric.data.Data``: ``edge_index``, ``x``, ``y``, the train/val/test masks and
        one weight per edge; multi-edges are kept unless ``coalesce``.

        The weights are ``edge_weight`` (shape ``[E]`` or ``[E, 1]``), else a one-column ``edge_attr`` (``[E]`` or
        ``[E, 1]``, said in a one-line note on stderr). Whatever else the ``Data`` holds is dropped with a one-line
        warning naming it: an ``edge_attr`` of several columns (or one next to ``edge_weight``) and any other
        attribute (``pos``, ``batch``, ...). Masks of several splits (shape ``[N, k]``, WikiCS) give column
        ``split`` (default 0, said in a note); a sparse ``x`` is densified (said in a note); features of another dtype
        than float32 (float64, ...) are converted to float32 quietly, as :meth:`from_edge_index` does."""
        edge_index, num_nodes, ew, kw = pyg_arguments(data, split)
        return cls.from_edge_index(edge_index, num_nodes, edge_weight=ew, coalesce=coalesce, name=name, **kw)

    def to_pyg(self) -> Any:
        """Convert to a ``torch_geometric.data.Data`` with the same vertex order."""
        Data = require("torch_geometric.data", "torch_geometric").Data
        d = Data(x=self.x, edge_index=self.edge_index(), y=self.y, num_nodes=self.num_nodes)
        if self.edge_weight is not None:
            d.edge_weight = self.edge_weight
        for mname in MASK_NAMES:
            if getattr(self, mname) is not None:
                d[mname] = getattr(self, mname)
        return d

    def to_scipy(self) -> sp.csr_matrix:
        """The in-neighbour CSR as scipy: entry ``[v, u]`` is the edge ``u -> v``."""
        w = np.ones(self.num_edges, np.float32) if self.edge_weight is None else self.edge_weight.numpy()
        n = self.num_nodes
        return sp.csr_matrix((w, self.indices.numpy(), self.indptr.numpy()), shape=(n, n))

    # ------------------------------------------------------------ transforms
    def symmetrize(self) -> Graph:
        """Return the undirected version: every edge in both directions.

        An edge already present in both directions is not doubled: ``u -> v`` appears ``max(c(u,v), c(v,u))``
        times, where ``c`` counts the copies given, so a simple graph stays simple and multi-edges stay as many.
        A pair given both ways keeps the larger weight of each matched copy.
        """
        ei = self.edge_index()
        n = self.num_nodes
        keys = []
        for side in (ei, ei.flip(0)):
            key, perm = torch.sort(side[1] * n + side[0], stable=True)
            keys.append((key, rank_in_run(key), perm))
        key = torch.cat([keys[0][0], keys[1][0]])
        rank = torch.cat([keys[0][1], keys[1][1]])
        w = None
        if self.edge_weight is not None:
            w = torch.cat([self.edge_weight[keys[0][2]], self.edge_weight[keys[1][2]]])
        order = torch.sort(rank, stable=True).indices  # order by (key, rank): rank first, then key, stably
        order = order[torch.sort(key[order], stable=True).indices]
        key, rank = key[order], rank[order]
        first = torch.ones(key.numel(), dtype=torch.bool)
        first[1:] = (key[1:] != key[:-1]) | (rank[1:] != rank[:-1])  # one copy of each (edge, copy number)
        if w is not None:
            w = w[order]
            group = torch.cumsum(first, 0) - 1
            w = torch.full((int(first.sum()),), -float("inf")).scatter_reduce(0, group, w, reduce="amax")
        key = key[first]
        dst = torch.div(key, n, rounding_mode="floor")
        indptr, indices, w = coo_to_csr(key - dst * n, dst, n, w, coalesce=False)
        return replace(self, indptr=indptr, indices=indices, edge_weight=w)

    def duplicate_edges(self) -> int:
        """Number of edges that repeat an earlier ``(source, destination)`` pair (0 for a simple graph)."""
        n, ip, dups, row = self.num_nodes, self.indptr, 0, 0
        while row < n:  # slabs of whole rows (a duplicate repeats a pair within its destination's row)
            e0 = int(ip[row])
            stop = min(n, max(row + 1, int(torch.searchsorted(ip, e0 + _STAT_EDGES, right=True)) - 1))
            e1 = int(ip[stop])
            if e1 - e0 > 1:
                dst = torch.repeat_interleave(torch.arange(stop - row), ip[row + 1 : stop + 1] - ip[row:stop])
                key = dst * n + self.indices[e0:e1].long()
                if bool((key[1:] < key[:-1]).any()):  # rows not sorted by source: sort
                    key = torch.sort(key).values
                dups += int((key[1:] == key[:-1]).sum())
            row = stop
        return dups

    def with_indices_dtype(self, dtype: torch.dtype) -> Graph:
        """Same graph with ``indices`` stored as int32 (half the memory) or int64."""
        if dtype == torch.int32 and self.num_nodes > torch.iinfo(torch.int32).max:
            raise GraphError("graph has too many vertices for int32 indices")
        return replace(self, indices=self.indices.to(dtype))

    def with_feature_dtype(self, dtype: torch.dtype) -> Graph:
        """Same graph with features stored as ``dtype``: ``torch.bfloat16`` (half the bytes; values rounded to
        bfloat16's 8 significant bits) or ``torch.float32``; ``self`` when they already are."""
        if self.x is None or self.x.dtype == dtype:
            return self
        feature_dtype_name(dtype)  # a dtype a Graph may hold, else GraphError
        return replace(self, x=self.x.to(dtype))

    # ------------------------------------------------------------ statistics
    def nbytes(self) -> dict[str, int]:
        """Bytes held by each part of the graph (topology, features, labels, masks)."""
        def size(t: Tensor | None) -> int:
            return 0 if t is None else t.numel() * t.element_size()

        out = {
            "topology": size(self.indptr) + size(self.indices) + size(self.edge_weight),
            "features": size(self.x),
            "labels": size(self.y),
            "masks": sum(size(getattr(self, m)) for m in MASK_NAMES),
        }
        out["total"] = sum(out.values())
        return out

    def stats(self) -> dict[str, Any]:
        """Summary statistics printed by ``gnnscale info``."""
        din, dout = self.in_degree().double(), self.out_degree().double()
        self_loops = self.num_self_loops()
        split = {m: (0 if getattr(self, m) is None else int(getattr(self, m).sum())) for m in MASK_NAMES}

        def desc(d: Tensor) -> dict[str, float]:
            return {
                "min": float(d.min()),
                "mean": float(d.mean()),
                "median": float(d.median()),
                "max": float(d.max()),
            }

        return {
            "name": self.name,
            "nodes": self.num_nodes,
            "edges": self.num_edges,
            "features": self.num_features,
            "classes": self.num_classes,
            "self_loops": self_loops,
            "duplicate_edges": self.duplicate_edges(),
            "weighted": self.edge_weight is not None,
            "weights_from": self.meta.get("edge_weight") if self.edge_weight is not None else None,
            "symmetrized_from_edges": self.meta.get("symmetrized_from_edges"),
            "isolated_nodes": int(((din == 0) & (dout == 0)).sum()),
            "feature_dtype": None if self.x is None else feature_dtype_name(self.x.dtype),
            "made_up": [p for p in ("features", "labels") if p in (self.meta.get("made_up") or [])],
            "unlabelled_nodes": None if self.y is None else int((self.y < 0).sum()),
            "class_names": self.meta.get("classes"),
            "spec": self.meta.get("spec"),
            "converted_from": list(self.meta.get("converted_from") or []),
            "in_degree": desc(din),
            "out_degree": desc(dout),
            **split,
            "bytes": self.nbytes(),
        }

    def equals(self, other: Graph) -> bool:
        """Exact equality of topology, data and metadata (used by convert round-trip tests), but for where the data
        was loaded from (``meta["spec"]``, ``meta["converted_from"]``: a converted copy names its directory)."""
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if f.name == "meta":
                a, b = ({k: v for k, v in m.items() if k not in PROVENANCE} for m in (a, b))
            if isinstance(a, Tensor) or isinstance(b, Tensor):
                if a is None or b is None or a.dtype != b.dtype or not torch.equal(a, b):
                    return False
            elif a != b:
                return False
        return True

    def __repr__(self) -> str:
        return (
            f"Graph(name={self.name!r}, nodes={self.num_nodes}, edges={self.num_edges}, "
            f"features={self.num_features}, classes={self.num_classes})"
        )


def feature_dtype(name: str) -> torch.dtype:
    """The feature dtype named ``name`` (``fp32``/``float32`` or ``bf16``/``bfloat16``, any case); GraphError
    naming the choices otherwise."""
    key = _FEATURE_DTYPE_ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in FEATURE_DTYPES:
        raise GraphError(f"unknown feature dtype {name!r}; choose fp32 (float32) or bf16 (bfloat16)")
    return FEATURE_DTYPES[key]


def feature_dtype_name(dtype: torch.dtype) -> str:
    """``float32`` or ``bfloat16``: the name meta.json records for a feature dtype."""
    for name, d in FEATURE_DTYPES.items():
        if d == dtype:
            return name
    raise GraphError(f"features must be float32 or bfloat16, not {dtype}")
