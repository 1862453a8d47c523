"""K-hop neighbour sampler: uniformity, relabelling, exactness at full fanout, batched requests, determinism."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from gnnscale.graph import Block
from gnnscale.graph.block import sampling_csr
from gnnscale.graph.generators import csbm
from gnnscale.nn import GNN, build_model
from gnnscale.sample import (
    SAMPLE_NORMS,
    CSRTopology,
    NeighborRequest,
    SampledAdjacency,
    Topology,
    hop_key,
    sample_blocks,
    sample_key,
    sample_positions,
)
from gnnscale.sample.neighbor import FLOYD_MAX_FANOUT, mix64_int
from gnnscale.testing import with_device

# A tiny literal graph: in-neighbours of each vertex (vertex 4 has none).
IN_NBRS: dict[int, list[int]] = {
    0: [1, 2, 3, 5],
    1: [0, 4],
    2: [6],
    3: [0, 1, 2, 4, 7],
    4: [],
    5: [3, 6, 7],
    6: [0],
    7: [2, 5],
}


def _csr(in_nbrs: dict[int, list[int]], weighted: bool = True) -> tuple[Tensor, Tensor, Tensor | None]:
    """Literal in-neighbour CSR; edge ``u -> v`` weighs ``1 + u / 10 + v / 100`` (distinct per edge)."""
    indptr, indices, weight = [0], [], []
    for v in range(len(in_nbrs)):
        indices += in_nbrs[v]
        weight += [1 + u / 10 + v / 100 for u in in_nbrs[v]]
        indptr.append(len(indices))
    w = torch.tensor(weight, dtype=torch.float32) if weighted else None
    return torch.tensor(indptr), torch.tensor(indices, dtype=torch.int64), w


def _topo(csr: tuple[Tensor, Tensor, Tensor | None], device: str = "cpu") -> CSRTopology:
    indptr, indices, weight = csr
    return CSRTopology(indptr.to(device), indices.to(device), None if weight is None else weight.to(device))


def _gen(seed: int, device: str = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _check_blocks(blocks: list[Block], seeds: Tensor, fanouts: list[int], in_nbrs: dict[int, list[int]]) -> None:
    """Structural invariants of a sample, checked row by row against the literal graph."""
    assert len(blocks) == len(fanouts)
    assert torch.equal(blocks[-1].row_ids(blocks[-1].num_dst).cpu(), seeds.cpu())
    for layer, block in enumerate(blocks):
        fanout = fanouts[len(fanouts) - 1 - layer]  # blocks[-1] used fanouts[0]
        assert block.src_ids is not None and block.src_ids.shape == (block.num_src,)
        assert block.indptr.dtype == block.indices.dtype == block.src_ids.dtype == torch.int64
        src = block.row_ids().cpu().tolist()
        assert len(set(src)) == len(src), "source rows must be unique vertices"
        dst = src[: block.num_dst]
        if layer + 1 < len(blocks):  # destinations are the next block's sources, in that order
            assert blocks[layer + 1].num_src == block.num_dst
            assert dst == blocks[layer + 1].row_ids().cpu().tolist()
        new = src[block.num_dst:]
        assert new == sorted(new), "newly reached vertices come in ascending id order"
        indptr, indices = block.indptr.cpu().tolist(), block.indices.cpu().tolist()
        assert indptr[0] == 0 and all(0 <= i < block.num_src for i in indices)
        weights = None if block.edge_weight is None else block.edge_weight.cpu().tolist()
        reached: set[int] = set()
        for r, v in enumerate(dst):
            got = [src[i] for i in indices[indptr[r]: indptr[r + 1]]]
            if weights is not None:  # each sampled edge keeps its own weight (see _csr)
                w = weights[indptr[r]: indptr[r + 1]]
                assert w == pytest.approx([1 + u / 10 + v / 100 for u in got]), (v, got, w)
            true = in_nbrs[v]
            want = len(true) if fanout < 0 else min(len(true), fanout)
            assert len(got) == want, (v, got)
            assert len(set(got)) == len(got), "sampled without replacement"
            assert set(got) <= set(true), (v, got, true)
            reached |= set(got)
        # every source row is a destination or a sampled neighbour: nothing extra is gathered
        assert set(new) == reached - set(dst)


# ------------------------------------------------------------------------------------------------ topology


def test_csr_topology_slices() -> None:
    topo = CSRTopology(*_csr(IN_NBRS))
    assert isinstance(topo, Topology)
    ids = torch.tensor([3, 4, 0, 3])
    indptr, indices, weight = topo.neighbors(ids)
    assert indptr.tolist() == [0, 5, 5, 9, 14]
    assert indices.tolist() == IN_NBRS[3] + IN_NBRS[0] + IN_NBRS[3]
    assert weight is not None
    expect = [1 + u / 10 + v / 100 for v in [3, 0, 3] for u in IN_NBRS[v]]
    torch.testing.assert_close(weight, torch.tensor(expect))
    assert topo.num_neighbors(ids).tolist() == [5, 0, 4, 5]
    indptr, indices, weight = topo.neighbors(torch.tensor([], dtype=torch.int64))
    assert indptr.tolist() == [0] and indices.numel() == 0 and weight is not None and weight.numel() == 0


# ------------------------------------------------------------------------------------------------ uniformity

STAR_DEG, FANOUT, DRAWS = 20, 5, 4000


def _star() -> CSRTopology:
    """Vertex 0 has in-neighbours 1..20; vertex 21 has in-neighbours 1, 2, 3."""
    nbrs = {0: list(range(1, STAR_DEG + 1)), **{v: [] for v in range(1, STAR_DEG + 1)}, STAR_DEG + 1: [1, 2, 3]}
    return CSRTopology(*_csr(nbrs, weighted=False))


def _assert_binomial(count: Tensor, trials: int, p: float, what: str) -> None:
    """Every entry of ``count`` is within 5 binomial standard deviations of ``trials * p``."""
    sigma = math.sqrt(trials * p * (1 - p))
    worst = float((count.double() - trials * p).abs().max())
    assert worst <= 5 * sigma, f"{what}: deviation {worst:.1f} > 5 sigma ({5 * sigma:.1f}); counts {count.tolist()}"


def test_uniform_inclusion_frequency() -> None:
    topo = _star()
    incl = torch.zeros(DRAWS, STAR_DEG, dtype=torch.bool)  # [draw, neighbour - 1]
    for d in range(DRAWS):
        (block,) = sample_blocks(topo, torch.tensor([0]), [FANOUT], key=sample_key(0, d))
        got = block.row_ids()[block.indices]
        assert got.numel() == FANOUT and torch.unique(got).numel() == FANOUT
        assert int(got.min()) >= 1 and int(got.max()) <= STAR_DEG
        incl[d, got - 1] = True
    # each neighbour is included with probability fanout / degree
    _assert_binomial(incl.sum(0), DRAWS, FANOUT / STAR_DEG, "inclusion")
    # and every pair with probability f (f - 1) / (d (d - 1)): a uniform subset, not e.g. a random window
    pairs = incl.double().t() @ incl.double()  # [d, d]
    off = ~torch.eye(STAR_DEG, dtype=torch.bool)
    _assert_binomial(pairs[off], DRAWS, FANOUT * (FANOUT - 1) / (STAR_DEG * (STAR_DEG - 1)), "pair inclusion")


def test_uniform_inclusion_with_a_fanout_above_floyds() -> None:
    """The keyed-smallest path (fanout > FLOYD_MAX_FANOUT) is uniform too: inclusion and pair frequencies."""
    deg, fanout, draws = 48, FLOYD_MAX_FANOUT + 4, 3000
    topo = CSRTopology(*_csr({0: list(range(1, deg + 1)), **{v: [] for v in range(1, deg + 1)}}, weighted=False))
    incl = torch.zeros(draws, deg, dtype=torch.bool)
    for d in range(draws):
        (block,) = sample_blocks(topo, torch.tensor([0]), [fanout], key=sample_key(1, d))
        got = block.row_ids()[block.indices]
        assert got.numel() == fanout and torch.unique(got).numel() == fanout
        incl[d, got - 1] = True
    _assert_binomial(incl.sum(0), draws, fanout / deg, "inclusion")
    pairs = (incl.double().t() @ incl.double())[~torch.eye(deg, dtype=torch.bool)]
    _assert_binomial(pairs, draws, fanout * (fanout - 1) / (deg * (deg - 1)), "pair inclusion")


def test_uniform_across_rows_in_one_batch() -> None:
    """Many rows sampled in one call (one key, a different vertex per row): each row exactly `fanout` distinct,
    each uniform."""
    rows, pool = 2000, list(range(2000, 2000 + STAR_DEG))
    nbrs = {v: pool for v in range(rows)} | {v: [] for v in pool}
    (block,) = sample_blocks(CSRTopology(*_csr(nbrs, weighted=False)), torch.arange(rows), [FANOUT], key=1)
    assert torch.equal(block.in_degree(), torch.full((rows,), FANOUT))
    got = block.row_ids()[block.indices].view(rows, FANOUT) - pool[0]  # [rows, fanout] in 0..19
    assert bool((got.sort(1).values.diff(dim=1) > 0).all()), "a row sampled the same neighbour twice"
    incl = torch.zeros(rows, STAR_DEG, dtype=torch.bool).scatter_(1, got, True)
    _assert_binomial(incl.sum(0), rows, FANOUT / STAR_DEG, "inclusion")


@pytest.mark.parametrize("fanout", [3, 4, 25, -1])
def test_degree_at_most_fanout_takes_all(fanout: int) -> None:
    topo = _star()
    (block,) = sample_blocks(topo, torch.tensor([STAR_DEG + 1, 0]), [fanout], key=0)
    assert sorted(block.row_ids()[block.indices[: block.indptr[1]]].tolist()) == [1, 2, 3]
    assert int(block.in_degree()[1]) == (STAR_DEG if fanout == -1 or fanout >= STAR_DEG else fanout)


# ------------------------------------------------------------------------------------------------ relabelling


@with_device
@pytest.mark.parametrize("fanouts", [[2, 2], [1, 3, 2], [3], [0, 2]])
def test_relabel_tiny_graph(fanouts: list[int], device: str) -> None:
    topo = _topo(_csr(IN_NBRS), device)
    seeds = torch.tensor([3, 0, 4], device=device)
    for s in range(20):
        blocks = sample_blocks(topo, seeds, fanouts, key=s)
        assert all(b.edge_weight is not None for b in blocks)
        assert all(b.device.type == torch.device(device).type for b in blocks)
        _check_blocks(blocks, seeds, fanouts, IN_NBRS)


def test_two_hop_frontier_exact_at_full_fanout() -> None:
    topo = CSRTopology(*_csr(IN_NBRS))
    seeds = torch.tensor([3, 6])
    b0, b1 = sample_blocks(topo, seeds, [-1, -1])
    # hop 0: 3 <- 0, 1, 2, 4, 7 and 6 <- 0; new vertices sorted after the seeds
    assert b1.row_ids().tolist() == [3, 6, 0, 1, 2, 4, 7]
    assert b1.indptr.tolist() == [0, 5, 6]
    assert b1.indices.tolist() == [2, 3, 4, 5, 6, 2]
    # hop 1 expands all 7: the only new vertex is 5 (in-neighbour of 0 and 7)
    assert b0.row_ids().tolist() == [3, 6, 0, 1, 2, 4, 7, 5]
    assert b0.num_dst == 7
    assert b0.indptr.tolist() == [0, 5, 6, 10, 12, 13, 13, 15]
    assert b0.row_ids()[b0.indices].tolist() == [0, 1, 2, 4, 7, 0, 1, 2, 3, 5, 0, 4, 6, 2, 5]
    _check_blocks([b0, b1], seeds, [-1, -1], IN_NBRS)


def test_edge_cases() -> None:
    topo = CSRTopology(*_csr(IN_NBRS))
    # a seed without in-edges, and fanout 0: blocks with no edges whose sources are just the destinations
    b0, b1 = sample_blocks(topo, torch.tensor([4], dtype=torch.int32), [2, 2])
    assert b1.num_dst == b1.num_src == b0.num_src == 1 and b0.num_edges == b1.num_edges == 0
    (b,) = sample_blocks(topo, torch.tensor([0, 3]), [0])
    assert b.row_ids().tolist() == [0, 3] and b.indptr.tolist() == [0, 0, 0] and b.edge_weight is not None
    # no seeds at all
    blocks = sample_blocks(topo, torch.tensor([], dtype=torch.int64), [3, 3])
    assert [(b.num_dst, b.num_src, b.num_edges) for b in blocks] == [(0, 0, 0), (0, 0, 0)]


def test_invalid_arguments() -> None:
    topo = CSRTopology(*_csr(IN_NBRS))
    with pytest.raises(ValueError, match="duplicates"):
        sample_blocks(topo, torch.tensor([1, 3, 1]), [2])
    with pytest.raises(ValueError, match="fanouts"):
        sample_blocks(topo, torch.tensor([1]), [2, -2])
    with pytest.raises(ValueError, match="fanouts"):
        sample_blocks(topo, torch.tensor([1]), [])
    with pytest.raises(ValueError, match="integer"):
        sample_blocks(topo, torch.tensor([1.0]), [2])
    with pytest.raises(ValueError, match="integer"):
        sample_blocks(topo, torch.tensor([[1]]), [2])


# ------------------------------------------------------------------------------------------------ exactness


@pytest.mark.parametrize("fanout", [-1, "max"])
def test_full_fanout_one_layer_is_in_neighbourhood(fanout: int | str) -> None:
    indptr, indices, weight = _csr(IN_NBRS)
    assert weight is not None
    f = int((indptr[1:] - indptr[:-1]).max()) if fanout == "max" else int(fanout)
    seeds = torch.tensor([7, 3, 2, 0])
    (block,) = sample_blocks(CSRTopology(indptr, indices, weight), seeds, [f], key=0)
    assert block.edge_weight is not None
    for r, v in enumerate(seeds.tolist()):
        lo, hi = int(block.indptr[r]), int(block.indptr[r + 1])
        assert block.row_ids()[block.indices[lo:hi]].tolist() == indices[indptr[v]: indptr[v + 1]].tolist()
        assert torch.equal(block.edge_weight[lo:hi], weight[indptr[v]: indptr[v + 1]])


def _forward_blocks(model: GNN, blocks: list[Block], x: Tensor, seed_epoch: tuple[int, int] | None):
    h = x[blocks[0].row_ids()]
    for layer, (conv, block) in enumerate(zip(model.block_layers, blocks, strict=True)):
        h = conv(block, model.layer_input(layer, h, block.row_ids(), seed_epoch))
    return h


@with_device
@pytest.mark.parametrize("kind", ["gcn", "sage", "gat"])
@pytest.mark.parametrize("num_layers", [2, 3])
@pytest.mark.parametrize("seed_epoch", [None, (3, 1)])
def test_full_fanout_matches_full_graph(kind: str, num_layers: int, seed_epoch: tuple[int, int] | None,
                                        device: str) -> None:
    """Sampled from the graph's own lists (no loops) and made the layers' adjacency per block (one loop outside
    the fanout, GCN weights from the sample or the graph): at full fanout a sampled forward is full-graph's."""
    graph = csbm(nodes=200, classes=3, avg_degree=5, features=8, seed=2)
    assert graph.x is not None
    model = build_model(kind, 8, 16, 3, layers=num_layers, dropout=0.5, heads=1, seed=0).to(device)
    model.eval()
    x = graph.x.to(device)
    topo = _topo(sampling_csr(graph, model.adjacency)[:3], device)
    max_deg = int(graph.in_degree().max())
    seeds = torch.randperm(200, generator=_gen(5))[:40].to(device)  # unsorted: the order must be kept
    with torch.no_grad():
        full = model(Block.from_graph(graph, model.adjacency).to(device), x, seed_epoch)[seeds]
        for norm in SAMPLE_NORMS:
            adjacency = SampledAdjacency.from_graph(graph, model.adjacency, norm)
            for fanouts in ([-1] * num_layers, [max_deg] * num_layers, [max_deg + 3] + [-1] * (num_layers - 1)):
                blocks = sample_blocks(topo, seeds, fanouts, key=0, adjacency=adjacency)
                out = _forward_blocks(model, blocks, x, seed_epoch)
                assert out.shape == full.shape
                torch.testing.assert_close(out, full, atol=1e-5, rtol=1e-5)
            # and a real sample (fanout 2) does not reproduce it: the comparison above can fail
            out = _forward_blocks(model, sample_blocks(topo, seeds, [2] * num_layers, 0, adjacency), x, seed_epoch)
            assert not torch.allclose(out, full, atol=1e-3)


