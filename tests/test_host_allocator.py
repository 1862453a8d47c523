"""The host allocator policy (``--host-allocator``): ``retain`` keeps freed large blocks, so the next epoch's
``[V, F]`` temporaries are not faulted in again; the engines apply it by default where host memory is the device.

Each check runs in a child process: the policy is process-wide and cannot be fully undone."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import gnnscale.engines.core.base as base
from gnnscale.config import TrainConfig
from gnnscale.engines import InMemoryEngine
from gnnscale.errors import ConfigError
from gnnscale.nn import build_model
from gnnscale.runtime import set_host_allocator
from gnnscale.testing import tiny_graph

# Faults of reallocating a freed 64 MB block (above glibc's mmap threshold, whatever its dynamic value), the best of
# four tries (now and then the heap cannot grow in place and one block is mapped anew), before and after `SETUP`.
_CHILD = """
import resource, torch
def faults():
    t = torch.empty(16 * 2**20); t.fill_(1.0); del t
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = torch.empty(16 * 2**20); t.fill_(1.0); del t
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
first = min(faults() for _ in range(2))
SETUP
print(first, min(faults() for _ in range(4)))
"""
_ENGINE = """
from gnnscale.engines import InMemoryEngine
from gnnscale.nn import build_model
from gnnscale.testing import tiny_graph
from gnnscale.train import TrainConfig
import torch
g = tiny_graph()
cfg = TrainConfig(model="gcn", hidden=8, epochs=1, host_allocator=POLICY)
model = build_model("gcn", g.num_features, 8, g.num_classes, layers=2, dropout=0.5, heads=1, seed=0)
InMemoryEngine(g, model, cfg, torch.device("cpu"))
"""


def _faults(setup: str) -> tuple[int, int]:
    code = _CHILD.replace("SETUP", setup)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    return int(out[0]), int(out[1])


def _glibc() -> None:
    if subprocess.run([sys.executable, "-c", "import ctypes.util, sys; "
                       "sys.exit(0 if ctypes.util.find_library('c') else 1)"]).returncode:
        pytest.skip("no C library with mallopt (not glibc)")


def test_retain_stops_page_faults_on_reallocation() -> None:
    _glibc()
    before, after = _faults("from gnnscale.runtime import set_host_allocator; assert set_host_allocator('retain')")
    assert before > 10_000 and after < 1_000, (before, after)  # 16K pages of 4 KiB, then none


def test_system_gives_glibc_defaults_back() -> None:
    _glibc()
    before, after = _faults("from gnnscale.runtime import set_host_allocator\n"
                            "assert set_host_allocator('retain') and set_host_allocator('system')")
    assert before > 10_000 and after > 10_000, (before, after)


@pytest.mark.parametrize(("policy", "retained"), [("'auto'", True), ("'retain'", True), ("'system'", False)])
def test_the_engines_apply_the_policy_on_the_cpu(policy: str, retained: bool) -> None:
    """The default (``auto``) retains when training on the CPU; ``system`` leaves glibc's behaviour."""
    _glibc()
    before, after = _faults(_ENGINE.replace("POLICY", policy))
    assert before > 10_000, before
    assert (after < 1_000) == retained, (policy, before, after)


def test_auto_leaves_the_allocator_alone_when_the_host_is_tight(monkeypatch: pytest.MonkeyPatch) -> None:
    """``auto`` retains only where the engine's host estimate is at most half the available memory: a graph near
    the host's size needs every freed page back. Counted in-process through the runtime call."""
    calls: list[str] = []
    monkeypatch.setattr(base.rt, "set_host_allocator", calls.append)
    g = tiny_graph()
    need = sum(base.estimate_host_bytes(g, TrainConfig(model="gcn", hidden=8),
                                        layer_copies=InMemoryEngine.host_layer_copies).values())
    assert need > 0
    for free, policy, expected in [(10 * need, "auto", ["retain"]), (need, "auto", []),
                                   (need, "retain", ["retain"]), (10 * need, "system", ["system"])]:
        calls.clear()
        monkeypatch.setattr(base.rt, "mem_get_info", lambda dev, free=free: (free, 4 * free))
        cfg = TrainConfig(model="gcn", hidden=8, host_allocator=policy)
        model = build_model("gcn", g.num_features, 8, g.num_classes, layers=2, dropout=0.5, heads=1, seed=0)
        InMemoryEngine(g, model, cfg, torch.device("cpu"))
        assert calls == expected, (free, policy, calls)


def test_bad_policies_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown host allocator"):
        set_host_allocator("jemalloc")
    with pytest.raises(ValueError, match="unknown host allocator"):
        set_host_allocator("auto")  # a config's choice, resolved by the engine
    with pytest.raises(ConfigError, match="--host-allocator"):
        TrainConfig(host_allocator="tcmalloc")


def test_auto_leaves_the_allocator_alone_for_per_edge_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    """``auto`` does not retain for a model with per-edge work (GAT: its ``[heads, E]`` blocks fragment a retained
    heap), even with room to spare; ``retain`` asked for is still applied. Counted through the runtime call."""
    calls: list[str] = []
    monkeypatch.setattr(base.rt, "set_host_allocator", calls.append)
    monkeypatch.setattr(base.rt, "mem_get_info", lambda dev: (1 << 40, 1 << 41))
    g = tiny_graph()
    for model_name, policy, expected in [("gat", "auto", []), ("gat", "retain", ["retain"]),
                                         ("gcn", "auto", ["retain"]), ("sage", "auto", ["retain"])]:
        calls.clear()
        cfg = TrainConfig(model=model_name, hidden=8, heads=2, host_allocator=policy)
        model = build_model(model_name, g.num_features, 8, g.num_classes, layers=2, dropout=0.5, heads=2, seed=0)
        InMemoryEngine(g, model, cfg, torch.device("cpu"))
        assert calls == expected, (model_name, policy, calls)
