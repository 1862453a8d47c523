"""The device runtime: resolving devices, the sim device (bounded pool, copies that read NaN until waited for,
races that raise), sync counts, pinned registration with a fake CUDA runtime, and the real accelerator paths
(skipped without a CUDA device). docs/runtime.md's prefetch example runs here as written, and with each wait
removed."""

from __future__ import annotations

import ast
import gc
import math
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import gnnscale.runtime as rt
from gnnscale.errors import ConfigError
from gnnscale.runtime import backend, sim
from gnnscale.testing import FakeCudart

ROOT = Path(__file__).resolve().parents[1]
HAS_CUDA = rt.accelerator_type() == "cuda" and rt.is_available()
only_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")


@pytest.fixture
def dev() -> rt.SimDevice:
    """A fresh sim device of 4 KiB (tests do not share streams or pools)."""
    return rt.SimDevice(0, capacity=4096)


def nan(t: torch.Tensor) -> bool:
    return bool(torch.isnan(t).all())


# ------------------------------------------------------------------------------------------------ devices
def test_resolve_device_specs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(rt.DEVICE_ENV, raising=False)
    assert rt.resolve_device("cpu") == torch.device("cpu")
    s0 = rt.resolve_device("sim")
    assert isinstance(s0, rt.SimDevice) and str(s0) == "sim:0" and rt.resolve_device(" sim:0 ") is s0
    assert rt.resolve_device("sim:1").index == 1 and rt.resolve_device(s0) is s0
    assert rt.resolve_device("auto") == (torch.device(rt.accelerator_type() or "cpu") if rt.is_available()
                                         else torch.device("cpu"))
    monkeypatch.setenv(rt.DEVICE_ENV, "sim:1")
    assert rt.resolve_device("auto") is rt.resolve_device("sim:1") and rt.default_device() is rt.sim_device(1)
    assert rt.is_accelerator(s0) and rt.is_sim(s0) and not rt.is_accelerator(torch.device("cpu"))
    assert rt.torch_device(s0) == torch.device("cpu") and rt.device_count("sim") == 2