# ------------------------------------------------------------------------------------------------ requests


class RecordingTopology:
    """Forwards to a topology and records every request's ids and the positions each take reads."""

    def __init__(self, inner: Topology):
        self.inner = inner
        self.requests: list[Tensor] = []
        self.takes: list[tuple[Tensor, Tensor, Tensor]] = []  # (degrees, indptr, pos)

    def request(self, ids: Tensor) -> NeighborRequest:
        self.requests.append(ids.clone())
        req = self.inner.request(ids)
        outer = self

        class Recorded:
            degrees = req.degrees

            def take(self, indptr: Tensor, pos: Tensor) -> tuple[Tensor, Tensor | None]:
                outer.takes.append((req.degrees.clone(), indptr.clone(), pos.clone()))
                return req.take(indptr, pos)

        return Recorded()


def test_one_request_per_hop_reading_only_the_sampled_entries() -> None:
    graph = csbm(nodes=300, classes=3, avg_degree=8, features=4, seed=3)
    inner = CSRTopology.from_graph(graph)
    topo = RecordingTopology(inner)
    seeds = torch.randperm(300, generator=_gen(0))[:25]
    fanouts = [4, 3, 2]
    blocks = sample_blocks(topo, seeds, fanouts, key=1)
    assert len(topo.requests) == len(topo.takes) == len(fanouts)
    for hop, (ids, (deg, indptr, pos)) in enumerate(zip(topo.requests, topo.takes, strict=True)):
        assert torch.unique(ids).numel() == ids.numel(), f"hop {hop} requested duplicate ids"
        block = blocks[len(blocks) - 1 - hop]
        assert torch.equal(ids, block.row_ids(block.num_dst)), "hop h requests exactly its block's destinations"
        # the take reads min(degree, fanout) distinct in-range positions per vertex: nothing else
        assert torch.equal(indptr[1:] - indptr[:-1], deg.clamp(max=fanouts[hop]))
        assert torch.equal(indptr, block.indptr)
        for r in range(ids.numel()):
            p = pos[indptr[r]: indptr[r + 1]]
            assert bool((p >= 0).all() and (p < deg[r]).all()) and bool((p.diff() > 0).all()), (hop, r, p)
    assert topo.requests[0].tolist() == seeds.tolist()
    # read amplification: entries read == entries sampled
    assert inner.fetched_entries == sum(b.num_edges for b in blocks)


