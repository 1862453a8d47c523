"""The hybrid engine's accelerator trainers on the runtime's sim device (an accelerator simulated on the CPU whose
asynchronous copies read as NaN until they are waited for, and which raises StreamOrderError when a stream
touches memory another stream may still use; docs/runtime.md).

With DRM off, every run trains two epochs and equals the mini-batch engine on the CPU (losses and weights, within
the tolerances of tests/test_hybrid.py), with no NaN anywhere, on ``cpu,sim:0`` (the accelerator's share sampled by
the CPU sampler or on the device itself) and on ``cpu,sim:0,sim:1``. The syncs and waits per iteration are what
the stages promise (gnnscale/engines/sampled/stages.py): per accelerator, one wait (its stream on the copy's event)
and two host syncs (the transfer stage's on its copies, the trainer's on its work and loss), and where the device
samples its share two more (the sampling stream, the loader's read of the input ids) plus the store reader's two
per hop; none on the CPU.

Removing any wait of the hybrid path makes one of these tests fail (the mechanism tests below remove each, one at
a time, by making the runtime call at that site a no-op), and so does a copy into a buffer the trainer still reads.
Two waits order the copies before training, each enough alone: removing one shows in the counts, removing both
reads unordered bytes (StreamOrderError). The sampling stream's host sync orders the blocks computed on that
stream (in the device's scope, so marked as written there) before the loader copies their input ids to the host:
without it that copy raises StreamOrderError. Removing the trainer's host sync lets the copy stream reuse memory the
trainer's stream may still read: the freed-memory check (or NaN) fails it; in an epoch of one iteration, where no
copy comes after, the loss copied to host memory on the trainer's stream reads as the poison (NaN).
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from typing import Any

import pytest
import torch
from test_hybrid import CPU, _hybrid, _minibatch
from torch import Tensor

import gnnscale.runtime as rt
from gnnscale.engines.sampled.hybrid import HybridEngine
from gnnscale.graph.generators import csbm
from gnnscale.graph.graph import Graph

BATCH = 16  # four iterations per epoch
HOPS = 2  # test_hybrid's fanouts (4, 3)


@pytest.fixture(scope="module")
def graph() -> Graph:
    return csbm(nodes=600, features=12, avg_degree=8, seed=5)


@functools.cache
def _reference(model: str) -> tuple[list[float], list[Tensor]]:
    """The mini-batch engine on the CPU: two epochs' losses and the weights after them."""
    g = csbm(nodes=600, features=12, avg_degree=8, seed=5)
    ref = _minibatch(g, model=model, batch_size=BATCH)
    losses = [ref.train_epoch(epoch)["loss"] for epoch in (1, 2)]
    return losses, [p.detach().clone() for p in ref.model.parameters()]


def _engine(g: Graph, devices: tuple[str, ...], shares: tuple[float, ...], on_device: list[bool],
            model: str = "sage") -> HybridEngine:
    """The hybrid engine on ``devices`` with a fixed split; ``on_device[g]``: trainer ``g`` samples its own share."""
    eng = _hybrid(g, devices, model=model, batch_size=BATCH, shares=shares, drm="off")
    eng.gpu_sampler = list(on_device)
    return eng


def _assert_counts(eng: HybridEngine, iterations: int) -> None:
    """Per iteration and sim device: one wait (the trainer's stream on the copy's event), two host syncs (the
    transfer stage on its copies, the trainer on its work), and for a share sampled on the device the sampling
    stream's sync, the store reader's two per hop (a route and a take) and the loader's blocking read of the input
    ids. Nothing on the CPU."""
    assert rt.sync_count(CPU) == 0 and rt.wait_count(CPU) == 0
    for g, dev in enumerate(eng.devices):
        if not rt.is_sim(dev):
            continue
        syncs = 2 + (2 + 2 * HOPS if eng.gpu_sampler[g] else 0)
        waits = rt.wait_count(dev)
        assert waits == iterations, f"{dev}: {waits} waits in {iterations} iterations, not one per iteration"
        got = rt.sync_count(dev)
        assert got == syncs * iterations, f"{dev}: {got} syncs in {iterations} iterations, not {syncs} per iteration"