@pytest.mark.parametrize("spec, message", [
    ("sim:2", "--device sim:2: only 2 sim device(s) present"),
    ("sim:x", "unknown device 'sim:x'; use auto, cpu, sim, sim:N, "),
    ("gpu", "unknown device 'gpu'"),
    ("meta", "unsupported device 'meta'"),
])
def test_resolve_device_errors(spec: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        rt.resolve_device(spec)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


@pytest.mark.skipif(HAS_CUDA, reason="checks the messages of a machine without a CUDA device")
def test_resolve_device_without_an_accelerator(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"^--device cuda:3 requested but no CUDA device is available$"):
        rt.resolve_device("cuda:3")
    with pytest.raises(ConfigError, match="no CUDA device"):
        rt.resolve_device(torch.device("cuda"))
    monkeypatch.setenv(rt.DEVICE_ENV, "gpu")
    with pytest.raises(ConfigError, match=r"^GNNSCALE_DEVICE=gpu: unknown device 'gpu'"):
        rt.resolve_device("auto")
    monkeypatch.setenv(sim.SIM_DEVICES_ENV, "none")
    with pytest.raises(ConfigError, match="GNNSCALE_SIM_DEVICES='none'"):
        rt.resolve_device("sim")


def test_resolve_device_counts_accelerators(monkeypatch: pytest.MonkeyPatch) -> None:
    """The index check, with the backend answering as a one-GPU machine."""
    monkeypatch.setattr(backend, "accelerator_type", lambda: "cuda")
    monkeypatch.setattr(backend, "is_available", lambda: True)
    monkeypatch.setattr(backend, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match=r"^--device cuda:3: only 1 CUDA device\(s\) present$"):
        rt.resolve_device("cuda:3")
    assert rt.resolve_device("cuda:0") == torch.device("cuda", 0)
    assert rt.resolve_device("cuda") == torch.device("cuda")
    with pytest.raises(ConfigError, match="no XPU device is available"):
        rt.resolve_device("xpu")


def test_sim_device_names_and_peers(dev: rt.SimDevice) -> None:
    other = rt.SimDevice(1, capacity=10)
    assert rt.device_name(dev) == "gnnscale sim device (4.0 KiB pool)"
    assert rt.can_access_peer(dev, other) and not rt.can_access_peer(dev, dev)
    assert not rt.can_access_peer(dev, torch.device("cpu"))
    assert rt.new_stream(torch.device("cpu")) is None and rt.current_stream(torch.device("cpu")) is None


# ---------------------------------------------------------------------------------------------- the pool
def test_pool_bound_peak_and_release(dev: rt.SimDevice) -> None:
    a = rt.empty((256,), device=dev)  # 1 KiB
    b = rt.zeros((512,), device=dev)  # 2 KiB
    assert rt.memory_allocated(dev) == 3072 and rt.mem_get_info(dev) == (1024, 4096) and b.sum() == 0
    with pytest.raises(rt.DeviceOutOfMemory) as info:
        rt.empty((257,), device=dev)
    assert isinstance(info.value, ConfigError)
    assert str(info.value) == ("out of memory on sim:0: cannot allocate 1.0 KiB with 3.0 KiB of 4.0 KiB in use; "
                               "lower the memory budget (--gpu-memory), the batch or the chunk size")
    assert rt.memory_allocated(dev) == 3072  # the failed allocation took nothing
    view = a[10:]
    del a
    assert rt.memory_allocated(dev) == 3072 and rt.device_of(view) is dev  # the view keeps the storage
    del view
    assert rt.memory_allocated(dev) == 2048 and rt.peak_bytes(dev) == 3072
    rt.reset_peak(dev)
    assert rt.peak_bytes(dev) == 2048
    del b
    assert rt.memory_allocated(dev) == 0
    with pytest.raises(rt.DeviceOutOfMemory):
        rt.to_device(torch.zeros(2000), dev)
    assert rt.memory_allocated(dev) == 0


def test_adopt_and_scope_counting(dev: rt.SimDevice) -> None:
    host = torch.zeros(100)  # 400 B
    assert rt.device_of(host) == torch.device("cpu")
    rt.adopt(host, dev)
    rt.adopt(host[:50], dev)  # the same storage counts once
    assert rt.memory_allocated(dev) == 400 and rt.device_of(host) is dev
    with pytest.raises(ValueError, match="on sim:0, not sim:1"):
        rt.adopt(host, rt.SimDevice(1))
    x = rt.to_device(torch.ones(100), dev)  # the default stream: done at once
    h = torch.ones(3)
    with rt.on_device(dev):
        y = x * 2  # an op on a sim tensor: its result is on the device
        idx = torch.arange(3)  # a factory in the scope: on the device
        z = h + 1  # host tensors only: stays on the host
        v = y[:10]  # a view: no new memory
    assert rt.device_of(y) is dev and rt.device_of(idx) is dev and rt.device_of(z) == torch.device("cpu")
    assert rt.memory_allocated(dev) == 400 + 400 + 400 + 24 and v.sum() == 20
    del y, v, idx
    assert rt.memory_allocated(dev) == 800
    with rt.on_device(dev), pytest.raises(rt.DeviceOutOfMemory, match="cannot allocate 3.9 KiB"):
        x.repeat(10)


# ------------------------------------------------------------------------------------------ deferred copies
def _wait(how: str, dev: rt.SimDevice, main: rt.SimStream, side: rt.SimStream, ev: rt.SimEvent) -> None:
    {"wait_event": lambda: rt.wait_event(ev, main), "wait_stream": lambda: rt.wait_stream(main, side),
     "event.wait": lambda: ev.wait(main), "stream.wait_stream": lambda: main.wait_stream(side),
     "synchronize device": lambda: rt.synchronize(dev), "synchronize stream": lambda: rt.synchronize(side),
     "synchronize event": lambda: rt.synchronize(ev)}[how]()


WAITS = ["wait_event", "wait_stream", "event.wait", "stream.wait_stream", "synchronize device",
         "synchronize stream", "synchronize event"]
HOST_SYNCS = ["synchronize device", "synchronize stream", "synchronize event"]


@pytest.mark.parametrize("how", WAITS)
def test_host_to_device_reads_nan_until_waited(dev: rt.SimDevice, how: str) -> None:
    main, side = dev.current_stream(), dev.new_stream()
    host = torch.arange(8.0)
    x = rt.to_device(host, dev, stream=side)
    ev = rt.record_event(side)
    assert isinstance(ev, rt.SimEvent)
    assert nan(x) and not side.query() and not ev.query()
    rt.wait_stream(side, main)  # waiting in the other direction completes nothing
    assert nan(x)
    _wait(how, dev, main, side, ev)
    assert torch.equal(x, host) and side.query() and ev.query()
    assert (dev.copies_issued, dev.copies_completed) == (1, 1)


@pytest.mark.parametrize("how", WAITS)
def test_device_to_host_reads_nan_until_the_host_syncs(dev: rt.SimDevice, how: str) -> None:
    main, side = dev.current_stream(), dev.new_stream()
    x = rt.to_device(torch.arange(6.0), dev)  # the default stream: done at once
    assert torch.equal(x, torch.arange(6.0))
    with pytest.raises(rt.StreamOrderError, match="stream1 reads .*default wrote"):
        rt.to_host(x, stream=side)  # side never waited for the copy on main
    rt.wait_stream(side, main)
    with rt.use_stream(side):
        h = rt.to_host(x)  # on the current stream: side
        ev = rt.record_event(side)
    assert isinstance(ev, rt.SimEvent) and rt.device_of(h) == torch.device("cpu") and nan(h)
    _wait(how, dev, main, side, ev)
    if how in HOST_SYNCS:
        assert torch.equal(h, torch.arange(6.0))
    else:  # a stream waited; the host did not
        assert nan(h)
        rt.synchronize(ev)
        assert torch.equal(h, torch.arange(6.0))


def test_host_buffers_made_in_a_device_scope_are_host_memory(dev: rt.SimDevice) -> None:
    """Inside ``on_device`` a factory's result counts as device memory, but the runtime's host buffers do not:
    ``to_host``'s destination and ``pinned_empty`` stay host memory (else a reader that brings its ids to the
    host inside a sampling stage gets them back "on" the device)."""
    with rt.use_stream(dev.new_stream()), rt.on_device(dev):
        x = rt.to_device(torch.arange(6.0), dev)
        h = rt.to_host(x, blocking=True)
        staging = rt.pinned_empty((4,), device=dev)
        made = torch.empty(3)  # a factory's result in the scope: device memory
    assert rt.device_of(h) == torch.device("cpu") and torch.equal(h, torch.arange(6.0))
    assert rt.device_of(staging) == torch.device("cpu") and rt.device_of(made) is dev


@pytest.mark.parametrize("dtype, value", [(torch.int64, -(2**63)), (torch.int32, -(2**31)), (torch.uint8, 255),
                                          (torch.bool, True), (torch.float16, math.nan)])
def test_poison_of_every_dtype(dev: rt.SimDevice, dtype: torch.dtype, value: float) -> None:
    side = dev.new_stream()
    x = rt.to_device(torch.zeros(3, dtype=dtype), dev, stream=side)
    assert rt.poison(dtype) is value or rt.poison(dtype) == value or math.isnan(float(rt.poison(dtype)))
    assert (torch.isnan(x).all() if dtype.is_floating_point else (x == value).all())
    rt.synchronize(side)
    assert (x == 0).all()


def test_an_event_captures_exactly_the_copies_before_it(dev: rt.SimDevice) -> None:
    main, side = dev.current_stream(), dev.new_stream()
    a = rt.to_device(torch.ones(4), dev, stream=side)
    ev = rt.record_event(side)
    assert isinstance(ev, rt.SimEvent)
    b = rt.to_device(torch.full((4,), 2.0), dev, stream=side)
    rt.wait_event(ev, main)
    assert torch.equal(a, torch.ones(4)) and nan(b)
    assert ev.query() and not side.query()
    rt.synchronize(rt.record_event(side))
    assert torch.equal(b, torch.full((4,), 2.0)) and dev.copies_completed == 2


def test_a_copy_is_performed_once_reading_its_source_then(dev: rt.SimDevice) -> None:
    main, side = dev.current_stream(), dev.new_stream()
    src = torch.arange(4.0)
    x = rt.to_device(src, dev, stream=side)
    src += 10  # reused before the copy was waited for: the copy reads it as it is when done
    rt.wait_stream(main, side)
    assert torch.equal(x, torch.arange(4.0) + 10)
    src += 100
    rt.wait_stream(main, side)
    rt.synchronize(dev)
    assert torch.equal(x, torch.arange(4.0) + 10) and dev.copies_completed == 1  # not copied again


def test_copies_on_one_stream_run_in_order_and_chain(dev: rt.SimDevice) -> None:
    main, side = dev.current_stream(), dev.new_stream()
    buf = rt.empty((4,), device=dev)
    rt.copy_async(buf, torch.ones(4), side)
    out = torch.empty(4)
    rt.copy_async(out, buf, side)  # device -> host of the buffer the first copy writes
    rt.copy_async(buf, torch.zeros(4), side)
    rt.synchronize(side)
    assert torch.equal(out, torch.ones(4)) and torch.equal(buf, torch.zeros(4))
    with rt.use_stream(side):  # an op on the copy's own stream sees it done
        y = rt.to_device(torch.full((4,), 3.0), dev)
        assert torch.equal(y + 1, torch.full((4,), 4.0))
    with rt.on_device(dev), pytest.raises(rt.StreamOrderError, match="sim:0/default reads .*sim:0/stream1 wrote"):
        y.sum()  # main never waited for side
    rt.wait_stream(main, side)
    with rt.on_device(dev):
        assert float(y.sum()) == 12.0


def test_a_copy_first_performs_the_pending_copy_it_reads(dev: rt.SimDevice) -> None:
    main, s1, s2 = dev.current_stream(), dev.new_stream(), dev.new_stream()
    x = rt.to_device(torch.arange(4.0), dev)
    rt.wait_stream(s1, main)
    h = rt.to_host(x, stream=s1)  # device -> host, pending until a host sync ...
    rt.wait_stream(s2, s1)  # ... which this stream-side wait is not
    assert nan(h)
    y = rt.to_device(h, dev, stream=s2)  # host -> device of that host buffer
    rt.wait_stream(main, s2)
    assert torch.equal(y, torch.arange(4.0)) and dev.copies_completed == 3


def test_copies_from_a_thread_are_deterministic(dev: rt.SimDevice) -> None:
    main, side = dev.current_stream(), dev.new_stream()
    made: list[tuple[torch.Tensor, rt.Event | None]] = []

    def produce() -> None:
        with rt.use_stream(side):
            x = rt.to_device(torch.arange(5.0), dev)
            made.append((x, rt.record_event(side)))

    t = threading.Thread(target=produce)
    t.start()
    t.join()
    (x, ev), = made
    assert nan(x) and main is dev.current_stream()  # the thread's current stream was its own
    rt.wait_event(ev, main)
    assert torch.equal(x, torch.arange(5.0))


# ------------------------------------------------------------------------------------------------- hazards
def test_reusing_a_buffer_needs_a_wait_for_its_reader(dev: rt.SimDevice) -> None:
    main, side = dev.current_stream(), dev.new_stream()
    buf = rt.empty((8,), device=dev)
    rt.copy_async(buf, torch.ones(8), side)
    rt.wait_event(rt.record_event(side), main)
    before = rt.record_event(main)  # recorded before the read below: it does not cover it
    rt.record_stream(buf, main)  # main reads buf
    with pytest.raises(rt.StreamOrderError, match=r"stream1 writes bytes 0\.\.32 .*default may still read"):
        rt.copy_async(buf, torch.zeros(8), side)
    rt.wait_event(before, side)
    with pytest.raises(rt.StreamOrderError):
        rt.copy_async(buf, torch.zeros(8), side)
    rt.wait_event(rt.record_event(main), side)  # after the read: the copy may go
    rt.copy_async(buf, torch.zeros(8), side)
    rt.synchronize(dev)
    assert torch.equal(buf, torch.zeros(8))


def test_reads_and_writes_racing_across_streams(dev: rt.SimDevice) -> None:
    main, s1, s2 = dev.current_stream(), dev.new_stream(), dev.new_stream()
    buf = rt.empty((8,), device=dev)
    rt.copy_async(buf[:4], torch.ones(4), s1)
    with pytest.raises(rt.StreamOrderError, match=r"stream2 reads bytes 0\.\.32 .*stream1 wrote"):
        rt.copy_async(torch.empty(8), buf, s2)  # s2 reads what s1 writes, unordered
    with pytest.raises(rt.StreamOrderError, match=r"stream2 writes bytes 12\.\.20 .*stream1 wrote"):
        rt.copy_async(buf[3:5], torch.zeros(2), s2)
    with pytest.raises(rt.StreamOrderError, match="a use"):
        rt.record_stream(buf[:1], main)  # the consumer never waited for the copy
    rt.copy_async(buf[4:], torch.zeros(4), s2)  # other bytes of the same buffer: no race
    rt.wait_stream(s2, s1)
    out = torch.empty(8)
    rt.copy_async(out, buf, s2)
    rt.synchronize(s2)
    assert torch.equal(out, torch.tensor([1.0] * 4 + [0.0] * 4))


def test_waits_are_transitive(dev: rt.SimDevice) -> None:
    main, s1, s2 = dev.current_stream(), dev.new_stream(), dev.new_stream()
    buf = rt.to_device(torch.ones(4), dev, stream=s1)
    rt.wait_stream(s2, s1)
    ev = rt.record_event(s2)  # s2 had waited for s1: the event covers s1's copy too
    rt.wait_event(ev, main)
    rt.record_stream(buf, main)  # no race: main -> s2 -> s1
    with rt.on_device(dev):
        assert float(buf.sum()) == 4.0


def test_a_host_sync_orders_everything_after_it(dev: rt.SimDevice) -> None:
    main, side = dev.current_stream(), dev.new_stream()
    buf = rt.to_device(torch.ones(4), dev)
    rt.record_stream(buf, main)
    rt.synchronize(dev)
    rt.copy_async(buf, torch.zeros(4), side)  # issued after the host waited for main's read
    rt.synchronize(side)
    assert torch.equal(buf, torch.zeros(4))


# -------------------------------------------------------------------------------------------- host reads
def test_a_host_read_comes_after_the_hosts_wait(dev: rt.SimDevice) -> None:
    """``host_list`` reads values the host has waited for: on a sim device it raises when work was issued on the
    current stream since the host's last wait for it, or when another stream wrote the bytes and the host has not
    waited for that stream (a copy into host memory among them); it counts no sync of its own. The CPU reads."""
    side = dev.new_stream()
    with rt.on_device(dev):
        total = rt.to_device(torch.arange(4), dev).cumsum(0)  # computed on the default stream
    with pytest.raises(rt.StreamOrderError, match="the host has not waited for sim:0/default"):
        rt.host_list(total, dev)
    rt.synchronize(rt.current_stream(dev))
    rt.reset_counts()
    assert rt.host_list(total, dev) == [0, 1, 3, 6] and rt.sync_count(dev) == 0
    host = rt.to_host(total, stream=side)  # into host memory on the side stream
    rt.synchronize(rt.current_stream(dev))  # the default stream's work: not the side stream's copy
    with pytest.raises(rt.StreamOrderError, match=f"{side} wrote"):
        rt.host_list(host, dev)
    rt.synchronize(side)
    assert rt.host_list(host, dev) == [0, 1, 3, 6]
    assert rt.host_list(torch.arange(3), torch.device("cpu")) == [0, 1, 2]


# -------------------------------------------------------------------------------------------- sync counts
def test_sync_and_wait_counts(dev: rt.SimDevice) -> None:
    rt.reset_counts()
    main, side = dev.current_stream(), dev.new_stream()
    x = rt.to_device(torch.ones(4), dev, stream=side)
    ev = rt.record_event(side)
    rt.wait_event(ev, main)
    rt.wait_stream(side, main)
    assert (rt.sync_count(dev), rt.wait_count(dev)) == (0, 2)
    rt.synchronize(dev)
    rt.synchronize(side)
    rt.synchronize(ev)
    with rt.on_device(dev):
        total = x.sum()  # computed in the device's scope: on the device
    assert rt.item(total) == 4.0
    rt.to_host(x, blocking=True)
    rt.to_host(x)
    rt.synchronize(None)
    assert (rt.sync_count(dev), rt.wait_count(dev)) == (5, 2)
    cpu = torch.device("cpu")
    rt.synchronize(cpu)
    rt.item(torch.ones(()))
    rt.wait_stream(rt.new_stream(cpu), rt.current_stream(cpu))  # no streams on a CPU: nothing to count
    assert (rt.sync_count(cpu), rt.wait_count(cpu)) == (2, 0)
    rt.reset_counts(dev)
    assert rt.sync_count(dev) == 0 and rt.sync_count(cpu) == 2


# --------------------------------------------------------------------------- docs/runtime.md's example
def _example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "runtime.md").read_text(), re.S)
    assert len(blocks) == 1
    return str(blocks[0])


