"""The mini-batch store's device tier on sim devices (gnnscale.runtime's accelerator simulated on the CPU): two
sim devices with small pools hold the hot topology and features, host memory the rest. Every read equals the
graph (features x[ids], neighbour lists, sampled blocks) on the devices' default streams and on a trainer's own
stream; the per-tier counters equal the CPU run's; the pools bound the placement; the syncs and waits per read
and per batch are what gnnscale/store/reader.py promises. A copy nobody waited for reads as NaN (or a poisoned
index), and work that races with another stream raises StreamOrderError, so removing any wait of the store makes
one of these tests fail; so does reusing a buffer another stream still reads. The host reads a read's per-source
counts (``host_values``) only after it waited for the device: without that wait, at any call site, the sim device's
host read raises StreamOrderError."""

from __future__ import annotations

import dataclasses
import gc
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
import torch
from test_minibatch_xgnn import GCN, weighted

import gnnscale.runtime as rt
from gnnscale.errors import ConfigError
from gnnscale.graph.block import sampling_csr
from gnnscale.graph.csr import csr_slices
from gnnscale.graph.generators import csbm
from gnnscale.graph.graph import Graph
from gnnscale.sample import CSRTopology, sample_blocks, sample_key
from gnnscale.store import (
    DeviceCache,
    DeviceSource,
    GlobalMemoryStore,
    InMemorySource,
    PinnedHostSource,
    ShardedDeviceSource,
    gather_rows,
    triton_available,
)
from gnnscale.store import cache as cache_mod
from gnnscale.store import features as features_mod
from gnnscale.store import reader as reader_mod
from gnnscale.store import sharded as sharded_mod
from gnnscale.store.placement import HOST

CPU = torch.device("cpu")
POOL = 1 << 16  # 64 KiB per sim device: the hot share and the reads' buffers
RATIOS = dict(gpu_graph_ratio=0.4, gpu_feature_ratio=0.5)
FANOUTS = (4, 3)


def graph() -> Graph:
    return weighted(csbm(nodes=300, features=6, avg_degree=6, seed=7))


G = graph()
assert G.x is not None
X = G.x
INDPTR, INDICES, WEIGHT = sampling_csr(G, GCN)[:3]


def sims(capacity: int = POOL) -> list[rt.SimDevice]:
    return [rt.SimDevice(i, capacity) for i in range(2)]


def store_on(devices: list[Any], **kw: Any) -> GlobalMemoryStore:
    return GlobalMemoryStore(G, devices, adjacency=GCN, **{**RATIOS, **kw})


def ids_of(seed: int, n: int = 200) -> torch.Tensor:
    return torch.randint(0, G.num_nodes, (n,), generator=torch.Generator().manual_seed(seed))  # repeats included


def on_stream(dev: Any, kind: str) -> Any:
    """The stream a read runs on: the device's default one, or a trainer's own."""
    return None if kind == "default" or not rt.is_accelerator(dev) else rt.new_stream(dev)


def read_everything(store: GlobalMemoryStore, g: int, stream: Any, seed: int = 0) -> dict[str, Any]:
    """Features, whole lists, degrees and a sampled batch (two hops, then its input rows) through reader ``g``,
    on ``stream``; the host waits for the stream before looking."""
    ids = ids_of(seed)
    uniq = torch.unique(ids)
    with rt.use_stream(stream):
        got = {"x": store.features(ids, g), "lists": store.neighbors(uniq, g), "deg": store.num_neighbors(uniq, g)}
        blocks = sample_blocks(store.reader(g), uniq[:40], FANOUTS, sample_key(3, 1))
        got["blocks"] = blocks
        src = blocks[0].src_ids
        assert src is not None
        got["input"] = store.features(src, g)
    rt.synchronize(stream if stream is not None else store.devices[g])
    got["ids"], got["uniq"] = ids, uniq
    return got


# ------------------------------------------------------------------------------------------------ (a) reads
@pytest.mark.parametrize("stream", ["default", "trainer"])
@pytest.mark.parametrize("reader", [0, 1])
def test_every_read_on_sim_devices_equals_the_graph(stream: str, reader: int) -> None:
    devs = sims()
    store = store_on(devs)
    assert store.placement.source == ((0, 1), (0, 1))  # each reads the other's partition over the link
    got = read_everything(store, reader, on_stream(devs[reader], stream))
    ids, uniq = got["ids"], got["uniq"]
    assert torch.equal(got["x"], X[ids])
    ptr, pos = csr_slices(INDPTR, uniq)
    p, i, w = got["lists"]
    assert torch.equal(p, ptr) and torch.equal(i, INDICES[pos]) and w is not None and torch.equal(w, WEIGHT[pos])
    assert torch.equal(got["deg"], ptr[1:] - ptr[:-1])
    want = sample_blocks(CSRTopology.from_graph(G, GCN), uniq[:40], FANOUTS, sample_key(3, 1))
    for b, a in zip(got["blocks"], want, strict=True):
        assert torch.equal(b.indptr, a.indptr) and torch.equal(b.indices, a.indices)
        assert torch.equal(b.src_ids, a.src_ids) and torch.equal(b.edge_weight, a.edge_weight)
    assert torch.equal(got["input"], X[want[0].src_ids])
    st = store.readers[reader].stats  # every source was read: own device, the other device, host memory
    assert set(st.rows_from) == set(st.lists_from) == set(st.entries_from) == {0, 1, HOST}


