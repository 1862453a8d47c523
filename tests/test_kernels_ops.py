"""The leaner keyed dropout (issue #30 point 2) draws exactly the masks of the five-pass formulation it replaced
and gives the same values and gradients."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

import gnnscale.runtime as rt
from gnnscale.nn import build_model
from gnnscale.nn.ops import _FIB32, _M31, _mix31, _mix31_int, keep_mask, keyed_dropout, mix_key
from gnnscale.runtime import cpu_kernels
from gnnscale.store.gather import scatter_add_rows


def _keep_mask_reference(row_ids: Tensor, num_features: int, p: float, key: int) -> Tensor:
    """The original mask: ``(((hr ^ hc) * FIB) >> 1) & (2^31 - 1) >= floor(p 2^31)`` in int32."""
    r = row_ids.long()
    hr = _mix31(((r ^ (r >> 31)) & _M31) ^ key)
    cols = torch.arange(num_features, dtype=torch.int64)
    hc = _mix31((cols * 0x9E3779B1) & _M31 ^ _mix31_int(key ^ 0x5BD1E995))
    u = hr.to(torch.int32).unsqueeze(1) ^ hc.to(torch.int32).unsqueeze(0)
    u *= _FIB32
    u >>= 1
    u &= _M31
    return u >= int(p * (1 << 31))


@pytest.mark.parametrize("p", [1e-9, 0.1, 0.25, 0.5, 0.6, 0.9, 0.999999])
def test_keep_mask_equals_the_reference(p: float) -> None:
    ids = torch.cat([torch.arange(5000), torch.randint(0, 2**40, (3000,)), torch.tensor([2**31 - 1, 2**31, 0])])
    for key in (mix_key(0, 1, 0), mix_key(7, 3, 2), 0, _M31):
        assert torch.equal(keep_mask(ids, 67, p, key), _keep_mask_reference(ids, 67, p, key)), (p, key)


def test_keep_mask_keeps_nothing_at_p_1() -> None:
    assert not keep_mask(torch.arange(100), 8, 1.0, 5).any()


def test_keyed_dropout_values_and_gradient() -> None:
    torch.manual_seed(0)
    x = torch.randn(3000, 33, requires_grad=True)
    ids = torch.randperm(10_000)[:3000]
    key, p = mix_key(1, 2, 1), 0.4
    out = keyed_dropout(x, p, key, ids)
    mask = _keep_mask_reference(ids, 33, p, key)
    ref = x.detach() * mask / (1.0 - p)
    assert torch.equal(out.detach(), ref)  # -0.0 == +0.0
    g = torch.randn_like(out)
    out.backward(g)
    assert x.grad is not None
    torch.testing.assert_close(x.grad, g * mask / (1.0 - p), rtol=0, atol=0)


@pytest.mark.parametrize("model", ["gcn", "sage"])
@pytest.mark.parametrize("input_grad", [True, False])
def test_a_linear_projection_s_vjp_is_autograd_s_bit_for_bit_without_a_forward(model: str, input_grad: bool,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """``project_vjp`` of GCN's and SAGE's projections (the offload engine's projection backward, chunk by chunk):
    the weight's gradient, accumulated over two chunks, and the input's gradient equal autograd's recomputation
    bit for bit, and no forward product runs (``project`` is never called)."""
    torch.manual_seed(1)
    layer = build_model(model, 48, 16, 5, layers=2, dropout=0.5, heads=1, seed=0).block_layers[0]
    assert layer.projects_first
    chunks = [(torch.randn(700, 48), torch.randn(700, 16)), (torch.randn(333, 48), torch.randn(333, 16))]
    expected, ref_x = [], []
    for x, g in chunks:  # the base class's way: recompute the projection under autograd
        xr = x.clone().requires_grad_(input_grad)
        layer.project(xr).backward(g)
        ref_x.append(xr.grad)
    expected = [p.grad.clone() for p in layer.parameters() if p.grad is not None]
    layer.zero_grad(set_to_none=True)
    monkeypatch.setattr(type(layer), "project", lambda *a: pytest.fail("project_vjp ran a forward product"))
    got_x = [layer.project_vjp(x, g, input_grad) for x, g in chunks]
    got = [p.grad for p in layer.parameters() if p.grad is not None]
    assert len(got) == len(expected) == 1
    assert torch.equal(got[0], expected[0])
    for a, b in zip(got_x, ref_x, strict=True):
        assert (a is None and b is None) if not input_grad else torch.equal(a, b)


@pytest.mark.skipif(not cpu_kernels.available(), reason="numba is not installed: the fused kernel cannot run")
@pytest.mark.parametrize("p", [1e-9, 0.1, 0.4, 0.5, 0.7, 0.999999])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_fused_dropout_gives_the_torch_path_s_bits_and_keeps_no_mask(p: float, dtype: torch.dtype,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The numba kernel (one pass each way) against the vectorised torch formulation: values and gradients equal
    bit for bit, signed zeros, infinities and NaN included; backward draws the mask again from the hashes, so
    autograd keeps nothing of ``[rows, F]`` (a saved bool mask would be 1 byte per element)."""
    torch.manual_seed(2)
    x = torch.randn(1500, 37, dtype=dtype)
    x[0, :4] = torch.tensor([float("inf"), -float("inf"), float("nan"), -0.0], dtype=dtype)
    ids = torch.cat([torch.randperm(10_000)[:1497], torch.tensor([0, 2**31 - 1, 2**40])])
    g = torch.randn_like(x)
    key = mix_key(3, 9, 1)
    results = []
    for fused in (False, True):
        monkeypatch.setattr(cpu_kernels, "MIN_ELEMENTS", 0 if fused else 1 << 62)
        xr = x.clone().requires_grad_(True)
        out = keyed_dropout(xr, p, key, ids)
        if fused:
            saved = [t for t in out.grad_fn.saved_tensors] if hasattr(out.grad_fn, "saved_tensors") else []
            assert all(t.numel() < x.numel() for t in saved), "a [rows, F] tensor was saved for backward"
        out.backward(g)
        results.append((out.detach(), xr.grad, keyed_dropout(x, p, key, ids)))
    bits = torch.int32 if dtype == torch.float32 else torch.int64
    for a, b in zip(*results, strict=True):
        assert torch.equal(a.view(bits), b.view(bits))  # every bit: signed zeros and NaN too


def test_the_fused_dropout_runs_where_it_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU float tensors of at least ``MIN_ELEMENTS`` take the kernel (counted), smaller ones and other dtypes
    the torch path."""
    monkeypatch.setattr(cpu_kernels, "MIN_ELEMENTS", 60_000)
    calls = []
    real = cpu_kernels.hashed_scale
    monkeypatch.setattr(cpu_kernels, "hashed_scale", lambda *a: calls.append(a[0].shape) or real(*a))
    ids = torch.arange(300)
    keyed_dropout(torch.randn(300, 200), 0.5, 7, ids)  # 60,000 elements
    keyed_dropout(torch.randn(300, 199), 0.5, 7, ids)  # one row short of MIN_ELEMENTS
    keyed_dropout(torch.randn(300, 300).half(), 0.5, 7, ids)
    sim = rt.SimDevice(0, 1 << 22)
    with rt.on_device(sim):  # a sim device's tensor: its accesses are checked through torch, so not the kernel
        x_sim = rt.to_device(torch.randn(300, 200), sim)
        rt.synchronize(sim)
        keyed_dropout(x_sim, 0.5, 7, ids)
    expected = [(300, 200)] if cpu_kernels.available() else []
    assert calls == expected


@pytest.mark.skipif(not cpu_kernels.available(), reason="numba is not installed: the fused kernel cannot run")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_fused_row_add_gives_index_add_s_bits(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """``scatter_add_rows`` (the chunked engines' gradient accumulation into host rows) through the kernel equals
    ``index_add_`` bit for bit, repeated rows included (added in turn), and the kernel ran (counted)."""
    monkeypatch.setattr(cpu_kernels, "MIN_ELEMENTS", 0)
    calls = []
    real = cpu_kernels.add_rows
    monkeypatch.setattr(cpu_kernels, "add_rows", lambda *a: calls.append(a[1].numel()) or real(*a))
    torch.manual_seed(3)
    host = torch.randn(500, 9, dtype=dtype)
    rows = torch.cat([torch.randperm(500)[:300].sort().values, torch.tensor([7, 7, 499, 0])])
    src = torch.randn(rows.numel(), 9, dtype=dtype) * 1e3
    expected = host.clone().index_add_(0, rows, src)
    scatter_add_rows(host, rows, src)
    bits = torch.int32 if dtype == torch.float32 else torch.int64
    assert calls == [rows.numel()] and torch.equal(host.view(bits), expected.view(bits))


def test_the_fused_row_add_refuses_rows_outside_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """An id past the table (or negative) raises before anything is written, like ``index_add_``; no memory
    outside the table is touched."""
    monkeypatch.setattr(cpu_kernels, "MIN_ELEMENTS", 0)
    host = torch.zeros(10, 4)
    for bad in ([0, 10], [-1, 3]):
        with pytest.raises(IndexError):
            scatter_add_rows(host, torch.tensor(bad), torch.ones(2, 4))
        assert not host.any()


def test_without_numba_torch_s_ops_serve_with_the_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where numba cannot be imported nothing fails: dropout (values and gradient) and the row add take torch's
    ops and give what the kernels give."""
    monkeypatch.setattr(cpu_kernels, "MIN_ELEMENTS", 0)
    torch.manual_seed(5)
    x, ids, g = torch.randn(400, 30), torch.randperm(5000)[:400], torch.randn(400, 30)
    host, rows, src = torch.randn(600, 30), torch.randperm(600)[:400].sort().values, torch.randn(400, 30)
    results = []
    for absent in (False, True):
        if absent:
            monkeypatch.setattr(cpu_kernels, "_kernels", lambda: None)
            assert not cpu_kernels.available()
        xr = x.clone().requires_grad_(True)
        out = keyed_dropout(xr, 0.3, 11, ids)
        out.backward(g)
        h = host.clone()
        scatter_add_rows(h, rows, src)
        results.append((out.detach(), xr.grad, h))
    for a, b in zip(*results, strict=True):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))