def _train(eng: HybridEngine, model: str = "sage", counts: bool = True) -> None:
    """Two epochs against the mini-batch reference; with ``counts``, the syncs and waits of each epoch."""
    losses, weights = _reference(model)
    for epoch in (1, 2):
        rt.reset_counts()
        rec: dict[str, Any] = eng.train_epoch(epoch)
        finite = math.isfinite(rec["loss"]) and all(bool(torch.isfinite(p).all()) for p in eng.model.parameters())
        assert finite, "NaN in the loss or the weights"
        assert rec["loss"] == pytest.approx(losses[epoch - 1], rel=1e-5)
        if counts:
            _assert_counts(eng, rec["batches"])
    for a, b in zip(weights, eng.model.parameters(), strict=True):
        torch.testing.assert_close(b.detach(), a, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------------ equal runs
@pytest.mark.parametrize(("devices", "shares", "on_device", "model"), [
    (("cpu", "sim:0"), (0.4, 0.6), [False, False], "sage"),
    (("cpu", "sim:0"), (0.3, 0.7), [False, True], "gcn"),
    (("sim:0", "cpu", "sim:1"), (0.3, 0.2, 0.5), [False, False, True], "gat"),
])
def test_hybrid_on_sim_devices_equals_the_minibatch_engine(graph: Graph, sims: list[rt.SimDevice],
                                                           devices: tuple[str, ...], shares: tuple[float, ...],
                                                           on_device: list[bool], model: str) -> None:
    """The CPU trainer beside one or two sim accelerators, each share sampled by the CPU sampler (features and
    blocks copied on the copy stream) or on its device (features only); the syncs and waits counted where one sim
    device reads the store alone (two read each other's partitions: their requests wait too)."""
    eng = _engine(graph, devices, shares, on_device, model)
    used = [d for d in eng.devices if rt.is_sim(d)]
    assert used == sims[: len(used)]
    before = [(d.copies_issued, d.copies_completed) for d in used]
    _train(eng, model, counts=len(used) == 1)
    for d, (issued, completed) in zip(used, before, strict=True):
        assert d.copies_issued > issued  # copies really deferred, then every one performed
        assert d.copies_completed - completed == d.copies_issued - issued
    rec = eng.train_epoch(3)
    assert min(rec["trainer_seeds"]) > 0 and all(b > 0 for b in rec["accel_bytes"])


# ------------------------------------------------------------------------------------------------ mistakes caught
def _skip_sync(monkeypatch: pytest.MonkeyPatch, skipped: Any) -> None:
    """``rt.synchronize`` does nothing for the targets ``skipped(target)`` picks (the site's no-op)."""
    synchronize = rt.synchronize
    monkeypatch.setattr(rt, "synchronize", lambda t: None if skipped(t) else synchronize(t))


@pytest.mark.parametrize(("removed", "failure"), [
    ("trainer event wait", "waits in"),
    ("transfer host sync", "syncs in"),
    ("trainer event wait and transfer host sync", "has not waited"),
    ("trainer host sync", "NaN in the loss|may reuse"),
    ("sampling host sync", "has not waited for sim:0/stream"),
])
def test_a_missing_wait_of_the_hybrid_engine_fails(graph: Graph, sims: list[rt.SimDevice], removed: str,
                                                   failure: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each wait of the hybrid path made a no-op at its site: the trainer stream's wait on the copy's event
    (``HybridEngine._propagate``), the transfer stage's host wait on its copy stream and the sampling stage's on
    its sampling stream (``SampledStages.transfer`` / ``.sample``), the trainer's host wait on its device (its
    loss). Each fails the run: by StreamOrderError, NaN, or the counts."""
    eng = _engine(graph, ("cpu", "sim:0"), (0.4, 0.6), [False, removed == "sampling host sync"])
    if "trainer event wait" in removed:
        monkeypatch.setattr(rt, "wait_event", lambda event, stream: None)
    if "transfer host sync" in removed:
        _skip_sync(monkeypatch, lambda t: any(t is s for s in eng.stages.copy_streams))
    if removed == "sampling host sync":
        _skip_sync(monkeypatch, lambda t: any(t is s for s in eng.stages.sample_streams))
    if removed == "trainer host sync":
        _skip_sync(monkeypatch, lambda t: isinstance(t, rt.SimDevice))
    with pytest.raises((rt.StreamOrderError, AssertionError), match=failure):
        _train(eng)
    monkeypatch.undo()
    for d in sims:  # the host waits for the failed run's streams: its memory, freed later, leaves no debt
        rt.synchronize(d)


@pytest.mark.parametrize("wait", [True, False])
def test_the_trainers_loss_is_poisoned_without_its_host_sync(graph: Graph, sims: list[rt.SimDevice], wait: bool,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer copies its loss to host memory on its stream and the host waits for its device before the
    epoch reads it (``HybridEngine._propagate``). In an epoch of one iteration (no later copy can reuse the
    trainer's memory first) the loss is the mini-batch engine's with that wait, and the poison without it: the
    copy into host memory is done only when the host waits."""
    eng = _hybrid(graph, ("cpu", "sim:0"), model="sage", batch_size=graph.num_nodes, shares=(0.4, 0.6), drm="off")
    eng.gpu_sampler = [False, False]
    if not wait:
        _skip_sync(monkeypatch, lambda t: isinstance(t, rt.SimDevice))
    rec = eng.train_epoch(1)
    assert rec["batches"] == 1
    if wait:
        ref = _minibatch(csbm(nodes=600, features=12, avg_degree=8, seed=5), model="sage",
                         batch_size=graph.num_nodes)
        assert rec["loss"] == pytest.approx(ref.train_epoch(1)["loss"], rel=1e-5)
        return
    assert math.isnan(rec["loss"])
    monkeypatch.undo()
    for d in sims:  # the host waits for the run's streams: its memory, freed later, leaves no debt
        rt.synchronize(d)


def _reusing_features(monkeypatch: pytest.MonkeyPatch, rows: int) -> Counter[int]:
    """A mutant transfer: each share's features land in one of two device buffers of ``rows`` rows per device,
    reused in turn (a double buffer), so iteration ``i + 2``'s copy refills the buffer iteration ``i`` trained
    from. Other copies (blocks, seeds) are the runtime's."""
    to_device = rt.to_device
    rings: dict[int, list[Tensor]] = {}
    turn = Counter[int]()

    def reusing(src: Tensor, device: rt.Device, *, stream: rt.Stream | None = None) -> Tensor:
        if not (rt.is_sim(device) and src.dim() == 2 and src.is_floating_point()):
            return to_device(src, device, stream=stream)
        ring = rings.setdefault(id(device), [rt.empty((rows, src.shape[1]), device=device) for _ in range(2)])
        out = ring[turn[id(device)] % 2][: src.shape[0]]
        turn[id(device)] += 1
        return rt.copy_async(out, src, stream)

    monkeypatch.setattr(rt, "to_device", reusing)
    return turn


@pytest.mark.parametrize("wait", [True, False])
def test_a_copy_into_a_buffer_the_trainer_still_reads_fails(graph: Graph, sims: list[rt.SimDevice], wait: bool,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """With the features copied into reused buffers, the trainer's host wait on its device (after its backward)
    is what keeps iteration ``i + 2``'s copy from overwriting the buffer iteration ``i`` read: with it the run
    equals the reference, without it the copy raises StreamOrderError."""
    eng = _engine(graph, ("cpu", "sim:0"), (0.4, 0.6), [False, False])
    copies = _reusing_features(monkeypatch, graph.num_nodes)
    if wait:
        _train(eng)
        assert sum(copies.values()) == 2 * 4  # two epochs of four iterations, every one through the buffers
        return
    _skip_sync(monkeypatch, lambda t: isinstance(t, rt.SimDevice))
    with pytest.raises(rt.StreamOrderError, match="may still read"):
        eng.train_epoch(1)


def test_a_share_sampled_on_the_cpu_is_moved_even_if_drm_hands_sampling_over_meanwhile(
        graph: Graph, sims: list[rt.SimDevice]) -> None:
    """DRM may hand an accelerator's sampling to its own device while an iteration sampled by the CPU sampler is
    between stages. The transfer stage must move that iteration's blocks (the sample stage's record), not decide by
    the assignment as it is now: on the H200 gpu-check's DRM run the blocks stayed in host memory beside features
    on the GPU ("Expected all tensors to be on the same device")."""
    eng = _engine(graph, ("cpu", "sim:0"), (0.4, 0.6), [False, False])
    it = next(eng._iterations([torch.arange(BATCH)]))
    it = eng._load(eng._sample(it, 7))
    assert it.blocks[1] and it.x[1] is not None
    features = it.x[1].numel() * it.x[1].element_size()
    topology = sum(b.nbytes() for b in it.blocks[1])
    eng.gpu_sampler = [False, True]  # the decision lands now
    it = eng._transfer(it)
    assert it.bytes_to[1] == features + topology  # the blocks went with the features
