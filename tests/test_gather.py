"""Host-row gathers (gnnscale.store.gather): both methods against torch's own indexing, bit for bit."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from gnnscale import runtime as rt
from gnnscale.errors import ConfigError
from gnnscale.store import GATHER_METHODS, default_gather_method, gather_rows, scatter_add_rows, triton_available
from gnnscale.testing import only_cuda

ROOT = Path(__file__).resolve().parents[1]


def _sorted_rows(n_total: int, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(n_total, generator=g)[:n].sort().values  # [n] int64, unique, ascending


def test_index_select_exact():
    host = torch.randn(1000, 37, generator=torch.Generator().manual_seed(0))  # [N, F]
    rows = _sorted_rows(1000, 400, seed=1)
    out = torch.empty(400, 37)
    got = gather_rows(host, rows, out, method="index_select")
    assert torch.equal(got, host[rows])
    assert got.data_ptr() == out.data_ptr()


def test_index_select_larger_out_returns_view():
    host = torch.randn(1000, 37, generator=torch.Generator().manual_seed(2))
    rows = _sorted_rows(1000, 123, seed=3)
    out = torch.full((500, 37), -1.0)
    got = gather_rows(host, rows, out)  # index_select is the default method
    assert got.shape == (123, 37)
    assert got.data_ptr() == out.data_ptr()
    assert torch.equal(out[:123], host[rows])
    assert torch.equal(out[123:], torch.full((377, 37), -1.0))  # the rest is untouched


def test_index_select_empty_and_unsorted():
    host = torch.randn(50, 4)
    out = torch.zeros(3, 4)
    assert gather_rows(host, torch.empty(0, dtype=torch.int64), out).shape == (0, 4)
    rows = torch.tensor([7, 2, 7])  # unsorted, repeated: still correct, only slower on the uva path
    assert torch.equal(gather_rows(host, rows, out), host[rows])


def test_bad_arguments():
    host, out = torch.randn(10, 3), torch.empty(10, 3)
    rows = torch.arange(4)
    with pytest.raises(ConfigError, match="unknown gather method"):
        gather_rows(host, rows, out, method="memcpy")
    with pytest.raises(ValueError, match="out holds 2 rows"):
        gather_rows(host, rows, torch.empty(2, 3))
    with pytest.raises(ValueError, match="int64"):
        gather_rows(host, rows.int(), out)
    with pytest.raises(ValueError, match="feature width or dtype"):
        gather_rows(host, rows, torch.empty(10, 3, dtype=torch.float64))
    assert GATHER_METHODS == ("index_select", "uva")


def test_uva_on_cpu_needs_interpreter(monkeypatch):
    if not triton_available():
        with pytest.raises(ConfigError, match="needs triton"):
            gather_rows(torch.randn(10, 3), torch.arange(4), torch.empty(4, 3), method="uva")
        return
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ConfigError, match="TRITON_INTERPRET"):
        gather_rows(torch.randn(10, 3), torch.arange(4), torch.empty(4, 3), method="uva")


def test_default_method():
    assert default_gather_method(torch.device("cpu")) == "index_select"
    expected = "uva" if triton_available() else "index_select"
    assert default_gather_method(torch.device("cuda", 0)) == expected


def test_scatter_add_rows():
    g = torch.Generator().manual_seed(4)
    host = torch.randn(200, 9, generator=g)
    rows = _sorted_rows(200, 60, seed=5)
    src = torch.randn(60, 9, generator=g)
    expected = host.clone()
    for i, r in enumerate(rows.tolist()):
        expected[r] += src[i]
    scatter_add_rows(host, rows, src)
    assert torch.equal(host, expected)
    with pytest.raises(ValueError, match="does not match"):
        scatter_add_rows(host, rows, src[:10])


# The uva kernel runs in Triton's interpreter in a fresh process: TRITON_INTERPRET is then set before anything
# imports triton, whatever the rest of the test session imported.
_UVA_SCRIPT = textwrap.dedent(
    """
    import torch
    from gnnscale.store import gather_rows

    g = torch.Generator().manual_seed(0)
    cases = 0
    for f in (1, 37, 128, 256):
        host = torch.randn(1000, f, generator=g)  # [N, F]
        for n in (0, 1, 3, 517, 1000):
            rows = torch.randperm(1000, generator=g)[:n].sort().values  # [n] int64
            out = torch.full((n + 5, f), float("nan"))  # larger buffer: the tail must stay untouched
            got = gather_rows(host, rows, out, method="uva")
            assert got.shape == (n, f) and (n == 0 or got.data_ptr() == out.data_ptr()), (f, n)
            assert torch.equal(got, host[rows]), (f, n)
            assert out[n:].isnan().all(), (f, n)
            cases += 1
    # unsorted, repeated ids are slower on a GPU but must still be correct
    host = torch.randn(64, 5, generator=g)
    rows = torch.tensor([63, 0, 63, 7])
    assert torch.equal(gather_rows(host, rows, torch.empty(4, 5), method="uva"), host[rows])
    # row id * row stride beyond 2^31: a 2 GiB uint8 host, never touched except the rows written here
    try:
        big = torch.empty(2**30 + 8, 2, dtype=torch.uint8)  # [N, 2]; address range only, pages stay unmapped
    except RuntimeError:
        print("SKIP-BIG")
    else:
        rows = torch.tensor([1, 2**30 + 3, 2**30 + 7])
        big[rows] = torch.tensor([[1, 2], [3, 4], [5, 6]], dtype=torch.uint8)
        got = gather_rows(big, rows, torch.zeros(3, 2, dtype=torch.uint8), method="uva")
        assert torch.equal(got, big[rows]), got
        cases += 1
    print("CASES", cases)
    """
)


@pytest.mark.skipif(not triton_available(), reason="triton is not installed (pip install triton): uva path untested")
def test_uva_triton_interpreter():
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": pythonpath}
    proc = subprocess.run([sys.executable, "-c", _UVA_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"interpreter run failed:\n{proc.stdout}\n{proc.stderr}"
    expected = 20 if "SKIP-BIG" in proc.stdout else 21  # 4 widths x 5 row counts (+ the > 2^31 offset case)
    assert f"CASES {expected}" in proc.stdout, proc.stdout


@only_cuda
@pytest.mark.parametrize("method", GATHER_METHODS)
def test_gather_on_cuda_is_exact(method: str) -> None:
    """The real GPU paths: pinned host rows -> device, sorted and unsorted ids, wide and narrow rows, empty."""
    if method == "uva" and not triton_available():
        pytest.skip("triton is not installed")
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(7)
    for f in (1, 37, 256):
        host = torch.randn(5000, f, generator=g).pin_memory()  # [N, F]
        unsorted = torch.randperm(5000, generator=g)[:999]
        for rows in (_sorted_rows(5000, 1200, seed=f), unsorted, _sorted_rows(5000, 0, seed=1)):
            n = rows.numel()
            out = torch.full((n + 3, f), float("nan"), device=dev)  # the tail must stay untouched
            staging = torch.empty(n, f, pin_memory=True) if method == "index_select" else None
            got = gather_rows(host, rows if method == "index_select" else rows.to(dev), out, method=method,
                              staging=staging)
            torch.cuda.synchronize()
            assert got.shape == (n, f) and torch.equal(got.cpu(), host[rows]), (f, n)
            assert out[n:].isnan().all(), (f, n)


def test_gather_into_a_sim_device_is_exact() -> None:
    """Sim twin of ``test_gather_on_cuda_is_exact`` (the index_select path; the UVA kernel reads pinned memory from
    a real GPU only): host rows -> staging -> a copy on a side stream into a sim device, sorted and unsorted ids,
    wide and narrow rows, empty; the rows are the poison until the stream is waited for, then ``host[rows]``, and
    the tail of ``out`` is untouched."""
    dev = rt.SimDevice(0, 1 << 24)
    side = rt.new_stream(dev)
    g = torch.Generator().manual_seed(7)
    for f in (1, 37, 256):
        host = torch.randn(5000, f, generator=g)  # [N, F]
        unsorted = torch.randperm(5000, generator=g)[:999]
        for rows in (_sorted_rows(5000, 1200, seed=f), unsorted, _sorted_rows(5000, 0, seed=1)):
            n = rows.numel()
            out = rt.to_device(torch.full((n + 3, f), float("nan")), dev)  # the tail must stay untouched
            staging = rt.pinned_empty((n, f), device=dev)
            rt.wait_stream(side, rt.current_stream(dev))  # out was filled on the default stream
            with rt.use_stream(side):
                got = gather_rows(host, rows, out, method="index_select", staging=staging)
            assert got.isnan().all(), (f, n)  # not waited for yet
            rt.wait_stream(rt.current_stream(dev), side)
            assert got.shape == (n, f) and torch.equal(got, host[rows]), (f, n)
            assert out[n:].isnan().all(), (f, n)