def _prefetch(replace: dict[str, str] | None = None) -> Callable[[list[torch.Tensor], Any], list[float]]:
    code = _example()
    for old, new in (replace or {}).items():
        assert code.count(old) == 1, old
        code = code.replace(old, new)
    ns: dict[str, Any] = {}
    exec(compile(code, "docs/runtime.md", "exec"), ns)
    fn: Callable[[list[torch.Tensor], Any], list[float]] = ns["prefetched_sums"]
    return fn


CHUNKS = [torch.full((16,), float(k)) for k in range(5)]
EXPECTED = [16.0 * k for k in range(5)]


@pytest.mark.parametrize("device", ["cpu", "sim"])
def test_the_documented_prefetch_is_right(dev: rt.SimDevice, device: str) -> None:
    target = torch.device("cpu") if device == "cpu" else dev
    rt.reset_counts()
    assert _prefetch()(CHUNKS, target) == EXPECTED
    assert rt.sync_count(target) == 1
    if device == "sim":
        assert rt.wait_count(dev) == 2 * len(CHUNKS) and dev.copies_completed == len(CHUNKS)


def test_the_documented_prefetch_fails_without_its_waits(dev: rt.SimDevice) -> None:
    no_consumer_wait = {"rt.wait_event(ready[k % 2], main)": "pass"}
    with pytest.raises(rt.StreamOrderError, match="reads .*stream1 wrote"):
        _prefetch(no_consumer_wait)(CHUNKS, dev)
    sums = _prefetch({**no_consumer_wait, "with rt.on_device(device):": "if True:"})(CHUNKS, rt.SimDevice(0, 4096))
    assert all(math.isnan(s) for s in sums)  # outside a scope: the poison
    with pytest.raises(rt.StreamOrderError, match="writes .*default may still read"):
        _prefetch({"rt.wait_stream(side, main)": "pass"})(CHUNKS, rt.SimDevice(0, 4096))


