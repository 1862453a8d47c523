"""`make gpu-check`'s report: ``summary.md`` from the steps' results and records (benchmarks/_gpu_check.py writes it
again after every step, so a run cut off still leaves the steps it finished)."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness.records import fmt, read_records, table

XGNN_EPOCH_S = 0.3  # XGNN's mini-batch epoch time at products scale, the goal of the minibatch step
H2D_PARTS = ("h2d_row_bytes", "h2d_topology_bytes", "h2d_index_bytes")
NOT_RUN = "not run"
DEADLINE = "not run (deadline)"


@dataclass
class Step:
    name: str
    budget_s: float  # on the GPU; the dry run gives every step the same generous time
    argv: list[str]
    jsonl: str | None = None  # its records: a file under OUT, or (``embed``) a scratch file copied into steps.jsonl
    what: str = ""
    embed: bool = False
    result: dict[str, Any] = field(default_factory=dict)


def _f(v: Any, spec: str = ".3f") -> str:
    return fmt(v, spec)


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return table(head, rows).splitlines()


def summarize_env(facts: dict[str, Any]) -> list[str]:
    keys = ["device_name", "device_memory_gib", "capability", "nvidia_smi", "torch", "torch_cuda", "torch_geometric",
            "pyg_torch_sparse", "triton", "gnnscale_triton_available", "cupy", "numpy", "scipy", "pymetis",
            "cpu_model", "cpu_count", "host_memory_gib", "python", "gnnscale_rev"]
    env = facts.get("env", {})
    return _table(["fact", "value"], [[k, f"`{env[k]}`"] for k in keys if k in env])


def summarize_tests(facts: dict[str, Any]) -> list[str]:
    c = facts.get("counts", {})
    kinds = ["collected", "passed", "failed", "error", "skipped", "deselected"]
    lines = _table(kinds, [[str(c.get(k, "-")) for k in kinds]])
    if facts.get("failed_tests"):
        lines += ["", "Failed: " + ", ".join(f"`{t}`" for t in facts["failed_tests"])]
    return lines


def summarize_gather(records: list[dict[str, Any]]) -> list[str]:
    rows = []
    for r in records:
        base = next((b for b in records if b["features"] == r["features"] and b["method"] == "bulk"), None)
        rows.append([str(r["features"]), r["label"], r["order"], _f(r["median_ms"], ".2f"), _f(r["gbps"], ".2f"),
                     _f(r["gbps"] / base["gbps"] if base and base["gbps"] else None, ".2f"),
                     "ok" if r["correct"] else "MISMATCH"])
    return _table(["F", "method", "ids", "median ms", "GB/s", "/ bulk", "check"], rows)


def _h2d(r: dict[str, Any]) -> str:
    """H2D GB per epoch: rows / topology / index when the engine splits them, else the total."""
    if r.get("h2d_bytes") is None:
        return "-"
    parts = [r.get(k) for k in H2D_PARTS]
    total = f"{r['h2d_bytes'] / 1e9:.3f}"
    if any(p is not None for p in parts):
        return total + " (" + " / ".join(_f(None if p is None else p / 1e9) for p in parts) + ")"
    return total


def ratio(r: dict[str, Any], base: dict[Any, float]) -> float | None:
    """``r``'s epoch time over the in-memory engine's of the same model (the offload benchmark stores none)."""
    b = base.get(r.get("model"))
    return None if not b else r["median_epoch_s"] / b


def summarize_offload(records: list[dict[str, Any]]) -> list[str]:
    rows = []
    base = {r.get("model"): r["median_epoch_s"] for r in records
            if r.get("impl") == "inmemory" and r.get("status") == "ok"}
    for r in records:
        budget = str(r.get("budget_spec") or "")
        label = r["impl"] + (f" {budget}" + (" GiB" if budget.replace(".", "").isdigit() else "") if budget else "")
        if r.get("status") != "ok":
            rows.append([label, "-", r.get("status", "?") + ": " + str(r.get("reason", ""))[:80]] + ["-"] * 7)
            continue
        rows.append([label, str(r.get("chunks", "-")), _f(r["median_epoch_s"]),
                     _f(r.get("ratio_vs_inmemory", ratio(r, base)), ".2f"),
                     _f(r.get("ratio_vs_pyg"), ".2f"), _h2d(r), _f(r.get("h2d_GBps"), ".2f"),
                     _f(None if r.get("peak_bytes") is None else r["peak_bytes"] / 2**20, ".0f"),
                     _f(r.get("h2d_over_ori"), ".3f"), _f(r.get("final_loss"), ".4f")])
    head = ["impl", "chunks", "median epoch (s)", "/ inmemory", "/ pyg", "H2D GB/epoch (rows / topology / index)",
            "H2D GB/s", "peak MiB", "h2d/ori", "loss"]
    lines = _table(head, rows)
    if records:
        r0 = records[0]
        lines += ["", f"Graph `{r0.get('dataset')}`: {r0.get('nodes')} vertices, {r0.get('edges')} edges; "
                  f"PyG baseline: `{r0.get('pyg_baseline')}`; device `{r0.get('device_name')}`."]
    return lines


def summarize_minibatch(records: list[dict[str, Any]]) -> list[str]:
    samplers = [r for r in records if r.get("kind") == "sampler"]
    lines: list[str] = []
    if samplers:
        lines += _table(["sampler (one epoch's batches)", "s", "MTEPS", "entries / sampled", "ours faster by"],
                        [[r["sampler"], _f(r["median_sample_s"]), _f(r["mteps"], ".1f"),
                          _f(r["read_amplification"], ".2f"), _f(r["ours_speedup"], ".2f")] for r in samplers])
        lines.append("")
    rows = []
    for r in (r for r in records if r.get("kind") != "sampler"):
        head = [_f(r.get("gpu_feature_ratio"), "g")]
        if r.get("status") != "ok":
            rows.append(head + [r.get("status", "?") + ": " + str(r.get("reason", ""))[:80]] + ["-"] * 8)
            continue
        rows.append(head + [_f(r["median_epoch_s"]), _f(r["median_epoch_s"] / XGNN_EPOCH_S, ".2f"),
                            _f(r.get("median_sample_s")), _f(r.get("median_extract_s")), _f(r.get("median_train_s")),
                            _f(r.get("mteps"), ".1f"), _f(r.get("feature_hit_rate"), ".3f"),
                            _f(r["h2d_bytes"] / 1e6, ".1f"), str(r.get("batches", "-"))])
    head = ["GPU feature ratio", "median epoch (s)", f"/ {XGNN_EPOCH_S} s (XGNN)", "sample s", "extract s",
            "train s", "MTEPS", "feature hit", "H2D MB", "batches"]
    return lines + _table(head, rows)


def summarize_taskparallel(records: list[dict[str, Any]]) -> list[str]:
    engines = [r for r in records if r.get("kind") == "engine"]
    rows = [[r.get("engine", "?"), r.get("model", "?"), str(len(r.get("devices") or [])),
             _f(r.get("mean_epoch_s")), _f(r.get("min_epoch_s")),
             ", ".join(f"{b / 2**20:.1f}" for b in r.get("device_peak_bytes") or []) or "-",
             _f(r.get("final_loss"), ".4f")] for r in engines]
    lines = _table(["engine", "model", "devices", "mean epoch (s)", "min (s)", "per-device peak MiB", "loss"], rows)
    reps = [r for r in records if r.get("kind") == "replication"]
    if reps:
        lines += [""] + _table(
            ["parts", "data-parallel alpha", "NeutronTask Table 2", "P group", "P-group alpha"],
            [[str(r["parts"]), _f(r.get("data_parallel_replication"), ".2f"),
              _f(r.get("neutrontask_table2_papers100m"), ".2f"), str(r.get("p_group_size", "-")),
              _f(r.get("p_group_replication"), ".2f")] for r in reps])
    return lines


def summarize_hybrid(records: list[dict[str, Any]]) -> list[str]:
    rows = [[r["devices"], ", ".join(f"{s:.3f}" for s in r["split"]), _f(r["predicted_epoch_s"]),
             _f(r["measured_epoch_s"]), _f(100 * r["error"], "+.1f"), _f(r.get("mteps"), ".1f"),
             _f(r["hybrid_over_minibatch"], ".2f")] for r in records if r.get("kind") == "model"]
    lines = _table(["devices", "split", "predicted epoch (s)", "measured (s)", "error %", "MTEPS",
                    "/ minibatch"], rows)
    for r in (r for r in records if r.get("kind") == "drm"):
        sweep = ", ".join(f"{k}: {v:.3f}" for k, v in r["sweep"].items())
        lines += ["", f"static CPU shares (s per epoch): {sweep}; DRM from 0.5 settled by iteration "
                      f"{r['settled_iteration']} at CPU share {r['drm_final_share']:.3f}, last epoch "
                      f"{r['drm_epoch_times'][-1]:.3f} s = {r['drm_last_over_best']:.2f}x the best static split"]
    return lines


def summarize_engines(records: list[dict[str, Any]]) -> list[str]:
    rows = []
    for r in records:
        devices = ",".join(r.get("devices") or []) or r.get("device", "?")
        if r.get("ranks"):
            devices += f" ({r['ranks']} rank{'s' if r['ranks'] > 1 else ''})"
        losses = ", ".join(f"{x:.6f}" for x in r.get("device_losses") or []) or "-"
        cpu = ", ".join(f"{x:.6f}" for x in r.get("cpu_losses") or []) or "-"
        rows.append([r.get("engine", "?"), r.get("model", "?"), devices, losses, cpu, _f(r.get("max_diff"), ".2e"),
                     _f(r.get("device_s"), ".1f"), _f(r.get("cpu_s"), ".1f"), r.get("status", "?")])
    lines = _table(["engine", "model", "devices", "device losses", "CPU losses", "max diff", "device s", "CPU s",
                    "status"], rows)
    if records:
        lines += ["", f"Equal when |device - CPU| <= {records[0].get('tol')} x max(1, |CPU|) at every epoch; graph "
                      f"`csbm {records[0].get('graph')}`."]
    for r in records:
        if r.get("traceback"):
            lines += ["", f"{r['engine']} raised:", "", "```", r["traceback"].rstrip(), "```"]
    return lines


def summarize_mover(records: list[dict[str, Any]]) -> list[str]:
    rows = [[r["method"], _f(r["bytes"] / 1e6, ".1f"), _f(r["seconds"] * 1e3, ".2f"), _f(r.get("gbps"), ".2f"),
             _f(r.get("over_pinned_copy"), ".2f"), "ok" if r["exact"] and r["counted_ok"] else "WRONG"]
            for r in records]
    lines = _table(["host -> device", "MB per pass", "median ms", "GB/s", "/ pinned copy", "check"], rows)
    if records:
        r0 = records[0]
        lines += ["", f"Pinned table of {r0['rows_total']} x {r0['features']} float32 on `{r0['device']}`, "
                      f"{r0['pieces']} pieces per pass."]
    return lines


SUMMARIZERS: dict[str, Callable[[list[dict[str, Any]]], list[str]]] = {
    "engines": summarize_engines, "mover": summarize_mover, "gather": summarize_gather,
    "offload": summarize_offload, "minibatch": summarize_minibatch, "taskparallel": summarize_taskparallel,
    "hybrid": summarize_hybrid}


def step_records(out: Path, s: Step) -> list[dict[str, Any]]:
    """A step's records: embedded in its result (``embed``), else its file under OUT."""
    if s.embed:
        return list(s.result.get("data", []))
    return read_records(out / s.jsonl) if s.jsonl else []