@pytest.mark.parametrize("fused", [False, True])
def test_the_layer_input_s_vjp_is_autograd_s_bit_for_bit(fused: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """``GNN.layer_input_vjp`` (the offload engine's backward through the next layer's ReLU and dropout, without
    their forward) gives autograd's ``dL/dh`` in every bit, zeros, signed zeros, infinities and NaN in ``h``
    included, through either dropout path; ``None`` for an ELU model or one with a norm (autograd then runs)."""
    if fused and not cpu_kernels.available():
        pytest.skip("numba is not installed: the fused kernel cannot run")
    monkeypatch.setattr(cpu_kernels, "MIN_ELEMENTS", 0 if fused else 1 << 62)
    torch.manual_seed(6)
    model = build_model("gcn", 12, 24, 5, layers=3, dropout=0.4, heads=1, seed=0)
    h = torch.randn(700, 24)
    h[0, :5] = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan")])
    ids, grad = torch.randperm(5000)[:700], torch.randn(700, 24)
    for layer in (1, 2):
        hr = h.clone().requires_grad_(True)
        model.layer_input(layer, hr, ids, (3, 7)).backward(grad)
        got = model.layer_input_vjp(layer, h, ids, (3, 7), grad)
        assert got is not None and hr.grad is not None
        assert torch.equal(got.view(torch.int32), hr.grad.view(torch.int32)), layer
    gat = build_model("gat", 12, 24, 5, layers=2, dropout=0.4, heads=2, seed=0)
    assert gat.layer_input_vjp(1, h, ids, (3, 7), grad) is None
    normed = build_model("gcn", 12, 24, 5, layers=2, dropout=0.4, heads=1, seed=0, norm="layer")
    assert normed.layer_input_vjp(1, h, ids, (3, 7), grad) is None