# ----------------------------------------------------------------------------------------- pinned memory
def test_pinning_slices_cover_the_tensor_and_close_once() -> None:
    t = torch.zeros(1000, 3)  # 12,000 bytes
    fake = FakeCudart()
    region = rt.pin_in_place(t, slice_bytes=5000, cudart=lambda: fake)
    assert region is not None and region.slices == 3
    spans = sorted(fake.registered.items())
    assert spans[0][0] == t.data_ptr() and [s for _, s in spans] == [5000, 5000, 2000]
    assert all(p + s == q for (p, s), (q, _) in zip(spans, spans[1:], strict=False))
    region.close()
    region.close()
    assert not fake.registered and len(fake.unregistered) == 3 and region.closed


def test_pinning_the_same_tensor_twice_shares_one_registration() -> None:
    """Two engines over one graph pin the same features: CUDA refuses a second registration of a range (an error
    that then surfaces at the next kernel launch, as the H200 gpu-check's hybrid step met), so the second pin takes
    a hold on the first registration, and the pages stay registered until the last hold goes."""
    t = torch.zeros(1000, 3)
    fake = FakeCudart()
    first = rt.pin_in_place(t, slice_bytes=5000, cudart=lambda: fake)
    second = rt.pin_in_place(t, slice_bytes=5000, cudart=lambda: fake)
    part = rt.pin_in_place(t[10:20], cudart=lambda: fake)  # a part of a registered tensor: covered too
    assert first is not None and second is not None and part is not None
    assert fake.calls == 3 and fake.last_error == 0  # one registration of 3 slices, never refused
    first.close()
    second.close()
    assert len(fake.registered) == 3  # `part` still holds it
    part.close()
    assert not fake.registered and len(fake.unregistered) == 3 and first.closed and part.closed
    again = rt.pin_in_place(t, slice_bytes=5000, cudart=lambda: fake)  # registered anew once let go
    assert again is not None and fake.calls == 6
    again.close()
    # a tensor overlapping a registration without being inside it: refused up front, never asked of CUDA
    big = torch.zeros(100)
    inner = rt.pin_in_place(big[10:20], cudart=lambda: fake)
    assert rt.pin_in_place(big, fallback=True, cudart=lambda: fake) is None and fake.last_error == 0
    with pytest.raises(ConfigError, match="already registered"):
        rt.pin_in_place(big, cudart=lambda: fake)
    assert inner is not None
    inner.close()


