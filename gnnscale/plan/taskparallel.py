"""Planner of the task-parallel engine (NeutronTask §4-5): which devices run which tasks, how the graph is cut
into chunks and subgraphs, and what each device holds.

**Tasks** of an ``L``-layer decoupled model: ``L`` vertex T tasks ``g1..gL`` and ``L`` P tasks ``p1..pL``; dgat's
edge T task ``e`` runs beside ``p1`` (it scores the edges of the rows ``p1`` caches, and its weights stay there).
So there are ``2L`` placements. With ``N`` devices (§4.1):

* ``N = 1``: every task on the one device;
* ``N < 2L``: same-type tasks grouped: ``N_t`` devices run the T tasks (contiguous runs, a pipeline) and ``N_p``
  the P tasks, ``N_p`` from the scheduling model (Eqs. 5-8) unless ``--t-devices`` gives ``N_t``;
* ``N = 2L``: one task per device;
* ``N > 2L``: hybrid parallelism (§4.3): ``N / 2L`` devices per task (``N`` must be a multiple of ``2L``), data
  parallel inside a group: T groups split subgraphs, P groups split every subgraph's chunks (so the chunk count
  per subgraph is a multiple of the group size). Neighbour rows are replicated only inside P groups.

**Chunks and subgraphs** (§4.2): the vertex ids are cut into ``M = S * k`` contiguous, edge-balanced chunks; every
epoch they are shuffled and every ``k`` make a subgraph. The planner picks the fewest subgraphs (at least two, so
the pipeline has something to overlap) whose per-device footprint fits ``--gpu-memory``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from gnnscale import runtime as rt
from gnnscale.errors import ConfigError
from gnnscale.graph.graph import Graph
from gnnscale.nn.ops import mix_key
from gnnscale.plan import throughput
from gnnscale.plan.memory import available_device_bytes
from gnnscale.units import format_bytes, format_bytes_up

if TYPE_CHECKING:
    from gnnscale.config import TrainConfig

SAFETY = 1.25
DEPENDENCY_MODES = ("exact", "skip")
GAMMA = 0.5
"""Eq. 6's overlap of computation and memory traffic in P tasks (empirical, as the paper says)."""


@dataclass
class Stage:
    """A run of same-type tasks on one device, or one task on a data-parallel group of devices."""

    kind: str
    """``"T"`` or ``"P"``."""
    start: int
    stop: int
    """Tasks ``start .. stop - 1`` of that type (layer indices)."""
    devices: list[int]
    """Indices into the device list; more than one: a hybrid-parallel group."""

    def label(self, dgat: bool) -> str:
        names = [f"{'g' if self.kind == 'T' else 'p'}{l + 1}" for l in range(self.start, self.stop)]
        if dgat and self.kind == "P" and self.start == 0:
            names.insert(0, "e")
        return "+".join(names)


@dataclass
class TaskPlan:
    """The assignment, the chunk split and the per-device estimates."""

    devices: list[str]
    regime: str
    t_stages: list[Stage]
    p_stages: list[Stage]
    n_t: int
    n_p: int
    subgraphs: int
    chunks_per_subgraph: int
    chunk_ptr: torch.Tensor
    """``[M + 1]`` vertex-id offsets of the chunks (contiguous, edge-balanced)."""
    estimate: list[int]
    """Modelled peak bytes per device."""
    budget: int
    predicted: dict[str, float] = field(default_factory=dict)
    """Eq. 5-6 seconds per epoch of the T and P tasks (``t_s``, ``p_s``) and the rates they used."""
    searched: dict[int, int] = field(default_factory=dict)
    """Subgraph counts tried -> the largest per-device estimate."""

    @property
    def num_chunks(self) -> int:
        return self.chunk_ptr.numel() - 1

    def describe(self, dgat: bool) -> str:
        stages = ", ".join(f"{s.label(dgat)} on {'/'.join(self.devices[d] + f'#{d}' for d in s.devices)}"
                           for s in (*self.t_stages, *self.p_stages))
        peak = max(self.estimate)
        return (f"taskparallel plan: {self.regime}, N_t={self.n_t} N_p={self.n_p}: {stages}; {self.subgraphs} "
                f"subgraph(s) x {self.chunks_per_subgraph} chunk(s); estimated peak {format_bytes(peak)} per device "
                f"of a {format_bytes(self.budget)} budget ({100 * peak / max(self.budget, 1):.0f}%)")


def placements(layers: int) -> int:
    """Device placements of an ``L``-layer decoupled model: ``L`` T tasks and ``L`` P tasks (dgat's edge task
    shares ``p1``'s)."""
    return 2 * layers


