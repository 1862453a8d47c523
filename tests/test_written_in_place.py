"""Results written where they land (issue #30, the offload engine on a CPU reading in place): the products,
projections, propagations and keyed dropout that take ``out=`` write it and return it, with the bits they give
without it, on the numba kernels' paths and on torch's."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from gnnscale.graph.block import Block
from gnnscale.nn import build_model
from gnnscale.nn.ops import keyed_dropout, mix_key, sparse_mm
from gnnscale.runtime import cpu_kernels


def _bits(t: Tensor) -> Tensor:
    return t.view(torch.int32)


def _kernels(monkeypatch: pytest.MonkeyPatch, on: bool) -> None:
    if on and not cpu_kernels.available():
        pytest.skip("numba is not installed: the fused kernels cannot run")
    monkeypatch.setattr(cpu_kernels, "MIN_ELEMENTS", 0 if on else 1 << 62)


def _block(num_dst: int, num_src: int) -> Block:
    g = torch.Generator().manual_seed(5)
    counts = torch.randint(0, 9, (num_dst,), generator=g)
    indptr = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
    cols = torch.randint(0, num_src, (int(indptr[-1]),), generator=g)
    return Block(indptr=indptr, indices=cols, num_src=num_src, edge_weight=torch.rand(cols.numel(), generator=g))


@pytest.mark.parametrize("kernels", [True, False])
def test_products_write_their_out(kernels: bool, one_thread: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """``sparse_mm(adj, x, out)`` returns ``out`` holding the product's bits (a row range of a host table); a
    non-contiguous ``out`` still receives them; the kernel refuses an ``out`` of the wrong shape."""
    _kernels(monkeypatch, kernels)
    block, x = _block(50, 80), torch.randn(80, 7)
    expected = sparse_mm(block.adj(), x)
    table = torch.full((200, 7), float("nan"))
    got = sparse_mm(block.adj(), x, table[100:150])
    assert got.data_ptr() == table[100].data_ptr()
    assert torch.equal(_bits(table[100:150]), _bits(expected)) and table[:100].isnan().all()
    wide = torch.zeros(50, 14)
    sparse_mm(block.adj(), x, wide[:, ::2])  # not contiguous: made, then copied there
    assert torch.equal(_bits(wide[:, ::2].contiguous()), _bits(expected)) and not wide[:, 1::2].any()
    if kernels:
        with pytest.raises(ValueError, match="cannot write"):
            cpu_kernels.csr_mm(block.adj(), x, torch.empty(49, 7))


@pytest.mark.parametrize("kernels", [True, False])
@pytest.mark.parametrize("p", [0.0, 0.5])
def test_keyed_dropout_writes_its_out(kernels: bool, p: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """``keyed_dropout(..., out=)``: the mask and values of the call without it, in ``out``, returned; int32
    ids (the chunks' dropout keys) draw the masks int64 ids draw."""
    _kernels(monkeypatch, kernels)
    x, ids, key = torch.randn(300, 33), torch.randperm(5000)[:300], mix_key(1, 2, 3)
    expected = keyed_dropout(x, p, key, ids)
    out = torch.empty(300, 33)
    assert keyed_dropout(x, p, key, ids, out) is out
    assert torch.equal(_bits(out), _bits(expected))
    assert torch.equal(_bits(keyed_dropout(x, p, key, ids.to(torch.int32))), _bits(expected))


@pytest.mark.parametrize("kernels", [True, False])
@pytest.mark.parametrize("model", ["gcn", "sage"])
def test_projections_and_propagations_write_their_out(model: str, kernels: bool, one_thread: None,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """GCN's and SAGE's ``project(x, out)`` and ``propagate(block, h, out)`` (what the offload engine stores per
    chunk) give the bits of the calls without ``out``, in ``out``."""
    _kernels(monkeypatch, kernels)
    layer = build_model(model, 24, 8, 5, layers=2, dropout=0.0, heads=1, seed=0).block_layers[0]
    assert layer.projects_first
    block, x = _block(50, 80), torch.randn(80, 24)
    with torch.no_grad():
        h = layer.project(x)
        out = torch.empty(80, 8)
        assert layer.project(x, out) is out and torch.equal(_bits(out), _bits(h))
        agg = layer.propagate(block, h)
        out = torch.empty(50, 8)
        assert layer.propagate(block, h, out) is out and torch.equal(_bits(out), _bits(agg))
