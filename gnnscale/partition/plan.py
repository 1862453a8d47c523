"""Two-level edge-cut partitioning (HongTu §4.1) and the saved partition plan (the CSR helpers it uses live in
:mod:`gnnscale.partition.csr` and are re-exported here).

Level 1 splits the vertices into ``m`` partitions (METIS on the symmetrised graph, or ``random``/``range`` for graphs
too big for METIS). Level 2 splits each partition into ``n`` chunks of destination vertices with about equal
in-edge counts. Vertices are renumbered so that partitions, and chunks inside them, are contiguous id ranges: a
chunk is ``[lo, hi)`` in the new numbering, its in-edges are the CSR rows ``lo..hi``, and every destination keeps
its full in-neighbourhood (full-neighbour aggregation, GAT's softmax included, runs on one chunk).

METIS is the expensive step and does not depend on ``n``, so a plan is saved per (graph, method, m, seed) and
re-split into any number of chunks without repartitioning.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from gnnscale._compat import require
from gnnscale.errors import ConfigError
from gnnscale.fsutil import atomic_file
from gnnscale.graph.csr import coo_to_csr
from gnnscale.graph.graph import Graph
from gnnscale.partition.csr import ChunkCounter, chunk_halo, chunk_neighbour_counts, permute_csr

__all__ = [
    "CHUNKERS",
    "PARTITION_METHODS",
    "ChunkCounter",
    "PartitionPlan",
    "chunk_halo",
    "chunk_neighbour_counts",
    "default_plan_dir",
    "graph_fingerprint",
    "load_or_chunk",
    "load_or_partition",
    "partition_graph",
    "permute_csr",
]

PARTITION_METHODS = ("metis", "random", "range")
CHUNKERS = ("range", "metis")
"""Level-2 splitters: ``range`` (contiguous runs of the partition balanced by in-edges, HongTu's) or ``metis``
(METIS sub-partitioning of each partition minimising communication volume, i.e. the chunks' summed in-neighbour
sets)."""
PLAN_FORMAT = "gnnscale-partition-plan"
PLAN_VERSION = 1


def default_plan_dir() -> Path:
    """Where plans are saved: ``$GNNSCALE_CACHE_DIR/plans``, else ``$XDG_CACHE_HOME/gnnscale/plans``, else
    ``~/.cache/gnnscale/plans``."""
    if os.environ.get("GNNSCALE_CACHE_DIR"):
        return Path(os.environ["GNNSCALE_CACHE_DIR"]) / "plans"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gnnscale" / "plans"


def graph_fingerprint(graph: Graph) -> str:
    """Hash of the topology (sizes, indptr, indices): the key under which a partition plan is saved."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{graph.num_nodes},{graph.num_edges}".encode())
    h.update(np.ascontiguousarray(graph.indptr.numpy()).data)
    step = 1 << 24
    for start in range(0, graph.num_edges, step):  # int64 pieces: the same graph with int32 indices hashes equal
        h.update(np.ascontiguousarray(graph.indices[start : start + step].numpy().astype(np.int64)).data)
    return h.hexdigest()


# ------------------------------------------------------------------------------------------------ level 1
def _metis_parts(graph: Graph, m: int, seed: int) -> Tensor:
    return _metis(graph.edge_index(), graph.num_nodes, m, seed)


def _metis(ei: Tensor, n: int, m: int, seed: int, volume: bool = False) -> Tensor:
    """``[n]`` part of each vertex of the graph ``ei`` (``[2, E]``, symmetrised here), METIS into ``m`` parts
    balanced by vertex count; ``volume`` minimises communication volume instead of the edge cut."""
    pymetis = require("pymetis")
    ei = ei[:, ei[0] != ei[1]]  # METIS rejects self-loops
    both = torch.cat([ei, ei.flip(0)], dim=1)
    xadj, adjncy, _ = coo_to_csr(both[0], both[1], n, None, coalesce=True)
    opts = pymetis.Options(seed=seed)
    kw: dict[str, Any] = {}
    if volume:
        opts.objtype = 1  # METIS_OBJTYPE_VOL: only the k-way scheme supports it
        kw["recursive"] = False
    if hasattr(pymetis, "CSRAdjacency"):  # pymetis >= 2025.2
        res = pymetis.part_graph(m, pymetis.CSRAdjacency(xadj.numpy(), adjncy.numpy()), options=opts, **kw)
    else:  # pragma: no cover - older pymetis
        res = pymetis.part_graph(m, xadj=xadj.numpy(), adjncy=adjncy.numpy(), options=opts, **kw)
    parts = torch.from_numpy(np.asarray(res[1] if isinstance(res, tuple) else res.vertex_part, dtype=np.int64))
    return parts


