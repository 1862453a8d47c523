"""Seeded synthetic graphs: contextual SBM (learnable, the default dataset; optionally with communities that give
it locality) and Graph500 Kronecker (R-MAT)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

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
    """``train_per_class`` / ``val_per_class`` random vertices of every class; the rest is test (Shchur et al.).
    Unlabelled vertices (label ``-1``) are in no split."""
    n = y.shape[0]
    train = np.zeros(n, dtype=bool)
    val = np.zeros(n, dtype=bool)
    for c in np.unique(y[y >= 0]):
        idx = rng.permutation(np.flatnonzero(y == c))
        train[idx[:train_per_class]] = True
        val[idx[train_per_class : train_per_class + val_per_class]] = True
    test = ~(train | val) & (y >= 0)
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
    communities: int = 0,
    p_intra: float = 0.9,
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
        communities: ``K > 0`` gives the graph locality: every vertex also gets a uniformly random community
            (:func:`csbm_communities`; ids are random with respect to communities, so a partitioner has to find
            them), and each edge picks its other endpoint inside the source's community with probability
            ``p_intra`` (there a vertex of the target class when the community has one, else any vertex of the
            community), else anywhere as without communities. ``0``: no communities (the graph is then the same as
            before these options existed). Features, labels, splits and the edges' sources and target classes
            are the same for every ``K`` and ``p_intra``; only the edges' other endpoints change.
        p_intra: with ``communities``, the probability that an edge is drawn inside its source's community (the
            fraction of intra-community edges is ``p_intra + (1 - p_intra) / K`` in expectation, before duplicate
            edges are merged).
    """
    if nodes < 2 or classes < 1 or features < 1 or avg_degree <= 0:
        raise DatasetError("csbm needs nodes >= 2, classes >= 1, features >= 1 and avg_degree > 0")
    if not 0.0 <= homophily <= 1.0 or not 0 < train < 1 or not 0 <= val < 1 or train + val >= 1:
        raise DatasetError("csbm needs 0 <= homophily <= 1, 0 < train, 0 <= val, train + val < 1")
    if not 0 <= communities <= nodes:
        raise DatasetError(f"csbm needs 0 <= communities <= nodes (0: no communities), got communities={communities}")
    if not 0.0 <= p_intra <= 1.0:
        raise DatasetError(f"csbm needs 0 <= p_intra <= 1, got p_intra={p_intra}")
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
    u = rng.random(len(src))
    dst = by_class[starts[target_class] + (u * counts[target_class]).astype(np.int64)]
    if communities:
        crng = _community_rng(seed)
        comm = crng.integers(0, communities, nodes)
        intra = (crng.random(m, dtype=np.float32) < p_intra)[ok]
        _community_targets(dst, src, target_class, u, intra, comm, y, communities, classes)
    keep = src != dst
    del target_class, u, same
    ei = _both_directions(src[keep], dst[keep])
    del src, dst, keep
    tr, va, te = random_split(nodes, (train, val, 1.0 - train - val), rng)
    return Graph.from_edge_index(
        ei,
        nodes,
        coalesce=True,  # a simple graph: pairs drawn twice are one edge
        x=torch.from_numpy(x),
        y=torch.from_numpy(y.astype(np.int64)),
        train_mask=tr,
        val_mask=va,
        test_mask=te,
        num_classes=classes,
        name="csbm",
    )


