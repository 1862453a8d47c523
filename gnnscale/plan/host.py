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

What the budget bounds (issue #44): the process's peak resident memory (``VmHWM`` of ``/proc/self/status``: anonymous
memory and mapped file pages alike) is at most :class:`HostBase` plus the budget. The base is what no budget can
remove: the process as it stands once the graph is loaded (the interpreter, torch, the graph's memory-mapped
topology as validation read it: its features' pages are released after they are checked), the engine's own
topology index (its copies of the CSR, :attr:`~gnnscale.engines.core.base.Engine.host_topology_copies` of the graph's
CSR bytes) and :data:`RUNTIME_ALLOWANCE` for what training loads (compiled kernels, thread stacks). ``gnnscale
plan --host-memory`` prints it; each epoch record carries ``host_base_bytes`` and ``host_peak_bytes``.

A budget that cannot hold the fixed parts is refused with one :class:`~gnnscale.errors.ConfigError` line that names
each part and the least budget that would do.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gnnscale.errors import ConfigError
from gnnscale.runtime.host import proc_kib
from gnnscale.store.disk import BUFFER_BYTES
from gnnscale.units import format_bytes, format_bytes_up

__all__ = ["CPU_CHUNK_SHARE", "RUNTIME_ALLOWANCE", "VERTEX_ARRAY_BYTES", "HostBase", "HostPlan", "cpu_chunk_bytes",
           "host_base", "host_peak_bytes", "plan_host", "read_buffer_bytes", "sampled_batch_rows",
           "sampled_working_bytes"]

VERTEX_ARRAY_BYTES = 32
"""Host bytes a vertex costs in arrays every engine keeps (an int64 label, an order or map entry, a predicted class,
the masks, placement maps): a lower bound, so that a budget refused is surely too small."""


RUNTIME_ALLOWANCE = 168 << 20
"""Bytes training adds to the process that loaded the graph, whatever the budget: the code of torch's and
gnnscale's kernels paged in as training first runs them (shared-library file pages count in the resident set),
the JIT's compiled kernels, thread stacks and allocator arenas (measured on Linux, torch 2.13, one thread:
120-150 MiB, mostly library pages: benchmarks/HISTORY.md; the minibatch engine in a freshly installed
environment up to 162 MiB, 2026-11-28, which 160 MiB missed in 2 of 6 runs: 168 MiB)."""


@dataclass(frozen=True)
class HostBase:
    """What ``--host-memory`` does not bound (bytes): the budget bounds the process's peak (``VmHWM``) at
    :attr:`total` plus the budget."""

    loaded: int
    """The process's peak resident memory once the graph is loaded (``VmHWM``): interpreter, torch, the graph."""
    topology: int
    """The engine's topology index: its own copies of the graph's CSR (priced)."""
    runtime: int = RUNTIME_ALLOWANCE

    @property
    def total(self) -> int:
        return self.loaded + self.topology + self.runtime

    def describe(self, budget: int) -> str:
        return (f"host base {format_bytes(self.total)} (the loaded process {format_bytes(self.loaded)}, the topology "
                f"index {format_bytes(self.topology)}, kernels and library code {format_bytes(self.runtime)}): "
                f"--host-memory {format_bytes(budget)} bounds the peak resident memory at "
                f"{format_bytes(self.total + budget)}")


def host_peak_bytes() -> int | None:
    """The process's peak resident set (``VmHWM``: anonymous and file pages), bytes; ``None`` off Linux."""
    kib = proc_kib("/proc/self/status", "VmHWM")
    return None if kib is None else kib * 1024


def host_base(num_nodes: int, num_edges: int, copies: float, loaded: int | None = None) -> HostBase:
    """The base of a run whose engine keeps ``copies`` copies of the ``num_nodes``/``num_edges`` CSR (int64
    indptr and indices, a float32 weight); ``loaded``: the process's peak once the graph was loaded (default:
    measured now; take it before any planner runs)."""
    csr = 8 * (num_nodes + 1) + 12 * num_edges
    return HostBase(loaded=(host_peak_bytes() if loaded is None else loaded) or 0, topology=int(copies * csr))


CPU_CHUNK_SHARE = 4
"""On a CPU, host memory is offload's device too: the chunks are planned in ``--host-memory / CPU_CHUNK_SHARE``
(without ``--gpu-memory``), which the host plan holds as the chunk's working set."""


def cpu_chunk_bytes(budget: int) -> int:
    """The device budget of offload's chunks on a CPU under ``--host-memory budget`` (:data:`CPU_CHUNK_SHARE`)."""
    return budget // CPU_CHUNK_SHARE


def sampled_batch_rows(num_nodes: int, batch_size: int, fanouts: tuple[int, ...]) -> tuple[int, int]:
    """``(input rows, edges)`` of one sampled batch at most: ``batch_size * (1 + f1 + f1*f2 + ...)`` rows (``-1``:
    every vertex), capped at ``num_nodes``; an upper bound (hubs shared by the seeds' neighbourhoods make fewer)."""
    rows, hop, edges = batch_size, batch_size, 0
    for f in fanouts:
        hop = num_nodes if f < 0 else min(num_nodes, hop * f)
        edges += hop
        rows += hop
    return min(rows, num_nodes), edges


def sampled_working_bytes(num_nodes: int, row_bytes: int, batch_size: int, fanouts: tuple[int, ...],
                          hidden: int, in_flight: int, classes: int = 1) -> int:
    """Host bytes a sampled engine works in beyond its caches: ``in_flight`` batches at once (made, queued,
    trained; :func:`sampled_batch_rows`), each row gathered as float32 features (``row_bytes``) and its blocks'
    edges (ids and weights, 16 bytes each), a hidden activation and its gradient per layer for the batch in
    training; and layer-wise evaluation's two ``[N, max(hidden, classes)]`` float32 tables, whose steps take the
    batches' rows (:func:`~gnnscale.engines.sampled.eval.layerwise`'s ``max_rows``)."""
    rows, edges = sampled_batch_rows(num_nodes, batch_size, fanouts)
    batches = in_flight * (rows * row_bytes + 16 * edges) + rows * 8 * hidden * len(fanouts)
    return batches + 2 * 4 * num_nodes * max(hidden, classes)


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
