"""Pinning host tensors in place (cudaHostRegister in slices): slicing, failure clean-up, unregistering once.
A fake runtime records the calls on CPU; the CUDA test registers real memory and reads it from the GPU.
(``gnnscale.store.pinning`` moved to the runtime: :mod:`gnnscale.runtime.pinned`.)"""

from __future__ import annotations

import gc

import pytest
import torch

from gnnscale.errors import ConfigError
from gnnscale.runtime import pin_in_place, pinned_host
from gnnscale.testing import FakeCudart, only_cuda


def test_slices_cover_the_tensor_exactly_and_close_once() -> None:
    t = torch.zeros(1000, 3)  # 12,000 bytes
    rt = FakeCudart()
    region = pin_in_place(t, slice_bytes=5000, cudart=lambda: rt)
    assert region is not None and region.slices == 3
    spans = sorted(rt.registered.items())
    assert spans[0][0] == t.data_ptr() and all(size <= 5000 for _, size in spans)
    for (p, s), (q, _) in zip(spans, spans[1:], strict=False):
        assert p + s == q  # no gap, no overlap
    assert spans[-1][0] + spans[-1][1] == t.data_ptr() + 12000
    region.close()
    region.close()  # a second close does nothing
    assert not rt.registered and len(rt.unregistered) == 3 and region.closed


def test_a_failed_slice_unregisters_the_others() -> None:
    t = torch.zeros(4000)
    rt = FakeCudart(fail_at=2)
    with pytest.raises(ConfigError, match="cudaHostRegister error 2"):
        pin_in_place(t, slice_bytes=4096, cudart=lambda: rt)
    assert not rt.registered and len(rt.unregistered) == 2
    rt = FakeCudart(fail_at=0)
    assert pin_in_place(t, slice_bytes=4096, fallback=True, cudart=lambda: rt) is None
    assert not rt.registered


def test_pinned_host_falls_back_to_a_copy_only_when_registration_fails() -> None:
    t = torch.arange(10.0)
    rt = FakeCudart()
    same, region = pinned_host(t, cudart=lambda: rt)
    assert same.data_ptr() == t.data_ptr() and region is not None  # no copy
    region.close()
    if torch.cuda.is_available():  # the fallback copies into pinned memory, which needs CUDA
        copy, none = pinned_host(t, cudart=lambda: FakeCudart(fail_at=0))
        assert none is None and copy.is_pinned() and torch.equal(copy, t)


def test_garbage_collection_unregisters_and_edge_cases() -> None:
    rt = FakeCudart()
    region = pin_in_place(torch.zeros(100), cudart=lambda: rt)
    assert len(rt.registered) == 1
    del region
    gc.collect()
    assert not rt.registered
    empty = pin_in_place(torch.zeros(0), cudart=lambda: rt)
    assert empty is not None and empty.slices == 0
    with pytest.raises(ValueError, match="contiguous"):
        pin_in_place(torch.zeros(4, 4).t(), cudart=lambda: rt)


@only_cuda
def test_registered_memory_is_read_by_the_gpu() -> None:
    from gnnscale.store import gather_rows, triton_available

    host = torch.randn(50_000, 32)
    with pin_in_place(host, slice_bytes=1 << 20) as region:  # several slices
        assert region is not None and region.slices > 1 and host.is_pinned()
        rows = torch.sort(torch.randint(0, 50_000, (4096,))).values
        out = torch.empty(4096, 32, device="cuda")
        if triton_available():
            gather_rows(host, rows.cuda(), out, method="uva")
            assert torch.equal(out.cpu(), host[rows])
        dev = host[:1000].to("cuda", non_blocking=True)
        assert torch.equal(dev.cpu(), host[:1000])


def test_registered_memory_is_read_by_a_sim_device() -> None:
    """Sim twin of the CUDA-only ``test_registered_memory_is_read_by_the_gpu`` (and test_runtime's
    ``test_cuda_registered_memory_is_read_by_the_gpu``): a host table registered in place in several slices (the
    fake runtime records them) is read by a device, in place, across slice boundaries: every byte the reads take
    lies in a registered slice while the region is open, the reads equal the table, and closing the region
    unregisters every slice once. (A sim device needs no page-locking; the registration itself is CUDA's.)"""
    from gnnscale import runtime as rt
    from gnnscale.store import gather_rows

    fake = FakeCudart()
    host = torch.randn(50_000, 32)
    dev = rt.SimDevice(0, 1 << 24)
    side = rt.new_stream(dev)
    with pin_in_place(host, slice_bytes=1 << 20, cudart=lambda: fake) as region:  # several slices
        assert region is not None and region.slices > 1 and len(fake.registered) == region.slices
        rows = torch.sort(torch.randint(0, 50_000, (4096,), generator=torch.Generator().manual_seed(0))).values
        row_bytes = host.shape[1] * host.element_size()
        for r in rows.tolist():  # every row read lies in one registered slice or spans two
            lo, hi = host.data_ptr() + r * row_bytes, host.data_ptr() + (r + 1) * row_bytes
            covered = sum(max(0, min(hi, p + n) - max(lo, p)) for p, n in fake.registered.items())
            assert covered == row_bytes, r
        out = rt.empty((4096, 32), device=dev)
        with rt.use_stream(side):
            got = gather_rows(host, rows, out, staging=rt.pinned_empty((4096, 32), device=dev))
            first = rt.to_device(host[:1000], dev)
        rt.synchronize(side)
        assert torch.equal(got, host[rows]) and torch.equal(first, host[:1000])
    assert not fake.registered and len(fake.unregistered) == region.slices
