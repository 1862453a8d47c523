"""The feature-source protocol (gnnscale.store.features): every source gathers exactly x[ids] (random, repeated,
empty ids; out= buffers), counts the rows and bytes each tier served, a cache serves its hot rows and nothing
else, tiers stack (device cache over host cache over a memory-mapped file), and bad input is one clear error."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from gnnscale.errors import ConfigError, GnnscaleError
from gnnscale.graph.generators import csbm
from gnnscale.store import (
    DeviceCache,
    DeviceSource,
    FeatureIndexError,
    FeatureSource,
    FeatureSourceError,
    GlobalMemoryStore,
    InMemorySource,
    MmapSource,
    PartitionedFeatures,
    PinnedHostSource,
    ShardedDeviceSource,
    triton_available,
)
from gnnscale.store.placement import HOST
from gnnscale.testing import FakeCudart, only_cuda

CPU = torch.device("cpu")
ROOT = Path(__file__).resolve().parents[1]
N, F = 60, 7


def table(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    x = torch.randn(N, F, generator=torch.Generator().manual_seed(0)) * 100  # [N, F]
    return x.to(dtype)


class PeerExchange:
    """In-process stand-in for Comm.exchange: the owners' parts answer with their own rows."""

    def __init__(self, parts: dict[int, PartitionedFeatures]):
        self.parts, self.calls = parts, 0

    def exchange(self, ids: torch.Tensor, owner: torch.Tensor, serve: Callable[[torch.Tensor], torch.Tensor],
                 width: int, dtype: torch.dtype, what: str = "feature fetch") -> torch.Tensor:
        self.calls += 1
        out = torch.empty(ids.numel(), width, dtype=dtype)
        for r, part in self.parts.items():
            sel = owner[ids] == r
            if bool(sel.any()):
                out[sel] = part.local(ids[sel])
        return out


def partitioned(x: torch.Tensor, rank: int = 1, world: int = 3) -> PartitionedFeatures:
    owner = torch.arange(N) % world
    parts = {r: PartitionedFeatures(x, owner, r) for r in range(world)}
    return PartitionedFeatures(x, owner, rank, exchange=PeerExchange(parts))


def sources(x: torch.Tensor, tmp: Path) -> dict[str, FeatureSource]:
    """One of every source over the table ``x``."""
    np.save(tmp / "x.npy", x.numpy())
    hot = torch.tensor([3, 0, 17, 59, 17])
    return {
        "memory": InMemorySource(x),
        "pinned": PinnedHostSource(x, CPU),
        "pinned-in-place": PinnedHostSource(x, CPU, pin=True, cudart=FakeCudart),
        "device": DeviceSource(x, CPU),
        "mmap": MmapSource(tmp / "x.npy"),
        "cache/memory": DeviceCache.of(InMemorySource(x), hot, CPU),
        "cache/cache/mmap": DeviceCache.of(DeviceCache.of(MmapSource(tmp / "x.npy"), torch.arange(10, 40), CPU,
                                                          tier="host-cache"), hot, CPU, tier="device-cache"),
        "partitioned": partitioned(x),
    }


NAMES = ["memory", "pinned", "pinned-in-place", "device", "mmap", "cache/memory", "cache/cache/mmap", "partitioned"]


# ------------------------------------------------------------------------------------------------ x[ids]
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64])
def test_every_source_gathers_exactly_x_ids(name: str, dtype: torch.dtype, tmp_path: Path) -> None:
    x = table(dtype)
    made = sources(x, tmp_path)
    assert list(made) == NAMES
    src = made[name]
    assert (src.num_rows, src.dim, src.dtype, src.device) == (N, F, dtype, CPU)
    g = torch.Generator().manual_seed(1)
    cases = [torch.randint(0, N, (40,), generator=g),  # random, repeats likely
             torch.tensor([5, 5, 5, 0, 59, 5]),  # repeated, both ends
             torch.randperm(N, generator=g),  # every row once, unsorted
             torch.tensor([17], dtype=torch.int32),  # another integer dtype
             torch.empty(0, dtype=torch.int64)]
    for ids in cases:
        got = src.gather(ids)
        assert got.shape == (ids.numel(), F) and got.dtype == dtype
        assert torch.equal(got, x[ids.long()]), (name, ids)
    # into a larger buffer: the first n rows are written and returned as a view, the tail untouched
    ids = cases[0]
    out = torch.full((ids.numel() + 3, F), -7, dtype=dtype)
    got = src.gather(ids, out=out)
    assert got.data_ptr() == out.data_ptr() and got.shape == (ids.numel(), F)
    assert torch.equal(out[: ids.numel()], x[ids]) and bool((out[ids.numel():] == -7).all())
    assert src.gather(torch.empty(0, dtype=torch.int64), out=out).shape == (0, F)


