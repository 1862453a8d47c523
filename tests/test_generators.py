"""csbm with communities (issue #11): locality that METIS finds, and no change to the graphs without it."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from gnnscale.errors import DatasetError
from gnnscale.graph.datasets import load_dataset
from gnnscale.graph.generators import csbm, csbm_communities
from gnnscale.graph.graph import Graph
from gnnscale.partition import partition_graph


def _digest(g: Graph) -> str:
    h = hashlib.sha256()
    for t in (g.indptr, g.indices, g.x, g.y, g.train_mask, g.val_mask, g.test_mask):
        assert t is not None
        h.update(np.ascontiguousarray(t.numpy()).tobytes())
    return h.hexdigest()[:16]


def _intra(g: Graph, comm: np.ndarray) -> float:
    ei = g.edge_index().numpy()
    return float(np.mean(comm[ei[0]] == comm[ei[1]]))


# Digests of csbm as generated before the communities options existed (commit 4858b77): saved seeds must keep
# giving the same graphs.
@pytest.mark.parametrize(("kw", "digest"), [
    ({"nodes": 2000, "seed": 3}, "30a38686f0db0b4e"),
    ({"nodes": 500, "classes": 1, "seed": 1}, "ffa8374d9aaeee17"),
    ({"nodes": 20000, "classes": 47, "avg_degree": 30, "seed": 7}, "6d81d4042577fa07"),
])
def test_csbm_without_communities_is_unchanged(kw: dict, digest: str) -> None:
    assert _digest(csbm(**kw)) == digest
    assert csbm(**kw).equals(csbm(**kw, communities=0, p_intra=0.3))  # p_intra is ignored without communities


def test_csbm_communities_are_seeded_and_change_only_the_edges() -> None:
    a = csbm(nodes=3000, communities=20, seed=5)
    assert a.equals(csbm(nodes=3000, communities=20, seed=5))
    assert not a.equals(csbm(nodes=3000, communities=20, seed=6))
    assert not a.equals(csbm(nodes=3000, communities=21, seed=5))
    plain = csbm(nodes=3000, seed=5)
    assert not np.array_equal(a.indices.numpy(), plain.indices.numpy())
    for name in ("x", "y", "train_mask", "val_mask", "test_mask"):
        assert np.array_equal(getattr(a, name).numpy(), getattr(plain, name).numpy()), name
    assert np.array_equal(csbm_communities(3000, 20, 5), csbm_communities(3000, 20, 5))
    assert not np.array_equal(csbm_communities(3000, 20, 5), csbm_communities(3000, 20, 6))


@pytest.mark.parametrize("p", [0.0, 0.5, 0.9])
def test_intra_community_fraction_is_p_intra(p: float) -> None:
    k = 32
    g = csbm(nodes=20000, avg_degree=10, classes=3, communities=k, p_intra=p, seed=2)
    comm = csbm_communities(20000, k, seed=2)
    assert np.bincount(comm, minlength=k).min() > 0
    expected = p + (1 - p) / k  # edges drawn anywhere land inside the community 1/K of the time
    assert abs(_intra(g, comm) - expected) < 0.015
    assert g.num_edges > 0.97 * 20000 * 10  # few duplicates or self-loops merged away


def test_all_edges_inside_communities_at_p_intra_1_and_homophily_kept() -> None:
    g = csbm(nodes=20000, avg_degree=10, classes=4, homophily=0.7, communities=16, p_intra=1.0, seed=3)
    comm = csbm_communities(20000, 16, seed=3)
    assert _intra(g, comm) == 1.0
    ei = g.edge_index().numpy()
    y = g.y.numpy()
    assert abs(float(np.mean(y[ei[0]] == y[ei[1]])) - 0.7) < 0.02


def test_tiny_communities_fall_back_to_any_vertex_of_the_community() -> None:
    # 400 communities of ~5 vertices and 20 classes: most (community, class) buckets are empty
    g = csbm(nodes=2000, avg_degree=4, classes=20, communities=400, p_intra=1.0, seed=4)
    assert _intra(g, csbm_communities(2000, 400, seed=4)) == 1.0
    assert g.num_edges > 0


def test_metis_finds_the_communities() -> None:
    kw = {"nodes": 20000, "avg_degree": 20, "seed": 1}
    g = csbm(**kw, communities=64, p_intra=0.9)
    plain = csbm(**kw)
    one = partition_graph(g, 1, 1, "range")
    alpha_range = one.with_chunks(g, 16, "range").stats(g)["alpha"]
    alpha_metis = one.with_chunks(g, 16, "metis").stats(g)["alpha"]
    alpha_plain = partition_graph(plain, 1, 1, "range").with_chunks(plain, 16, "metis").stats(plain)["alpha"]
    assert alpha_metis < 0.4 * alpha_range  # measured 2.99 vs 11.10
    assert alpha_metis < 0.5 * alpha_plain  # measured 2.99 vs 8.29


@pytest.mark.parametrize(("spec", "msg"), [
    ("csbm:nodes=100,communities=-1", "0 <= communities <= nodes"),
    ("csbm:nodes=100,communities=101", "0 <= communities <= nodes"),
    ("csbm:nodes=100,communities=4,p_intra=1.5", "0 <= p_intra <= 1"),
    ("csbm:nodes=100,communities=4,p_intra=-0.1", "0 <= p_intra <= 1"),
    ("csbm:communities=many", "not a valid int"),
])
def test_community_options_are_validated(spec: str, msg: str) -> None:
    with pytest.raises(DatasetError, match=msg):
        load_dataset(spec)


def test_community_options_in_specs() -> None:
    g = load_dataset("csbm:nodes=600,features=4,communities=6,p_intra=0.8,seed=9")
    ref = csbm(nodes=600, features=4, communities=6, p_intra=0.8, seed=9)
    assert np.array_equal(g.indices.numpy(), ref.indices.numpy())
    assert g.meta["spec"] == "csbm:communities=6,features=4,nodes=600,p_intra=0.8,seed=9"


def test_kronecker_levels_drawn_by_threads_are_the_serial_draws() -> None:
    import numpy as np

    from gnnscale.graph.generators import _uniform_levels

    m = 1 << 20  # large enough for the threaded path
    serial = np.random.default_rng(7)
    want = [serial.random(m) for _ in range(3)]
    threaded = np.random.default_rng(7)
    got = list(_uniform_levels(threaded, 3, m, threads=3))
    assert all(np.array_equal(a, b) for a, b in zip(want, got, strict=True))
    assert threaded.random() == serial.random()  # the generator continues where the serial draws leave it
