"""Locality of the synthetic graphs (issue #11): the replication factor α of range and METIS chunks.

    .venv/bin/python benchmarks/locality.py --threads 1
    .venv/bin/python benchmarks/locality.py --threads 1 --chunks 8,16 --dataset csbm:nodes=20000,communities=64

For each ``--dataset`` (repeatable; default: Kronecker scale 18, plain csbm and the community csbm of the
ogbn-products stand-in, the two csbm at the same size and degree), one partition
(``partition_graph(g, 1, 1, "range")``) is split into each ``--chunks`` count by each ``--chunkers`` chunker:
``range`` (contiguous id runs with about equal in-edges) and ``metis`` (METIS on the partition, communication-volume
objective: ``PartitionPlan.with_chunks(g, n, "metis")``). The table gives HongTu's neighbour replication factor
``α = sum_k |N_k| / |V|`` (``plan.stats(g)["alpha"]``): how many times a layer's source rows are loaded per pass
when every chunk loads its whole in-neighbour set (``--dedup none``). ``n`` chunks of a graph without locality
give α close to ``n`` once the degree is well above ``n``; the lower α under ``metis``, the more locality METIS found.

One JSON line per (dataset, chunks, chunker) is appended to ``--out`` (default
benchmarks/results/locality.jsonl), with α, the chunking time and balance, and the environment.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

try:  # run as a script (its folder is on sys.path) or imported as benchmarks.locality
    from offload import PRODUCTS_LIKE, _list, append_records, environment, prepare
except ImportError:  # pragma: no cover
    from benchmarks.offload import PRODUCTS_LIKE, _list, append_records, environment, prepare

from gnnscale.partition import partition_graph

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "locality.jsonl"
# 65,536 vertices: METIS with the volume objective into 64 chunks took over 8 minutes on Kronecker scale 18 here.
# 64 communities of ~1,024 vertices keep the (community, class) buckets at ~200 vertices, as in the stand-in.
DEFAULT_DATASETS = [
    "kronecker:scale=16,edgefactor=16",
    "csbm:nodes=65536,avg_degree=50",
    "csbm:nodes=65536,avg_degree=50,communities=64,p_intra=0.9",
]


def measure(g: Any, chunks: list[int], chunkers: list[str]) -> list[dict[str, Any]]:
    """α and balance of one range partition of ``g`` split into each chunk count by each chunker."""
    base = partition_graph(g, 1, 1, "range")
    out = []
    for n in chunks:
        for chunker in chunkers:
            t0 = time.perf_counter()
            plan = base.with_chunks(g, n, chunker)
            chunk_s = time.perf_counter() - t0
            st = plan.stats(g)
            out.append({"chunks": n, "chunker": chunker, "alpha": st["alpha"], "chunk_s": chunk_s,
                        "chunk_vertices_max": st["chunk_vertices_max"], "chunk_edges_max": st["chunk_edges_max"],
                        "chunk_edge_imbalance": st["chunk_edge_imbalance"]})
            print(f"  {n:4d} chunks, {chunker:5s}: alpha {st['alpha']:7.3f}  ({chunk_s:.1f} s)", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", action="append", metavar="SPEC",
                    help="dataset spec, repeatable (default: " + "; ".join(DEFAULT_DATASETS) + ")")
    ap.add_argument("--root", default=None, help="folder of dataset files (planetoid, ogb, npz)")
    ap.add_argument("--chunks", default="8,16,64", help="chunk counts (comma list)")
    ap.add_argument("--chunkers", default="range,metis", help="chunkers (comma list of range, metis)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON Lines file to append to")
    args = ap.parse_args(argv)
    chunks = [int(c) for c in _list(args.chunks)]
    chunkers = _list(args.chunkers)
    records: list[dict[str, Any]] = []
    for spec in args.dataset or DEFAULT_DATASETS:
        g, load_s = prepare(argparse.Namespace(**{**vars(args), "dataset": spec}))
        env = environment(torch.device("cpu"))  # after prepare() applied --threads
        print(f"{spec}: {g.num_nodes:,} nodes, {g.num_edges:,} directed edges ({load_s:.1f} s)", flush=True)
        for r in measure(g, chunks, chunkers):
            records.append({"benchmark": "locality", "dataset": spec, "nodes": g.num_nodes, "edges": g.num_edges,
                            "load_s": load_s, **r, **env})
        del g
    print(f"\nReplication factor α = sum_k |N_k| / |V| (one partition; products stand-in: {PRODUCTS_LIKE})\n")
    header = [f"α {c} {n}" for c in chunkers for n in chunks]
    print("| dataset | nodes | directed edges | " + " | ".join(header) + " |")
    print("|---|---:|---:|" + "---:|" * len(header))
    for spec in dict.fromkeys(r["dataset"] for r in records):
        rs = {(r["chunker"], r["chunks"]): r for r in records if r["dataset"] == spec}
        first = next(iter(rs.values()))
        cells = [f"{rs[(c, n)]['alpha']:.2f}" for c in chunkers for n in chunks]
        print(f"| `{spec}` | {first['nodes']:,} | {first['edges']:,} | " + " | ".join(cells) + " |")
    append_records(args.out, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