# ------------------------------------------------------------------------------------------------ keyed sampling


def _reference_positions(key: int, hop: int, v: int, deg: int, fanout: int) -> list[int]:
    """Floyd's algorithm, written out in plain Python on 64-bit integers, for one vertex (what the sampler must
    draw: a function of the key, the hop, the vertex and its degree only)."""
    mask = (1 << 64) - 1
    golden = 0x9E3779B97F4A7C15
    if fanout < 0 or deg <= fanout:
        return list(range(deg))
    kv = mix64_int(v ^ hop_key(key, hop))
    if fanout > FLOYD_MAX_FANOUT:  # key every position, keep the smallest keys (ties: lower position)
        keys = [(mix64_int((kv + (p + 1) * golden) & mask) >> 1, p) for p in range(deg)]
        return sorted(p for _, p in sorted(keys)[:fanout])
    chosen: list[int] = []
    for i in range(fanout):
        j = deg - fanout + i
        t = (mix64_int((kv + (i + 1) * golden) & mask) >> 1) % (j + 1)
        chosen.append(j if t in chosen else t)
    return sorted(chosen)


def test_positions_are_floyds_algorithm_on_the_vertex_key() -> None:
    """Checked against a plain-Python reference: int64 wrap-around, logical shifts and Floyd's rule all exact."""
    frontier = torch.tensor([0, 5, 2**40 + 3, 17, 123456789])
    deg = torch.tensor([3, 40, 9, 1000, 60])
    for key, hop, fanout in [(0, 0, 5), (sample_key(7, 3), 1, 5), (sample_key(1, 1), 2, 8), (2**63 + 11, 0, 1),
                             (sample_key(2, 5), 0, FLOYD_MAX_FANOUT), (sample_key(2, 5), 1, FLOYD_MAX_FANOUT + 7)]:
        indptr, pos = sample_positions(frontier, deg, fanout, hop_key(key, hop))
        for r, (v, d) in enumerate(zip(frontier.tolist(), deg.tolist(), strict=True)):
            got = pos[indptr[r]: indptr[r + 1]].tolist()
            assert got == _reference_positions(key, hop, v, d, fanout), (key, hop, v, d)


