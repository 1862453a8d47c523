"""The layer contract: AGGREGATE over a block, then UPDATE (HongTu Eq. 1)."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn

from gnnscale.graph.block import AdjacencySpec, Block
from gnnscale.graph.graph import Graph


class BlockLayer(nn.Module):
    """A GNN layer written as ``update(aggregate(block, x_src), x_dst)``.

    Engines may call the two halves separately: a chunked engine aggregates one destination chunk at a time, and
    a layer whose aggregation has no trainable per-edge computation (``edge_compute = False``) can have its
    aggregate output cached instead of recomputed in backward (HongTu §4.2).
    """

    edge_compute: ClassVar[bool] = False
    """True when AGGREGATE has trainable per-edge computation (GAT): caching it costs ``O(|E|)``, so recompute."""
    adjacency: ClassVar[AdjacencySpec] = AdjacencySpec()
    """The normalised adjacency the layer aggregates over; engines build blocks from it."""
    update_uses_dst: ClassVar[bool] = True
    """False when UPDATE ignores ``x_dst`` (GCN, GAT, MLP): a caching engine then need not load those rows."""
    sparse_backward: ClassVar[bool] = False
    """True when backpropagating AGGREGATE multiplies by the transposed adjacency (:meth:`Block.adj_t`): chunked
    engines then build each block's transpose once on the host and move it with the block."""
    reads_by_product: ClassVar[bool] = False
    """True when a parameter-free AGGREGATE (and :meth:`propagate`) reads ``x_src`` only through products with the
    block's adjacency, never by row position: a block whose sources are rows of a larger table (its ``indices``
    the table's row ids) then serves with the table itself as ``x_src``, and a CPU engine reads rows in place."""

    has_update_vjp: ClassVar[bool] = False
    """True when :meth:`update_vjp` backpropagates UPDATE without its forward (a caching engine then need not
    recompute UPDATE in backward)."""
    output_bias: ClassVar[str | None] = None
    """The name of the bias added last to every output row (``"bias"``, ``"lin_l.bias"``, ...), ``None`` for none:
    under a BatchNorm that follows the layer its gradient is exactly zero (:meth:`biases_before_norm`)."""

    in_features: int
    out_features: int

    def biases_before_norm(self, followed_by_batch_norm: bool) -> list[nn.Parameter]:
        """The layer's biases whose every output row is shifted by them just before a training-mode BatchNorm: its
        :attr:`output_bias` when ``followed_by_batch_norm``, and any the layer normalises inside itself (GIN's
        MLP). A BatchNorm subtracts its rows' mean, so their true gradient is zero (:meth:`GNN.biases_before_norm
        <gnnscale.nn.stack.Stack.biases_before_norm>`)."""
        if not followed_by_batch_norm or self.output_bias is None:
            return []
        bias = dict(self.named_parameters()).get(self.output_bias)  # None: a layer built with bias=False
        return [] if bias is None else [bias]

    @property
    def aggregate_has_params(self) -> bool:
        """True when AGGREGATE itself uses parameters (projection before aggregation, attention)."""
        return self.edge_compute

    @property
    def cacheable(self) -> bool:
        """True when AGGREGATE is a parameter-free linear map of ``x_src``: its output can be cached in forward and
        only UPDATE recomputed in backward, with :meth:`aggregate_vjp` carrying gradients to the sources."""
        return not self.aggregate_has_params

    @property
    def projects_first(self) -> bool:
        """True when AGGREGATE is ``propagate(block, project(x_src))``: a per-vertex projection, then a
        parameter-free linear map. An engine can then project each vertex once, move the (narrower) projected rows
        and cache the propagation like a :attr:`cacheable` layer's."""
        return False

    def project(self, x: Tensor, out: Tensor | None = None) -> Tensor:
        """``[rows, F_in] -> [rows, F_agg]``: the per-vertex part of a :attr:`projects_first` AGGREGATE; with
        ``out`` (no autograd), written there and ``out`` returned (an engine's host rows)."""
        raise NotImplementedError

    def project_vjp(self, x: Tensor, grad: Tensor, input_grad: bool) -> Tensor | None:
        """Backpropagate ``grad`` (``dL/d project(x)``, ``[rows, F_agg]``) through :meth:`project`: its parameters'
        gradients are accumulated into their ``.grad``; returns ``dL/dx`` when ``input_grad`` (else ``None``).

        The default recomputes :meth:`project` under autograd; a linear projection overrides it with
        :func:`~gnnscale.nn.ops.linear_vjp`, which needs no forward product (an engine that projects chunk by chunk
        calls this once per chunk in backward).
        """
        with torch.enable_grad():
            x = x.detach().requires_grad_(input_grad)
            self.project(x).backward(grad)
        return x.grad if input_grad else None

    def propagate(self, block: Block, h: Tensor, out: Tensor | None = None) -> Tensor:
        """``[num_src, F] -> [num_dst, F]``: the parameter-free sparse part of AGGREGATE (``aggregate_vjp`` is its
        transpose); with ``out`` (no autograd), written there and ``out`` returned."""
        raise NotImplementedError

    def aggregate_vjp(self, block: Block, grad_agg: Tensor) -> Tensor:
        """``[num_dst, F_agg] -> [num_src, F_in]``: gradient of a cacheable AGGREGATE with respect to ``x_src``.

        The default differentiates :meth:`aggregate` at zero (exact for a linear map); layers override it with
        the transposed sparse product, which needs neither the source rows nor a forward pass.
        """
        x = torch.zeros(block.num_src, self.in_features, device=grad_agg.device, requires_grad=True)
        with torch.enable_grad():
            (grad,) = torch.autograd.grad(self.aggregate(block, x), x, grad_agg)
        return grad

    def aggregate_vjp_add(self, block: Block, grad_agg: Tensor, out: Tensor, rows: Tensor) -> None:
        """``out[rows] += aggregate_vjp(block, grad_agg)`` (``rows``: the source rows' distinct rows of ``out``).
        Layers whose :meth:`aggregate_vjp` is a transposed product override it with
        :func:`~gnnscale.nn.ops.spmm_t_add`, which adds each source row's sum as it is made."""
        out.index_add_(0, rows, self.aggregate_vjp(block, grad_agg))

    def update_vjp(self, agg: Tensor, x_dst: Tensor | None, grad: Tensor, agg_grad: bool,
                   dst_grad: bool) -> tuple[Tensor | None, Tensor | None] | None:
        """Backpropagate ``grad`` (``dL/d update(agg, x_dst)``) through UPDATE without its forward products: the
        parameters' gradients are accumulated into their ``.grad``; returns ``(dL/dagg if agg_grad, dL/dx_dst if
        dst_grad)``. ``None`` (the default): not written for this layer, and a caching engine recomputes UPDATE under
        autograd instead. A linear UPDATE writes it with :func:`~gnnscale.nn.ops.linear_vjp` (the products autograd
        computes, so the gradients are autograd's)."""
        del agg, x_dst, grad, agg_grad, dst_grad
        return None

    def workspace_bytes(self, num_src: int, num_dst: int, num_edges: int) -> int:
        """Upper bound of the bytes one forward + backward of this layer on a block holds at its peak, beyond its
        input rows: outputs, tensors saved for backward and their gradients (the planner sums these per chunk)."""
        f_in, f_out = self.in_features, self.out_features
        return 4 * (3 * num_src * max(f_in, f_out) + 4 * num_dst * (f_in + f_out))

    def aggregate(self, block: Block, x_src: Tensor) -> Tensor:
        """``[num_src, F_in] -> [num_dst, F_agg]``: combine each destination's in-neighbour rows."""
        raise NotImplementedError

    def update(self, agg: Tensor, x_dst: Tensor) -> Tensor:
        """``([num_dst, F_agg], [num_dst, F_in]) -> [num_dst, F_out]``: the per-vertex transformation."""
        raise NotImplementedError

    def forward(self, block: Block | Tensor, x_src: Tensor, edge_weight: Tensor | None = None) -> Tensor:
        """``layer(block, x_src)``, or PyG's ``layer(x, edge_index[, edge_weight])`` on the whole graph (its block
        built from ``edge_index`` with the layer's :attr:`adjacency` on each call, as PyG's uncached convs do)."""
        block, x_src = block_and_features(self, block, x_src, edge_weight)
        return self.update(self.aggregate(block, x_src), x_src[: block.num_dst])

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}"