@pytest.mark.parametrize("name", ["memory", "pinned", "device", "mmap"])
def test_a_plain_source_counts_rows_and_bytes_under_its_tier(name: str, tmp_path: Path) -> None:
    src = sources(table(torch.float16), tmp_path)[name]
    src.gather(torch.tensor([1, 2, 2, 9]))
    src.gather(torch.empty(0, dtype=torch.int64))  # an empty read counts nothing, not even a request
    src.gather(torch.arange(11))
    tier = src.tier
    assert tier == {"memory": "host", "pinned": "pinned", "device": "device", "mmap": "disk"}[name]
    st = src.read_stats()
    assert dict(st.rows) == {tier: 15} and dict(st.bytes) == {tier: 15 * F * 2} and dict(st.requests) == {tier: 2}
    assert src.reset_stats().total_rows == 15 and src.read_stats().total_rows == 0


# ------------------------------------------------------------------------------------------------ the cache
class Spy(InMemorySource):
    """Records the ids each read asks for."""

    def __init__(self, x: torch.Tensor, **kw: Any):
        super().__init__(x, **kw)
        self.asked: list[torch.Tensor] = []

    def _gather(self, ids: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        self.asked.append(ids.clone())
        return super()._gather(ids, out)


def test_the_cache_serves_its_hot_rows_and_the_fallback_the_rest() -> None:
    """The cache's rows are marked (x + 1000), so every answer row shows which tier served it; the counters
    equal the hits and misses computed here, and the fallback is asked once per read, in ascending id order."""
    x = table()
    hot = torch.tensor([4, 11, 12, 30, 58])
    fallback = Spy(x)
    slots = torch.full((N,), -1)
    slots[hot] = torch.arange(hot.numel())
    cache = DeviceCache(fallback, DeviceSource(x[hot] + 1000), lambda ids: slots[ids])
    ids = torch.tensor([58, 0, 4, 4, 31, 12, 59, 1, 30, 0])
    got = cache.gather(ids)
    is_hot = torch.isin(ids, hot)
    assert torch.equal(got[is_hot], x[ids[is_hot]] + 1000)  # from the cache
    assert torch.equal(got[~is_hot], x[ids[~is_hot]])  # from the fallback
    hits, misses = int(is_hot.sum()), int((~is_hot).sum())
    assert (hits, misses) == (5, 5)
    st = cache.read_stats()
    assert dict(st.rows) == {"device": hits, "host": misses}
    assert dict(st.bytes) == {"device": hits * F * 4, "host": misses * F * 4}
    assert dict(st.requests) == {"device": 1, "host": 1}
    assert len(fallback.asked) == 1 and fallback.asked[0].tolist() == sorted(ids[~is_hot].tolist())
    cache.gather(hot)  # all hits: the fallback is not asked at all
    assert len(fallback.asked) == 1 and cache.read_stats().rows["device"] == hits + hot.numel()


def test_a_cache_built_from_hot_ids_counts_its_fill_then_only_misses(tmp_path: Path) -> None:
    x = table()
    np.save(tmp_path / "x.npy", x.numpy())
    disk = MmapSource(tmp_path / "x.npy")
    hot = torch.tensor([7, 3, 3, 50, 21])  # a repeat: cached once
    cache = DeviceCache.of(disk, hot, CPU, tier="gpu")
    assert cache.read_stats().rows == {"disk": 4}  # the fill read four distinct rows from the file
    cache.reset_stats()
    ids = torch.randint(0, N, (500,), generator=torch.Generator().manual_seed(2))
    assert torch.equal(cache.gather(ids), x[ids])
    hits = int(torch.isin(ids, hot).sum())
    assert 0 < hits < 500
    assert cache.read_stats().rows == {"gpu": hits, "disk": 500 - hits}
    assert cache.read_stats().bytes == {"gpu": hits * F * 4, "disk": (500 - hits) * F * 4}


def test_tiers_stack_and_each_counts_what_it_served(tmp_path: Path) -> None:
    """Device cache over a host cache over a memory-mapped file: each row is served by the first tier that
    holds it, and the three tiers' counts add up to the request."""
    x = table()
    np.save(tmp_path / "x.npy", x.numpy())
    top_ids, mid_ids = torch.tensor([0, 1, 2, 40]), torch.arange(30, 50)
    mid = DeviceCache.of(MmapSource(tmp_path / "x.npy"), mid_ids, CPU, tier="host-cache")
    top = DeviceCache.of(mid, top_ids, CPU, tier="device-cache")
    assert [s.tier for s in top.tiers()] == ["device-cache", "host-cache", "disk"]
    top.reset_stats()
    ids = torch.arange(N).repeat(2)  # every row twice
    assert torch.equal(top.gather(ids), x[ids])
    in_top = torch.isin(ids, top_ids)
    in_mid = torch.isin(ids, mid_ids) & ~in_top  # row 40 is in both: the device cache serves it
    want = {"device-cache": int(in_top.sum()), "host-cache": int(in_mid.sum()),
            "disk": int((~in_top & ~in_mid).sum())}
    assert want == {"device-cache": 8, "host-cache": 38, "disk": 74}
    assert dict(top.read_stats().rows) == want


# ------------------------------------------------------------------------------------------------ mmap
def test_mmap_source_is_read_only_and_reads_only_what_is_asked(tmp_path: Path) -> None:
    x = table(torch.float64)
    np.save(tmp_path / "x.npy", x.numpy())
    src = MmapSource(tmp_path / "x.npy")
    assert isinstance(src.array, np.memmap) and not src.array.flags.writeable
    got = src.gather(torch.tensor([59, 2]))
    got[:] = 0  # the rows handed out are copies: the file is untouched
    assert torch.equal(src.gather(torch.tensor([59, 2])), x[[59, 2]])
    assert np.array_equal(np.load(tmp_path / "x.npy"), x.numpy())
    assert src.read_stats().rows == {"disk": 4}


_UNPICKLED: list[str] = []


class _Bomb:
    """Records it was unpickled: loading the file must never get that far."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_UNPICKLED.append, ("unpickled",))


def test_mmap_source_refuses_files_that_are_not_one_numeric_table(tmp_path: Path) -> None:
    obj = np.empty((2, 2), dtype=object)
    obj[0, 0] = _Bomb()
    np.save(tmp_path / "obj.npy", obj, allow_pickle=True)
    with pytest.raises(FeatureSourceError, match="cannot map"):
        MmapSource(tmp_path / "obj.npy")
    assert _UNPICKLED == []  # data only, never unpickled
    np.save(tmp_path / "flat.npy", np.arange(5.0))
    with pytest.raises(FeatureSourceError, match=r"one \[rows, dim\] array"):
        MmapSource(tmp_path / "flat.npy")
    with pytest.raises(FeatureSourceError, match="cannot map"):
        MmapSource(tmp_path / "missing.npy")
    (tmp_path / "junk.npy").write_bytes(b"not a numpy file at all")
    with pytest.raises(FeatureSourceError, match="cannot map"):
        MmapSource(tmp_path / "junk.npy")


# ------------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("name", NAMES)
def test_ids_out_of_range_are_one_clear_error(name: str, tmp_path: Path) -> None:
    src = sources(table(), tmp_path)[name]
    for bad in ([0, N], [-1, 3], [N + 100]):
        with pytest.raises(FeatureIndexError, match=rf"outside \[0, {N}\)") as err:
            src.gather(torch.tensor(bad))
        assert isinstance(err.value, GnnscaleError) and isinstance(err.value, IndexError)
    for ids in (torch.tensor([1.0, 2.0]), torch.tensor([[1, 2]]), torch.tensor([True, False]), [1, 2]):
        with pytest.raises(FeatureIndexError, match="1-D integer tensor"):
            src.gather(ids)  # type: ignore[arg-type]
    assert src.read_stats().total_rows == 0 or name.startswith("cache")  # nothing read (a cache's fill aside)


def test_bad_out_buffers_and_mismatched_tiers_are_refused() -> None:
    src = InMemorySource(table())
    ids = torch.tensor([1, 2, 3])
    for out in (torch.empty(2, F), torch.empty(3, F + 1), torch.empty(3, F, dtype=torch.float64),
                torch.empty(F, 3).t()):
        with pytest.raises(FeatureSourceError, match="out"):
            src.gather(ids, out=out)
    with pytest.raises(FeatureSourceError, match="cannot stand in front"):
        DeviceCache(src, DeviceSource(torch.zeros(2, F + 1)), lambda i: i)
    empty = DeviceCache.of(InMemorySource(torch.zeros(0, F)), torch.empty(0, dtype=torch.int64), CPU)
    assert empty.gather(torch.empty(0, dtype=torch.int64)).shape == (0, F)
    with pytest.raises(FeatureIndexError, match=r"outside \[0, 0\)"):
        empty.gather(torch.tensor([0]))
    with pytest.raises(FeatureSourceError, match="CPU tensor"):
        InMemorySource(np.zeros((2, 2)))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="unknown gather method"):
        PinnedHostSource(table(), CPU, method="fast")


# ------------------------------------------------------------------------------------------------ pinned
def test_pinned_source_registers_its_table_in_place_and_unregisters_once() -> None:
    x = table()
    rt = FakeCudart()
    src = PinnedHostSource(x, CPU, pin=True, cudart=lambda: rt)
    assert src.table.data_ptr() == x.data_ptr()  # pinned in place, not copied
    assert src.region is not None and list(rt.registered) == [x.data_ptr()]
    assert torch.equal(src.gather(torch.tensor([9, 1])), x[[9, 1]])
    src.close()
    src.close()
    assert rt.registered == {} and rt.unregistered == [x.data_ptr()]
    unpinned = PinnedHostSource(x, CPU)  # a CPU reader needs no pinning
    assert unpinned.region is None and unpinned.method == "index_select"


_UVA_SCRIPT = textwrap.dedent(
    """
    import torch
    from gnnscale.store import DeviceCache, PinnedHostSource

    x = torch.randn(300, 37, generator=torch.Generator().manual_seed(0))
    src = PinnedHostSource(x, torch.device("cpu"), method="uva")
    ids = torch.randint(0, 300, (123,), generator=torch.Generator().manual_seed(1))
    assert torch.equal(src.gather(ids), x[ids])
    cache = DeviceCache.of(src, torch.arange(0, 300, 3), torch.device("cpu"))
    assert torch.equal(cache.gather(ids), x[ids])
    print("OK", dict(src.read_stats().rows))
    """
)


@pytest.mark.skipif(not triton_available(), reason="triton is not installed (pip install triton): uva path untested")
def test_pinned_source_reads_with_the_uva_kernel_in_the_triton_interpreter() -> None:
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": pythonpath}
    proc = subprocess.run([sys.executable, "-c", _UVA_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"interpreter run failed:\n{proc.stdout}\n{proc.stderr}"
    assert "OK {'pinned': " in proc.stdout, proc.stdout


@only_cuda
@pytest.mark.parametrize("method", ["index_select", "uva", "auto"])
def test_pinned_source_and_device_cache_on_cuda(method: str) -> None:
    if method == "uva" and not triton_available():
        pytest.skip("triton is not installed")
    x = torch.randn(5000, 33, generator=torch.Generator().manual_seed(0))
    cuda = torch.device("cuda")
    src = PinnedHostSource(x, cuda, method=method)
    assert src.table.is_pinned()
    ids = torch.randint(0, 5000, (1000,), generator=torch.Generator().manual_seed(1))
    for _ in range(3):  # the staging buffer is reused
        assert torch.equal(src.gather(ids.to(cuda)).cpu(), x[ids])
    cache = DeviceCache.of(src, torch.arange(0, 5000, 7), cuda)
    got = cache.gather(ids.to(cuda))
    assert got.device.type == "cuda" and torch.equal(got.cpu(), x[ids])
    hits = int((ids % 7 == 0).sum())
    assert cache.read_stats().rows["cache"] == hits


# ------------------------------------------------------------------------------------------------ partitioned
def test_partitioned_source_serves_own_rows_locally_and_the_rest_through_the_exchange() -> None:
    x = table()
    part = partitioned(x, rank=1, world=3)
    ids = torch.tensor([1, 4, 0, 2, 2, 7, 59, 58, 0])  # owners: 1 1 0 2 2 1 2 1 0
    assert torch.equal(part.gather(ids), x[ids])
    mine = int((ids % 3 == 1).sum())
    assert mine == 4
    st = part.read_stats()
    assert dict(st.rows) == {"local": mine, "remote": ids.numel() - mine}
    assert dict(st.bytes) == {"local": mine * F * 4, "remote": (ids.numel() - mine) * F * 4}
    assert isinstance(part.exchange, PeerExchange) and part.exchange.calls == 1
    part.gather(torch.empty(0, dtype=torch.int64))  # collective: takes part in the exchange with no ids
    assert part.exchange.calls == 2
    alone = PartitionedFeatures(x, torch.arange(N) % 3, 1)  # no exchange: own rows only
    assert torch.equal(alone.gather(torch.tensor([1, 4])), x[[1, 4]])
    with pytest.raises(FeatureIndexError, match="does not hold"):
        alone.gather(torch.tensor([1, 0]))
    with pytest.raises(IndexError, match="does not hold"):
        alone.local(torch.tensor([2]))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _exchange_entry(rank: int, world: int, port: int, out: str) -> None:
    from gnnscale.distributed.comm import Comm

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    comm = Comm.setup(torch.device("cpu"), 60.0)
    try:
        x = table()
        part = PartitionedFeatures(x, torch.arange(N) % world, rank, exchange=comm)
        ids = torch.randint(0, N, (25,), generator=torch.Generator().manual_seed(rank))
        ok = torch.equal(part.gather(ids), x[ids])
        empty = part.gather(torch.empty(0, dtype=torch.int64)).shape == (0, F)  # the peer still gathers: no hang
        if rank == 0:
            part.gather(torch.tensor([1]))  # rank 0 asks for a row of rank 1 while rank 1 asks for nothing
        else:
            part.gather(torch.empty(0, dtype=torch.int64))
        torch.save({"ok": ok and empty, "rows": dict(part.read_stats().rows),
                    "expected_local": int((ids % world == rank).sum())}, Path(out) / f"rank{rank}.pt")
    finally:
        comm.close()


def test_partitioned_source_gathers_through_a_real_exchange_between_two_ranks(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    mp.start_processes(_exchange_entry, args=(2, _free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    for r in range(2):
        got = torch.load(tmp_path / f"rank{r}.pt")
        assert got["ok"], r
        local = got["expected_local"]
        assert got["rows"]["local"] == local and got["rows"]["remote"] == 25 - local + (1 if r == 0 else 0)


# ------------------------------------------------------------------------------------------------ XGNN tiers
def test_sharded_device_tier_reads_each_partition_from_its_holder() -> None:
    """Three "devices"; this reader gets partition 0 from itself and partitions 1 and 2 from device 2: one request
    per holder per read, whatever the partitions asked. Another reader reads partition 2 from host memory, so
    asking it for one of those rows is an error."""
    G, hot = 3, 30
    x = table()[:hot]  # row r = rank r
    shards: list[dict[int, torch.Tensor]] = [{0: x[0::3]}, {1: x[1::3]}, {1: x[1::3] + 0, 2: x[2::3]}]
    src = ShardedDeviceSource(shards, [CPU] * G, [0, 2, 2], CPU, hot, F)
    ids = torch.tensor([3, 1, 0, 4, 4, 27, 10, 29, 2])  # partitions 0 1 0 1 1 0 1 2 2
    assert torch.equal(src.gather(ids), x[ids])
    assert dict(src.read_stats().rows) == {"device0": 3, "device2": 6}
    assert dict(src.read_stats().bytes) == {"device0": 3 * F * 4, "device2": 6 * F * 4}
    assert dict(src.read_stats().requests) == {"device0": 1, "device2": 1}
    shards[2][1] = torch.full_like(shards[2][1], float("nan"))  # the holder's copy is looked up at every read
    assert bool(src.gather(torch.tensor([1])).isnan().all())
    partial = ShardedDeviceSource(shards, [CPU] * G, [0, 1, HOST], CPU, hot, F)
    assert torch.equal(partial.gather(torch.tensor([1, 0])), x[[1, 0]])
    with pytest.raises(FeatureIndexError, match=r"partitions \[2\] are not read from a device"):
        partial.gather(torch.tensor([2, 0]))


def test_global_store_features_are_a_cache_in_front_of_host_memory() -> None:
    """The store's feature path is the composition: its per-tier counters are the reader's StoreStats."""
    ring = [[0, 1, 0, 1], [1, 0, 1, 0], [0, 1, 0, 1], [1, 0, 1, 0]]
    g = csbm(nodes=300, features=6, avg_degree=6, seed=7)
    assert g.x is not None
    store = GlobalMemoryStore(g, [CPU] * 4, gpu_feature_ratio=0.5, links=ring)
    src = store.feature_source(1)
    assert isinstance(src, DeviceCache) and [s.tier for s in src.tiers()] == ["device*", "host"]
    ids = torch.randint(0, g.num_nodes, (400,), generator=torch.Generator().manual_seed(0))
    assert torch.equal(store.features(ids, 1), g.x[ids])
    st, rs = store.readers[1].stats, src.read_stats()
    assert {(HOST if t == "host" else int(t.removeprefix("device"))): n for t, n in rs.rows.items()} == st.rows_from
    assert rs.bytes["host"] == st.h2d_feature_bytes and rs.total_rows == st.feature_requests == 400
    assert st.feature_hits == int((store.rank[ids] < store.hot_features).sum())  # on a ring every hot row is
    assert torch.equal(src.gather(ids), g.x[ids])  # the source alone answers too
    store.reset_stats()
    assert src.read_stats().total_rows == 0 and store.stats.feature_requests == 0
    with pytest.raises(FeatureIndexError, match=r"outside \[0, 300\)"):
        store.features(torch.tensor([0, 300]))