def write_summary(out: Path, steps: list[Step], header: list[str]) -> str:
    lines = [*header, ""]
    lines += _table(["step", "status", "seconds", "limit (s)", "what"],
                    [[s.name, s.result.get("status", NOT_RUN), _f(s.result.get("seconds"), ".1f"),
                      _f(s.result.get("timeout_s"), ".0f"), s.what] for s in steps])
    for s in steps:
        res = s.result
        lines += ["", f"## {s.name}: {res.get('status', NOT_RUN)}", "", "```", shlex.join(s.argv), "```", ""]
        if not res or res.get("status") == DEADLINE:
            continue
        if res.get("note"):
            lines += [res["note"], ""]
        try:  # a record missing a field must not cost the summary of the other steps
            if s.name == "env":
                lines += summarize_env(res)
            elif s.name == "tests":
                lines += summarize_tests(res)
            elif s.name == "distributed":
                lines += [f"- {ln}" for ln in res.get("lines", [])] or ["(no output lines)"]
            elif s.jsonl:
                recs = step_records(out, s)
                good = [r for r in recs if r.get("ok", True)]  # the harness's record of a case that raised: ok false
                lines += [f"Case `{r.get('case')}` failed: {r.get('error')}" for r in recs if not r.get("ok", True)]
                lines += SUMMARIZERS[s.name](good) if good else ["(no records)"]
        except Exception as exc:  # noqa: BLE001
            lines += [f"(summary of this step failed: {type(exc).__name__}: {exc}; see {s.jsonl or 'steps.jsonl'})"]
        if res.get("status") != "ok":
            if res.get("traceback"):
                lines += ["", "Traceback:", "", "```", res["traceback"], "```"]
            elif res.get("tail"):
                lines += ["", "Last lines of its output:", "", "```", res["tail"], "```"]
    text = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(text)
    return text
