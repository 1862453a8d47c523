"""The leaner keyed dropout (issue #30 point 2) draws exactly the masks of the five-pass formulation it replaced
and gives the same values and gradients."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from gnnscale.nn import build_model
from gnnscale.nn.ops import _FIB32, _M31, _mix31, _mix31_int, keep_mask, keyed_dropout, mix_key


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