def _per_vertex_samples(blocks: list[Block]) -> dict[tuple[int, int], list[int]]:
    """``(hop, vertex) -> sampled in-neighbours`` of every destination of every block."""
    out = {}
    for layer, b in enumerate(blocks):
        hop = len(blocks) - 1 - layer
        ids = b.row_ids().tolist()
        for r in range(b.num_dst):
            out[(hop, ids[r])] = sorted(ids[i] for i in b.indices[b.indptr[r]: b.indptr[r + 1]].tolist())
    return out


@with_device
def test_keyed_samples_do_not_depend_on_the_batch(device: str) -> None:
    """A vertex's sample at a hop is the same whichever batch it is in, in whatever order, on whichever device."""
    graph = csbm(nodes=600, classes=3, avg_degree=20, features=4, seed=8)
    topo = CSRTopology.from_graph(graph)
    dev_topo = _topo((topo.indptr, topo.indices, topo.weight), device)
    seeds = torch.randperm(600, generator=_gen(2))[:90]
    key = sample_key(3, 2)
    whole = _per_vertex_samples(sample_blocks(topo, seeds, [6, 4], key))
    parts = {}
    for part in (seeds[:31], seeds[31:32], seeds[32:].flip(0)):  # uneven parts, one reversed
        parts.update(_per_vertex_samples(sample_blocks(dev_topo, part.to(device), [6, 4], key)))
    seed_set = set(seeds.tolist())
    for (hop, v), nbrs in whole.items():
        assert parts[(hop, v)] == nbrs, (hop, v)
    # the seeds' samples (hop 0) are the same on every split; and the key matters
    other = _per_vertex_samples(sample_blocks(topo, seeds, [6, 4], sample_key(3, 3)))
    assert any(other[(0, v)] != whole[(0, v)] for v in seed_set)


