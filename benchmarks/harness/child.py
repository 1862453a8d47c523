"""One case in its own process: ``python -m benchmarks.harness.child SPEC.json RESULT.json``.

``SPEC`` holds ``module``, ``params`` and ``threads``. The child sets torch's thread count (``OMP_NUM_THREADS``
and ``MKL_NUM_THREADS`` are already set by the harness), calls ``module.run(params)`` and writes
``{"ok": true, "records": [...], "versions": {...}, "peak_rss_bytes": ...}`` or ``{"ok": false, "error": ...}``
to ``RESULT``. Standard library only before the module is imported: a peer's own venv runs this file too.
"""

from __future__ import annotations

import importlib
import json
import sys
import traceback
from pathlib import Path
from typing import Any

VERSIONED = {"torch": "torch", "pyg": "torch_geometric", "dgl": "dgl", "numpy": "numpy"}


def versions() -> dict[str, str]:
    """Versions of the libraries of the field this process imported."""
    out = {}
    for key, mod in VERSIONED.items():
        m = sys.modules.get(mod)
        if m is not None and getattr(m, "__version__", None):
            out[key] = str(m.__version__)
    return out


def peak_rss_bytes() -> int | None:
    """The process's peak resident set (``VmHWM``)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def set_threads(threads: int) -> None:
    try:
        import torch
    except ImportError:  # pragma: no cover - a case that needs no torch
        return
    torch.set_num_threads(threads)


def run_case(spec: dict[str, Any]) -> dict[str, Any]:
    set_threads(int(spec.get("threads", 1)))
    try:
        module = importlib.import_module(spec["module"])
        out = module.run(spec.get("params", {}))
    except Exception as exc:  # noqa: BLE001 - recorded as the case's error; the other cases go on
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500], "traceback": traceback.format_exc(),
                "versions": versions()}
    records = out if isinstance(out, list) else [out]
    return {"ok": True, "records": records, "versions": versions(), "peak_rss_bytes": peak_rss_bytes()}


def main(argv: list[str]) -> int:
    spec_path, result_path = Path(argv[0]), Path(argv[1])
    result = run_case(json.loads(spec_path.read_text()))
    result_path.write_text(json.dumps(result, default=str))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
