"""Accuracy against published numbers and against PyG: test accuracy at the best validation epoch, over seeds.

    python -m benchmarks accuracy
    python -m benchmarks accuracy --quick
    python -m benchmarks accuracy --workloads cora-gcn,photo-gin-bn --seeds 0,1 --epochs 50

Each workload (``--workloads``, default all of :data:`WORKLOADS`) trains one model on one real graph of the
shared datasets (``--root``, default ``../shared/datasets`` beside the repository; README.md there): Cora with the
Planetoid split (GCN, hidden 16, 200 epochs, as Kipf & Welling), Amazon Computers and Amazon Photo with
gnnscale's npz split of 20 training and 30 validation labels per class drawn with the seed (GCN, hidden 64, 200
epochs, as Shchur et al.), and GIN with batch norm on Amazon Photo (issue #31's protocol: hidden 64, 100 epochs,
no dropout of the input features) trained by gnnscale and by PyG's ``GIN(norm="batch_norm")`` on the same split.
Every other setting is ``TrainConfig``'s default (2 layers, dropout 0.5, Adam lr 0.01, weight decay 5e-4).

One case per (workload, system, seed); gnnscale trains through its public API (``gnnscale.train(graph,
TrainConfig(...), device)`` with the in-memory engine), PyG with its own loop (full-batch, evaluation after every
epoch). A record holds the test accuracy at the epoch of best validation accuracy (the first on ties:
``test_acc_at_best_val``, the figure ``gnnscale train`` prints first), the final test accuracy, the best epoch, and
the workload, system, seed, epochs and model settings. A missing dataset file fails its case with the path looked
for. ``--quick``: Cora GCN, seeds 0 and 1, 50 epochs. The table gives the mean ± sample standard deviation over
the seeds beside the published figure (:data:`PUBLISHED`), and the gnnscale-against-PyG workloads per seed with
the median.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import Case, Row, latest_session, split_list
from benchmarks.harness.machine import ROOT
from benchmarks.harness.records import provenance, table

TITLE = "Accuracy against published numbers and against PyG"
ROUNDS = 1  # a seed's accuracy does not change from round to round; the seeds are the repetitions
DEFAULT_ROOT = ROOT.parent / "shared" / "datasets"


@dataclass(frozen=True)
class Workload:
    """One model on one graph: ``spec`` is the ``--dataset`` spec (files under ``--root``/``sub``)."""

    label: str
    spec: str
    file: str
    model: str
    hidden: int
    epochs: int
    seeds: tuple[int, ...]
    sub: str = ""
    norm: str = "none"
    input_dropout: float | None = None
    systems: tuple[str, ...] = ("gnnscale",)


WORKLOADS = {
    "cora-gcn": Workload("Cora, Planetoid split", "planetoid:cora", "ind.cora.x", "gcn", 16, 200, (0, 1, 2, 3, 4),
                         sub="planetoid"),
    "computers-gcn": Workload("Amazon Computers, 20/30 per class", "npz:amazon_electronics_computers.npz",
                              "amazon_electronics_computers.npz", "gcn", 64, 200, (0, 1, 2, 3, 4),
                              sub="gnn-benchmark"),
    "photo-gcn": Workload("Amazon Photo, 20/30 per class", "npz:amazon_electronics_photo.npz",
                          "amazon_electronics_photo.npz", "gcn", 64, 200, (0, 1, 2, 3, 4), sub="gnn-benchmark"),
    "photo-gin-bn": Workload("Amazon Photo, 20/30 per class", "npz:amazon_electronics_photo.npz",
                             "amazon_electronics_photo.npz", "gin", 64, 100, (0, 1, 2), sub="gnn-benchmark",
                             norm="batch", input_dropout=0.0, systems=("gnnscale", "pyg")),
}
"""The workloads, in table order."""
PUBLISHED = {
    "cora-gcn": (0.815, "Kipf & Welling, ICLR 2017, Table 2"),
    "computers-gcn": (0.826, "Shchur et al. 2018, on the largest connected component"),
    "photo-gcn": (0.912, "Shchur et al. 2018, on the largest connected component"),
}
"""Published test accuracy of a workload's model on its graph (semi-supervised node classification), and where."""
QUICK = {"workloads": "cora-gcn", "seeds": (0, 1), "epochs": 50}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--workloads", default=None,
                    help=f"comma list of {', '.join(WORKLOADS)} (default: all; --quick: {QUICK['workloads']})")
    ap.add_argument("--seeds", default=None, help="comma list (default: each workload's; --quick: 0,1)")
    ap.add_argument("--epochs", type=int, default=None, help="(default: each workload's; --quick: 50)")
    ap.add_argument("--root", default=str(DEFAULT_ROOT), help="the shared datasets folder (default %(default)s)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N (default cpu)")