def _balanced_bounds(cost: Tensor, pieces: int) -> Tensor:
    """``[pieces + 1]`` offsets splitting ``cost`` into ``pieces`` non-empty contiguous runs of about equal sum."""
    n = cost.numel()
    if pieces > n:
        raise ConfigError(f"cannot split {n} vertices into {pieces} non-empty pieces")
    cs = torch.cumsum(cost.double(), 0)
    targets = cs[-1] * torch.arange(1, pieces, dtype=torch.float64) / pieces
    cuts = torch.searchsorted(cs, targets, right=True)
    bounds = [0]
    for j, c in enumerate(cuts.tolist(), start=1):  # non-empty runs; leave room for the pieces still to come
        bounds.append(min(max(c, bounds[-1] + 1), n - (pieces - j)))
    bounds.append(n)
    return torch.tensor(bounds, dtype=torch.int64)


def _level1_parts(graph: Graph, method: str, m: int, seed: int) -> Tensor:
    n = graph.num_nodes
    if m == 1:
        return torch.zeros(n, dtype=torch.int64)
    if method == "metis":
        return _metis_parts(graph, m, seed)
    if method == "random":
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
        parts = torch.empty(n, dtype=torch.int64)
        parts[order] = torch.arange(n) * m // n
        return parts
    bounds = _balanced_bounds(graph.in_degree() + 1, m)  # "range": contiguous id ranges, balanced by in-edges
    return torch.repeat_interleave(torch.arange(m), bounds[1:] - bounds[:-1], output_size=n)