# ------------------------------------------------------------------------------------------------ determinism


def _same(a: list[Block], b: list[Block]) -> bool:
    def eq(s: Tensor | None, t: Tensor | None) -> bool:
        return (s is None and t is None) or (s is not None and t is not None and torch.equal(s.cpu(), t.cpu()))

    return len(a) == len(b) and all(
        x.num_src == y.num_src and eq(x.indptr, y.indptr) and eq(x.indices, y.indices)
        and eq(x.src_ids, y.src_ids) and eq(x.edge_weight, y.edge_weight)
        for x, y in zip(a, b, strict=True)
    )


@with_device
def test_deterministic_with_a_key(device: str) -> None:
    graph = csbm(nodes=500, classes=3, avg_degree=12, features=4, seed=4)
    csr = sampling_csr(graph, build_model("gcn", 4, 8, 3, layers=2, dropout=0.0, heads=1, seed=0).adjacency)[:3]
    topo = _topo(csr, device)
    seeds = torch.arange(0, 500, 7, device=device)
    first = sample_blocks(topo, seeds, [5, 3], key=11)
    assert _same(first, sample_blocks(topo, seeds, [5, 3], key=11))
    assert not _same(first, sample_blocks(topo, seeds, [5, 3], key=12))
    assert _same(first, sample_blocks(_topo(csr), seeds.cpu(), [5, 3], key=11))  # and the CPU draws the same
