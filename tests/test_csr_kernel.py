"""The CPU CSR product kernels (issue #30 point 2): ``sparse_mm`` at one torch thread and the offload engine's
fused transposed product into host rows sum every row in order, as the torch path does, bit for bit."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

import gnnscale.runtime as rt
from gnnscale.graph.block import Block
from gnnscale.nn.ops import sparse_mm, spmm_t, spmm_t_add
from gnnscale.runtime import cpu_kernels

NEEDS_NUMBA = pytest.mark.skipif(not cpu_kernels.available(),
                                 reason="numba is not installed: the fused kernels cannot run")


def _csr(n: int, m: int, dtype: torch.dtype, index_dtype: torch.dtype = torch.int64,
         seed: int = 4) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """A random ``[n, m]`` CSR matrix with empty rows and a column repeated within a row: the sparse tensor and
    its row pointers, columns and values."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, 25, (n,), generator=g)
    counts[::7] = 0  # rows with no entries
    indptr = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
    cols = torch.randint(0, m, (int(indptr[-1]),), generator=g)
    cols[:5] = 3  # a repeated column within the first non-empty row
    values = torch.randn(cols.numel(), dtype=dtype, generator=g)
    adj = torch.sparse_csr_tensor(indptr.to(index_dtype), cols.to(index_dtype), values, (n, m))
    return adj, indptr, cols, values


def _sequential_product(indptr: Tensor, cols: Tensor, values: Tensor, x: Tensor) -> Tensor:
    """``A @ x`` summed entry by entry in each row's order from zero, a multiply and an add (each rounded) per
    entry: the arithmetic the kernel promises, computed with torch's elementwise ops."""
    n = indptr.numel() - 1
    lengths = indptr[1:] - indptr[:-1]
    out = torch.zeros(n, x.shape[1], dtype=x.dtype)
    for t in range(int(lengths.max())):
        rows = torch.nonzero(lengths > t).squeeze(1)
        k = indptr[rows] + t
        out[rows] = out[rows] + values[k].unsqueeze(1) * x[cols[k]]
    return out


def _bits(t: Tensor) -> Tensor:
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int64)


