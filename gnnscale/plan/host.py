"""The host-memory planner: how a ``--host-memory`` budget is split between what a run must keep in RAM, the disk
tier's read buffer, the host row cache and the host activation buffers, and what spills to ``--scratch`` files.

The budget covers what the run allocates beyond the process's own baseline (the interpreter and torch, about
0.2-0.3 GiB of anonymous memory that no budget can remove) and beyond the graph's memory-mapped arrays (the
topology and features of a converted directory are file pages: the kernel's page cache, not the process's anonymous
memory). What the plan prices, per part:

- ``model``: parameters, gradients and Adam's two moments (4 float32 copies);
- ``vertex arrays``: the per-vertex arrays the engine keeps in RAM (labels, masks, orders, predictions, placement
  maps): :data:`VERTEX_ARRAY_BYTES` bytes a vertex for every engine;
- ``read buffer``: the disk tier's reusable buffer (:func:`read_buffer_bytes`), one per reader;
- ``working set``: what one batch or chunk holds in host memory while it is made, when the caller prices it (the
  engines do not yet: a batch's gathered rows and, on a CPU, offload's chunk are outside the budget, as the README
  says);
- then, from what is left: the sampled engines' host cache of hot rows (:attr:`HostPlan.cache_bytes`), or the
  full-graph engines' activation buffers, those that fit in RAM (:attr:`HostPlan.ram_activation_bytes`) and the rest
  spilled to files (:attr:`HostPlan.spill_bytes`).

A budget that cannot hold the fixed parts is refused with one :class:`~gnnscale.errors.ConfigError` line that names
each part and the least budget that would do.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gnnscale.errors import ConfigError
from gnnscale.store.disk import BUFFER_BYTES
from gnnscale.units import format_bytes, format_bytes_up

__all__ = ["VERTEX_ARRAY_BYTES", "HostPlan", "plan_host", "read_buffer_bytes"]

VERTEX_ARRAY_BYTES = 32
"""Host bytes a vertex costs in arrays every engine keeps (an int64 label, an order or map entry, a predicted class,
the masks, placement maps): a lower bound, so that a budget refused is surely too small."""


@dataclass(frozen=True)
class HostPlan:
    """How a ``--host-memory`` budget is spent (bytes); :func:`plan_host` makes it."""

    budget: int
    fixed: dict[str, int] = field(default_factory=dict)
    """What the run must keep in RAM, by part (model, vertex arrays, read buffer, working set)."""
    buffer_bytes: int = 0
    """The disk tier's read buffer (each reader's; :attr:`readers` of them are in :attr:`fixed`)."""
    readers: int = 1
    cache_bytes: int = 0
    """The host cache of hot feature rows (sampled engines): what the budget has left after the fixed parts."""
    activation_bytes: int = 0
    """Every host activation buffer the engine needs (full-graph engines)."""
    ram_activation_bytes: int = 0
    """Of :attr:`activation_bytes`, the buffers kept in RAM."""

    @property
    def fixed_bytes(self) -> int:
        return sum(self.fixed.values())

    @property
    def spill_bytes(self) -> int:
        """Activation bytes past the budget: spilled to ``--scratch`` files."""
        return self.activation_bytes - self.ram_activation_bytes

    @property
    def free_bytes(self) -> int:
        """What the budget has left after the fixed parts, the host cache and the activations kept in RAM."""
        return self.budget - self.fixed_bytes - self.cache_bytes - self.ram_activation_bytes

    @property
    def spills(self) -> bool:
        return self.spill_bytes > 0

    def describe(self) -> str:
        """One line for ``gnnscale plan`` and the run's summary."""
        fixed = ", ".join(f"{k} {format_bytes(v)}" for k, v in self.fixed.items())
        line = f"host memory {format_bytes(self.budget)}: fixed {format_bytes(self.fixed_bytes)} ({fixed})"
        if self.cache_bytes:
            line += f", host cache {format_bytes(self.cache_bytes)}"
        if self.activation_bytes:
            line += f", activations {format_bytes(self.ram_activation_bytes)} in RAM"
            if self.spills:
                line += f" and {format_bytes(self.spill_bytes)} spilled to --scratch files"
        return line

    def summary(self) -> dict[str, int]:
        """The plan's figures for the run's metrics (``host_*`` keys, bytes)."""
        return {"host_budget_bytes": self.budget, "host_fixed_estimate_bytes": self.fixed_bytes,
                "host_cache_plan_bytes": self.cache_bytes, "host_activation_ram_plan_bytes": self.ram_activation_bytes,
                "host_spill_plan_bytes": self.spill_bytes}


def read_buffer_bytes(budget: int, row_bytes: int) -> int:
    """The disk tier's read buffer for ``budget``: an eighth of it, at most :data:`~gnnscale.store.disk.BUFFER_BYTES`
    and at least one row."""
    return max(row_bytes, min(BUFFER_BYTES, budget // 8))


def least_budget(other: int, readers: int, row_bytes: int) -> int:
    """The least budget that holds ``other`` fixed bytes and ``readers`` read buffers of the size *that* budget
    gives (:func:`read_buffer_bytes` grows with the budget: the need at a refused budget is not enough)."""

    def need(b: int) -> int:
        return other + readers * read_buffer_bytes(b, row_bytes)

    candidates = [other + readers * row_bytes, other + readers * max(row_bytes, BUFFER_BYTES)]
    if readers < 8:  # where the buffer is an eighth of the budget: b >= other + readers * b / 8
        candidates.append(-(-8 * other // (8 - readers)))
    return min(b for b in candidates if need(b) <= b)


def plan_host(budget: int, *, num_nodes: int, parameters: int, row_bytes: int, readers: int = 1,
              working_bytes: int = 0, activation_bytes: int = 0, cache: bool = False) -> HostPlan:
    """Split ``budget`` (``--host-memory``, bytes) for one run.

    Args:
        budget: the host memory the run may use beyond the process's baseline and the memory-mapped graph.
        num_nodes: vertices (priced at :data:`VERTEX_ARRAY_BYTES` each).
        parameters: the model's parameter count (4 float32 copies: weights, gradients, Adam's two moments).
        row_bytes: bytes of one stored feature row (the read buffer holds at least one).
        readers: disk readers, each with its own read buffer (offload and taskparallel: one per worker).
        working_bytes: host bytes of one batch or chunk while it is made (its gathered rows).
        activation_bytes: the full-graph engines' host activation buffers; those past the budget spill.
        cache: whether what is left goes to a host row cache (sampled engines).

    Raises:
        ConfigError: the budget cannot hold the fixed parts (one line naming each part and the least budget).
    """
    buffer = read_buffer_bytes(budget, row_bytes)
    fixed = {"model": 16 * parameters, "vertex arrays": VERTEX_ARRAY_BYTES * num_nodes,
             "read buffer": readers * buffer}
    if working_bytes:
        fixed["working set"] = working_bytes
    need = sum(fixed.values())
    if need > budget:
        parts = ", ".join(f"{k} {format_bytes(v)}" for k, v in fixed.items())
        least = least_budget(need - fixed["read buffer"], readers, row_bytes)
        raise ConfigError(f"--host-memory {format_bytes(budget)} cannot hold what the run keeps in host memory "
                          f"({parts}): give at least {format_bytes_up(least)}")
    left = budget - need
    ram = min(activation_bytes, left)
    cache_bytes = left - ram if cache else 0
    return HostPlan(budget=budget, fixed=fixed, buffer_bytes=buffer, readers=readers, cache_bytes=cache_bytes,
                    activation_bytes=activation_bytes, ram_activation_bytes=ram)
