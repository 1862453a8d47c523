"""The runtime on an accelerator type other than CUDA (issue #46, item 6): :class:`gnnscale.testing.FakeAccelerator`
stands in for ``torch.accelerator`` (torch >= 2.6) or for the type's own module (torch < 2.6), and the runtime's
public calls select its devices, make and use its streams and events, and report its memory statistics."""

from __future__ import annotations

import pytest
import torch

import gnnscale.runtime as rt
from gnnscale.errors import ConfigError
from gnnscale.testing import FakeAccelerator

XPU0, XPU1 = torch.device("xpu", 0), torch.device("xpu", 1)


@pytest.fixture(params=[True, False], ids=["torch.accelerator", "torch.xpu"])
def fake(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> FakeAccelerator:
    monkeypatch.delenv(rt.DEVICE_ENV, raising=False)
    return FakeAccelerator(count=2, kind="xpu").install(monkeypatch, generic=request.param)


def test_the_runtime_selects_a_non_cuda_accelerator(fake: FakeAccelerator) -> None:
    assert rt.accelerator_type() == "xpu" and rt.is_available() and rt.device_count() == 2
    assert rt.default_device() == torch.device("xpu") and rt.resolve_device("auto") == torch.device("xpu")
    assert rt.resolve_device("xpu:1") == XPU1 and rt.is_accelerator(XPU1) and not rt.is_sim(XPU1)
    with pytest.raises(ConfigError, match="xpu:2"):
        rt.resolve_device("xpu:2")
    with pytest.raises(ConfigError):
        rt.resolve_device("cuda:0")  # not this build's accelerator
    assert rt.device_name(XPU1) == "Fake XPU accelerator 1"
    assert rt.can_access_peer(XPU0, XPU1) and not rt.can_access_peer(XPU0, XPU0)
    fake.count = 0
    assert not rt.is_available() and rt.device_count() == 0 and rt.default_device() == torch.device("cpu")


def test_streams_events_and_waits_go_to_the_accelerator(fake: FakeAccelerator) -> None:
    """A double-buffer's calls reach the fake's streams and events in order; waits and syncs are counted under
    the device's key (``xpu:1``)."""
    rt.reset_counts()
    main, side = rt.current_stream(XPU1), rt.new_stream(XPU1)
    assert main is not None and side is not None and main is not side
    assert main.device == XPU1 and side.device == XPU1
    rt.wait_stream(side, main)
    with rt.use_stream(side):
        assert rt.current_stream(XPU1) is side
        ready = rt.record_event(side)
    assert rt.current_stream(XPU1) is main  # restored
    rt.wait_event(ready, main)
    with rt.on_device(XPU1):
        assert fake.index == 1
    rt.synchronize(side)
    rt.synchronize(ready)
    rt.synchronize(XPU1)
    own = rt.new_event(XPU1)
    assert rt.record_event(main, own) is own
    assert [e for e in fake.log if e[0] != "set_stream"] == [
        ("wait_stream", side.name, main.name),
        ("record", side.name),
        ("wait_event", main.name, side.name),
        ("synchronize", side.name),
        ("synchronize", f"event@{side.name}"),
        ("synchronize", "xpu:1"),
        ("record", main.name),
    ]
    assert ("set_stream", side.name) in fake.log  # use_stream made it current
    assert (rt.wait_count(XPU1), rt.sync_count(XPU1)) == (2, 3)
    assert (rt.wait_count(XPU0), rt.sync_count(XPU0)) == (0, 0)
    # host tensors copied "on" an accelerator stream: the copy runs, the stream is entered around it
    dst = torch.zeros(3)
    assert torch.equal(rt.copy_async(dst, torch.ones(3), side), torch.ones(3))


def test_memory_statistics_come_from_the_accelerator(fake: FakeAccelerator) -> None:
    fake.allocate(3 << 20)
    assert rt.memory_allocated(XPU0) == 3 << 20 and rt.peak_bytes(XPU0) == 3 << 20
    assert rt.mem_get_info(XPU0) == (fake.total - (3 << 20), fake.total)
    fake.allocate(-(2 << 20))
    assert rt.memory_allocated(XPU0) == 1 << 20 and rt.peak_bytes(XPU0) == 3 << 20
    rt.reset_peak(XPU0)
    assert rt.peak_bytes(XPU0) == 1 << 20
    fake.allocate(1 << 20)
    assert rt.peak_bytes(XPU0) == 2 << 20


def test_a_fake_accelerator_is_not_cuda() -> None:
    with pytest.raises(ValueError, match="other than cuda"):
        FakeAccelerator(kind="cuda")