@NEEDS_NUMBA
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_the_csr_kernel_sums_each_row_in_order(dtype: torch.dtype, index_dtype: torch.dtype, one_thread: None,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """``sparse_mm`` through the kernel: every bit of the in-order sum, for widths from 1 to 129 (a prefetch of
    each cache line of a row, whole or not), rows without entries, a repeated column, infinities and NaN in the
    rows; torch's CSR product (MKL's) agrees to rounding (bitwise on this repo's machine); the kernel ran, its
    one loop for any width."""
    monkeypatch.setattr(cpu_kernels, "MIN_ELEMENTS", 0)
    calls, built = [], []
    real, build = cpu_kernels.csr_mm, cpu_kernels._build_csr_kernels
    monkeypatch.setattr(cpu_kernels, "csr_mm", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(cpu_kernels, "_build_csr_kernels", lambda w: built.append(w) or build(w))
    n, m = 700, 900
    adj, indptr, cols, values = _csr(n, m, dtype, index_dtype)
    for width in (1, 7, 16, 64, 129):
        x = torch.randn(m, width, dtype=dtype)
        x[3, 0], x[11, -1] = float("inf"), float("nan")
        got = sparse_mm(adj, x)
        assert torch.equal(_bits(got), _bits(_sequential_product(indptr, cols, values, x))), width
        mkl = torch.addmm(torch.empty(n, width, dtype=dtype), adj, x, beta=0.0)
        torch.testing.assert_close(got, mkl, equal_nan=True)
    assert len(calls) == 5
    assert built == [0] * 5  # one loop for any width (the transposed add compiles narrow widths' own)


@NEEDS_NUMBA
def test_the_csr_kernel_takes_what_it_applies_to(one_thread: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel runs for CPU products whose dense side has at least ``MIN_ELEMENTS`` elements, at one torch
    thread; not below it, not at two threads (MKL's product then runs on torch's workers), not for a sim
    device's tensors (their every access is checked through torch), not for a dtype mismatch."""
    monkeypatch.setattr(cpu_kernels, "MIN_ELEMENTS", 900 * 8)
    calls = []
    real = cpu_kernels.csr_mm
    monkeypatch.setattr(cpu_kernels, "csr_mm", lambda *a: calls.append(a[1].shape) or real(*a))
    adj = _csr(700, 900, torch.float32)[0]
    sparse_mm(adj, torch.randn(900, 8))  # exactly MIN_ELEMENTS
    sparse_mm(adj, torch.randn(900, 7))  # below
    assert not cpu_kernels.csr_mm_applies(adj, torch.randn(900, 8, dtype=torch.float64))  # values float32
    torch.set_num_threads(2)
    sparse_mm(adj, torch.randn(900, 8))
    torch.set_num_threads(1)
    sim = rt.SimDevice(0, 1 << 24)
    with rt.on_device(sim):
        x_sim = rt.to_device(torch.randn(900, 8), sim)
        rt.synchronize(sim)
        assert not cpu_kernels.csr_mm_applies(adj, x_sim)
    assert calls == [(900, 8)]


@NEEDS_NUMBA
def test_the_csr_kernel_refuses_entries_outside_its_operands(one_thread: None) -> None:
    """A column past ``x``'s rows, or negative, raises ``IndexError`` (the entry is never read: numba checks no
    bounds itself); row pointers that run past the entries or backwards do too; shapes that do not chain raise
    ``ValueError``."""
    x = torch.randn(4, 3)
    for indptr, cols in (([0, 1, 2], [0, 4]), ([0, 1, 2], [-1, 0]), ([0, 2, 1], [0, 1]), ([0, 1, 3], [0, 1])):
        adj = torch.sparse_csr_tensor(torch.tensor(indptr), torch.tensor(cols), torch.ones(len(cols)), (2, 4))
        with pytest.raises(IndexError):
            cpu_kernels.csr_mm(adj, x)
    with pytest.raises(ValueError):
        cpu_kernels.csr_mm(_csr(5, 6, torch.float32)[0], x)


def _block(num_dst: int, num_src: int, dtype: torch.dtype) -> Block:
    adj, indptr, cols, values = _csr(num_dst, num_src, dtype, seed=9)
    return Block(indptr=indptr, indices=cols, num_src=num_src, edge_weight=values).with_transpose()


@pytest.mark.parametrize("width", [5, 33])
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_transposed_product_added_into_host_rows_is_the_product_then_the_add(
        fused: bool, dtype: torch.dtype, width: int, one_thread: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """``spmm_t_add`` (the offload engine's source-row gradients on a CPU reading in place) leaves the host
    table as ``A^T @ grad`` followed by ``index_add_`` would, bit for bit, rows outside ``rows`` untouched; with
    numba it runs the fused kernel (counted; narrow rows the loop compiled for their width), without it the
    product and the add."""
    if fused and not cpu_kernels.available():
        pytest.skip("numba is not installed: the fused kernel cannot run")
    monkeypatch.setattr(cpu_kernels, "MIN_ELEMENTS", 0)
    if not fused:
        monkeypatch.setattr(cpu_kernels, "_kernels", lambda: None)
    calls, built = [], []
    real, build = cpu_kernels.csr_mm_add, cpu_kernels._build_csr_kernels
    monkeypatch.setattr(cpu_kernels, "csr_mm_add", lambda *a: calls.append(1) or real(*a))
    block = _block(300, 400, dtype)
    grad = torch.randn(300, width, dtype=dtype) * 100
    host = torch.randn(1000, width, dtype=dtype)
    rows = torch.randperm(1000)[:400].sort().values
    expected = host.clone().index_add_(0, rows, spmm_t(block, grad))  # the product: the loop for any width
    monkeypatch.setattr(cpu_kernels, "_build_csr_kernels", lambda w: built.append(w) or build(w))
    spmm_t_add(block, grad, host, rows)
    assert torch.equal(_bits(host), _bits(expected))
    assert calls == ([1] if fused else [])
    assert built == ([width if width <= cpu_kernels.NARROW else 0] if fused else [])  # narrow rows: their own loop


@NEEDS_NUMBA
def test_the_fused_transposed_product_counts_its_work(one_thread: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused transposed product takes a product of at least ``MIN_ELEMENTS`` multiply-adds (entries times
    width) however few rows its gradient has: the offload engine's 5-wide class-layer gradients of one chunk,
    which the plain product (counting its dense side's elements) leaves to the torch path."""
    block = _block(300, 400, torch.float32)
    adj_t = block.adj_t()
    monkeypatch.setattr(cpu_kernels, "MIN_ELEMENTS", block.num_edges * 5)
    assert cpu_kernels.csr_mm_add_applies(adj_t, torch.ones(300, 5), torch.zeros(400, 5))
    assert not cpu_kernels.csr_mm_add_applies(adj_t, torch.ones(300, 4), torch.zeros(400, 4))
    assert not cpu_kernels.csr_mm_applies(adj_t, torch.ones(300, 5))


@NEEDS_NUMBA
def test_the_fused_transposed_product_refuses_rows_outside_the_table(one_thread: None) -> None:
    """A host row id past the table raises before anything is written."""
    block = _block(30, 40, torch.float32)
    host = torch.zeros(50, 5)
    rows = torch.arange(40)
    rows[-1] = 50
    with pytest.raises(IndexError):
        cpu_kernels.csr_mm_add(block.adj_t(), torch.ones(30, 5), host, rows)
    assert not host.any()