def test_pinning_failure_unregisters_and_falls_back() -> None:
    t = torch.zeros(4000)
    fake = FakeCudart(fail_at=2)
    with pytest.raises(ConfigError, match="cudaHostRegister error 2"):
        rt.pin_in_place(t, slice_bytes=4096, cudart=lambda: fake)
    assert not fake.registered and len(fake.unregistered) == 2
    assert rt.pin_in_place(t, slice_bytes=4096, fallback=True, cudart=lambda: FakeCudart(fail_at=0)) is None
    same, region = rt.pinned_host(t, cudart=lambda: (fake := FakeCudart()))
    assert same.data_ptr() == t.data_ptr() and region is not None and region.slices == 1
    del region
    gc.collect()
    assert not fake.registered  # garbage collection unregistered it
    with pytest.raises(ValueError, match="contiguous"):
        rt.pin_in_place(torch.zeros(4, 4).t(), cudart=FakeCudart)


def test_nothing_is_pinned_for_cpu_or_sim(dev: rt.SimDevice) -> None:
    t = torch.arange(6.0)
    for d in (dev, torch.device("cpu")):
        same, region = rt.pinned_host(t, device=d, cudart=lambda: pytest.fail("no registration"))
        assert same.data_ptr() == t.data_ptr() and region is None and not rt.needs_pinning(d)
        assert not rt.pinned_empty((3,), device=d).is_pinned()
    if not HAS_CUDA:  # no accelerator to pin for: the fallback keeps the tensor
        copy, none = rt.pinned_host(t, cudart=lambda: FakeCudart(fail_at=0))
        assert none is None and copy.data_ptr() == t.data_ptr()