def _both_directions(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """``[2, 2E]``: the edges ``src -> dst`` then ``dst -> src``, written in place (no concatenated temporaries)."""
    k = src.shape[0]
    ei = np.empty((2, 2 * k), dtype=np.int64)
    ei[0, :k], ei[0, k:], ei[1, :k], ei[1, k:] = src, dst, dst, src
    return ei


def _community_rng(seed: int) -> np.random.Generator:
    """The community stream of :func:`csbm`: a child of ``seed``'s, so the main stream is untouched."""
    return np.random.default_rng(np.random.SeedSequence(seed).spawn(1)[0])


def csbm_communities(nodes: int, communities: int, seed: int = 0) -> np.ndarray:
    """``[nodes]`` community of each vertex of ``csbm(nodes=nodes, communities=communities, seed=seed)``.

    Cheap (no graph is built): the ids come first from their own seeded stream.
    """
    if not 1 <= communities <= nodes:
        raise DatasetError(f"csbm needs 1 <= communities <= nodes here, got communities={communities}")
    return _community_rng(seed).integers(0, communities, nodes)


def _community_targets(
    dst: np.ndarray,
    src: np.ndarray,
    target_class: np.ndarray,
    u: np.ndarray,
    intra: np.ndarray,
    comm: np.ndarray,
    y: np.ndarray,
    communities: int,
    classes: int,
    block: int = 1 << 23,
) -> None:
    """Overwrite ``dst`` of the ``intra`` edges with a vertex of the source's community (in place).

    The vertex is ``u``-uniform among the community's vertices of ``target_class`` when there are any, else among
    all of the community's vertices. Buckets come from one (community, class)-sorted index; edges are processed in
    blocks so the temporaries stay small at products scale.
    """
    n = y.shape[0]
    idx_t = np.int32 if n < 2**31 else np.int64
    cc = comm * classes + y  # bucket of each vertex
    by_cc = np.argsort(cc, kind="stable").astype(idx_t)
    cc_counts = np.bincount(cc, minlength=communities * classes)
    cc_starts = np.concatenate([[0], np.cumsum(cc_counts)[:-1]])
    del cc
    c_counts = np.bincount(comm, minlength=communities)  # buckets of one community are consecutive in by_cc
    c_starts = np.concatenate([[0], np.cumsum(c_counts)[:-1]])
    comm_t = comm.astype(idx_t)
    for lo in range(0, dst.shape[0], block):
        sl = slice(lo, lo + block)
        i = np.flatnonzero(intra[sl])
        c = comm_t[src[sl][i]]
        key = c.astype(np.int64) * classes + target_class[sl][i]
        cnt = cc_counts[key]
        start = cc_starts[key]
        empty = cnt == 0
        cnt[empty] = c_counts[c[empty]]
        start[empty] = c_starts[c[empty]]
        dst[lo + i] = by_cc[start + (u[sl][i] * cnt).astype(np.int64)]


def _uniform_levels(rng: np.random.Generator, levels: int, m: int, threads: int = 2) -> Iterator[np.ndarray]:
    """``rng.random(m)`` for each of ``levels`` levels, drawn by ``threads`` threads (the same numbers: each draws its
    slice from a copy of the generator advanced to it; NumPy fills without the GIL); ``rng`` ends where the
    serial draws would leave it. The next level is drawn while the caller uses this one."""
    bits = rng.bit_generator
    if not hasattr(bits, "advance") or m < (1 << 20):
        for _ in range(levels):
            yield rng.random(m)
        return
    start = copy.deepcopy(bits)
    bounds = [m * t // threads for t in range(threads + 1)]

    def draw(level: int) -> np.ndarray:
        out = np.empty(m)

        def fill(t: int) -> None:
            gen = copy.deepcopy(start)
            gen.advance(level * m + bounds[t])
            np.random.Generator(gen).random(bounds[t + 1] - bounds[t], out=out[bounds[t] : bounds[t + 1]])

        list(pool.map(fill, range(threads)))
        return out

    with ThreadPoolExecutor(threads) as pool, ThreadPoolExecutor(1) as ahead:
        nxt = ahead.submit(draw, 0)
        for level in range(levels):
            r = nxt.result()
            if level + 1 < levels:
                nxt = ahead.submit(draw, level + 1)
            yield r
    bits.advance(levels * m)


RMAT = (0.57, 0.19, 0.19)
"""Graph500's R-MAT quadrant probabilities a, b, c (d is the rest)."""


def kronecker_edge_block(start: np.random.BitGenerator, scale: int, m: int, lo: int, hi: int
                         ) -> tuple[np.ndarray, np.ndarray]:
    """Edges ``lo..hi`` of :func:`kronecker`'s ``m`` R-MAT draws (sources, destinations; before the vertex
    permutation), ``start`` being the bit generator of ``np.random.default_rng(seed)`` untouched: the same numbers
    :func:`kronecker` draws, a block at a time (level ``l``'s uniforms for edge ``e`` are the stream's
    ``l * m + e``-th; ``start`` is copied, not advanced)."""
    a, b, c = RMAT
    acc = np.dtype(np.int32 if scale <= 30 else np.int64)
    src: np.ndarray = np.zeros(hi - lo, dtype=acc)
    dst: np.ndarray = np.zeros(hi - lo, dtype=acc)
    for level in range(scale):
        bits = copy.deepcopy(start)
        bits.advance(level * m + lo)  # type: ignore[attr-defined]
        r = np.random.Generator(bits).random(hi - lo)
        bit = acc.type(1 << level)
        src_bit = r >= a + b
        dst_bit = (r >= a) != src_bit
        dst_bit |= r >= a + b + c
        src += src_bit * bit
        dst += dst_bit * bit
    return src, dst


def check_kronecker(scale: int, edgefactor: int, features: int, classes: int, train: float, val: float,
                    test: float | None) -> float:
    """The test fraction (``None``: the rest); DatasetError unless the options make a Kronecker graph (also checked
    by the streaming convert)."""
    if not 1 <= scale <= 34 or edgefactor < 1 or features < 1 or classes < 1:
        raise DatasetError("kronecker needs 1 <= scale <= 34, edgefactor >= 1, features >= 1, classes >= 1")
    rest = 1.0 - train - val if test is None else test
    if not (0 < train <= 1 and 0 <= val <= 1 and 0 <= rest <= 1 and train + val + rest <= 1 + 1e-9):
        raise DatasetError(f"kronecker needs 0 < train, 0 <= val, 0 <= test and train + val + test <= 1 (got "
                           f"train={train}, val={val}, test={test})")
    return rest


def kronecker(
    scale: int = 16,
    edgefactor: int = 16,
    features: int = 64,
    classes: int = 16,
    seed: int = 0,
    train: float = 0.25,
    val: float = 0.5,
    test: float | None = None,
) -> Graph:
    """Graph500 Kronecker graph (R-MAT a=.57, b=.19, c=.19) with random features, labels and a random split:
    ``train``, ``val`` and ``test`` of the vertices (default 25/50 and the rest test; a graph the size of
    ogbn-papers100M labels about 1%: ``train=0.01,val=0.001,test=0.002`` gives its shape, the rest in no split).

    ``2**scale`` vertices and ``edgefactor * 2**scale`` generated edges, symmetrised, self-loops and duplicates
    removed, vertex ids randomly permuted (as Graph500 does). Features and labels are random: the graph is for
    measuring systems, not accuracy (HongTu's protocol for unlabelled graphs).
    """
    test = check_kronecker(scale, edgefactor, features, classes, train, val, test)
    a, b, c = RMAT
    rng = np.random.default_rng(seed)
    n, m = 1 << scale, edgefactor << scale
    acc = np.dtype(np.int32 if scale <= 30 else np.int64)  # ids as they are built: half the traffic in int32
    src: np.ndarray = np.zeros(m, dtype=acc)
    dst: np.ndarray = np.zeros(m, dtype=acc)
    for level, r in enumerate(_uniform_levels(rng, scale, m)):
        bit = acc.type(1 << level)
        src_bit = r >= a + b  # quadrants c, d
        dst_bit = (r >= a) != src_bit  # quadrant b ...
        dst_bit |= r >= a + b + c  # ... or d
        src += src_bit * bit
        dst += dst_bit * bit
    perm = rng.permutation(n)
    src, dst = perm[src], perm[dst]
    keep = src != dst
    ei = np.vstack([np.concatenate([src[keep], dst[keep]]), np.concatenate([dst[keep], src[keep]])])
    x = rng.standard_normal((n, features), dtype=np.float32)
    y = rng.integers(0, classes, n)
    tr, va, te = random_split(n, (train, val, test), rng)
    return Graph.from_edge_index(
        ei,
        n,
        coalesce=True,  # a simple graph: R-MAT draws popular pairs many times, kept once
        x=torch.from_numpy(x),
        y=torch.from_numpy(y),
        train_mask=tr,
        val_mask=va,
        test_mask=te,
        num_classes=classes,
        name=f"kronecker-{scale}",
        meta={"made_up": ["features", "labels"]},  # training says so: accuracy on them measures nothing
    )