def block_and_features(who: nn.Module, first: object, second: object, edge_weight: Tensor | None = None
                       ) -> tuple[Block, Tensor]:
    """``(block, x)`` from a layer's or a model's call: gnnscale's ``(block, x)``, or PyG's ``(x, edge_index)``
    (``[N, F]`` features, ``[2, E]`` integer edges ``(source, destination)``), whose block is the whole graph's with
    ``who.adjacency`` (self-loops, normalisation) and ``edge_weight`` where that adjacency is weighted (GCN, as
    PyG's ``GCNConv``). Anything else is a ``TypeError`` saying what to pass."""
    name = type(who).__name__
    if isinstance(first, Block) and isinstance(second, Tensor):
        if edge_weight is not None:
            raise TypeError(f"{name}: edge_weight goes with (x, edge_index); a Block carries its own weights")
        return first, second
    edges = isinstance(second, Tensor) and second.dim() == 2 and second.shape[0] == 2 and not (
        second.dtype.is_floating_point or second.dtype.is_complex or second.dtype == torch.bool)
    if isinstance(first, Tensor) and first.dim() == 2 and edges:
        assert isinstance(second, Tensor)
        adjacency: AdjacencySpec = who.adjacency  # type: ignore[assignment]
        if edge_weight is not None and not adjacency.weighted:
            raise TypeError(f"{name} takes no edge_weight: its aggregation is unweighted (as PyG's SAGEConv, "
                            "GATConv without edge_dim and GINConv); only GCN's is weighted")
        graph = Graph.from_edge_index(second.cpu(), num_nodes=int(first.shape[0]),
                                      edge_weight=None if edge_weight is None else edge_weight.cpu())
        return Block.from_graph(graph, adjacency).to(first.device), first
    def shown(t: object) -> str:
        return f"{t.dtype} tensor {list(t.shape)}" if isinstance(t, Tensor) else type(t).__name__
    raise TypeError(f"{name} takes (block, x): a gnnscale Block (Block.from_graph(graph, model.adjacency)) and the "
                    f"[num_src, F] features; or PyG's (x, edge_index): [N, F] features and [2, E] integer edges; "
                    f"got ({shown(first)}, {shown(second)})")
