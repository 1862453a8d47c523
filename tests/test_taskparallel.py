"""The task-parallel engine (NeutronTask): exactness against the in-memory decoupled model, skip mode as the model
on the epoch's masked adjacency, the task-partition regimes, the pipeline's overlap and bounded queue,
recomputation, per-device memory counters, the scheduling model and bad input."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch

from gnnscale.cli import main
from gnnscale.config import ChunkOptions, TaskParallelOptions, TrainConfig
from gnnscale.engines import InMemoryEngine, TaskParallelEngine, select_engine
from gnnscale.errors import ConfigError
from gnnscale.graph.block import Block, normalized_csr
from gnnscale.graph.csr import csr_rows
from gnnscale.graph.generators import csbm
from gnnscale.nn import build_model
from gnnscale.nn.decoupled import DecoupledGNN
from gnnscale.plan.taskparallel import model_times, plan_taskparallel, replication_factor
from gnnscale.testing import only_cuda
from gnnscale.units import format_bytes

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def graph():  # type: ignore[no-untyped-def]
    return csbm(nodes=240, avg_degree=6, features=12, classes=4, seed=3)


def _model(g, cfg: TrainConfig) -> DecoupledGNN:  # type: ignore[no-untyped-def]
    m = build_model(cfg.model, g.num_features, cfg.hidden, g.num_classes, layers=cfg.layers, dropout=cfg.dropout,
                    heads=1, seed=cfg.seed)
    assert isinstance(m, DecoupledGNN)
    return m


def _config(kind: str, layers: int, devices: int | tuple[str, ...], **kw: object) -> TrainConfig:
    """``devices``: that many CPU devices, or the devices named."""
    names = ("cpu",) * devices if isinstance(devices, int) else devices
    base = dict(model=kind, layers=layers, hidden=16, dropout=0.5, engine="taskparallel", devices=names, subgraphs=3)
    base.update(kw)
    return TrainConfig(**base)  # type: ignore[arg-type]


def _grads(m: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in m.parameters()]


def _close(a: list[torch.Tensor], b: list[torch.Tensor], tol: float = 1e-4) -> bool:
    return all(torch.allclose(x, y, rtol=tol, atol=tol * 1e-2) for x, y in zip(a, b, strict=True))


def _compare(g, cfg: TrainConfig, epochs: int = 2, device: torch.device = CPU) -> TaskParallelEngine:  # type: ignore[no-untyped-def]
    ref = InMemoryEngine(g, _model(g, cfg).to(device), cfg, device)
    eng = TaskParallelEngine(g, _model(g, cfg).to(device), cfg, device)
    for e in range(1, epochs + 1):
        a, b = ref.train_epoch(e)["loss"], eng.train_epoch(e)["loss"]
        assert b == pytest.approx(a, rel=1e-5), f"epoch {e}: {b} != {a}"
        assert _close(_grads(eng.model), _grads(ref.model)), f"epoch {e}: gradients differ"
    assert eng.evaluate() == ref.evaluate()
    return eng


@pytest.mark.parametrize("devices", [1, 2, 3])
@pytest.mark.parametrize("layers", [2, 3])
@pytest.mark.parametrize("kind", ["dgcn", "dgat"])
def test_exact_mode_equals_the_in_memory_decoupled_model(graph, kind: str, layers: int, devices: int) -> None:  # type: ignore[no-untyped-def]
    _compare(graph, _config(kind, layers, devices))


@only_cuda
@pytest.mark.parametrize("dependency", ["exact", "skip"])
@pytest.mark.parametrize("kind", ["dgcn", "dgat"])
def test_on_cuda_matches_the_in_memory_model(kind: str, dependency: str) -> None:
    """The CUDA path: pinned features, device-to-device moves between the T and P devices, the device threads on
    streams. Exact mode equals the reference; skip mode runs and its peaks are the CUDA allocator's."""
    g = csbm(nodes=3000, avg_degree=8, features=32, classes=4, seed=1)
    cuda = torch.device("cuda")
    n = max(2, torch.cuda.device_count())
    names = tuple(f"cuda:{i % torch.cuda.device_count()}" for i in range(n))
    cfg = _config(kind, 2, names, dependency=dependency, subgraphs=4)
    if dependency == "exact":
        _compare(g, cfg, device=cuda)
    else:
        eng = TaskParallelEngine(g, _model(g, cfg).to(cuda), cfg, cuda)
        losses = [eng.train_epoch(e)["loss"] for e in (1, 2, 3)]
        assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]