def _side(kind: str, devices: list[int], tasks: int) -> list[Stage]:
    """``tasks`` tasks of one type over ``devices``: contiguous runs (fewer devices than tasks, or as many), or
    equal groups (more devices)."""
    n = len(devices)
    if n <= tasks:
        return [Stage(kind, r * tasks // n, (r + 1) * tasks // n, [devices[r]]) for r in range(n)]
    g = n // tasks
    return [Stage(kind, l, l + 1, devices[l * g : (l + 1) * g]) for l in range(tasks)]


def model_times(graph: Graph, config: TrainConfig, flops: float, bandwidth: float) -> dict[str, float]:
    """Eqs. 5-6: modelled seconds of one epoch's T tasks and P tasks (forward) on one device."""
    assert graph.num_classes is not None
    V, E = graph.num_nodes, graph.num_edges + graph.num_nodes
    dims = [graph.num_features] + [config.hidden] * (config.layers - 1) + [graph.num_classes]
    d_e = dims[-1]
    t = sum(2 * V * dims[l] * dims[l + 1] for l in range(config.layers))
    if config.model == "dgat":
        t += 2 * E * d_e * d_e
    avg = E / max(V, 1)
    p = 0.0
    for _ in range(config.layers):  # P tasks propagate g_θ's output (width d_e)
        p += GAMMA * 2 * V * avg * d_e / flops + (1 - GAMMA) * 4 * (V * avg * (1 + 2 * d_e) + V) / bandwidth
    return {"t_s": t / flops, "p_s": p, "flops": flops, "bandwidth": bandwidth}


def assign(num_devices: int, layers: int, config: TrainConfig, times: dict[str, float] | None) -> tuple[
        str, list[Stage], list[Stage], int, int]:
    """The regime, T and P stages and ``N_t, N_p`` for ``num_devices`` devices (see the module docstring)."""
    n, tasks = num_devices, placements(layers)
    t_dev = config.t_devices
    if n == 1:
        if t_dev not in (None, 1):
            raise ConfigError(f"--t-devices {t_dev} with one device: the T and P tasks share it")
        return "one device", [Stage("T", 0, layers, [0])], [Stage("P", 0, layers, [0])], 1, 1
    if n > tasks and n % tasks:
        ok = ", ".join(str(c) for c in (tasks, 2 * tasks, 3 * tasks))
        raise ConfigError(
            f"{config.model} with {layers} layers has {tasks} task placements ({layers} T, {layers} P"
            f"{', the edge task with p1' if config.model == 'dgat' else ''}); {n} devices cannot host them: hybrid "
            f"parallelism splits the devices into equal groups, one per task -- use {ok}, ... devices or fewer "
            f"than {tasks}")
    if t_dev is not None and not 1 <= t_dev <= n - 1:
        raise ConfigError(f"--t-devices {t_dev} leaves no device for the {'T' if t_dev < 1 else 'P'} tasks of "
                          f"{n} devices; give 1 .. {n - 1}")
    if n >= tasks and t_dev is None:
        n_t = n // 2
    elif t_dev is not None:
        n_t = t_dev
    else:
        assert times is not None
        n_p = round(n * times["p_s"] / max(times["p_s"] + times["t_s"], 1e-30))  # Eq. 7
        n_t = n - min(max(n_p, 1), n - 1)  # Eq. 8, each type keeps a device
    n_p = n - n_t
    for count, what in ((n_t, "T"), (n_p, "P")):
        if count > layers and count % layers:
            raise ConfigError(f"{count} devices for the {layers} {what} tasks cannot form equal groups; "
                              f"use a multiple of {layers} or at most {layers} (--t-devices)")
    t_stages = _side("T", list(range(n_t)), layers)
    p_stages = _side("P", list(range(n_t, n)), layers)
    if n == tasks and n_t == layers:
        regime = "one task per device"
    elif any(len(s.devices) > 1 for s in (*t_stages, *p_stages)):
        regime = "hybrid (data parallel inside task groups)"
    else:
        regime = "same-type tasks grouped"
    return regime, t_stages, p_stages, n_t, n_p


def _edge_balanced(graph: Graph, pieces: int) -> torch.Tensor:
    cost = graph.in_degree() + 1
    cum = torch.cumsum(cost, 0)
    total = int(cum[-1])
    targets = torch.arange(1, pieces, dtype=torch.int64) * total // pieces
    inner = torch.searchsorted(cum, targets, right=True) + 1
    ptr = torch.cat([torch.zeros(1, dtype=torch.int64), inner, torch.tensor([graph.num_nodes])])
    # strictly increasing: every chunk keeps at least one vertex
    ptr = torch.maximum(ptr, torch.arange(pieces + 1))
    ptr = torch.minimum(ptr, graph.num_nodes - pieces + torch.arange(pieces + 1))
    return ptr


def estimate_bytes(graph: Graph, config: TrainConfig, stages: tuple[list[Stage], list[Stage]], n_dev: int,
                   chunk_ptr: torch.Tensor, subgraphs: int) -> list[int]:
    """Modelled peak bytes per device.

    A T device holds its tasks' parameters (with gradients and Adam state on the first device) and, per subgraph in
    flight (two: the pipeline's depth), the widest input and output rows of its tasks, their gradients and the
    recomputation's saved tensors; with ``--norm``, each of its norms' rows, saved ``x̂`` and gradient, and with
    BatchNorm the last T device also holds the class-wide gradient of a subgraph between the gradient-sums pass and
    the real backward (the statistics and gradient sums themselves are a few vectors). A P device holds its
    chunks' blocks (with transposes), the cached input rows of its P tasks (one task at a time for dgcn; every
    task's input for dgat, whose edge gradients read them) and their output gradients, dgat's attention weights and
    their gradients (``[E]`` each), and one chunk's working set.
    """
    assert graph.num_classes is not None
    t_stages, p_stages = stages
    N, M = graph.num_nodes, chunk_ptr.numel() - 1
    C = graph.num_classes
    dims = [graph.num_features] + [config.hidden] * (config.layers - 1) + [C]
    sizes = (chunk_ptr[1:] - chunk_ptr[:-1])
    per_sub = int(sizes.max()) * max(M // subgraphs, 1)  # rows of the largest subgraph (bound)
    E = graph.num_edges + N
    indeg = graph.in_degree() + 1
    cum = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(indeg, 0)])
    chunk_edges = int((cum[chunk_ptr[1:]] - cum[chunk_ptr[:-1]]).max())
    params = 4 * sum(dims[l] * dims[l + 1] + dims[l + 1] for l in range(config.layers)) + 4 * 3 * C * C
    out = [0] * n_dev
    norms = 0 if config.norm == "none" else 1  # each hidden T layer's norm: its rows, x-hat and their gradient
    for s in t_stages:
        widest = max(dims[s.start : s.stop + 1])
        work = 2 * 4 * per_sub * (dims[s.start] + dims[s.stop]) * 3 + 4 * per_sub * widest * 4
        work += norms * 2 * 3 * 4 * per_sub * widest * max(s.stop - s.start, 1)  # two subgraphs in flight
        if config.norm == "batch" and s.stop == config.layers:
            # BatchNorm's gradient-sums pass holds dL/dH0 of a subgraph's rows until the real backward takes it
            work += 4 * per_sub * C
        for d in s.devices:
            out[d] = max(out[d], work)
    dgat = config.model == "dgat"
    for s in p_stages:
        g = len(s.devices)
        share_rows = min(N, math.ceil(N / g) * 2) if g > 1 else N  # own rows plus (bounded) replicated halo
        share_edges = math.ceil(E / g)
        topology = 4 * (2 * share_rows + 3 * share_edges) * (2 if not dgat else 1) + 8 * share_rows
        layers_held = (s.stop - s.start) if dgat else 1
        rows = 4 * share_rows * C * (2 * layers_held + 2)  # cached inputs, outputs and their gradients
        attention = 2 * 4 * share_edges if dgat else 0
        work = 4 * chunk_edges * (C * (4 if dgat else 1) + 4) + 4 * int(sizes.max()) * C * 6
        for d in s.devices:
            out[d] += topology + rows + attention + work
    return [int(SAFETY * b) + 4 * params for b in out]


def plan_taskparallel(graph: Graph, config: TrainConfig, device: rt.Device,
                      times: dict[str, float] | None = None) -> TaskPlan:
    """Assign tasks to devices and choose the subgraph count (see the module docstring).

    Raises:
        ConfigError: a device count or ``--t-devices`` that cannot host the tasks, ``--subgraphs`` larger than the
            vertex count, or a budget that does not hold one chunk per device (the message names the minimum).
    """
    devices = list(config.devices) if config.devices else [str(device)]
    n = len(devices)
    if times is None:  # Eqs. 5-6: they assign devices (1 < N < 2L, no --t-devices) and are reported after training
        times = measured_times(graph, config, [rt.resolve_device(d) for d in devices])
    regime, t_stages, p_stages, n_t, n_p = assign(n, config.layers, config, times)
    group = max(len(s.devices) for s in p_stages)
    t_group = max(len(s.devices) for s in t_stages)
    k = config.chunks if config.chunks is not None else group
    if k % group:
        raise ConfigError(f"--chunks {k} per subgraph must be a multiple of the P group size {group}")
    N = graph.num_nodes
    if config.subgraphs is not None and config.subgraphs * k > N:
        raise ConfigError(f"--subgraphs {config.subgraphs} x {k} chunk(s) is more than the {N} vertices of "
                          f"{graph.name}; use at most {max(N // k, 1)} subgraphs")
    budget = (config.memory_budget if config.memory_budget is not None
              else available_device_bytes(device))  # type: ignore[arg-type]  # any runtime device
    searched: dict[int, int] = {}

    def peak(s: int) -> tuple[int, list[int], torch.Tensor]:
        ptr = _edge_balanced(graph, s * k)
        est = estimate_bytes(graph, config, (t_stages, p_stages), n, ptr, s)
        searched[s] = max(est)
        return max(est), est, ptr

    if config.subgraphs is not None:
        s = config.subgraphs
        if s < t_group:
            raise ConfigError(f"--subgraphs {s} leaves T devices idle: each T task runs on a group of {t_group} "
                              f"devices that split the subgraphs; use at least {t_group}")
        best, est, ptr = peak(s)
        if best > budget:
            raise ConfigError(f"--subgraphs {s} needs about {format_bytes(best)} on the busiest device, more than "
                              f"the budget ({format_bytes(budget)}); leave --subgraphs out to let the planner "
                              "choose")
    else:
        limit = max(N // k, 1)
        s = min(max(2, t_group), limit)  # every T group member gets a subgraph
        best, est, ptr = peak(s)
        while best > budget and s < limit:
            s = min(2 * s, limit)
            best, est, ptr = peak(s)
        if best > budget:
            raise ConfigError(f"the taskparallel engine needs at least {format_bytes_up(best)} per device for "
                              f"{graph.name} ({config.model}, {config.layers} layers, {n} device(s), tried up to "
                              f"{s} subgraphs), more than the budget ({format_bytes(budget)})")
    plan = TaskPlan(devices, regime, t_stages, p_stages, n_t, n_p, s, k, ptr, est, budget,
                    predicted=times or {}, searched=searched)
    return plan


def measured_times(graph: Graph, config: TrainConfig, devices: list[rt.Device]) -> dict[str, float]:
    """Eqs. 5-6 with the FLOPS and memory bandwidth of ``devices[0]`` (measured once per machine, cached; a sim
    device's where its tensors are: the host's)."""
    flops, bandwidth = throughput.compute_rates(rt.torch_device(devices[0]))
    return model_times(graph, config, flops, bandwidth)


def epoch_subgraphs(num_chunks: int, k: int, seed: int, epoch: int) -> tuple[list[list[int]], list[int], list[int]]:
    """Algorithm 1's per-epoch regrouping: the chunks shuffled (seeded by ``seed`` and ``epoch``) and every ``k``
    made a subgraph. Returns the subgraphs' chunks, each chunk's subgraph and its slot in it."""
    gen = torch.Generator().manual_seed(mix_key(seed, epoch, 0x5EED))
    perm = torch.randperm(num_chunks, generator=gen).tolist()
    subs = [perm[s * k : (s + 1) * k] for s in range(num_chunks // k)]
    sub_of, slot = [0] * num_chunks, [0] * num_chunks
    for s, members in enumerate(subs):
        for r, c in enumerate(members):
            sub_of[c], slot[c] = s, r
    return subs, sub_of, slot


def p_group_parts(plan: TaskPlan, seed: int, epoch: int = 1) -> torch.Tensor:
    """``[N]`` the member of a P group (of the plan's largest) that propagates each vertex in ``epoch``: chunks go
    to members by their slot in their subgraph, as the engine assigns them."""
    group = max(len(s.devices) for s in plan.p_stages)
    _, _, slot = epoch_subgraphs(plan.num_chunks, plan.chunks_per_subgraph, seed, epoch)
    sizes = plan.chunk_ptr[1:] - plan.chunk_ptr[:-1]
    return torch.repeat_interleave(torch.tensor(slot, dtype=torch.int64) % group, sizes)


def replication_factor(graph: Graph, parts: torch.Tensor) -> float:
    """Data parallelism's neighbour replication factor: vertices each part holds (its own and its in-neighbours'
    rows), summed over parts, per vertex (NeutronTask Table 2's alpha; 1.0 for one part).

    Args:
        parts: ``[N]`` part of each vertex.
    """
    dst = torch.repeat_interleave(torch.arange(graph.num_nodes), graph.indptr[1:] - graph.indptr[:-1])
    src = graph.indices.long()
    m = int(parts.max()) + 1 if parts.numel() else 1
    cross = parts[src] != parts[dst]
    pairs = torch.unique(parts[dst[cross]] * graph.num_nodes + src[cross])  # (part, remote in-neighbour)
    return (graph.num_nodes + pairs.numel()) / max(graph.num_nodes, 1) if m > 0 else 1.0
