"""The training record's keys: one meaning and one unit per key, whichever engine writes it.

Every epoch yields one record (``--metrics FILE`` writes it as a JSON line): the keys the training loop writes for
every engine, then the counters of the engine that ran. :data:`EPOCH_KEYS` is the whole vocabulary; an engine writes
the subset that applies to it, and never a key that is not here (``tests/test_metrics_schema.py`` runs every engine
and checks). docs/metrics.md is generated from this module (``python -m gnnscale.engines.core.schema``).

Units: ``bytes``; ``s`` (seconds, wall clock); ``rows`` (vertex rows of a feature or activation matrix);
``count``; ``fraction`` (0..1); ``list`` (one value per device, trainer or rank, in that order).

Each key also has a *kind* (:data:`KINDS`), what its value is: bytes that *moved* in the epoch (traffic: copies,
reads, messages) are not bytes *held* (memory: peaks, resident sizes, buffers), though both are bytes. ``gnnscale
report`` groups a record's keys by kind, never by their names.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

KINDS: dict[str, str] = {
    "metric": "training metrics",
    "moved": "bytes moved in the epoch",
    "held": "bytes held",
    "volume": "row volumes, not all moved",
    "count": "counts",
    "time": "seconds",
    "ratio": "fractions and rates",
    "setting": "settings",
}
"""What a key's value is, and the heading ``gnnscale report`` groups it under: ``moved``, bytes that crossed a link,
a disk or the network in the epoch; ``held``, bytes resident at a point (a peak, a size at the epoch's end);
``volume``, bytes of deduplication's accounting (rows needed, rows reused), not all of which moved; the others
by their unit."""

_UNIT_KINDS = {"s": "time", "rows": "count", "count": "count", "fraction": "ratio"}
"""The kind a key of these units has unless it says otherwise; ``bytes``, ``list`` and ``-`` keys name theirs."""


@dataclass(frozen=True)
class Key:
    """One key of the training record."""

    unit: str
    meaning: str
    written_by: str
    """``loop`` (every engine), or the engines that write it, in prose."""
    kind: str = ""
    """One of :data:`KINDS` (for a ``list``, the kind of each value); by default the unit's."""

    def __post_init__(self) -> None:
        if not self.kind:
            if self.unit not in _UNIT_KINDS:
                raise ValueError(f"a {self.unit!r} key must name its kind (one of {', '.join(KINDS)})")
            object.__setattr__(self, "kind", _UNIT_KINDS[self.unit])
        if self.kind not in KINDS:
            raise ValueError(f"unknown kind {self.kind!r}: one of {', '.join(KINDS)}")


_LOOP = "loop"

EPOCH_KEYS: dict[str, Key] = {
    # written by the training loop for every engine
    "epoch": Key("count", "Epoch number, from 1.", _LOOP, kind="metric"),
    "loss": Key("-", "Mean training cross-entropy over the epoch's training vertices.", _LOOP, kind="metric"),
    "train_acc": Key("fraction", "Accuracy on the training vertices after the epoch (no dropout).", _LOOP,
                     kind="metric"),
    "val_acc": Key("fraction", "Accuracy on the validation vertices; null without them.", _LOOP, kind="metric"),
    "test_acc": Key("fraction", "Accuracy on the test vertices; null without them.", _LOOP, kind="metric"),
    "epoch_time_s": Key("s", "Training time of the epoch, without the evaluation.", _LOOP),
    "peak_device_bytes": Key("bytes", "Peak memory of the training device(s) in the epoch: the accelerator "
                             "allocator's peak, or on CPU the measured live bytes of the engine's device-side "
                             "work (multi-device engines: the largest device's); offload on one CPU counts them in "
                             "its first epoch (every epoch under --gpu-memory), later epochs report the process's "
                             "peak resident bytes, as the in-memory engine on CPU does.", _LOOP, kind="held"),
    "estimated_peak_device_bytes": Key("bytes", "The planner's estimate of peak_device_bytes for the epoch's chunks "
                                       "(its memory model, issue #30: within 1.00-1.15x of the counted peak; a user's "
                                       "PyG convs measured on probe blocks, issue #45: within 1.00-1.25x).",
                                       "offload", kind="held"),
    "norm_passes": Key("count", "With --norm batch: BatchNorm's extra passes over the chunks (task-parallel: "
                       "subgraphs) in the epoch, a statistics pass (forward) and a gradient-sums pass (backward) per "
                       "norm, so that every chunk normalises with the whole layer's statistics.",
                       "offload, taskparallel"),
    "norm_reduced_bytes": Key("bytes", "With --norm batch: bytes of BatchNorm's partial sums (float64 moments and "
                              "gradient sums) the workers, devices or ranks added up in the epoch.",
                              "offload, taskparallel, minibatch, hybrid, distributed", kind="moved"),
    # host <-> device traffic (one meaning for every engine)
    "h2d_bytes": Key("bytes", "Everything copied host -> device in the epoch: the sum of h2d_row_bytes, "
                     "h2d_topology_bytes and h2d_index_bytes.", "offload, taskparallel, minibatch", kind="moved"),
    "h2d_row_bytes": Key("bytes", "Vertex rows (features, activations, gradients) copied host -> device.",
                         "offload, taskparallel, minibatch", kind="moved"),
    "h2d_topology_bytes": Key("bytes", "Graph structure copied host -> device: row pointers, neighbour ids, "
                              "edge weights of blocks or sampled lists.", "offload, taskparallel, minibatch",
                              kind="moved"),
    "h2d_index_bytes": Key("bytes", "Row-index vectors copied host -> device (which rows a chunk loads).",
                           "offload", kind="moved"),
    "d2h_bytes": Key("bytes", "Vertex rows copied device -> host (outputs, gradients).", "offload", kind="moved"),
    "d2d_bytes": Key("bytes", "Bytes one device read from another (rows, lists).", "minibatch", kind="moved"),
    "device_peak_bytes": Key("list", "Peak memory per device, bytes.", "offload, taskparallel", kind="held"),
    # full-graph chunked engines
    "chunks": Key("count", "Chunks the vertices are split into (all partitions together for offload).",
                  "offload, taskparallel"),
    "partitions": Key("count", "Level-1 partitions (HongTu's m).", "offload"),
    "devices": Key("count", "Devices the engine trained on.", "offload, taskparallel"),
    "layer_passes": Key("count", "Layer passes over the chunks in the epoch (forward and backward).", "offload"),
    "rows_ori": Key("rows", "Rows the chunks would load with no deduplication (HongTu's V_ori).", "offload"),
    "rows_ori_bytes": Key("bytes", "rows_ori in bytes.", "offload", kind="volume"),
    "rows_h2d": Key("rows", "Rows actually loaded host -> device.", "offload"),
    "rows_h2d_bytes": Key("bytes", "rows_h2d in bytes.", "offload", kind="moved"),
    "rows_reused": Key("rows", "Rows kept on the device from the previous chunk (not reloaded).", "offload"),
    "rows_reused_bytes": Key("bytes", "rows_reused in bytes.", "offload", kind="volume"),
    "rows_d2d": Key("rows", "Rows received from another device's chunk (inter-GPU duplicates).", "offload"),
    "rows_d2d_bytes": Key("bytes", "rows_d2d in bytes.", "offload", kind="moved"),
    "rows_p2p": Key("rows", "Rows shared between partitions on one device.", "offload"),
    "rows_p2p_bytes": Key("bytes", "rows_p2p in bytes.", "offload", kind="moved"),
    # task parallel (NeutronTask)
    "subgraphs": Key("count", "Subgraphs the epoch's chunks were grouped into (Algorithm 1's S).", "taskparallel"),
    "t2t_bytes": Key("bytes", "Bytes handed between T-task devices.", "taskparallel", kind="moved"),
    "t2p_bytes": Key("bytes", "Bytes handed from T-task to P-task devices.", "taskparallel", kind="moved"),
    "p2p_bytes": Key("bytes", "Bytes handed between P-task devices.", "taskparallel", kind="moved"),
    "p2t_bytes": Key("bytes", "Bytes handed from P-task back to T-task devices (gradients).", "taskparallel",
                     kind="moved"),
    "t_forward_s": Key("s", "T-task forward time, summed over devices.", "taskparallel"),
    "p_forward_s": Key("s", "P-task forward time, summed over devices.", "taskparallel"),
    "t_busy_s": Key("s", "T-task time with recomputation and backward, summed over devices.", "taskparallel"),
    "p_busy_s": Key("s", "P-task time with backward, summed over devices.", "taskparallel"),
    "predicted_t_s": Key("s", "T-task forward time predicted by Eq. 5.", "taskparallel"),
    "predicted_p_s": Key("s", "P-task forward time predicted by Eq. 6.", "taskparallel"),
    "pipeline_wall_s": Key("s", "Wall time of the pipelined forward and backward.", "taskparallel"),
    # sampled engines
    "batches": Key("count", "Mini-batches (iterations) in the epoch.", "minibatch, hybrid, distributed"),
    "trainers": Key("count", "Trainers that shared every batch.", "minibatch, hybrid"),
    "trainer_seeds": Key("list", "Seed vertices each trainer trained on.", "minibatch, hybrid", kind="count"),
    "trainer_sampled_edges": Key("list", "Sampled edges each trainer's blocks held.", "minibatch, hybrid",
                                 kind="count"),
    "trainer_s": Key("list", "Seconds each trainer spent training.", "hybrid", kind="time"),
    "sampled_edges": Key("count", "Edges of all sampled blocks of the epoch.", "minibatch, hybrid, distributed"),
    "fetched_neighbor_entries": Key("count", "Neighbour-list entries the sampler read, every tier together.",
                                    "minibatch"),
    "graph_hit_rate": Key("fraction", "Neighbour-list lookups served from device memory.", "minibatch"),
    "feature_hit_rate": Key("fraction", "Feature-row reads served from device memory.", "minibatch"),
    "sample_s": Key("s", "Sampling time.", "minibatch, distributed"),
    "extract_s": Key("s", "Feature and list fetching time.", "minibatch"),
    "train_s": Key("s", "Forward, backward and optimiser time.", "minibatch, distributed"),
    # the disk tier (--host-memory, features read from a converted directory)
    "disk_read_bytes": Key("bytes", "Feature bytes read from the graph directory's x.npy by positional reads in "
                           "training (each distinct row once per read; distributed: each rank's own rows once, at "
                           "set-up, in the first epoch's record, summed over the ranks); --host-memory only.",
                           "minibatch, offload, taskparallel, hybrid, distributed", kind="moved"),
    "spill_bytes": Key("bytes", "Bytes of the host buffers (activations, gradients, projections, aggregations) "
                       "spilled to unlinked files in --scratch; --host-memory and --scratch only.", "offload",
                       kind="held"),
    "host_rows_ram_bytes": Key("bytes", "Bytes of the host buffers kept in RAM (not spilled); --host-memory "
                               "only.", "offload", kind="held"),
    "host_cache_hits": Key("count", "Feature rows served by the disk tier's host cache of hot rows; --host-memory "
                           "only.", "minibatch, taskparallel, hybrid"),
    "host_cache_misses": Key("count", "Feature rows the host cache did not hold, read from disk (distinct rows per "
                             "read); --host-memory only.", "minibatch, taskparallel, hybrid"),
    "anon_rss_bytes": Key("bytes", "Anonymous resident memory of the process at the epoch's end (RssAnon of "
                          "/proc/self/status: what the process really holds, the page cache of mapped files "
                          "not included; distributed: the largest rank's); --host-memory only, null off Linux.",
                          "minibatch, offload, taskparallel, hybrid, distributed", kind="held"),
    "host_base_bytes": Key("bytes", "What --host-memory does not bound: the process's peak resident memory once the "
                           "graph was loaded, the engine's topology index and the kernels' allowance "
                           "(gnnscale plan --host-memory prints it); --host-memory only.",
                           "minibatch, offload, taskparallel, hybrid, distributed", kind="held"),
    "host_peak_bytes": Key("bytes", "The process's peak resident memory so far (VmHWM of /proc/self/status: "
                           "anonymous and mapped file pages); under --host-memory at most host_base_bytes plus the "
                           "budget (a warning says when not); --host-memory only, null off Linux.",
                           "minibatch, offload, taskparallel, hybrid, distributed", kind="held"),
    # hybrid (HyScale-GNN)
    "accel_bytes": Key("list", "Bytes sent to each accelerator trainer (features and blocks).", "hybrid", kind="moved"),
    "gpu_sampled": Key("list", "The accelerator trainers that sample their batches on the accelerator (their "
                       "indices), at the epoch's end.", "hybrid", kind="setting"),
    "split": Key("list", "Fraction of every batch each trainer took, at the epoch's end.", "hybrid", kind="ratio"),
    "threads": Key("list", "Threads of the CPU sampler, loader and trainer, at the epoch's end.", "hybrid",
                   kind="count"),
    "drm_work_moves": Key("count", "Dynamic resource management: work moved between trainers.", "hybrid"),
    "drm_thread_moves": Key("count", "Dynamic resource management: threads moved between CPU stages.", "hybrid"),
    "predicted_epoch_s": Key("s", "Epoch time predicted by the performance model.", "hybrid"),
    "mteps": Key("-", "Millions of traversed (sampled) edges per second.", "hybrid", kind="ratio"),
    "sa_s": Key("s", "Stage time per iteration: sampling on the accelerator.", "hybrid"),
    "sc_s": Key("s", "Stage time per iteration: sampling on the CPU.", "hybrid"),
    "load_s": Key("s", "Stage time per iteration: feature loading.", "hybrid"),
    "tran_s": Key("s", "Stage time per iteration: host -> accelerator transfer.", "hybrid"),
    "tc_s": Key("s", "Stage time per iteration: the CPU trainer.", "hybrid"),
    "ta_s": Key("s", "Stage time per iteration: the accelerator trainer.", "hybrid"),
    "sync_s": Key("s", "Gradient synchronisation time.", "hybrid, distributed"),
    # distributed (HopGNN)
    "ranks": Key("count", "Ranks of the job.", "distributed"),
    "strategy": Key("-", "micrograph or model-centric.", "distributed", kind="setting"),
    "remote_rows": Key("rows", "Feature rows read from other ranks.", "distributed"),
    "remote_bytes": Key("bytes", "remote_rows in bytes.", "distributed", kind="moved"),
    "needed_rows": Key("rows", "Feature rows the epoch's micrographs needed.", "distributed"),
    "local_rows": Key("rows", "Of those, rows held by the rank that used them.", "distributed"),
    "local_hit_rate": Key("fraction", "local_rows / needed_rows.", "distributed"),
    "migration_bytes": Key("bytes", "Model bytes moved between ranks (model migration).", "distributed", kind="moved"),
    "time_steps": Key("count", "Time steps per iteration (model migrations + 1), mean over ranks.",
                      "distributed"),
    "merges": Key("count", "Micrograph merges in force (HopGNN §5.3).", "distributed"),
    "fetch_s": Key("s", "Remote feature fetching time, summed over ranks.", "distributed"),
    "migrate_s": Key("s", "Model migration time, summed over ranks.", "distributed"),
    "rank_feature_bytes": Key("list", "Feature bytes each rank holds.", "distributed", kind="held"),
    "rank_cache_peak_bytes": Key("list", "Peak bytes of each rank's pre-gathered feature cache.", "distributed",
                                 kind="held"),
    "rank_rss_bytes": Key("list", "Resident memory of each rank's process.", "distributed", kind="held"),
}
"""Every key a per-epoch record may hold."""

H2D_PARTS = ("h2d_row_bytes", "h2d_topology_bytes", "h2d_index_bytes")
"""``h2d_bytes`` is their sum, in every engine that writes it."""

WALL_PARTS = ("load_s", "prepare_s", "training_s", "eval_s", "checkpoint_s", "other_s")
"""The summary's ``timings`` that split ``wall_s``: no two overlap, and they sum to it (``other_s`` is the rest)."""

TIMING_KEYS: dict[str, Key] = {
    "wall_s": Key("s", "The run's wall time: load_s and train()'s own time (total_time_s); the sum of the parts "
                  "load_s, prepare_s, training_s, eval_s, checkpoint_s and other_s.", _LOOP),
    "load_s": Key("s", "Part: reading the dataset (the command's, or the caller's timings={\"load_s\": ...}; 0 "
                  "when not given).", _LOOP),
    "prepare_s": Key("s", "Part: train()'s work before the first epoch: checks, reading the checkpoint to resume "
                     "from, choosing the engine (with the estimates that takes), building the model and the "
                     "engine's set-up (setup_s).", _LOOP),
    "training_s": Key("s", "Part: the epochs' training (the sum of epoch_time_s over this run's epochs), less the "
                      "checkpoints written within an epoch.", _LOOP),
    "eval_s": Key("s", "Part: the evaluation after each epoch (the accuracies of the epoch records).", _LOOP),
    "checkpoint_s": Key("s", "Part: writing checkpoints (--checkpoint), at epoch ends and within epochs.", _LOOP),
    "other_s": Key("s", "Part: the rest of the wall time: the per-epoch callbacks (the command's epoch lines, "
                   "progress bar and metrics records), keeping the best epoch's weights, restoring a resumed "
                   "checkpoint's state, the summary itself.", _LOOP),
    "ready_s": Key("s", "load_s + prepare_s: the time until the first epoch starts (the command's \"ready to "
                   "train\" line).", _LOOP),
    "setup_s": Key("s", "The engine's set-up, within prepare_s; the engine's own steps below ran in it or, for the "
                   "offload planner's, while the engine was chosen (also within prepare_s).", _LOOP),
    "partition_s": Key("s", "Within prepare_s: partitioning (or reading a saved partition plan).",
                       "offload, distributed"),
    "chunk_s": Key("s", "Within prepare_s: splitting the partitions into chunks.", "offload"),
    "plan_s": Key("s", "Within prepare_s: choosing the plan (chunk counts; tasks and subgraphs).",
                  "offload, taskparallel"),
    "model_s": Key("s", "Within setup_s: building and calibrating the performance model.", "hybrid"),
    "epoch_s": Key("s", "Mean of epoch_time_s over this run's epochs.", _LOOP),
}
"""Every key of the summary record's ``timings`` (seconds, wall clock)."""


def markdown() -> str:
    """docs/metrics.md: the page is this function's output."""
    lines = [
        "# Training records",
        "",
        "`gnnscale train --metrics FILE` writes one JSON object per epoch, then a summary object (`\"summary\":",
        "true`). The epoch keys below mean one thing, in one unit, whichever engine writes them; an engine writes the",
        "ones that apply to it. Generated from `gnnscale/engines/core/schema.py`",
        "(`python -m gnnscale.engines.core.schema`).",
        "",
        "Units: bytes; s (seconds, wall clock); rows (vertex rows); count; fraction (0..1); list (one value per",
        "device, trainer or rank).",
        "",
        "Kinds (what a value is; `gnnscale report` groups the keys by kind): moved (bytes that crossed a link, a disk",
        "or the network in the epoch: traffic); held (bytes resident at a point: a peak, a size at the epoch's end);",
        "volume (bytes of deduplication's accounting, rows needed or reused, not all of which moved); count; time;",
        "ratio (fractions and rates); setting; metric. A list's kind is that of each of its values.",
        "",
        "| key | unit | kind | written by | meaning |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| `{name}` | {k.unit} | {k.kind} | {k.written_by} | {k.meaning} |" for name, k in EPOCH_KEYS.items()]
    lines += [
        "",
        "## The summary's timings",
        "",
        "The summary record's `timings` say where the run's time went. The parts `load_s`, `prepare_s`,",
        "`training_s`, `eval_s`, `checkpoint_s` and `other_s` do not overlap and sum to `wall_s` (`other_s` is the",
        "rest); the other keys are steps within a part. `gnnscale train` prints the parts on its last timing line",
        "(`... N epochs in Ws wall: load ..., preparation ..., training ..., evaluation ..., checkpoints ...,",
        "other ...`) and the steps before the first epoch on its `ready to train` line.",
        "",
        "| key | unit | written by | meaning |",
        "|---|---|---|---|",
    ]
    lines += [f"| `{name}` | {k.unit} | {k.written_by} | {k.meaning} |" for name, k in TIMING_KEYS.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown())
