"""Locality of the synthetic graphs (issue #11): the replication factor α of range and METIS chunks.

    python -m benchmarks locality
    python -m benchmarks locality --chunks 8,16 --dataset csbm:nodes=20000,communities=64

For each ``--dataset`` (repeatable; default: Kronecker scale 16, plain csbm and the community csbm of the
ogbn-products stand-in, the two csbm at the same size and degree), one partition
(``partition_graph(g, 1, 1, "range")``) is split into each ``--chunks`` count by each ``--chunkers`` chunker:
``range`` (contiguous id runs with about equal in-edges) and ``metis`` (METIS on the partition, communication-volume
objective: ``PartitionPlan.with_chunks(g, n, "metis")``). The table gives HongTu's neighbour replication factor
``α = sum_k |N_k| / |V|`` (``plan.stats(g)["alpha"]``): how many times a layer's source rows are loaded per pass
when every chunk loads its whole in-neighbour set (``--dedup none``). ``n`` chunks of a graph without locality
give α close to ``n`` once the degree is well above ``n``; the lower α under ``metis``, the more locality METIS found.
One case per dataset; one record per (dataset, chunks, chunker) with α, the chunking time and balance.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from benchmarks.harness import Case, latest_session, split_list
from benchmarks.harness.graphs import device_name, load_graph
from benchmarks.harness.records import provenance, table

TITLE = "Locality of the synthetic graphs (issue #11): replication factor α of range and METIS chunks"
ROUNDS = 1  # α and the chunking are deterministic; one round says it all
# 65,536 vertices: METIS with the volume objective into 64 chunks took over 8 minutes on Kronecker scale 18 here.
# 64 communities of ~1,024 vertices keep the (community, class) buckets at ~200 vertices, as in the stand-in.
DEFAULT_DATASETS = [
    "kronecker:scale=16,edgefactor=16",
    "csbm:nodes=65536,avg_degree=50",
    "csbm:nodes=65536,avg_degree=50,communities=64,p_intra=0.9",
]
QUICK_DATASETS = ["csbm:nodes=4096,avg_degree=20,communities=16,p_intra=0.9"]


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--dataset", action="append", metavar="SPEC",
                    help="dataset spec, repeatable (default: " + "; ".join(DEFAULT_DATASETS) + ")")
    ap.add_argument("--root", default=None, help="folder of dataset files (planetoid, ogb, npz)")
    ap.add_argument("--chunks", default="8,16,64", help="chunk counts (comma list; --quick: 8)")
    ap.add_argument("--chunkers", default="range,metis", help="chunkers (comma list of range, metis)")
    ap.add_argument("--seed", type=int, default=0)


def cases(args: argparse.Namespace) -> list[Case]:
    specs = args.dataset or (QUICK_DATASETS if args.quick else DEFAULT_DATASETS)
    chunks = [8] if args.quick and args.chunks == "8,16,64" else [int(c) for c in split_list(args.chunks)]
    return [Case(spec, {"dataset": spec, "root": args.root, "seed": args.seed, "chunks": chunks,
                        "chunkers": split_list(args.chunkers)}) for spec in specs]


def run(params: dict[str, Any]) -> list[dict[str, Any]]:
    """α and balance of one range partition of the graph split into each chunk count by each chunker."""
    from gnnscale.partition import partition_graph

    g, load_s = load_graph(params["dataset"], params["root"], params["seed"])
    base = partition_graph(g, 1, 1, "range")
    out = []
    for n in params["chunks"]:
        for chunker in params["chunkers"]:
            t0 = time.perf_counter()
            plan = base.with_chunks(g, n, chunker)
            chunk_s = time.perf_counter() - t0
            st = plan.stats(g)
            out.append({"dataset": params["dataset"], "nodes": g.num_nodes, "edges": g.num_edges, "load_s": load_s,
                        "chunks": n, "chunker": chunker, "alpha": st["alpha"], "chunk_s": chunk_s,
                        "chunk_vertices_max": st["chunk_vertices_max"], "chunk_edges_max": st["chunk_edges_max"],
                        "chunk_edge_imbalance": st["chunk_edge_imbalance"], "device": "cpu",
                        "device_name": device_name()})
    return out


def describe(r: dict[str, Any]) -> str:
    return f"{r['chunks']} chunks, {r['chunker']}: alpha {r['alpha']:.3f} ({r['chunk_s']:.1f} s)"


def render(records: list[dict[str, Any]]) -> str:
    recs = latest_session(records, lambda r: r.get("alpha") is not None)
    chunks = sorted({r["chunks"] for r in recs})
    chunkers = list(dict.fromkeys(r["chunker"] for r in recs))
    rows = []
    for spec in dict.fromkeys(r["dataset"] for r in recs):
        rs = {(r["chunker"], r["chunks"]): r for r in recs if r["dataset"] == spec}
        first = next(iter(rs.values()))
        rows.append([f"`{spec}`", f"{first['nodes']:,}", f"{first['edges']:,}",
                     *[f"{rs[(c, n)]['alpha']:.2f}" if (c, n) in rs else "-" for c in chunkers for n in chunks]])
    head = ["dataset", "nodes", "directed edges", *[f"α {c} {n}" for c in chunkers for n in chunks]]
    return (f"{provenance(recs)}\n\nReplication factor α = sum_k |N_k| / |V| of one partition split into chunks "
            f"(the lower under metis, the more locality).\n\n{table(head, rows)}\n")
