import os

import pytest

import gnnscale._compat  # noqa: F401  (warning filters)


@pytest.fixture(autouse=True, scope="session")
def _plan_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Partition plans go to a per-run folder, never to the user's ~/.cache (subprocesses inherit it)."""
    os.environ["GNNSCALE_CACHE_DIR"] = str(tmp_path_factory.mktemp("gnnscale-cache"))
