"""docs/own-model.md ("Bring your own model", issue #45) runs: an example that drifts from the code fails here.

- Every ```python block runs, in order, in one namespace (they build on each other), as a reader would paste them.
- The factory module the page shows (the block that starts ``# mymodels.py``) is written out as that file and
  trained through ``TrainConfig(model_factory="mymodels:make")``, as ``--model-factory`` imports it.
- Every ``gnnscale`` command on the page parses with the CLI's own parser, and every ``--model-factory`` it
  passes names a function of a module the page shows.
- The page is in the Sphinx toctree, and README.md points to it.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from doc_examples import argv, blocks, commands, flags_of, mentions, parse, run_python

import gnnscale as gs
from gnnscale.nn import Stack

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "own-model.md"
TEXT = GUIDE.read_text()
MODULE = re.compile(r"\A# (\w+)\.py\n")
"""The first line of a block that is a module of the reader's (written out as that file)."""


def modules() -> dict[str, str]:
    """The modules the page shows: name -> source."""
    return {m.group(1): body for body in blocks(TEXT, "python") if (m := MODULE.match(body))}


def test_the_guide_has_examples_to_check() -> None:
    assert len(blocks(TEXT, "python")) >= 5
    assert "mymodels" in modules()
    found = commands(TEXT)
    assert len(found) >= 3 and any("predict" in c for c in found)


@pytest.mark.parametrize("command", commands(TEXT))
def test_every_guide_command_parses(command: str) -> None:
    parse(command, "docs/own-model.md")


@pytest.mark.parametrize("mention", mentions(TEXT))
def test_every_flag_named_inline_exists(mention: str) -> None:
    args = argv(mention)
    unknown = [w.split("=")[0] for w in args[1:] if w.startswith("--") and w.split("=")[0] not in flags_of(args[0])]
    assert not unknown, f"docs/own-model.md mentions `{mention}`: {args[0]} has no {unknown}"


@pytest.mark.parametrize("command", [c for c in commands(TEXT) if "--model-factory" in c])
def test_every_factory_named_is_on_the_page(command: str) -> None:
    args = argv(command)
    spec = args[args.index("--model-factory") + 1]
    module, function = spec.split(":")
    source = modules().get(module)
    assert source is not None, f"{command!r} names {module}, which the page does not show (a '# {module}.py' block)"
    assert re.search(rf"^def {function}\(in_features, num_classes\)", source, re.M), \
        f"{module}.py on the page has no {function}(in_features, num_classes)"


def test_the_guide_is_in_the_toctree_and_the_readme_points_to_it() -> None:
    index = (ROOT / "docs" / "index.rst").read_text()
    assert re.search(r"^   own-model$", index, re.M), "docs/index.rst's Guides toctree misses own-model"
    assert "docs/own-model.md" in (ROOT / "README.md").read_text()


@pytest.mark.usefixtures("one_thread")
def test_the_python_examples_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)  # where a reader's mymodels.py is: --model-factory imports from the working folder
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    namespace: dict[str, object] = {"__name__": "own_model_guide"}
    run_python(blocks(TEXT, "python"), "docs/own-model.md", namespace)
    graph = namespace["graph"]
    assert isinstance(graph, gs.Graph)
    for name, source in modules().items():
        (tmp_path / f"{name}.py").write_text(source)
    sys.modules.pop("mymodels", None)
    try:
        cfg = gs.TrainConfig(model_factory="mymodels:make", engine="offload", memory_budget="4MB", epochs=1)
        result = gs.train(graph, cfg, device="cpu")
    finally:
        sys.modules.pop("mymodels", None)
    assert isinstance(result.model, Stack) and result.engine == "offload"
    assert result.model.block_layers[0].in_features == graph.num_features
