"""SplitBatchNorm (gnnscale/nn/batchnorm.py): BatchNorm over rows that arrive in chunks (statistics and
gradient-sums passes) or from several participants (a reducer), equal to one BatchNorm1d call on all the rows."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import Tensor, nn

from gnnscale.nn.batchnorm import SplitBatchNorm, kept_grads


def _reference(x: Tensor, dy: Tensor, seed: int = 0) -> tuple[nn.BatchNorm1d, Tensor, Tensor]:
    torch.manual_seed(seed)
    bn = nn.BatchNorm1d(x.shape[1])
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    xr = x.clone().requires_grad_(True)
    y = bn(xr)
    y.backward(dy)
    assert xr.grad is not None
    return bn, y.detach(), xr.grad


def _split(seed: int = 0) -> SplitBatchNorm:
    torch.manual_seed(seed)
    bn = SplitBatchNorm(5)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    return bn


def _data() -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(7)
    return torch.randn(40, 5, generator=g) * 3 + 2, torch.randn(40, 5, generator=g)


def test_plain_split_batchnorm_is_batchnorm1d() -> None:
    x, dy = _data()
    ref, y_ref, gx_ref = _reference(x, dy)
    bn = _split()
    assert set(bn.state_dict()) == set(ref.state_dict())
    xr = x.clone().requires_grad_(True)
    y = bn(xr)
    y.backward(dy)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(xr.grad, gx_ref)
    torch.testing.assert_close(bn.running_var, ref.running_var)


@pytest.mark.parametrize("parts", [[40], [7, 13, 20], [1, 39]])
def test_chunked_passes_equal_one_call(parts: list[int]) -> None:
    """Statistics pass, normalising pass, gradient-sums pass and backward pass over chunks give one call's output,
    input gradient, parameter gradients and running statistics; with the sums left out (a backward that only sees
    its own chunk) the gradient is wrong, so the test sees a missing pass."""
    x, dy = _data()
    ref, y_ref, gx_ref = _reference(x, dy)
    bn = _split()
    chunks = list(zip(x.split(parts), dy.split(parts), strict=True))
    bn.begin_stats()
    for xc, _ in chunks:
        assert torch.equal(bn(xc), xc)  # the statistics pass returns its input
    bn.end_stats()
    bn.begin_grad_sums()
    with kept_grads(bn):
        for xc, dc in chunks:
            bn(xc.clone().requires_grad_(True)).backward(dc)
    assert bn.weight.grad is None  # the sums pass moved no parameter
    bn.end_grad_sums()
    ys, gxs = [], []
    for xc, dc in chunks:
        xr = xc.clone().requires_grad_(True)
        y = bn(xr)
        y.backward(dc)
        ys.append(y.detach())
        gxs.append(xr.grad)
    torch.testing.assert_close(torch.cat(ys), y_ref)
    torch.testing.assert_close(torch.cat(gxs), gx_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(bn.weight.grad, ref.weight.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(bn.bias.grad, ref.bias.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(bn.running_mean, ref.running_mean)
    torch.testing.assert_close(bn.running_var, ref.running_var)
    assert int(bn.num_batches_tracked) == 1
    if len(parts) > 1 and min(parts) > 1:  # per-chunk BatchNorm (statistics of one chunk) is not the same function
        per_chunk = torch.cat([nn.functional.batch_norm(xc, None, None, bn.weight, bn.bias, True)
                               for xc, _ in chunks]).detach()
        assert not torch.allclose(per_chunk, y_ref, atol=1e-3)


def test_a_gradient_in_parts_adds_up() -> None:
    """A vertex whose gradient arrives in parts (two copies of its row, each weighted 1/2): the sums and the
    corrections are linear in dy, each copy taking its weight's share of the correction."""
    x, dy = _data()
    _, _, gx_ref = _reference(x, dy)
    bn = _split()
    bn.begin_stats()
    bn(x)
    bn.end_stats()
    halves = (dy * 0.25, dy * 0.75)
    bn.begin_grad_sums()
    for d in halves:
        bn(x.clone().requires_grad_(True)).backward(d)
    bn.end_grad_sums()
    total = torch.zeros_like(x)
    for d in halves:
        xr = x.clone().requires_grad_(True)
        bn.row_weight = torch.full((40,), 0.5)
        bn(xr).backward(d)
        assert xr.grad is not None
        total += xr.grad
    torch.testing.assert_close(total, gx_ref, rtol=1e-5, atol=1e-6)


def _thread_reducer(n: int) -> object:
    """A reducer for ``n`` threads: every thread's vector summed (a barrier per call), in a fixed order."""
    barrier, lock = threading.Barrier(n), threading.Lock()
    slots: dict[int, Tensor] = {}

    def reduce(v: Tensor) -> Tensor:
        me = threading.get_ident()
        with lock:
            slots[me] = v.clone()
        barrier.wait()
        out = sum(slots[k] for k in sorted(slots))
        barrier.wait()
        with lock:
            slots.pop(me, None)
        return out  # type: ignore[return-value]

    return reduce


def test_reducer_with_duplicate_rows_equals_one_call_on_distinct_rows() -> None:
    """Three participants hold overlapping rows (a vertex in two shares): with weights 1 / copies and a reducer,
    outputs are the one-call outputs and the input gradients, summed over each vertex's copies, equal its
    gradient in one call on the distinct rows."""
    x, dy = _data()
    ref, y_ref, gx_ref = _reference(x, dy)
    shares = [torch.arange(0, 18), torch.arange(12, 30), torch.cat([torch.arange(28, 40), torch.arange(0, 3)])]
    copies = torch.zeros(40)
    for s in shares:
        copies[s] += 1
    # the loss gradient of a vertex held twice arrives split between its copies
    dy_parts = [dy[s] / copies[s].unsqueeze(1) for s in shares]
    reducer = _thread_reducer(len(shares))
    replicas = [_split() for _ in shares]
    outs: list[tuple[Tensor, Tensor]] = [None] * len(shares)  # type: ignore[list-item]

    def run(i: int) -> None:
        bn = replicas[i]
        bn.reduce = reducer  # type: ignore[assignment]
        bn.row_weight = 1.0 / copies[shares[i]]
        xr = x[shares[i]].clone().requires_grad_(True)
        y = bn(xr)
        y.backward(dy_parts[i])
        assert xr.grad is not None
        outs[i] = (y.detach(), xr.grad)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(shares))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    gx = torch.zeros_like(x)
    for s, (y, g) in zip(shares, outs, strict=True):
        torch.testing.assert_close(y, y_ref[s])
        gx.index_add_(0, s, g)
    torch.testing.assert_close(gx, gx_ref, rtol=1e-5, atol=1e-6)
    wgrad = sum(bn.weight.grad for bn in replicas)
    torch.testing.assert_close(wgrad, ref.weight.grad, rtol=1e-5, atol=1e-6)
    for bn in replicas:
        torch.testing.assert_close(bn.running_var, ref.running_var)
