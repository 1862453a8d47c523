"""Accuracy cost of bfloat16 feature storage (issue #29 item 5): GCN trained in memory on float32 features against
the same run on the features stored in bfloat16 (``feature_dtype=bf16``: rounded to bfloat16, upcast to float32 on
the device), on Cora, CiteSeer and Amazon Computers.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bf16_accuracy.py
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bf16_accuracy.py --datasets cora --seeds 0 --epochs 20

The goal: the bfloat16 run within 0.5 point of the float32 run (median over the seeds of the per-seed difference
of the test accuracy at the best validation epoch).

Datasets (``--root``, default ``../shared/datasets`` from the repository root): ``planetoid/ind.cora.*`` and
``planetoid/ind.citeseer.*`` (standard Planetoid split, row-normalised features) and
``gnn-benchmark/amazon_electronics_computers.npz`` (20/30 per class, the rest test, drawn with the seed). A data
set whose files are missing is said in one line and skipped.

Protocol: ``TrainConfig`` defaults (GCN, 2 layers, hidden 64, dropout 0.5, lr 0.01, weight decay 5e-4), 200
epochs, engine ``inmemory`` on the CPU, seeds 0, 1, 2; both runs of a seed use the same split and initialisation,
so the only difference is the features' rounding. Prints one table row per data set with the per-seed test
accuracies at best validation (fp32 / bf16), the median difference in points and PASS when its absolute value is
at most ``--bound`` (0.5), and the bytes of the feature matrix in each dtype.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import subprocess
import sys
from pathlib import Path

import torch

from gnnscale import TrainConfig, load_dataset, train

REPO = Path(__file__).resolve().parents[1]
SPECS = {
    "cora": ("planetoid:cora", "planetoid", "planetoid/ind.cora.x"),
    "citeseer": ("planetoid:citeseer", "planetoid", "planetoid/ind.citeseer.x"),
    "computers": ("npz:gnn-benchmark/amazon_electronics_computers.npz", "",
                  "gnn-benchmark/amazon_electronics_computers.npz"),
}


def _revision() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "gnnscale"], cwd=REPO, capture_output=True,
                               text=True, check=True).stdout.strip()
        return rev + (" (gnnscale/ modified)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default=str(REPO.parent / "shared" / "datasets"))
    p.add_argument("--datasets", default="cora,citeseer,computers")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--bound", type=float, default=0.5, help="goal, in points (default 0.5)")
    args = p.parse_args(argv)
    root = Path(args.root)
    seeds = [int(s) for s in args.seeds.split(",")]
    print(f"# {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, commit {_revision()}, "
          f"{platform.machine()} ({torch.get_num_threads()} torch threads), "
          f"torch {torch.__version__}, cpu")
    print("| dataset | fp32 test acc at best val, per seed (%) | bf16 (%) | median bf16 - fp32 (points) | "
          "max abs (points) | features fp32 / bf16 | within 0.5 |")
    print("|---|---|---|---:|---:|---|---|")
    for name in args.datasets.split(","):
        spec, sub, need = SPECS[name]
        if not (root / need).exists():
            print(f"| {name} | skipped: {root / need} not found | | | | | |")
            continue
        accs: dict[str, list[float]] = {"fp32": [], "bf16": []}
        size = {}
        for seed in seeds:
            for dtype in ("fp32", "bf16"):
                g = load_dataset(f"{spec}:feature_dtype={dtype}", root / sub if sub else root, seed=seed)
                assert g.x is not None
                size[dtype] = g.nbytes()["features"]
                cfg = TrainConfig(model="gcn", engine="inmemory", epochs=args.epochs, seed=seed)
                run = train(g, cfg, "cpu")
                accs[dtype].append(100 * float(run.summary["test_acc_at_best_val"]))
        diff = [b - a for a, b in zip(accs["fp32"], accs["bf16"], strict=True)]
        med = statistics.median(diff)
        ok = "PASS" if abs(med) <= args.bound else "FAIL"
        print(f"| {name} | {' / '.join(f'{a:.1f}' for a in accs['fp32'])} | "
              f"{' / '.join(f'{a:.1f}' for a in accs['bf16'])} | {med:+.2f} | {max(map(abs, diff)):.2f} | "
              f"{size['fp32'] / 2**20:.1f} / {size['bf16'] / 2**20:.1f} MiB | {ok} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