def test_feature_sources_on_a_sim_device_are_ready_for_their_stream() -> None:
    """A pinned-host source's rows are copied on the reading stream: the poison until the stream is waited for,
    then x[ids]; the device, cache and sharded sources read x[ids] on a trainer stream too."""
    dev, other = rt.SimDevice(0, POOL), rt.SimDevice(1, POOL)
    ids = ids_of(1, 50)
    src = PinnedHostSource(X, dev)
    assert src.method == "index_select" and src.region is None  # a sim device needs no page-locking
    s = rt.new_stream(dev)
    with rt.use_stream(s):
        got = src.gather(ids)
    assert bool(got.isnan().all())  # not waited for yet
    consumer = rt.new_stream(dev)
    rt.wait_stream(consumer, s)
    assert torch.equal(got, X[ids]) and rt.device_of(got) is dev
    hot = X[::3]
    shards = [{0: hot[0::2]}, {1: hot[1::2]}]
    placed = [{0: rt.to_device(shards[0][0], dev)}, {1: rt.to_device(shards[1][1], other)}]
    rt.synchronize(dev)
    rt.synchronize(other)
    cache = DeviceCache.of(PinnedHostSource(X, dev), torch.arange(0, G.num_nodes, 3), dev)
    sources = {"device": DeviceSource(X, dev), "cache": cache,
               "sharded": ShardedDeviceSource(placed, [dev, other], [0, 1], dev, hot.shape[0], X.shape[1])}
    for name, source in sources.items():
        rt.synchronize(dev)
        want = ids[ids < hot.shape[0]] if name == "sharded" else ids
        with rt.use_stream(s):
            got = source.gather(want)
        rt.synchronize(s)
        assert torch.equal(got, (hot if name == "sharded" else X)[want]), name
    assert dict(sources["sharded"].read_stats().requests) == {"device0": 1, "device1": 1}
    # host-side sources given ids that are still being copied to the device read them on the host (a blocking
    # copy on the stream that carries them)
    for host_side in (InMemorySource(X), PinnedHostSource(X, CPU)):
        with rt.use_stream(s):
            ids_dev = rt.to_device(ids, dev)
            assert torch.equal(host_side.gather(ids_dev), X[ids]), host_side


# ------------------------------------------------------------------------------------------------ (b) counters
def test_per_tier_counters_equal_the_cpu_run() -> None:
    cpu, sim = store_on([CPU, CPU]), store_on(sims())
    for g in (0, 1):
        a, b = read_everything(cpu, g, None), read_everything(sim, g, on_stream(sim.devices[g], "trainer"))
        assert torch.equal(a["x"], b["x"]) and torch.equal(a["input"], b["input"])
        assert cpu.feature_source(g).read_stats() == sim.feature_source(g).read_stats()
    ca, sa = cpu.stats, sim.stats
    assert ca.staging_allocs == 0 and sa.staging_allocs == 2  # one reused buffer per sim reader
    for f in dataclasses.fields(sa):
        if f.name != "staging_allocs":
            assert getattr(ca, f.name) == getattr(sa, f.name), f.name
    assert sa.remote_requests > 0 and sa.d2d_bytes > 0 and sa.rows_from[HOST] > 0 and sa.entries_from[HOST] > 0


# ------------------------------------------------------------------------------------------------ (c) pools
def test_the_pools_hold_exactly_the_placement_and_bound_it() -> None:
    devs = sims()
    store = store_on(devs)
    need = store.device_bytes()
    assert [d.pool.used for d in devs] == need and min(need) > 0
    for g in (0, 1):
        read_everything(store, g, on_stream(devs[g], "trainer"))
    gc.collect()
    assert [d.pool.used for d in devs] == need  # a read keeps no device memory
    small = [rt.SimDevice(0, need[0] - 1), rt.SimDevice(1, POOL)]
    with pytest.raises(rt.DeviceOutOfMemory, match=r"^out of memory on sim:0: cannot allocate"):
        store_on(small)
    with pytest.raises(ConfigError, match="more than the budget"):
        store_on(sims(), memory_budget=max(need) - 1)
    exact = [rt.SimDevice(g, need[g]) for g in (0, 1)]
    assert store_on(exact, memory_budget=max(need)).device_bytes() == need


