"""The sampled family: the engines that train on sampled neighbourhoods, one loop with each engine's parts
plugged in: mini-batch (XGNN, ``--engine minibatch``), hybrid CPU + accelerators (HyScale-GNN, ``--engine
hybrid``) and distributed (HopGNN, DistDGL's model-centric strategy, ``--engine distributed``).

* :mod:`~gnnscale.engines.sampled.loop`: the shared loop (:class:`SampledLoop`), the epoch's order, the fanouts,
  a trainer's share of a batch, its forward and backward, the counters.
* :mod:`~gnnscale.engines.sampled.engine`: :class:`SampledEngine`, the set-up every sampled engine shares.
* :mod:`~gnnscale.engines.sampled.eval`: evaluation (layer-wise full-neighbour or sampled inference).
* :mod:`~gnnscale.engines.sampled.norm`: BatchNorm over a global batch across the trainers of one process.
* :mod:`~gnnscale.engines.sampled.predict`: the predicted epochs of minibatch and hybrid.
* :mod:`~gnnscale.engines.sampled.stages`: the pipelined stages of a batch (sampling, loading, transfer).
* :mod:`~gnnscale.engines.sampled.exchange`: the parts of the loop that cross ranks.
* :mod:`~gnnscale.engines.sampled.minibatch`: :class:`MiniBatchEngine` over XGNN's global memory store.
* :mod:`~gnnscale.engines.sampled.hybrid`: :class:`HybridEngine` with dynamic resource management.
* :mod:`~gnnscale.engines.sampled.distributed`: :class:`DistributedEngine` on torch.distributed.
* :mod:`~gnnscale.engines.sampled.distributed_norm`: BatchNorm across ranks.
* :mod:`~gnnscale.engines.sampled.distributed_predict`: the distributed engine's predicted epoch.
"""

from __future__ import annotations

from gnnscale.engines.sampled.distributed import DistributedEngine
from gnnscale.engines.sampled.engine import SampledEngine
from gnnscale.engines.sampled.hybrid import HybridEngine
from gnnscale.engines.sampled.loop import (
    EVAL_BATCH,
    EVAL_EPOCH,
    TRAINER_COUNTERS,
    GradientReducer,
    NoReducer,
    SampledBatch,
    SampledCounters,
    SampledLoop,
    Step,
    backward_share,
    check_fanouts,
    cut,
    default_fanouts,
    epoch_order,
    fetch_batch,
    forward,
    inline_feed,
    model_depth,
    sampling_reasons,
)
from gnnscale.engines.sampled.minibatch import MiniBatchEngine

__all__ = [
    "DistributedEngine", "HybridEngine", "MiniBatchEngine", "SampledEngine",
    "EVAL_BATCH", "EVAL_EPOCH", "TRAINER_COUNTERS", "GradientReducer", "NoReducer", "SampledBatch", "SampledCounters",
    "SampledLoop", "Step", "backward_share", "check_fanouts", "cut", "default_fanouts", "epoch_order", "fetch_batch",
    "forward", "inline_feed", "model_depth", "sampling_reasons",
]