def test_the_edge_task_changes_the_result(graph) -> None:  # type: ignore[no-untyped-def]
    """dgat's attention is really used: zeroing its scores (uniform weights) changes the loss."""
    cfg = _config("dgat", 2, 2)
    eng = TaskParallelEngine(graph, _model(graph, cfg), cfg, CPU)
    base = eng.evaluate()
    a = eng.train_epoch(1)["loss"]
    eng2 = TaskParallelEngine(graph, _model(graph, cfg), cfg, CPU)
    for r in eng2.runners:
        assert r.model.edge is not None
        with torch.no_grad():
            r.model.edge.att.zero_()
    assert eng2.train_epoch(1)["loss"] != pytest.approx(a, rel=1e-6)
    assert base is not None


def _masked_reference_loss(g, cfg: TrainConfig, sub: torch.Tensor) -> tuple[float, list[torch.Tensor]]:  # type: ignore[no-untyped-def]
    """The decoupled model on the adjacency without the edges ``u -> v`` whose ``sub[u] > sub[v]``."""
    m = _model(g, cfg)
    indptr, indices, weight = normalized_csr(g, m.adjacency)
    dst = csr_rows(indptr, indices.numel())
    keep = sub[indices] <= sub[dst]
    counts = torch.zeros(g.num_nodes, dtype=torch.int64).index_add_(0, dst[keep], torch.ones_like(dst[keep]))
    ptr = torch.zeros(g.num_nodes + 1, dtype=torch.int64)
    torch.cumsum(counts, 0, out=ptr[1:])
    block = Block(indptr=ptr, indices=indices[keep], num_src=g.num_nodes,
                  edge_weight=None if weight is None else weight[keep])
    out = m(block, g.x, (cfg.seed, 1))
    loss = torch.nn.functional.cross_entropy(out[g.train_mask], g.y[g.train_mask])
    loss.backward()
    return float(loss.detach()), _grads(m)


@pytest.mark.parametrize("kind", ["dgcn", "dgat"])
@pytest.mark.parametrize("devices", [1, 3])
def test_skip_mode_is_the_model_on_the_epochs_masked_adjacency(graph, kind: str, devices: int) -> None:  # type: ignore[no-untyped-def]
    """Algorithm 1: exactly the edges from subgraphs later in this epoch's shuffled order are skipped -- no more
    (rows of earlier subgraphs are reused), no fewer."""
    cfg = _config(kind, 2, devices, dependency="skip", subgraphs=4)
    eng = TaskParallelEngine(graph, _model(graph, cfg), cfg, CPU)
    sub = eng.subgraph_of_vertex(1)
    assert sub.unique().numel() == 4
    loss = eng.train_epoch(1)["loss"]
    ref_loss, ref_grads = _masked_reference_loss(graph, cfg, sub)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    assert _close(_grads(eng.model), ref_grads)
    exact = TaskParallelEngine(graph, _model(graph, cfg), _config(kind, 2, devices, subgraphs=4), CPU)
    assert exact.train_epoch(1)["loss"] != pytest.approx(loss, rel=1e-4)  # edges really were skipped


def test_skip_mode_reshuffles_subgraphs_every_epoch(graph) -> None:  # type: ignore[no-untyped-def]
    cfg = _config("dgcn", 2, 1, dependency="skip", subgraphs=4)
    eng = TaskParallelEngine(graph, _model(graph, cfg), cfg, CPU)
    orders = {tuple(eng.subgraph_of_vertex(e)[eng.ptr[:-1]].tolist()) for e in range(1, 6)}
    assert len(orders) > 1


def test_skip_with_one_subgraph_is_exact(graph) -> None:  # type: ignore[no-untyped-def]
    _compare(graph, _config("dgat", 2, 2, dependency="skip", subgraphs=1), epochs=1)


# ------------------------------------------------------------------------------------------------ regimes
def _stages(eng: TaskParallelEngine) -> list[tuple[str, str, list[int]]]:
    return [(s.kind, s.label(eng.dgat), s.devices) for s in (*eng.plan.t_stages, *eng.plan.p_stages)]


