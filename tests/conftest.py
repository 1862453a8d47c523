import gc
import os
from collections.abc import Iterator

import pytest
import torch

import gnnscale._compat  # noqa: F401  (warning filters)
import gnnscale.runtime as rt


@pytest.fixture(autouse=True, scope="session")
def _plan_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Partition plans go to a per-run folder, never to the user's ~/.cache (subprocesses inherit it)."""
    os.environ["GNNSCALE_CACHE_DIR"] = str(tmp_path_factory.mktemp("gnnscale-cache"))


@pytest.fixture
def sims(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[rt.SimDevice]]:
    """The process's sim devices ``sim:0 .. sim:2`` (what ``--devices sim:0,sim:1`` names), counts reset."""
    monkeypatch.setenv(rt.SIM_DEVICES_ENV, "3")
    devices = [rt.sim_device(i) for i in range(3)]
    gc.collect()  # earlier tests' engines give their device memory back
    rt.reset_counts()
    yield devices
    gc.collect()


# ``--cuda-only``: keep the tests that exercise a CUDA device (what `make gpu-check` runs on a lent GPU): those
# parametrised with a cuda ``device`` (``gnnscale.testing.with_device``), those skipped without CUDA
# (``gnnscale.testing.only_cuda`` or any skipif whose reason names CUDA) and those whose id names cuda.
@pytest.fixture
def one_thread() -> Iterator[None]:
    """Torch at one thread for the test (the CPU kernels of ``runtime.cpu_kernels`` run there; at more threads
    the CSR product stays MKL's, on torch's own workers), restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cuda-only", action="store_true", help="run only the tests that use a CUDA device")


def is_cuda_test(item: pytest.Item) -> bool:
    params = getattr(getattr(item, "callspec", None), "params", {})
    if str(params.get("device", "")).startswith("cuda"):
        return True
    if "cuda" in item.name.lower():
        return True
    return any("cuda" in str(m.kwargs.get("reason", "")).lower() for m in item.iter_markers("skipif"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--cuda-only"):
        return
    keep = [i for i in items if is_cuda_test(i)]
    config.hook.pytest_deselected(items=[i for i in items if not is_cuda_test(i)])
    items[:] = keep