def cases(args: argparse.Namespace) -> list[Case]:
    keys = split_list(args.workloads or (QUICK["workloads"] if args.quick else ",".join(WORKLOADS)))
    unknown = [k for k in keys if k not in WORKLOADS]
    if unknown:
        raise SystemExit(f"error: unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    seeds = [int(s) for s in split_list(args.seeds)] if args.seeds else QUICK["seeds"] if args.quick else None
    epochs = args.epochs or (QUICK["epochs"] if args.quick else None)
    out = []
    for key in keys:
        w = WORKLOADS[key]
        for seed in seeds or w.seeds:
            for system in w.systems:
                params = {"workload": key, "system": system, "seed": seed, "epochs": epochs or w.epochs,
                          "root": str(Path(args.root).resolve()), "device": args.device}
                out.append(Case(f"{key}/{system}/seed{seed}", params,
                                group=f"{key}/seed{seed}" if len(w.systems) > 1 else None))
    return out


def run(params: dict[str, Any]) -> dict[str, Any]:
    """Train one workload's model with one system and seed; its accuracies."""
    from benchmarks.harness.graphs import device_name
    from gnnscale import load_dataset

    w = WORKLOADS[params["workload"]]
    root = Path(params["root"]) / w.sub
    if not (root / w.file).exists():
        raise FileNotFoundError(f"{root / w.file} not found: the accuracy benchmark reads the shared datasets "
                                f"(--root {params['root']}, laid out as in its README.md)")
    g = load_dataset(w.spec, root, seed=params["seed"])
    t0 = time.perf_counter()
    accs = (_train_pyg if params["system"] == "pyg" else _train_gnnscale)(g, w, params)
    return {"workload": params["workload"], "system": params["system"], "dataset": w.label, "dataset_spec": w.spec,
            "nodes": g.num_nodes, "edges": g.num_edges, "model": w.model, "hidden": w.hidden, "norm": w.norm,
            "input_dropout": w.input_dropout, "seed": params["seed"], "epochs": params["epochs"], **accs,
            "train_s": time.perf_counter() - t0, "device": params["device"],
            "device_name": device_name(params["device"])}


def _train_gnnscale(g: Any, w: Workload, params: dict[str, Any]) -> dict[str, Any]:
    from gnnscale import TrainConfig, train

    cfg = TrainConfig(model=w.model, hidden=w.hidden, epochs=params["epochs"], seed=params["seed"], norm=w.norm,
                      input_dropout=w.input_dropout, engine="inmemory")
    s = train(g, cfg, params["device"]).summary
    return {"engine": s["engine"], "test_acc_at_best_val": s["test_acc_at_best_val"],
            "final_test_acc": s["final_test_acc"], "best_epoch": s["best_epoch"], "best_val_acc": s["best_val_acc"]}


def _train_pyg(g: Any, w: Workload, params: dict[str, Any]) -> dict[str, Any]:
    """PyG's ``GIN`` (``BasicGNN``) with the workload's norm, full-batch, ``TrainConfig``'s default optimiser; the
    input features dropped only when the workload's ``input_dropout`` says so (``BasicGNN`` does not)."""
    import torch
    import torch.nn.functional as F
    import torch_geometric
    from torch_geometric.nn.models import GIN

    assert w.model == "gin", "the PyG system trains GIN"
    dev = torch.device(params["device"])
    x, y, ei = g.x.to(dev), g.y.to(dev), g.edge_index().to(dev)
    train, val, test = g.train_mask.to(dev), g.val_mask.to(dev), g.test_mask.to(dev)
    torch.manual_seed(params["seed"])
    norm = None if w.norm == "none" else f"{w.norm}_norm"
    model = GIN(x.shape[1], w.hidden, 2, int(y.max()) + 1, dropout=0.5, norm=norm).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    best_val, test_at_best, best_epoch, last = -1.0, 0.0, 0, 0.0
    for epoch in range(1, params["epochs"] + 1):
        model.train()
        opt.zero_grad()
        xin = F.dropout(x, w.input_dropout) if w.input_dropout else x
        F.cross_entropy(model(xin, ei)[train], y[train]).backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            pred = model(x, ei).argmax(-1)
        acc_val = float((pred[val] == y[val]).float().mean())
        last = float((pred[test] == y[test]).float().mean())
        if acc_val > best_val:
            best_val, test_at_best, best_epoch = acc_val, last, epoch
    return {"engine": f"pyg {torch_geometric.__version__}", "test_acc_at_best_val": test_at_best,
            "final_test_acc": last, "best_epoch": best_epoch, "best_val_acc": best_val}


def describe(r: dict[str, Any]) -> str:
    return (f"{r['workload']} {r['system']} seed {r['seed']}: test at best val {r['test_acc_at_best_val']:.4f} "
            f"(epoch {r['best_epoch']}), final {r['final_test_acc']:.4f} ({r['train_s']:.1f} s)")


def selected(records: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Per (workload, system), in :data:`WORKLOADS` order: the successful records of the latest run of it, one per
    seed (the last), by seed."""
    ok = [r for r in records if r.get("ok", True) and r.get("test_acc_at_best_val") is not None]
    keys = sorted(dict.fromkeys((r["workload"], r["system"]) for r in ok),
                  key=lambda k: (list(WORKLOADS).index(k[0]) if k[0] in WORKLOADS else len(WORKLOADS), k))
    out = {}
    for key in keys:
        per_seed = {r["seed"]: r for r in latest_session(ok, lambda r, key=key: (r["workload"], r["system"]) == key)}
        out[key] = [per_seed[s] for s in sorted(per_seed)]
    return out


def _accs(recs: list[dict[str, Any]]) -> list[float]:
    return [r["test_acc_at_best_val"] for r in recs]


def _mean_std(recs: list[dict[str, Any]]) -> str:
    a = _accs(recs)
    std = f" ± {100 * statistics.stdev(a):.1f}" if len(a) > 1 else ""
    return f"{100 * statistics.mean(a):.1f}{std}%"


def _seeds(recs: list[dict[str, Any]]) -> str:
    s = [r["seed"] for r in recs]
    return f"{s[0]}-{s[-1]}" if len(s) > 2 and s == list(range(s[0], s[-1] + 1)) else ", ".join(map(str, s))


def _model(r: dict[str, Any]) -> str:
    norm = f", {r['norm']} norm" if r.get("norm", "none") != "none" else ""
    return f"{r['model'].upper()}, hidden {r['hidden']}{norm}, {r['epochs']} epochs"


def _published_rows(sel: dict[tuple[str, str], list[dict[str, Any]]]) -> list[list[str]]:
    rows = []
    for (key, system), recs in sel.items():
        if system == "gnnscale" and key in PUBLISHED:
            fig, source = PUBLISHED[key]
            rows.append([recs[0]["dataset"], _model(recs[0]), f"{_mean_std(recs)} (seeds {_seeds(recs)})",
                         f"{100 * fig:.1f}%", source])
    return rows


def _system(r: dict[str, Any]) -> str:
    norm = r.get("norm", "none")
    if r["system"] == "pyg":
        arg = "None" if norm == "none" else f'"{norm}_norm"'
        return f"PyG `{r['model'].upper()}(norm={arg})`"
    drop = "" if r.get("input_dropout") is None else f" --input-dropout {r['input_dropout']:g}"
    return f"gnnscale {r.get('engine', 'inmemory')}, `--norm {norm}{drop}`"


def _peer_rows(sel: dict[tuple[str, str], list[dict[str, Any]]]) -> list[list[str]]:
    rows = []
    for key in dict.fromkeys(k for k, s in sel if s == "pyg"):
        for system in ("gnnscale", "pyg"):
            recs = sel.get((key, system), [])
            if recs:
                r = recs[0]
                rows.append([f"{r['dataset']}: {_model(r)}", _system(r),
                             " / ".join(f"{a:.4f}" for a in _accs(recs)), _seeds(recs),
                             f"**{statistics.median(_accs(recs)):.4f}**"])
    return rows


def render(records: list[dict[str, Any]]) -> str:
    sel = selected(records)
    if not sel:
        return "No successful run recorded.\n"
    shown = [r for recs in sel.values() for r in recs]
    out = [provenance(shown), "Test accuracy at the best validation epoch; per workload and system the latest run, "
           "the last record of each seed."]
    pub = _published_rows(sel)
    if pub:
        out.append(table(["dataset", "model", "gnnscale, mean ± std over seeds", "published", "source"], pub))
    peers = _peer_rows(sel)
    if peers:
        out.append("Against PyG on the same split and seed:\n\n" + table(
            ["workload", "system", "test accuracy per seed", "seeds", "median"], peers))
    return "\n\n".join(out) + "\n"


def headline(records: list[dict[str, Any]]) -> list[Row]:
    sel = selected(records)
    rows = []
    pub = [(key, recs) for (key, system), recs in sel.items() if system == "gnnscale" and key in PUBLISHED]
    if pub:
        fig = "; ".join(f"{recs[0]['dataset'].split(',')[0].removeprefix('Amazon ')} {recs[0]['model'].upper()} "
                        f"{100 * statistics.mean(_accs(recs)):.1f}% (published {100 * PUBLISHED[key][0]:.1f}%)"
                        for key, recs in pub)
        rows.append(Row("accuracy against published numbers", fig, tuple(r for _, recs in pub for r in recs)))
    for key in dict.fromkeys(k for k, s in sel if s == "pyg"):
        ours, theirs = sel.get((key, "gnnscale"), []), sel[(key, "pyg")]
        if ours:
            r = ours[0]
            rows.append(Row(f"accuracy against PyG: {r['model'].upper()}, {r['norm']} norm, {r['dataset']}",
                            f"median {statistics.median(_accs(ours)):.4f} vs PyG "
                            f"{statistics.median(_accs(theirs)):.4f} ({len(ours)} seeds)", tuple(ours + theirs)))
    return rows
