"""Seeded synthetic graphs: contextual SBM (learnable, the default dataset) and Graph500 Kronecker (R-MAT)."""

from __future__ import annotations

import numpy as np
import torch

from gnnscale.errors import DatasetError
from gnnscale.graph.graph import Graph


def random_split(
    num_nodes: int, fractions: tuple[float, float, float], rng: np.random.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random train/val/test masks with the given fractions of the vertices."""
    perm = rng.permutation(num_nodes)
    n_train = int(round(fractions[0] * num_nodes))
    n_val = int(round(fractions[1] * num_nodes))
    n_test = min(num_nodes - n_train - n_val, int(round(fractions[2] * num_nodes)))
    masks = []
    for lo, hi in ((0, n_train), (n_train, n_train + n_val), (n_train + n_val, n_train + n_val + n_test)):
        m = torch.zeros(num_nodes, dtype=torch.bool)
        m[torch.from_numpy(perm[lo:hi])] = True
        masks.append(m)
    return masks[0], masks[1], masks[2]


def per_class_split(
    y: np.ndarray, train_per_class: int, val_per_class: int, rng: np.random.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``train_per_class`` / ``val_per_class`` random vertices of every class; the rest is test (Shchur et al.)."""
    n = y.shape[0]
    train = np.zeros(n, dtype=bool)
    val = np.zeros(n, dtype=bool)
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        train[idx[:train_per_class]] = True
        val[idx[train_per_class : train_per_class + val_per_class]] = True
    test = ~(train | val)
    return torch.from_numpy(train), torch.from_numpy(val), torch.from_numpy(test)


def csbm(
    nodes: int = 20000,
    classes: int = 5,
    avg_degree: float = 10.0,
    homophily: float = 0.6,
    features: int = 64,
    signal: float = 0.2,
    train: float = 0.1,
    val: float = 0.1,
    seed: int = 0,
) -> Graph:
    """Contextual stochastic block model: planted classes, Gaussian features around class means, homophilous edges.

    Args:
        nodes: vertices, each with a uniformly random class.
        classes: number of planted classes.
        avg_degree: expected undirected degree.
        homophily: fraction of edges joining two vertices of the same class (exact in expectation).
        features: feature dimensions; ``x_v = signal * mu_{y_v} + N(0, I)`` with ``mu_c ~ N(0, I)``.
        signal: class-mean strength; small values make features alone weak, so the graph carries the signal.
        train, val: fractions of vertices in the train and validation masks; the rest is test.
        seed: seeds everything.
    """
    if nodes < 2 or classes < 1 or features < 1 or avg_degree <= 0:
        raise DatasetError("csbm needs nodes >= 2, classes >= 1, features >= 1 and avg_degree > 0")
    if not 0.0 <= homophily <= 1.0 or not 0 < train < 1 or not 0 <= val < 1 or train + val >= 1:
        raise DatasetError("csbm needs 0 <= homophily <= 1, 0 < train, 0 <= val, train + val < 1")
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, nodes)
    means = rng.standard_normal((classes, features)).astype(np.float32)
    x = signal * means[y] + rng.standard_normal((nodes, features), dtype=np.float32)

    by_class = np.argsort(y, kind="stable")
    counts = np.bincount(y, minlength=classes)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    m = int(round(nodes * avg_degree / 2))
    src = rng.integers(0, nodes, m)
    same = rng.random(m) < homophily
    if classes > 1:
        target_class = np.where(same, y[src], (y[src] + rng.integers(1, classes, m)) % classes)
    else:
        target_class = y[src]
    ok = counts[target_class] > 0
    src, target_class = src[ok], target_class[ok]
    pick = (rng.random(src.shape[0]) * counts[target_class]).astype(np.int64)
    dst = by_class[starts[target_class] + pick]
    keep = src != dst
    ei = np.vstack([np.concatenate([src[keep], dst[keep]]), np.concatenate([dst[keep], src[keep]])])
    tr, va, te = random_split(nodes, (train, val, 1.0 - train - val), rng)
    return Graph.from_edge_index(
        ei,
        nodes,
        x=torch.from_numpy(x),
        y=torch.from_numpy(y.astype(np.int64)),
        train_mask=tr,
        val_mask=va,
        test_mask=te,
        num_classes=classes,
        name="csbm",
    )


def kronecker(
    scale: int = 16,
    edgefactor: int = 16,
    features: int = 64,
    classes: int = 16,
    seed: int = 0,
) -> Graph:
    """Graph500 Kronecker graph (R-MAT a=.57, b=.19, c=.19) with random features, labels, 25/50/25 split.

    ``2**scale`` vertices and ``edgefactor * 2**scale`` generated edges, symmetrised, self-loops and duplicates
    removed, vertex ids randomly permuted (as Graph500 does). Features and labels are random: the graph is for
    measuring systems, not accuracy (HongTu's protocol for unlabelled graphs).
    """
    if not 1 <= scale <= 34 or edgefactor < 1 or features < 1 or classes < 1:
        raise DatasetError("kronecker needs 1 <= scale <= 34, edgefactor >= 1, features >= 1, classes >= 1")
    a, b, c = 0.57, 0.19, 0.19
    rng = np.random.default_rng(seed)
    n, m = 1 << scale, edgefactor << scale
    src = np.zeros(m, dtype=np.int64)
    dst = np.zeros(m, dtype=np.int64)
    for level in range(scale):
        r = rng.random(m)
        src_bit = r >= a + b  # quadrants c, d
        dst_bit = ((r >= a) & (r < a + b)) | (r >= a + b + c)  # quadrants b, d
        src |= src_bit.astype(np.int64) << level
        dst |= dst_bit.astype(np.int64) << level
    perm = rng.permutation(n)
    src, dst = perm[src], perm[dst]
    keep = src != dst
    ei = np.vstack([np.concatenate([src[keep], dst[keep]]), np.concatenate([dst[keep], src[keep]])])
    x = rng.standard_normal((n, features), dtype=np.float32)
    y = rng.integers(0, classes, n)
    tr, va, te = random_split(n, (0.25, 0.5, 0.25), rng)
    return Graph.from_edge_index(
        ei,
        n,
        x=torch.from_numpy(x),
        y=torch.from_numpy(y),
        train_mask=tr,
        val_mask=va,
        test_mask=te,
        num_classes=classes,
        name=f"kronecker-{scale}",
    )