def test_one_device_hosts_every_task(graph) -> None:  # type: ignore[no-untyped-def]
    eng = _compare(graph, _config("dgat", 2, 1), epochs=1)
    assert eng.plan.regime == "one device"
    assert _stages(eng) == [("T", "g1+g2", [0]), ("P", "e+p1+p2", [0])]


def test_fewer_devices_than_tasks_group_same_type_tasks(graph) -> None:  # type: ignore[no-untyped-def]
    eng = _compare(graph, _config("dgcn", 3, 2), epochs=1)
    assert eng.plan.regime == "same-type tasks grouped"
    assert _stages(eng) == [("T", "g1+g2+g3", [0]), ("P", "p1+p2+p3", [1])]
    eng = _compare(graph, _config("dgat", 3, 3, t_devices=1), epochs=1)
    assert _stages(eng) == [("T", "g1+g2+g3", [0]), ("P", "e+p1", [1]), ("P", "p2+p3", [2])]
    stats = eng.train_epoch(2)
    assert stats["t2p_bytes"] > 0 and stats["p2p_bytes"] > 0  # H^0 went T -> P, H^1 P -> P


def test_as_many_devices_as_tasks_run_one_task_each(graph) -> None:  # type: ignore[no-untyped-def]
    eng = _compare(graph, _config("dgcn", 2, 4), epochs=1)
    assert eng.plan.regime == "one task per device"
    assert _stages(eng) == [("T", "g1", [0]), ("T", "g2", [1]), ("P", "p1", [2]), ("P", "p2", [3])]
    assert eng.train_epoch(2)["t2t_bytes"] > 0  # g1's output handed to g2's device


def test_more_devices_than_tasks_form_hybrid_groups(graph) -> None:  # type: ignore[no-untyped-def]
    cfg = _config("dgcn", 2, 8, subgraphs=3)
    eng = _compare(graph, cfg, epochs=1)
    assert eng.plan.regime.startswith("hybrid")
    assert _stages(eng) == [("T", "g1", [0, 1]), ("T", "g2", [2, 3]), ("P", "p1", [4, 5]), ("P", "p2", [6, 7])]
    assert eng.plan.chunks_per_subgraph % 2 == 0  # a multiple of the group size
    eng.tasks.trace = []
    eng.train_epoch(2)
    # data parallel inside a group: both members of p1's group propagate chunks, both of g1's run subgraphs
    p1 = {eng.tasks.p_runner(0, k).index for op, l, k in eng.tasks.trace if op == "PF" and l == 0}
    g1 = {eng.tasks.t_runner(eng.plan.t_stages[0], s).index for op, st, s in eng.tasks.trace if op == "TF" and st == 0}
    assert p1 == {4, 5} and g1 == {0, 1}


def test_p_group_members_fetch_only_the_rows_their_chunks_read(graph) -> None:  # type: ignore[no-untyped-def]
    """Inside a hybrid P group each member receives the union of its chunks' source rows, not whole source
    chunks: the T -> P bytes are data parallelism's replication over the members, as `partition` reports it."""
    from gnnscale.plan.taskparallel import p_group_parts

    cfg = _config("dgcn", 2, 8, subgraphs=3)
    eng = TaskParallelEngine(graph, _model(graph, cfg), cfg, CPU)
    for epoch in (1, 2):
        stats = eng.train_epoch(epoch)
        parts = p_group_parts(eng.plan, cfg.seed, epoch)
        owner = torch.tensor([eng.tasks.p_runner(0, int(torch.searchsorted(eng.ptr, v, right=True)) - 1).index
                              for v in range(graph.num_nodes)])
        assert torch.equal(owner - 4, parts)  # p1's group is devices 4 and 5
        rows = round(replication_factor(graph, parts) * graph.num_nodes)
        assert graph.num_nodes < rows < 2 * graph.num_nodes
        assert stats["t2p_bytes"] == rows * graph.num_classes * 4


def test_subgraphs_fewer_than_a_t_group_are_refused_and_the_default_feeds_every_t_device() -> None:
    g = csbm(nodes=400, avg_degree=4, features=4, seed=0)
    with pytest.raises(ConfigError, match="leaves T devices idle"):
        plan_taskparallel(g, _config("dgcn", 2, 16, subgraphs=2), CPU)
    plan = plan_taskparallel(g, _config("dgcn", 2, 16, subgraphs=None), CPU)
    assert plan.subgraphs >= 4 and all(len(s.devices) == 4 for s in plan.t_stages)