# ------------------------------------------------------------------------------------------------ the plan
@dataclass(eq=False)
class PartitionPlan:
    """A renumbering of the vertices into ``partitions x chunks`` contiguous destination ranges.

    New vertex id ``i`` is old id ``perm[i]``. Chunk ``k`` (partition ``k // chunks``, position ``k % chunks``)
    owns the new ids ``chunk_ptr[k] .. chunk_ptr[k+1]``.
    """

    method: str
    partitions: int
    chunks: int
    seed: int
    graph_key: str
    perm: Tensor
    """``[N]`` int64: old id of each new id."""
    part_ptr: Tensor
    """``[partitions + 1]`` new-id offsets of the partitions."""
    chunk_ptr: Tensor
    """``[partitions * chunks + 1]`` new-id offsets of the chunks."""
    chunker: str = "range"
    """How partitions were split into chunks (:data:`CHUNKERS`)."""
    _inv: Tensor | None = field(default=None, repr=False)

    @property
    def num_nodes(self) -> int:
        return int(self.perm.numel())

    @property
    def num_chunks(self) -> int:
        return self.partitions * self.chunks

    def inverse(self) -> Tensor:
        """``[N]`` int64: new id of each old id."""
        if self._inv is None:
            inv = torch.empty_like(self.perm)
            inv[self.perm] = torch.arange(self.num_nodes)
            self._inv = inv
        return self._inv

    def chunk_range(self, k: int) -> tuple[int, int]:
        return int(self.chunk_ptr[k]), int(self.chunk_ptr[k + 1])

    def with_chunks(self, graph: Graph, chunks: int, chunker: str = "range") -> PartitionPlan:
        """The same partitions split into ``chunks`` chunks each.

        ``range`` is cheap (no repartitioning): contiguous runs of each partition with about equal in-edges.
        ``metis`` runs METIS on each partition's induced subgraph, minimising the communication volume (the summed
        chunk in-neighbour sets) with vertex-balanced chunks, and renumbers vertices inside the partition so that
        chunks stay contiguous ranges; its plans are worth saving (:func:`load_or_chunk`).
        """
        if chunker not in CHUNKERS:
            raise ConfigError(f"unknown chunker {chunker!r}; choose one of {', '.join(CHUNKERS)}")
        if chunks < 1:
            raise ConfigError(f"--chunks must be >= 1, got {chunks}")
        sizes = (self.part_ptr[1:] - self.part_ptr[:-1]).tolist()
        if chunks > min(sizes):
            raise ConfigError(f"--chunks {chunks} is more than the {min(sizes)} vertices of the smallest partition")
        if chunker == "metis" and chunks > 1:
            return self._metis_chunks(graph, chunks)
        cost = graph.in_degree()[self.perm] + 1  # in-edges incl. a self-loop: what a chunk aggregates
        ptr = [torch.zeros(1, dtype=torch.int64)]
        for i in range(self.partitions):
            lo, hi = int(self.part_ptr[i]), int(self.part_ptr[i + 1])
            ptr.append(lo + _balanced_bounds(cost[lo:hi], chunks)[1:])
        return PartitionPlan(self.method, self.partitions, chunks, self.seed, self.graph_key, self.perm,
                             self.part_ptr, torch.cat(ptr), chunker, self._inv)

    def _metis_chunks(self, graph: Graph, chunks: int) -> PartitionPlan:
        indptr, indices = permute_csr(graph.indptr, graph.indices, None, self.perm, self.inverse())[:2]
        dst = torch.repeat_interleave(torch.arange(self.num_nodes), indptr[1:] - indptr[:-1],
                                      output_size=int(indptr[-1]))
        src = indices.long()
        perm = self.perm.clone()
        ptr = [torch.zeros(1, dtype=torch.int64)]
        for i in range(self.partitions):
            lo, hi = int(self.part_ptr[i]), int(self.part_ptr[i + 1])
            e0, e1 = int(indptr[lo]), int(indptr[hi])
            s, d = src[e0:e1], dst[e0:e1]
            inside = (s >= lo) & (s < hi)
            parts = _metis(torch.stack([s[inside] - lo, d[inside] - lo]), hi - lo, chunks, self.seed, volume=True)
            counts = torch.bincount(parts, minlength=chunks)
            if bool((counts == 0).any()):
                raise ConfigError(f"the metis chunker left {int((counts == 0).sum())} of {chunks} chunks of "
                                  f"partition {i} empty; use fewer chunks or --chunker range")
            perm[lo:hi] = self.perm[lo:hi][torch.sort(parts, stable=True).indices]
            ptr.append(lo + torch.cumsum(counts, 0))
        return PartitionPlan(self.method, self.partitions, chunks, self.seed, self.graph_key, perm,
                             self.part_ptr, torch.cat(ptr), "metis")

    # ------------------------------------------------------------------------------------------ statistics
    def stats(self, graph: Graph) -> dict[str, Any]:
        """Replication factor α, edge cut and balance of this plan on ``graph``.

        ``alpha`` is HongTu's neighbour replication factor: the number of chunk in-neighbour sets a vertex appears
        in, averaged over all vertices (``sum_k |N_k| / |V|``), i.e. how many times a layer's rows cross the bus.
        """
        indptr, indices = permute_csr(graph.indptr, graph.indices, None, self.perm, self.inverse())[:2]
        counts = chunk_neighbour_counts(indptr, indices, self.chunk_ptr)  # [K, 3]: |N_k|, outside, in-edges
        nbr, edges = counts[:, 0].tolist(), counts[:, 2].tolist()
        rows = (self.chunk_ptr[1:] - self.chunk_ptr[:-1] + counts[:, 1]).tolist()  # destinations + outside nbrs
        cut = 0
        if self.partitions > 1:  # in-edges whose source lies in another partition, one partition at a time
            for i in range(self.partitions):
                lo, hi = int(self.part_ptr[i]), int(self.part_ptr[i + 1])
                src = indices[int(indptr[lo]) : int(indptr[hi])]
                cut += int(((src < lo) | (src >= hi)).sum())
        e = torch.tensor(edges, dtype=torch.float64)
        return {
            "method": self.method,
            "partitions": self.partitions,
            "chunks": self.chunks,
            "chunker": self.chunker,
            "alpha": sum(nbr) / max(self.num_nodes, 1),
            "edge_cut": cut / max(graph.num_edges, 1),
            "partition_sizes": (self.part_ptr[1:] - self.part_ptr[:-1]).tolist(),
            "chunk_vertices_max": int((self.chunk_ptr[1:] - self.chunk_ptr[:-1]).max()),
            "chunk_edges_max": int(e.max()),
            "chunk_edge_imbalance": float(e.max() / e.mean()) if e.mean() > 0 else 1.0,
            "chunk_rows_max": max(rows),
        }

    # ------------------------------------------------------------------------------------------ persistence
    def file_name(self) -> str:
        """``<graph>-<method>-p<m>-s<seed>.npz``; a metis-chunked plan adds ``-metis<n>`` (its order depends on
        ``n``)."""
        chunked = f"-metis{self.chunks}" if self.chunker == "metis" else ""
        return f"{self.graph_key[:24]}-{self.method}-p{self.partitions}-s{self.seed}{chunked}.npz"

    def save(self, path: str | Path) -> Path:
        """Write atomically (a temporary sibling renamed into place)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = {"format": PLAN_FORMAT, "version": PLAN_VERSION, "method": self.method,
                "partitions": self.partitions, "chunks": self.chunks, "seed": self.seed, "graph_key": self.graph_key,
                "chunker": self.chunker}
        with atomic_file(path) as fh:
            np.savez(fh, perm=self.perm.numpy(), part_ptr=self.part_ptr.numpy(), chunk_ptr=self.chunk_ptr.numpy(),
                     meta=np.array(json.dumps(meta)))
        return path

    def owners(self) -> Tensor:
        """``[N]`` int64: the partition of every vertex (a distributed rank's, with one part per rank)."""
        owner = torch.empty(self.num_nodes, dtype=torch.int64)
        for p in range(self.partitions):
            owner[self.perm[int(self.part_ptr[p]) : int(self.part_ptr[p + 1])]] = p
        return owner

    @classmethod
    def load_for_ranks(cls, path: str, ranks: int) -> PartitionPlan:
        """The plan of ``--plan``, which must exist and have one part per rank (its graph is checked by the
        engine that reads it)."""
        if not os.path.isfile(path):
            raise ConfigError(f"--plan {path}: no such file (write one with gnnscale partition --partitions {ranks} "
                              "--dataset ...)")
        plan = cls.load(path)
        if plan.partitions != ranks:
            raise ConfigError(f"--plan {path} has {plan.partitions} partitions for {ranks} ranks; partition the "
                              "graph into one part per rank")
        return plan

    @classmethod
    def load(cls, path: str | Path) -> PartitionPlan:
        """Read a plan written by :meth:`save`; a damaged or foreign file raises ConfigError."""
        try:
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(str(z["meta"]))
                if meta.get("format") != PLAN_FORMAT or meta.get("version") != PLAN_VERSION:
                    raise ValueError("not a gnnscale partition plan")
                return cls(meta["method"], int(meta["partitions"]), int(meta["chunks"]), int(meta["seed"]),
                           meta["graph_key"], torch.from_numpy(z["perm"].astype(np.int64)),
                           torch.from_numpy(z["part_ptr"].astype(np.int64)),
                           torch.from_numpy(z["chunk_ptr"].astype(np.int64)), meta.get("chunker", "range"))
        except (OSError, ValueError, KeyError) as exc:
            raise ConfigError(f"cannot read partition plan {path}: {exc}") from None


def partition_graph(graph: Graph, partitions: int = 1, chunks: int = 1, method: str = "metis",
                    seed: int = 0, graph_key: str | None = None) -> PartitionPlan:
    """Two-level partition of ``graph`` (HongTu §4.1).

    Args:
        partitions: ``m``, level-1 parts (one per GPU in HongTu).
        chunks: ``n``, destination chunks per part, balanced by in-edge count.
        method: ``metis`` (pymetis on the symmetrised graph), ``random`` or ``range`` (contiguous id ranges).
        seed: METIS / random seed.
        graph_key: :func:`graph_fingerprint` of ``graph`` when the caller already has it (hashing is O(E)).
    """
    if method not in PARTITION_METHODS:
        raise ConfigError(f"unknown partition method {method!r}; choose one of {', '.join(PARTITION_METHODS)}")
    if partitions < 1:
        raise ConfigError(f"--partitions must be >= 1, got {partitions}")
    if partitions > graph.num_nodes:
        raise ConfigError(f"--partitions {partitions} is more than the graph's {graph.num_nodes} vertices")
    parts = _level1_parts(graph, method, partitions, seed)
    sizes = torch.bincount(parts, minlength=partitions)
    if bool((sizes == 0).any()):  # METIS may leave a part empty on tiny or disconnected graphs
        raise ConfigError(f"{method} left {int((sizes == 0).sum())} of {partitions} partitions empty; "
                          "use fewer partitions or --partition-method random")
    perm = torch.sort(parts, stable=True).indices
    part_ptr = torch.zeros(partitions + 1, dtype=torch.int64)
    torch.cumsum(sizes, 0, out=part_ptr[1:])
    plan = PartitionPlan(method, partitions, 1, seed, graph_key or graph_fingerprint(graph), perm, part_ptr,
                         part_ptr.clone())
    return plan.with_chunks(graph, chunks)


def load_or_partition(graph: Graph, partitions: int, chunks: int, method: str = "metis", seed: int = 0,
                      plan_dir: str | Path | None = None) -> tuple[PartitionPlan, Path | None, bool]:
    """The saved plan for (graph, method, partitions, seed) re-split into ``chunks``, or a new one (then saved).

    Returns:
        ``(plan, path, reused)``; ``path`` is None when the plan directory is not writable.
    """
    directory = Path(plan_dir) if plan_dir is not None else default_plan_dir()
    key = graph_fingerprint(graph)
    probe = PartitionPlan(method, partitions, chunks, seed, key, torch.empty(0), torch.empty(0), torch.empty(0))
    path = directory / probe.file_name()
    if path.is_file():
        try:
            saved = PartitionPlan.load(path)
        except ConfigError:
            saved = None  # damaged: repartition and overwrite
        if saved is not None and saved.graph_key == key and saved.num_nodes == graph.num_nodes:
            return (saved if saved.chunks == chunks else saved.with_chunks(graph, chunks)), path, True
    plan = partition_graph(graph, partitions, chunks, method, seed, graph_key=key)
    try:
        plan.save(path)
    except OSError:
        return plan, None, False
    return plan, path, False


def load_or_chunk(base: PartitionPlan, graph: Graph, chunks: int, chunker: str = "range",
                  plan_dir: str | Path | None = None) -> PartitionPlan:
    """``base`` split into ``chunks`` per partition by ``chunker``; metis-chunked plans are saved beside the base
    plan and reused (METIS runs once per partition and chunk count)."""
    if chunker != "metis" or chunks == 1:
        return base if base.chunks == chunks and base.chunker == chunker else base.with_chunks(graph, chunks)
    directory = Path(plan_dir) if plan_dir is not None else default_plan_dir()
    probe = PartitionPlan(base.method, base.partitions, chunks, base.seed, base.graph_key, torch.empty(0),
                          torch.empty(0), torch.empty(0), "metis")
    path = directory / probe.file_name()
    if path.is_file():
        try:
            saved = PartitionPlan.load(path)
            if saved.graph_key == base.graph_key and saved.num_nodes == base.num_nodes and saved.chunks == chunks:
                return saved
        except ConfigError:
            pass  # damaged: recompute and overwrite
    plan = base.with_chunks(graph, chunks, "metis")
    with contextlib.suppress(OSError):
        plan.save(path)
    return plan
