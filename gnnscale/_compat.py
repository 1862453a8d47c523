"""Optional dependencies, probed once (PyG ``typing.py`` style).

A missing one raises ImportError naming the pip package at use, never at import of gnnscale.
"""

from __future__ import annotations

import importlib.util
import warnings
from typing import Any

# torch's sparse CSR support prints beta warnings on every construction; they are noise for our users.
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")
# PyG warns when optional compiled extensions (torch-scatter, ...) are absent; we do not need them.
warnings.filterwarnings("ignore", message="An issue occurred while importing")

WITH_PYG = importlib.util.find_spec("torch_geometric") is not None
WITH_PYMETIS = importlib.util.find_spec("pymetis") is not None
WITH_TQDM = importlib.util.find_spec("tqdm") is not None
# run reports (gnnscale.report) draw PNGs with it; the pip extra is gnnscale[report]
WITH_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def require(module: str, pip_name: str | None = None) -> Any:
    """Import ``module`` or raise ImportError telling the user what to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - exercised only when a dependency is missing
        raise ImportError(
            f"gnnscale needs '{pip_name or module}' for this feature: pip install {pip_name or module}"
        ) from exc