# ------------------------------------------------------------------------------------------------ (d) syncs and waits
def counts(devs: list[Any]) -> list[tuple[int, int]]:
    return [(rt.sync_count(d), rt.wait_count(d)) for d in devs]


@pytest.mark.parametrize("kind", ["cpu", "sim"])
def test_syncs_and_waits_per_read_are_what_the_reader_promises(kind: str) -> None:
    """Per read: one sync for the per-source counts; on an accelerator each host read adds one to read its ids
    on the host and (from the reader's second host read on) one before its staging buffer is reused; each request
    to the other device is one wait on each device. The CPU counts the same per-source syncs and waits nowhere."""
    sim = kind == "sim"
    devs: list[Any] = sims() if sim else [CPU, CPU]
    store = store_on(devs)
    reader = store.readers[0]
    by_rank = torch.argsort(store.rank)  # rank r: on device r % 2 while hot, in host memory only past 150
    ids = by_rank[[0, 2, 4, 6, 8, 1, 3, 5, 7, 9, 200, 210, 220, 230, 240]]
    assert store.hot_graph == 120 and store.hot_features == 150
    seen: list[int] = []
    real = reader.host_rows

    def spy(t: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        seen.append(rows.numel())
        return real(t, rows)

    reader.host_rows = spy  # type: ignore[method-assign]
    steps: list[tuple[Callable[[], Any], int, int]] = [  # (a read, its per-source syncs, its host reads)
        (lambda: reader.features(ids), 1, 1), (lambda: reader.features(ids), 1, 1),
        (lambda: reader.request(ids), 1, 2), (lambda: reader.neighbors(ids), 2, 4)]
    first = True
    for read, routes, host_reads in steps:
        rt.reset_counts()
        seen.clear()
        read()
        assert len(seen) == host_reads
        if sim:
            waits = routes  # each route sent one request to device 1
            assert counts(devs) == [(routes + 2 * host_reads - first, waits), (0, waits)]
        else:
            assert counts([CPU]) == [(routes, 0)]
        first = False
    # a whole batch: two hops (a request and a take each), then its input rows
    before = reader.stats.remote_requests
    rt.reset_counts()
    seen.clear()
    blocks = sample_blocks(reader, torch.unique(ids), FANOUTS, sample_key(1, 0))
    src = blocks[0].src_ids
    assert src is not None
    reader.features(src)
    remote = reader.stats.remote_requests - before
    assert remote > 0 and len(seen) > 0
    if sim:
        assert counts(devs) == [(5 + 2 * len(seen), remote), (0, remote)]
    else:
        assert counts([CPU]) == [(5, 0)]


# ------------------------------------------------------------------------------------------------ reused buffers
def test_a_staging_buffer_is_reused_only_after_the_copy_that_read_it() -> None:
    """The host gathers a pinned-host source's rows into one staging buffer and a copy on the reading stream moves
    them: the host must wait for that copy before it gathers the next rows into the buffer. Two reads issued on a
    stream before it runs: each gets its own rows."""
    dev = rt.SimDevice(0, POOL)
    src = PinnedHostSource(X, dev)
    s = rt.new_stream(dev)
    a_ids, b_ids = ids_of(4, 60), ids_of(5, 60)
    rt.reset_counts()
    with rt.use_stream(s):
        a = src.gather(a_ids)
        b = src.gather(b_ids)
    syncs = rt.sync_count(dev)
    rt.synchronize(s)
    assert torch.equal(a, X[a_ids]) and torch.equal(b, X[b_ids])  # a's copy read a's rows, not b's
    assert syncs == 1  # the second read waited for the first one's copy (host ids: no other sync)


def test_a_reused_out_buffer_is_written_only_after_its_readers_are_done() -> None:
    """Double-buffered feature reads through the store's feature source: the trainer stream reads buffer k % 2
    while the reader's stream fills the other; before the reader writes a buffer again its stream must wait for
    the trainer's. Without that wait the store's write into the buffer races with the read and raises."""
    devs = sims()
    store = store_on(devs)
    dev, source = devs[0], store.feature_source(0)
    batches = [ids_of(10 + k, 64) for k in range(4)]

    def run(wait_for_consumer: bool) -> list[float]:
        producer, consumer = rt.new_stream(dev), rt.current_stream(dev)
        bufs = [rt.empty((64, X.shape[1]), device=dev) for _ in range(2)]
        sums = []
        for k, ids in enumerate(batches):
            if wait_for_consumer:
                rt.wait_stream(producer, consumer)  # the buffer's last reader (batch k - 2) is done
            with rt.use_stream(producer):
                source.gather(ids, out=bufs[k % 2])
                ready = rt.record_event(producer)
            rt.wait_event(ready, consumer)
            with rt.on_device(dev):
                sums.append(bufs[k % 2].sum())
        rt.synchronize(dev)
        return [float(v) for v in sums]

    assert run(True) == pytest.approx([float(X[ids].sum()) for ids in batches])
    with pytest.raises(rt.StreamOrderError, match="may still read"):
        run(False)


# ------------------------------------------------------------------------------------------------ row gathers
def test_gather_rows_into_a_sim_device_reads_nan_until_waited_for() -> None:
    """The offload engines' host -> device gather: the CPU gathers into staging, a copy on the current stream
    fills out; out is the poison until that stream is waited for. The UVA kernel is for real GPUs only."""
    dev = rt.SimDevice(0, POOL)
    rows = torch.tensor([5, 1, 7, 299])
    out = rt.empty((6, X.shape[1]), device=dev)
    staging = rt.pinned_empty((4, X.shape[1]), device=dev)
    s = rt.new_stream(dev)
    with rt.use_stream(s):
        got = gather_rows(X, rows, out, staging=staging)
    assert bool(got.isnan().all())
    rt.wait_stream(rt.current_stream(dev), s)
    assert torch.equal(got, X[rows])
    with pytest.raises(ValueError, match="staging buffer"):
        gather_rows(X, rows, out)
    if triton_available():
        with pytest.raises(ConfigError, match="real GPU"):
            gather_rows(X, rows, out, method="uva")


# ------------------------------------------------------------------------------------------------ host reads
def _unsynced(monkeypatch: pytest.MonkeyPatch, module: ModuleType, caller: str) -> list[str]:
    """The mutant of one call site of ``host_values``: called from ``module``'s function ``caller``, it reads the
    values without the host's wait for the device (``rt.host_list`` alone); every other call is the real one.
    Returns the calls the mutant made (the site was reached)."""
    real = module.host_values
    made: list[str] = []

    def host_values(t: torch.Tensor, device: rt.Device) -> list[Any]:
        if sys._getframe(1).f_code.co_name != caller:
            return real(t, device)
        made.append(caller)
        return rt.host_list(t, device)

    monkeypatch.setattr(module, "host_values", host_values)
    return made


def _host_read_sites() -> dict[str, tuple[ModuleType, str, Callable[[list[rt.SimDevice]], Any]]]:
    """Each call site of ``host_values``: its module, its function, and a read on sim devices that reaches it."""
    ids = ids_of(2, 80)

    def hot(devs: list[rt.SimDevice]) -> ShardedDeviceSource:
        h = X[::3]
        placed = [{0: rt.to_device(h[0::2], devs[0])}, {1: rt.to_device(h[1::2], devs[1])}]
        for d in devs:
            rt.synchronize(d)
        return ShardedDeviceSource(placed, devs, [0, 1], devs[0], h.shape[0], X.shape[1])

    return {
        "reader.py route": (reader_mod, "_route", lambda devs: store_on(devs).neighbors(torch.unique(ids), 0)),
        "reader.py take": (reader_mod, "take", lambda devs: sample_blocks(
            store_on(devs).reader(0), torch.unique(ids)[:40], FANOUTS, sample_key(3, 1))),
        "cache.py read": (cache_mod, "_gather", lambda devs: DeviceCache.of(
            PinnedHostSource(X, devs[0]), torch.arange(0, G.num_nodes, 3), devs[0]).gather(ids)),
        "features.py range check": (features_mod, "check_range", lambda devs: DeviceSource(X, devs[0]).gather(
            rt.to_device(ids, devs[0]))),
        "sharded.py counts": (sharded_mod, "_gather", lambda devs: hot(devs).gather(ids[ids < X[::3].shape[0]])),
    }


@pytest.mark.parametrize("stream", ["default", "trainer"])
@pytest.mark.parametrize("site", list(_host_read_sites()))
def test_a_host_read_without_its_sync_fails_at_every_site(site: str, stream: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """``host_values`` waits for the device's current stream before the host reads the values (a real GPU's
    ``tolist`` would wait by itself, uncounted). Without that wait, at any one of its call sites, the sim device's
    host read (``rt.host_list``) raises StreamOrderError: the host has not waited for the work that computed the
    values. With it, the same read succeeds."""
    module, caller, read = _host_read_sites()[site]
    devs = sims(4 * POOL)
    s = on_stream(devs[0], stream)
    with rt.use_stream(s):
        read(devs)
    for d in devs:
        rt.synchronize(d)
    made = _unsynced(monkeypatch, module, caller)
    with rt.use_stream(s), pytest.raises(rt.StreamOrderError, match="the host has not waited for sim:0/"):
        read(devs)
    assert made == [caller]  # the mutant site, reached once, is what failed
    monkeypatch.undo()
    for d in devs:  # the failed read's memory, freed later, leaves no debt
        rt.synchronize(d)
