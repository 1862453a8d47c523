"""Sparse aggregation and chunk-invariant dropout shared by every layer and engine."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

import gnnscale._compat  # noqa: F401  (silences torch's sparse-CSR beta warnings)
from gnnscale.graph.block import Block
from gnnscale.runtime import cpu_kernels


def sparse_mm(adj: Tensor, x: Tensor, out: Tensor | None = None) -> Tensor:
    """``adj @ x`` for a sparse CSR ``adj`` (never differentiated here). On the CPU, large products run
    :func:`gnnscale.runtime.cpu_kernels.csr_mm` (each row summed in order, its rows prefetched); the others are
    written straight into an uninitialised output (``addmm`` with ``beta=0``): bitwise the same product, without the
    zero fill and the full copy of the result that torch's ``@`` adds around its CSR kernel (two of its four
    passes over the output).

    With ``out`` (a contiguous ``[rows, F]`` tensor of ``x``'s dtype, sharing no memory with ``x``), the product
    is written there and ``out`` returned: an engine's host rows, where the result would be copied to."""
    if out is not None and (not out.is_contiguous() or adj.device.type != "cpu" or adj.dtype != x.dtype):
        return out.copy_(sparse_mm(adj, x))
    x = x if out is None else x.detach()  # out= takes no autograd
    if adj.device.type != "cpu" or adj.dtype != x.dtype:
        return adj @ x
    if cpu_kernels.csr_mm_applies(adj, x):  # the rows gathered ahead of their use (runtime.cpu_kernels)
        return cpu_kernels.csr_mm(adj, x, out)
    out = torch.empty(adj.shape[0], x.shape[1], dtype=x.dtype) if out is None else out
    return torch.addmm(out, adj, x, beta=0.0, out=out)


class _SpMM(torch.autograd.Function):
    """``out = A @ x`` with ``A`` sparse CSR; backward is ``A^T @ grad`` with a cached CSR transpose.

    No ``[num_edges, F]`` tensor is ever built, in forward or backward, on CPU or CUDA.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, adj: Tensor, adj_t: Tensor) -> Tensor:
        ctx.adj_t = adj_t
        return sparse_mm(adj, x)  # [num_dst, F]

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        return sparse_mm(ctx.adj_t, grad.contiguous()), None, None  # [num_src, F]


def linear_vjp(weight: Tensor, x: Tensor, grad: Tensor, input_grad: bool) -> Tensor | None:
    """Backward of ``x @ weight.t()`` (``F.linear`` without bias) with no forward product: ``grad.t() @ x`` is
    accumulated into ``weight.grad``, and ``grad @ weight`` returned when ``input_grad``. The products are the ones
    autograd computes for ``mm(x, weight.t())`` (its column-major branch for the weight), so the gradients are
    bitwise autograd's."""
    grad_w = grad.t().mm(x)  # [out, in]
    if weight.grad is None:
        weight.grad = grad_w
    else:
        weight.grad += grad_w
    return grad.mm(weight.detach()) if input_grad else None


def bias_vjp(bias: Tensor | None, grad: Tensor) -> None:
    """Backward of adding ``bias`` to every row: ``grad``'s column sums accumulated into ``bias.grad`` (autograd's
    ``sum(0)``); nothing for no bias."""
    if bias is None:
        return
    grad_b = grad.sum(0)
    if bias.grad is None:
        bias.grad = grad_b
    else:
        bias.grad += grad_b


def with_values(adj: Tensor, values: Tensor) -> Tensor:
    """The sparse CSR matrix with ``adj``'s structure (its index tensors shared, not copied) and ``values``."""
    return torch.sparse_csr_tensor(adj.crow_indices(), adj.col_indices(), values, adj.shape)


def transpose_order(block: Block) -> Tensor:
    """``[E]`` int64: the block's edges in the order of its transpose :meth:`Block.adj_t` (by source, then
    destination: a stable sort of the source rows), cached on the block. ``t_values[i] = values[order[i]]``."""
    if "t_order" not in block._cache:
        block._cache["t_order"] = torch.sort(block.indices, stable=True).indices
    return block._cache["t_order"]


def spmm(block: Block, x: Tensor, out: Tensor | None = None) -> Tensor:
    """Weighted sum of in-neighbour rows: ``out[v] = sum_u w_uv x[u]`` for each destination row ``v``; written
    into ``out`` when given (no autograd: see :func:`sparse_mm`)."""
    if not x.requires_grad or out is not None:
        return sparse_mm(block.adj(), x, out)
    return _SpMM.apply(x.contiguous(), block.adj(), block.adj_t())


def spmm_t(block: Block, grad: Tensor) -> Tensor:
    """Transposed product ``A^T @ grad``: each source row sums the gradients of the destinations it feeds."""
    return sparse_mm(block.adj_t(), grad.contiguous())  # [num_src, F]


def spmm_t_add(block: Block, grad: Tensor, out: Tensor, rows: Tensor) -> None:
    """``out[rows] += A^T @ grad`` (``rows``: ``[num_src]`` distinct int64 rows of ``out``, one per source row):
    on the CPU one fused pass (:func:`gnnscale.runtime.cpu_kernels.csr_mm_add`) with no ``[num_src, F]`` product
    in memory, else the product and ``index_add_``; the same bits either way."""
    adj_t, grad = block.adj_t(), grad.contiguous()
    if cpu_kernels.csr_mm_add_applies(adj_t, grad, out):
        cpu_kernels.csr_mm_add(adj_t, grad, out, rows)
        return
    out.index_add_(0, rows, sparse_mm(adj_t, grad))


def spmm_mean(block: Block, x: Tensor, out: Tensor | None = None) -> Tensor:
    """Mean of in-neighbour rows (zero for a destination without in-edges); written into ``out`` when given (no
    autograd)."""
    deg = block.in_degree().clamp(min=1).to(x.dtype).unsqueeze(-1)  # [num_dst, 1]
    if out is not None:
        return spmm(block, x, out).div_(deg)
    return spmm(block, x) / deg


# --------------------------------------------------------------------------------------------- keyed dropout
# Dropout masks are a pure function of (key, global vertex id, feature index), so an engine that processes the
# graph chunk by chunk, or recomputes a layer in backward, draws exactly the mask the in-memory engine draws.
_M31 = cpu_kernels.M31
_FIB32 = cpu_kernels.FIB32  # 0x9E3779B9 as a signed int32 (golden-ratio multiplier)
_INT32_MIN = -(1 << 31)
_C = cpu_kernels.MIX  # < 2^27: a product with a 31-bit value stays below 2^58, no int64 overflow anywhere


def _mix31(h: Tensor) -> Tensor:
    """A 31-bit integer hash (two multiply-xorshift rounds) on int64 tensors holding values in [0, 2^31)."""
    h = (((h >> 16) ^ h) * _C) & _M31
    h = (((h >> 16) ^ h) * _C) & _M31
    return (h >> 16) ^ h


def _mix31_int(h: int) -> int:
    """:func:`_mix31` on a Python int in ``[0, 2^31)``: the same hash with no tensor (no device round trip)."""
    h = (((h >> 16) ^ h) * _C) & _M31
    h = (((h >> 16) ^ h) * _C) & _M31
    return (h >> 16) ^ h


def mix_key(*parts: int) -> int:
    """Fold integers (seed, epoch, layer, ...) into one 31-bit dropout key (plain Python: no tensor, no sync)."""
    h = 0x2545F491
    for p in parts:
        h = _mix31_int(h ^ (int(p) & _M31))
    return h


def _column_key(key: int) -> int:
    """What the column hashes mix with (``key`` mixed again on the host)."""
    return _mix31_int(key ^ 0x5BD1E995)


def _threshold(p: float) -> int:
    """What the mixed hashes are compared with (see :func:`keep_mask`); ``>= 2^31`` keeps nothing (``p == 1``)."""
    return 2 * int(p * (1 << 31)) - (1 << 31)


def _hashes(row_ids: Tensor, num_features: int, key: int) -> tuple[Tensor, Tensor]:
    """The mask's ``[rows]`` and ``[F]`` int32 factors (the fused kernel makes the same,
    :func:`gnnscale.runtime.cpu_kernels.hashed_scale`)."""
    r = row_ids.long()
    hr = _mix31(((r ^ (r >> 31)) & _M31) ^ key)  # [rows]
    cols = torch.arange(num_features, device=row_ids.device, dtype=torch.int64)
    hc = _mix31((cols * cpu_kernels.COLUMN) & _M31 ^ _column_key(key))  # [F]
    # Per element: XOR of the fully mixed row and column hashes, then multiplicative (Fibonacci) hashing in
    # int32, keeping the top 31 bits u = (x * FIB mod 2^32) >> 1, and keep when u >= T = floor(p 2^31). int32
    # multiplication wraps modulo 2^32 on CPU and CUDA alike. Three passes over [rows, F] instead of five: with
    # U the unsigned product, u >= T is U >= 2T, i.e. (U - 2^31) >= 2T - 2^31 as signed int32, and subtracting
    # 2^31 (flipping the top bit) commutes into the odd multiplier's operand: (x ^ 2^31) * FIB = x * FIB ^ 2^31
    # (mod 2^32). So the column hashes take the top bit and the product is compared directly.
    return hr.to(torch.int32), hc.to(torch.int32) ^ _INT32_MIN


def keep_mask(row_ids: Tensor, num_features: int, p: float, key: int) -> Tensor:
    """``[rows, F]`` bool mask, true with probability ``1 - p``, identical for a vertex wherever it appears."""
    threshold = _threshold(p)
    if threshold >= 1 << 31:  # p == 1: nothing kept
        return torch.zeros(row_ids.numel(), num_features, dtype=torch.bool, device=row_ids.device)
    hr, hc = _hashes(row_ids, num_features, key)
    u = hr.unsqueeze(1) ^ hc.unsqueeze(0)  # [rows, F]
    u *= _FIB32
    return u >= threshold


class _HashedDropout(torch.autograd.Function):
    """Keyed dropout in one fused CPU pass each way (:func:`gnnscale.runtime.cpu_kernels.hashed_scale`): backward
    draws the mask again from the ``[rows]`` ids it saved, so no ``[rows, F]`` mask is kept."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, ids: Tensor, key: int, p: float) -> Tensor:
        ctx.save_for_backward(ids)
        ctx.key, ctx.p = key, p
        return cpu_kernels.hashed_scale(x, ids, key, _column_key(key), _threshold(p), p)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        (ids,) = ctx.saved_tensors
        key, p = ctx.key, ctx.p
        return cpu_kernels.hashed_scale(grad, ids, key, _column_key(key), _threshold(p), p), None, None, None


class _MaskedScale(torch.autograd.Function):
    """``x * mask / (1 - p)`` with a bool ``mask``, in both directions: the mask is made a float tensor and
    multiplied in place, one vectorised pass each (``torch.where(mask, x, 0)`` takes a bool-indexed kernel several
    times slower on the CPU). Saves only the bool mask for backward."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, mask: Tensor, p: float) -> Tensor:
        ctx.save_for_backward(mask)
        ctx.p = p
        return _masked_scale(x, mask, p)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        (mask,) = ctx.saved_tensors
        return _masked_scale(grad, mask, ctx.p), None, None


def _masked_scale(x: Tensor, mask: Tensor, p: float) -> Tensor:
    # x * 1.0 / (1 - p) is bitwise x / (1 - p), what the reference divides by; a dropped element is x * 0.0
    # (+-0, NaN for an infinite x: torch's own dropout multiplies alike)
    # the bool mask read as bytes: torch's uint8 -> float conversion is vectorised, its bool one is not (2.2x)
    return mask.view(torch.uint8).to(x.dtype).mul_(x).div_(1.0 - p)


def keyed_dropout(x: Tensor, p: float, key: int | None, row_ids: Tensor, out: Tensor | None = None) -> Tensor:
    """Inverted dropout whose mask depends only on ``key`` and the rows' global vertex ids.

    Args:
        x: ``[rows, F]`` representations.
        p: drop probability; ``key=None`` or ``p=0`` returns ``x`` unchanged (evaluation).
        key: from :func:`mix_key` (seed, epoch, layer).
        row_ids: ``[rows]`` global vertex id of each row.
        out: where to write the result (an engine's host rows; then ``out`` is returned, with no autograd): in
            the fused kernel's one pass where it runs, else copied there.
    """
    if key is None or p <= 0.0:
        return x if out is None else out.copy_(x)
    if p < 1.0 and cpu_kernels.dropout_applies(x):  # one fused pass each way, no mask kept
        if not x.requires_grad or out is not None:
            return cpu_kernels.hashed_scale(x, row_ids, key, _column_key(key), _threshold(p), p, out)
        return _HashedDropout.apply(x, row_ids, key, p)  # type: ignore[no-any-return]
    mask = keep_mask(row_ids, x.shape[1], p, key)
    if out is not None:
        return out.copy_(_masked_scale(x.detach(), mask, p))
    if not x.requires_grad:
        return _masked_scale(x, mask, p)
    return _MaskedScale.apply(x, mask, p)