# ------------------------------------------------------------------------------------------- the package
def test_only_the_backend_names_the_accelerator_apis() -> None:
    files = sorted((ROOT / "gnnscale" / "runtime").glob("*.py"))
    naming = [f.name for f in files if re.search(r"torch\.(cuda|accelerator)\b", f.read_text())]
    assert naming == ["backend.py"]
    allowed = ("gnnscale.errors", "gnnscale.units", "gnnscale.runtime")
    for f in files:
        tree = ast.parse(f.read_text())
        mods = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
        assert all(not m.startswith("gnnscale") or m.startswith(allowed) for m in mods), f.name
        assert len(f.read_text().splitlines()) <= 400, f.name


# ------------------------------------------------------------------------------------------- real CUDA
@only_cuda
def test_cuda_copies_events_and_counts() -> None:
    cuda = rt.resolve_device("cuda:0")
    assert isinstance(cuda, torch.device) and rt.is_accelerator(cuda) and rt.device_name(cuda)
    rt.reset_counts()
    main, side = rt.current_stream(cuda), rt.new_stream(cuda)
    host = rt.pinned_empty((1 << 16,), device=cuda).copy_(torch.arange(1 << 16, dtype=torch.float32))
    with rt.use_stream(side):
        x = rt.to_device(host, cuda)
        ev = rt.record_event(side)
    rt.wait_event(ev, main)
    rt.record_stream(x, main)
    back = rt.to_host(x * 2, blocking=True)
    assert torch.equal(back, host * 2) and back.is_pinned()
    assert rt.sync_count(cuda) == 1 and rt.wait_count(cuda) == 1
    free, total = rt.mem_get_info(cuda)
    assert 0 < free <= total
    rt.reset_peak(cuda)
    y = rt.empty((1 << 20,), device=cuda)
    assert rt.peak_bytes(cuda) >= y.numel() * 4
    with pytest.raises(rt.DeviceOutOfMemory, match="out of memory on cuda:0"):
        rt.empty((total,), device=cuda)


@only_cuda
def test_cuda_registered_memory_is_read_by_the_gpu() -> None:
    host = torch.randn(50_000, 32)
    region = rt.pin_in_place(host, slice_bytes=1 << 20)
    assert region is not None
    with region:
        assert region.slices > 1 and host.is_pinned()
        dev = rt.to_device(host[:1000], torch.device("cuda"))
        rt.synchronize(torch.device("cuda"))
        assert torch.equal(dev.cpu(), host[:1000])
