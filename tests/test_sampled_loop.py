"""The shared sampled loop (``gnnscale.engines.sampled.loop``): a toy sampled engine, one small module on the loop
plus a registry entry, trains through the CLI with the mini-batch engine's losses and accuracies, checkpoints within an
epoch and resumes to an uninterrupted run's losses; the loop runs its parts in order (the feed ahead of each step,
reduce, step, sync, the engine's look, the iteration hook) and counts what they did."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from gnnscale.cli import main
from gnnscale.config import SamplingOptions, TrainConfig
from gnnscale.engines import ENGINES
from gnnscale.engines.sampled.engine import IterationCheckpoints, SampledEngine
from gnnscale.engines.sampled.eval import SampledInference
from gnnscale.engines.sampled.loop import (
    NoReducer,
    SampledBatch,
    SampledCounters,
    SampledLoop,
    Step,
    backward_share,
    epoch_order,
    forward,
    inline_feed,
)
from gnnscale.graph.datasets import load_dataset
from gnnscale.graph.generators import csbm
from gnnscale.graph.graph import Graph
from gnnscale.nn.model import GNN
from gnnscale.nn.stack import Stack
from gnnscale.sample import CSRTopology, sample_key
from gnnscale.train import train

# ------------------------------------------------------------------------------------------------ the toy engine


class ToyEngine(IterationCheckpoints, SampledEngine):
    """One trainer on the training device; the graph's own lists and features in host memory; each batch sampled
    and fetched when the loop asks for it."""

    name = "toy"
    options = (SamplingOptions,)

    @classmethod
    def _not_supported_reasons(cls, graph: Graph, config: TrainConfig, device: torch.device, *,
                               model: Stack | None = None) -> list[str]:
        return cls.sampling_reasons(config, model) if config.engine == "toy" else ["a test engine: --engine toy"]

    def __init__(self, graph: Graph, model: GNN, config: TrainConfig, device: torch.device):
        super().__init__(graph, model, config, device)
        assert graph.x is not None and graph.y is not None
        x, self.y = graph.x, graph.y.to(device)
        self.topology = CSRTopology.from_graph(graph, model.adjacency)
        self.features = lambda ids: x[ids.cpu()].to(device)
        self.loop = SampledLoop(self.optimizer, self.train_ids, seed=config.seed, batch_size=config.batch_size,
                                reducer=NoReducer())
        self.inference = SampledInference(model, self.topology, self.features, self.adjacency, graph.num_nodes,
                                          config.batch_size, device)

    def train_epoch(self, epoch: int) -> dict[str, Any]:
        self.model.train()
        se, key = (self.config.seed, epoch), sample_key(self.config.seed, epoch)
        counters = SampledCounters()

        def step(batch: SampledBatch, total: int) -> None:
            counters.took(0, batch)
            loss = backward_share(forward(self.model, batch.blocks, batch.x, se), self.y[batch.seeds], total)
            counters[0]["loss_sum"] += float(loss) * total

        self.loop.run(epoch, inline_feed(self.topology, self.features, self.fanouts, key, self.adjacency), step,
                      counters)
        return counters.record()


# ------------------------------------------------------------------------------------------------ through the CLI
DATA = "csbm:nodes=600,features=8,avg_degree=6,train=0.5"


def _cli_records(tmp_path: Path, engine: str, *extra: str) -> list[dict[str, Any]]:
    m = tmp_path / f"{engine}.jsonl"
    assert main(["train", "--dataset", DATA, "--engine", engine, "--batch-size", "50", "--fanouts", "4,3",
                 "--epochs", "3", "--device", "cpu", "--quiet", "--metrics", str(m), *extra]) == 0
    return [json.loads(line) for line in m.read_text().splitlines()]


def test_a_toy_engine_on_the_loop_trains_through_the_cli_like_the_minibatch_engine(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(ENGINES, "toy", ToyEngine)
    toy, ref = _cli_records(tmp_path, "toy"), _cli_records(tmp_path, "minibatch")
    epochs = [r for r in toy if not r.get("summary")]
    want = [r for r in ref if not r.get("summary")]
    assert toy[-1]["summary"] and toy[-1]["engine"] == "toy"
    n = int(load_dataset(DATA).train_mask.sum())  # type: ignore[union-attr]
    assert [r["batches"] for r in epochs] == [r["batches"] for r in want] == [-(-n // 50)] * 3
    assert n > 100  # several steps an epoch
    assert [r["loss"] for r in epochs] == pytest.approx([r["loss"] for r in want], rel=1e-5)
    for a, b in zip(epochs, want, strict=True):  # the same sample, so the same counters, and the same inference
        assert (a["sampled_edges"], a["trainer_seeds"]) == (b["sampled_edges"], b["trainer_seeds"])
        assert [a[k] for k in ("train_acc", "val_acc", "test_acc")] == pytest.approx(
            [b[k] for k in ("train_acc", "val_acc", "test_acc")], abs=1e-6)
    # sampled evaluation goes through the loop's inference part too: the same keyed sample as the mini-batch one
    toy_eval = _cli_records(tmp_path, "toy", "--eval-fanouts", "2,2")
    ref_eval = _cli_records(tmp_path, "minibatch", "--eval-fanouts", "2,2")
    assert [r.get("test_acc") for r in toy_eval] == pytest.approx([r.get("test_acc") for r in ref_eval], abs=1e-6)


def test_an_engine_on_the_loop_checkpoints_within_an_epoch_and_resumes(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop's iteration hook, in an engine that is not the distributed one: a run that fails as epoch 2's
    third iteration steps resumes from the checkpoint written after its second, and its losses (epoch 2's put
    together from the iterations before and after) are an uninterrupted run's."""
    monkeypatch.setitem(ENGINES, "toy", ToyEngine)
    g = csbm(nodes=600, features=8, avg_degree=6, seed=3, train=0.5)
    cfg = TrainConfig(model="sage", layers=2, hidden=16, engine="toy", batch_size=50, fanouts=(4, 3), epochs=3)
    per_epoch = -(-int(g.train_mask.sum()) // 50)  # type: ignore[union-attr]
    assert per_epoch > 3
    whole = train(g, cfg, "cpu").history
    steps = [0]

    def fail_at_epoch_2_iteration_2(engine: Any, *_: Any) -> None:
        step = engine.loop.step

        def counted() -> None:
            steps[0] += 1
            if steps[0] == per_epoch + 3:
                raise RuntimeError("killed")
            step()

        engine.loop.step = counted

    ck = tmp_path / "ck"
    with pytest.raises(RuntimeError, match="killed"):
        train(g, cfg, "cpu", checkpoint=ck, checkpoint_iterations=1, on_start=fail_at_epoch_2_iteration_2)
    state = torch.load(ck / "checkpoint.pt", weights_only=False)
    assert state["epoch"] == 1 and state["engine"]["progress"]["iteration"] == 2
    assert state["engine"]["progress"]["counters"][0]["seeds"] == 100  # two iterations' counters kept
    resumed = train(g, cfg, "cpu", checkpoint=ck, checkpoint_iterations=1, resume=True).history
    assert [r["epoch"] for r in resumed] == [1, 2, 3]
    assert [r["loss"] for r in resumed] == pytest.approx([r["loss"] for r in whole], rel=1e-6)
    assert [r["trainer_seeds"] for r in resumed] == [r["trainer_seeds"] for r in whole]


# ------------------------------------------------------------------------------------------------ the loop's order
class _Recorder:
    """A reducer and an optimiser that write what they are asked to do."""

    def __init__(self, log: list[str]):
        self.log = log

    def reduce(self) -> None:
        self.log.append("reduce")

    def sync(self) -> None:
        self.log.append("sync")

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.log.append("zero")

    def step(self) -> None:
        self.log.append("step")


def test_the_loop_runs_its_parts_in_order_and_resumes_after_a_checkpoints_iterations() -> None:
    log: list[str] = []
    rec = _Recorder(log)
    ids = torch.arange(100, 110)
    loop = SampledLoop(rec, ids, seed=4, batch_size=4, reducer=rec)  # type: ignore[arg-type]
    assert [b.tolist() for b in loop.batches(1)] == [b.tolist() for b in torch.split(ids[epoch_order(4, 1, 10)], 4)]

    def feed(batches: list[torch.Tensor], first: int) -> Any:
        for i, b in enumerate(batches, first):
            log.append(f"feed {i}")
            yield b

    def step(batch: torch.Tensor, total: int) -> int:
        log.append(f"train {batch.numel()}/{total}")
        counters[0]["seeds"] += batch.numel()
        return batch.numel()

    def after(s: Step[torch.Tensor, int]) -> None:
        assert s.result == s.item.numel() and s.sync_s >= 0
        log.append(f"after {s.index}")

    saved: list[dict[str, Any]] = []

    def hook(epoch: int, done: int) -> None:
        assert loop.progress is not None
        saved.append(loop.progress)
        log.append(f"checkpoint {epoch}:{done}")

    loop.on_iteration = hook
    counters = SampledCounters()
    batches = loop.run(1, feed, step, counters, after)
    assert len(batches) == 3 and counters.iterations == 3 and counters[0]["seeds"] == 10
    per_step = ["zero", "train", "reduce", "step", "sync", "after", "checkpoint"]
    got = [e.split()[0] for e in log]
    assert got == ["feed", *per_step, "feed", *per_step, "feed", *per_step[:-1]]  # no checkpoint after the last
    assert loop.progress is None
    # a resume of epoch 1 after its first iteration: the feed starts at iteration 1, with the counters kept
    log.clear()
    loop.on_iteration = None
    loop.resume = saved[0]
    counters = SampledCounters()
    loop.run(1, feed, step, counters)
    assert [e for e in log if e.startswith("feed")] == ["feed 1", "feed 2"]
    assert counters.iterations == 3 and counters[0]["seeds"] == 10 and loop.resume is None
    # a checkpoint of another epoch is not this one's
    loop.resume = saved[0]
    log.clear()
    loop.run(2, feed, step, SampledCounters())
    assert [e for e in log if e.startswith("feed")] == ["feed 0", "feed 1", "feed 2"]