def test_hybrid_needs_equal_groups() -> None:
    g = csbm(nodes=100, avg_degree=4, features=4, seed=0)
    with pytest.raises(ConfigError, match="6 devices cannot host"):
        plan_taskparallel(g, _config("dgat", 2, 6), CPU)
    with pytest.raises(ConfigError, match="t-devices 3 leaves no device"):
        plan_taskparallel(g, _config("dgcn", 2, 3, t_devices=3), CPU)


def test_scheduling_model_splits_devices_by_eqs_7_8() -> None:
    g = csbm(nodes=200, avg_degree=4, features=8, seed=0)
    cfg = _config("dgcn", 3, 4)  # 4 < 6 placements: the model decides
    for t_s, p_s, n_p in ((1.0, 3.0, 3), (3.0, 1.0, 1), (1.0, 1.0, 2), (1.0, 100.0, 3)):
        plan = plan_taskparallel(g, cfg, CPU, times={"t_s": t_s, "p_s": p_s})
        assert (plan.n_p, plan.n_t) == (n_p, 4 - n_p)
    t = model_times(g, cfg, flops=1e9, bandwidth=1e9)
    wider = model_times(g, _config("dgcn", 3, 4, hidden=64), flops=1e9, bandwidth=1e9)
    assert wider["t_s"] > t["t_s"] and wider["p_s"] == t["p_s"]  # T tasks grow with width, P tasks with |E|


def test_rates_are_measured_once_and_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    from gnnscale.plan import throughput

    first = throughput.compute_rates(CPU)
    monkeypatch.setattr(throughput, "measure_compute", lambda d: pytest.fail("measured again"))
    assert throughput.compute_rates(CPU) == first


# ------------------------------------------------------------------------------------------------ pipeline
def test_skip_mode_overlaps_t_and_p_devices(graph) -> None:  # type: ignore[no-untyped-def]
    """The T device's last subgraph waits until the P device has started the first: a handshake that only a
    pipelined engine completes (exact mode cannot: its first P task waits for every T task)."""
    cfg = _config("dgcn", 2, 2, dependency="skip", subgraphs=4)
    eng = TaskParallelEngine(graph, _model(graph, cfg), cfg, CPU)
    started = threading.Event()
    met: list[bool] = []

    def t_hook(k: int, s: int) -> None:
        if s == 3:
            met.append(started.wait(timeout=30))

    eng.tasks.hooks = {"t_forward": t_hook, "p_forward": lambda s: started.set()}
    eng.train_epoch(1)
    assert met == [True]


def test_t_stages_run_at_most_the_queue_depth_ahead(graph) -> None:  # type: ignore[no-untyped-def]
    """Stage 1 stalls on subgraph 0 until stage 0 starts subgraph QUEUE_DEPTH, which the bounded queue between
    the stages forbids: the wait must run out (an unbounded queue lets stage 0 run ahead and meet it)."""
    from gnnscale.engines.taskparallel.engine import QUEUE_DEPTH

    cfg = _config("dgcn", 2, 3, t_devices=2, subgraphs=QUEUE_DEPTH + 2)
    eng = TaskParallelEngine(graph, _model(graph, cfg), cfg, CPU)
    ahead = threading.Event()
    met: list[bool] = []
    started: list[tuple[int, int]] = []

    def t_hook(k: int, s: int) -> None:
        started.append((k, s))
        if (k, s) == (0, QUEUE_DEPTH):
            ahead.set()
        if (k, s) == (1, 0):
            met.append(ahead.wait(timeout=0.5))

    eng.tasks.hooks = {"t_forward": t_hook}
    eng.train_epoch(1)
    assert met == [False]
    # and the stages still ran every subgraph, stage 0 no more than QUEUE_DEPTH ahead of stage 1 at any start
    assert sorted(started) == [(k, s) for k in range(2) for s in range(QUEUE_DEPTH + 2)]
    for i, (k, s) in enumerate(started):
        if k == 0 and s >= QUEUE_DEPTH:
            assert (1, s - QUEUE_DEPTH) in started[:i]


