"""PyG's GIN on Amazon Photo, issue #31's protocol: 2 layers, hidden 64, dropout 0.5, Adam lr 0.01, weight decay
5e-4, 100 full-batch epochs, 20/30 labels per class (gnnscale's ``read_npz`` split for the same seed); prints the
test accuracy at the best validation epoch and at the last. ``INPUT_DROPOUT=1`` also drops the input features, as
gnnscale's models do (PyG's ``BasicGNN`` does not).

    .venv/bin/python benchmarks/gin_photo_pyg.py \
        ../shared/datasets/gnn-benchmark/amazon_electronics_photo.npz batch_norm 0 1 2
"""

from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F
from torch_geometric.nn.models import GIN

from gnnscale.graph.io import read_npz


def main(argv: list[str]) -> None:
    path, norm, seeds = argv[0], argv[1], [int(s) for s in argv[2:]]
    input_dropout = os.environ.get("INPUT_DROPOUT") == "1"
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    for seed in seeds:
        g = read_npz(path, seed=seed)
        assert g.x is not None and g.y is not None and g.train_mask is not None
        assert g.val_mask is not None and g.test_mask is not None
        x, y, ei = g.x.to(dev), g.y.to(dev), g.edge_index().to(dev)
        train, val, test = g.train_mask.to(dev), g.val_mask.to(dev), g.test_mask.to(dev)
        torch.manual_seed(seed)
        model = GIN(x.shape[1], 64, 2, int(y.max()) + 1, dropout=0.5, norm=None if norm == "none" else norm).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
        best_val, test_at_best, last = -1.0, 0.0, 0.0
        for _ in range(100):
            model.train()
            opt.zero_grad()
            xin = F.dropout(x, 0.5) if input_dropout else x
            loss = F.cross_entropy(model(xin, ei)[train], y[train])
            loss.backward()
            opt.step()
            model.eval()
            with torch.no_grad():
                pred = model(x, ei).argmax(-1)
            acc_val = float((pred[val] == y[val]).float().mean())
            last = float((pred[test] == y[test]).float().mean())
            if acc_val > best_val:
                best_val, test_at_best = acc_val, last
        print(f"pyg GIN norm={norm} input_dropout={input_dropout} seed={seed}: test at best val {test_at_best:.4f}, "
              f"final test {last:.4f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