def _saved_at_backward(eng: TaskParallelEngine, keep_forward: bool = False) -> tuple[dict[int, set], list[bool]]:
    """Arrange that each T device records the keys of its ``saved`` tensors when its first backward-phase operation
    starts (a re-forward, or the last stage's backward), i.e. while the epoch runs, after its forward; and that
    every T backward records whether its input is there. ``keep_forward``: the T forward keeps its output under
    the same key, as an engine without recomputation would keep its activations."""
    first: dict[int, set] = {}
    found: list[bool] = []

    def wrap(name: str, hook) -> None:  # type: ignore[no-untyped-def]
        original = getattr(eng.tasks, name)

        def wrapped(k, s, *rest):  # type: ignore[no-untyped-def]
            return hook(original, k, s, *rest)

        setattr(eng.tasks, name, wrapped)

    def snapshot(original, k, s, *rest):  # type: ignore[no-untyped-def]
        r = eng.tasks.t_runner(eng.t_stages[k], s)
        first.setdefault(r.index, set(r.saved))
        return original(k, s, *rest)

    def backward(original, k, s, *rest):  # type: ignore[no-untyped-def]
        r = eng.tasks.t_runner(eng.t_stages[k], s)
        first.setdefault(r.index, set(r.saved))
        found.append((k, s) in r.saved)
        return original(k, s, *rest)

    def forward(original, k, s, *rest):  # type: ignore[no-untyped-def]
        out = original(k, s, *rest)
        eng.tasks.t_runner(eng.t_stages[k], s).saved[(k, s)] = out
        return out

    wrap("t_refwd", snapshot)
    wrap("t_backward", backward)
    if keep_forward:
        wrap("t_forward", forward)
    return first, found


def test_t_tasks_are_recomputed_not_stored(graph) -> None:  # type: ignore[no-untyped-def]
    """Each T stage runs its forward once, recomputes once (every stage but the last) and backpropagates once per
    subgraph; nothing of the forward survives it: when a T device starts its backward, it holds nothing of its
    forward -- the stages before the last nothing at all, the last only the input its backward just received --
    and each backward finds the input its recomputation kept. Observed while the epoch runs (the epoch clears
    every device's tensors when it ends), and shown to see a forward that keeps its activations."""
    cfg = _config("dgcn", 3, 4, t_devices=3, subgraphs=3)
    eng = TaskParallelEngine(graph, _model(graph, cfg), cfg, CPU)
    eng.tasks.trace = []
    first, found = _saved_at_backward(eng)
    eng.train_epoch(1)
    for op, want in (("TF", 3 * 3), ("TR", 2 * 3), ("TB", 3 * 3)):
        assert sum(1 for o, _, _ in eng.tasks.trace if o == op) == want
    last = 2  # the backward goes from the last subgraph of the epoch's order
    assert first == {0: set(), 1: set(), 2: {(2, last)}}
    assert found == [True] * (3 * 3)
    assert all(not r.saved and not r.cache for r in eng.runners)  # and the epoch released everything
    # the same observation of an engine whose T forward keeps its activations: every subgraph's, on every stage
    keeping = TaskParallelEngine(graph, _model(graph, cfg), cfg, CPU)
    first, _ = _saved_at_backward(keeping, keep_forward=True)
    keeping.train_epoch(1)
    assert first == {k: {(k, s) for s in range(3)} for k in range(3)}


def test_per_device_peaks_are_counted(graph) -> None:  # type: ignore[no-untyped-def]
    cfg = _config("dgcn", 2, 2)
    eng = TaskParallelEngine(graph, _model(graph, cfg), cfg, CPU)
    stats = eng.train_epoch(1)
    peaks = stats["device_peak_bytes"]
    assert len(peaks) == 2 and stats["peak_device_bytes"] == max(peaks)
    rows = graph.num_nodes * graph.num_classes * 4
    assert peaks[1] >= rows  # the P device caches every row of H^0 it propagates
    # the T device holds the subgraphs in flight, not the whole graph: more subgraphs, a lower peak
    more = TaskParallelEngine(graph, _model(graph, cfg), _config("dgcn", 2, 2, subgraphs=8), CPU)
    assert more.train_epoch(1)["device_peak_bytes"][0] < 0.75 * peaks[0]


def test_replication_factor_counts_remote_in_neighbours() -> None:
    from gnnscale.graph.graph import Graph

    # 0 -> 1, 1 -> 2, 2 -> 3, 0 -> 3 (src -> dst); parts {0,1} and {2,3}
    g = Graph.from_edge_index(torch.tensor([[0, 1, 2, 0], [1, 2, 3, 3]]), num_nodes=4)
    assert replication_factor(g, torch.tensor([0, 0, 1, 1])) == pytest.approx((4 + 2) / 4)  # 1 and 0 replicated
    assert replication_factor(g, torch.zeros(4, dtype=torch.int64)) == 1.0


# ------------------------------------------------------------------------------------------------ selection and CLI
def test_auto_picks_taskparallel_when_the_graph_does_not_fit_one_device(graph) -> None:  # type: ignore[no-untyped-def]
    cfg = TrainConfig(model="dgcn", hidden=16, memory_budget=200_000)
    cls, rejected = select_engine(graph, cfg, CPU)
    assert cls is TaskParallelEngine and "inmemory" in rejected
    cls, _ = select_engine(graph, TrainConfig(model="gcn", hidden=16, memory_budget=1 << 30), CPU)
    assert cls is not TaskParallelEngine


@pytest.mark.parametrize("extra, message", [
    (["--model", "dgat", "--devices", ",".join(["cpu"] * 6)], "cannot host"),
    (["--subgraphs", "100000"], "more than the"),
    (["--gpu-memory", "1KB"], "needs at least"),
    (["--dependency", "sometimes"], "invalid choice"),
])
def test_bad_input_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str],
                                         message: str) -> None:
    metrics = tmp_path / "m.jsonl"
    rc = main(["train", "--dataset", "csbm:nodes=300,avg_degree=4", "--model", "dgcn", "--engine", "taskparallel",
               "--epochs", "1", "--quiet", "--metrics", str(metrics), *extra])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1 and message in err
    assert list(tmp_path.iterdir()) == []


def test_cli_trains_and_reports_task_times(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    metrics = tmp_path / "m.jsonl"
    rc = main(["train", "--dataset", "csbm:nodes=300,avg_degree=4", "--model", "dgat", "--engine", "taskparallel",
               "--devices", "cpu,cpu", "--epochs", "2", "--quiet", "--metrics", str(metrics)])
    out = capsys.readouterr().out
    assert rc == 0 and "taskparallel plan" in out and "predicted by Eq. 5" in out
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert len(records[0]["device_peak_bytes"]) == 2 and records[0]["predicted_p_s"] > 0
    for r in records[:-1]:  # forward times are part of the busy times, which add recomputation and backward
        assert 0 < r["t_forward_s"] < r["t_busy_s"] and 0 < r["p_forward_s"] < r["p_busy_s"]
    assert records[-1]["summary"] and records[-1]["engine"] == "taskparallel"


def test_partition_command_prints_the_assignment(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["partition", "--engine", "taskparallel", "--dataset", "csbm:nodes=400,avg_degree=6",
               "--devices", ",".join(["cpu"] * 8), "--json"])
    st = json.loads(capsys.readouterr().out)
    assert rc == 0 and st["regime"].startswith("hybrid") and len(st["device_estimate_bytes"]) == 8
    assert st["p_group_size"] == 2 and 1.0 < st["p_group_replication"] < st["data_parallel_replication"]


def test_the_engine_declares_its_mode_options_and_estimate(graph) -> None:  # type: ignore[no-untyped-def]
    """Full-graph mode; it reads the chunk and task-parallel option groups; its estimate for `gnnscale plan` is
    the planner's T/P split, subgraphs and busiest device."""
    assert TaskParallelEngine.mode == "full" and TaskParallelEngine.options == (ChunkOptions, TaskParallelOptions)
    cfg = _config("dgcn", 2, 3, t_devices=1)
    plan = plan_taskparallel(graph, cfg, CPU)
    line = TaskParallelEngine.estimate(graph, cfg, CPU)
    assert line.startswith(f"{plan.n_t} T / {plan.n_p} P device(s)") and "\n" not in line
    assert f"{plan.subgraphs} subgraph(s)" in line and format_bytes(max(plan.estimate)) in line
