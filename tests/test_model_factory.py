"""A model of the user's by name (issue #45): ``--model-factory module:function`` trains, saves, plans and
predicts through the CLI; a saved model keeps the factory's name and predict builds it only through a factory
named again (one error line without it, or with one that cannot be imported or whose model the weights do not
fit; a warning when the name differs); loading a file never imports a module the file names."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from gnnscale import Block, TrainConfig, load_model, predict, save_model, train
from gnnscale.checkpoint import load_checkpoint, save_checkpoint
from gnnscale.cli import main
from gnnscale.errors import ConfigError
from gnnscale.graph.datasets import load_dataset
from gnnscale.launcher import _read_result
from gnnscale.nn import GCNLayer, Stack, build_model
from gnnscale.nn.factory import build_from_factory

SPEC = "csbm:nodes=300,features=8"
MODULE = "gsf_models"
"""The test's factory module, written into its tmp_path (the working folder, where --model-factory imports from)."""
FACTORIES = '''
from gnnscale.nn import SAGELayer, Stack


def make(in_features, num_classes):
    return Stack([SAGELayer(in_features, 16), SAGELayer(16, num_classes)], dropout=0.2)


def same(in_features, num_classes):  # another name, the same model
    return make(in_features, num_classes)


def wider(in_features, num_classes):  # weights of other shapes
    return Stack([SAGELayer(in_features, 32), SAGELayer(32, num_classes)])
'''
EVIL = "evil_marker_mod"
EVIL_SOURCE = '''
from pathlib import Path

Path(__file__).with_name("IMPORTED").write_text("a saved model ran this module")


def make(in_features, num_classes):
    raise AssertionError("never called")
'''


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``tmp_path`` as the working folder and on ``sys.path``, holding the factory module and the evil one; both
    forgotten by ``sys.modules`` afterwards."""
    (tmp_path / f"{MODULE}.py").write_text(FACTORIES)
    (tmp_path / f"{EVIL}.py").write_text(EVIL_SOURCE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in (MODULE, EVIL):
        sys.modules.pop(name, None)


def _one_error(capsys: pytest.CaptureFixture[str], *words: str) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for w in words:
        assert w in err, err
    return err


def _predictions_of(model: Stack, state: dict[str, torch.Tensor], spec: str = SPEC) -> np.ndarray:
    g = load_dataset(spec)
    model.load_state_dict(state)
    with torch.no_grad():
        return model.eval()(Block.from_graph(g, model.adjacency), g.x).argmax(-1).numpy()


def test_model_factory_trains_saves_and_predicts_through_the_cli(here: Path, capsys: pytest.CaptureFixture[str]
                                                                 ) -> None:
    metrics, saved = here / "run.jsonl", here / "m.pt"
    assert main(["train", "--dataset", SPEC, "--epochs", "2", "--device", "cpu", "--quiet",
                 "--model-factory", f"{MODULE}:make", "--save-model", str(saved), "--metrics", str(metrics)]) == 0
    out = capsys.readouterr().out
    assert f"model stack (--model-factory {MODULE}:make)" in out and f"--model-factory {MODULE}:make)" in out
    summary = json.loads(metrics.read_text().splitlines()[-1])
    assert (summary["model"], summary["model_factory"]) == ("stack", f"{MODULE}:make")
    assert summary["config"]["model_factory"] == f"{MODULE}:make"
    # what the API trains from the same config: the CLI saved that model's best weights
    g = load_dataset(SPEC)
    res = train(g, TrainConfig(model_factory=f"{MODULE}:make", epochs=2), "cpu")
    net, config = load_model(saved, f"{MODULE}:make")
    assert config.model_factory == f"{MODULE}:make"
    for k, v in net.state_dict().items():
        assert torch.equal(v, res.best_state[k]), k
    want = _predictions_of(build_from_factory(f"{MODULE}:make", 8, g.num_classes or 0, 0), res.best_state)

    assert main(["predict", "--dataset", SPEC, "--model", str(saved), "--out", str(here / "p.npy"), "--device", "cpu",
                 "--model-factory", f"{MODULE}:make"]) == 0
    assert capsys.readouterr().err == ""
    assert (np.load(here / "p.npy") == want).all()
    # another name for a model the weights fit: a warning, and the same predictions
    assert main(["predict", "--dataset", SPEC, "--model", str(saved), "--out", str(here / "q.npy"), "--device", "cpu",
                 "--model-factory", f"{MODULE}:same"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("warning: ") and err.count("\n") == 1 and f"built by {MODULE}:make" in err, err
    assert (np.load(here / "q.npy") == want).all()


@pytest.mark.parametrize(("factory", "words"), [
    (None, ["holds a model built by --model-factory gsf_models:make", "name it again", "never imports"]),
    ("no_such_module_45:make", ["--model-factory no_such_module_45:make: cannot import no_such_module_45"]),
    (f"{MODULE}:missing", [f"{MODULE} has no missing"]),
    ("not a spec", ["--model-factory must be module:function"]),
    (f"{MODULE}:wider", ["its weights do not fit the model --model-factory gsf_models:wider builds",
                         "[16, 8] in the file, [32, 8] in the model", "it was built by gsf_models:make"]),
])
def test_predict_without_a_usable_factory_is_one_error_line(here: Path, capsys: pytest.CaptureFixture[str],
                                                            factory: str | None, words: list[str]) -> None:
    g = load_dataset(SPEC)
    config = TrainConfig(model_factory=f"{MODULE}:make", epochs=1)
    model = build_from_factory(f"{MODULE}:make", g.num_features, g.num_classes or 0, 0)
    saved = save_model(here / "m.pt", model, config, g)
    out = here / "p.npy"
    flag = [] if factory is None else ["--model-factory", factory]
    assert main(["predict", "--dataset", SPEC, "--model", str(saved), "--out", str(out), *flag]) == 2
    _one_error(capsys, *words)
    assert not out.exists()


def test_a_saved_model_never_imports_the_module_it_names(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g = load_dataset(SPEC)
    model = build_from_factory(f"{MODULE}:make", g.num_features, g.num_classes or 0, 0)
    evil = save_model(here / "evil.pt", model, TrainConfig(model_factory=f"{EVIL}:make"), g)  # names it, as data
    out = here / "p.npy"
    assert main(["predict", "--dataset", SPEC, "--model", str(evil), "--out", str(out)]) == 2
    _one_error(capsys, f"--model-factory {EVIL}:make", "name it again")
    with pytest.raises(ConfigError, match="name it again"):
        load_model(evil)
    assert main(["predict", "--dataset", SPEC, "--model", str(evil), "--out", str(out), "--device", "cpu",
                 "--model-factory", f"{MODULE}:make"]) == 0  # built through the factory named now
    err = capsys.readouterr().err
    assert err.startswith("warning: ") and f"built by {EVIL}:make; built through {MODULE}:make" in err, err
    # a built-in model's file with a factory named: ignored (a warning), and not imported either
    gcn = build_model("gcn", g.num_features, 64, g.num_classes or 0, **TrainConfig().model_kwargs())
    builtin = save_model(here / "gcn.pt", gcn, TrainConfig(), g)
    net, config = load_model(builtin, f"{EVIL}:make")
    assert config.model_factory is None and net.kind == "gcn"
    assert f"--model-factory {EVIL}:make is ignored" in capsys.readouterr().err
    # a checkpoint whose config names it: resuming names it, and never imports it
    ck = here / "ck"
    train(g, TrainConfig(model_factory=f"{MODULE}:make", epochs=1), "cpu", checkpoint=ck)
    state = load_checkpoint(ck)
    assert state is not None
    save_checkpoint(ck, {**state, "config": {**state["config"], "model_factory": f"{EVIL}:make"}})
    assert main(["train", "--dataset", SPEC, "--epochs", "2", "--device", "cpu", "--quiet", "--checkpoint", str(ck),
                 "--resume"]) == 2
    _one_error(capsys, f"name it again with --model-factory {EVIL}:make")
    assert main(["train", "--dataset", SPEC, "--epochs", "2", "--device", "cpu", "--quiet", "--checkpoint", str(ck),
                 "--resume", "--model-factory", f"{MODULE}:make"]) == 2
    _one_error(capsys, f"--model-factory {EVIL}:make -> {MODULE}:make")
    assert not (here / "IMPORTED").exists() and EVIL not in sys.modules
    importlib.import_module(EVIL)  # what importing it would have done: the test can see it
    assert (here / "IMPORTED").exists()


def test_resume_names_the_factory_again(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g = load_dataset(SPEC)
    ck = here / "ck"
    config = TrainConfig(model_factory=f"{MODULE}:make", epochs=1)
    first = train(g, config, "cpu", checkpoint=ck)
    more = TrainConfig(model_factory=f"{MODULE}:make", epochs=2)
    for changed, words in ((TrainConfig(epochs=2), "name it again with --model-factory gsf_models:make"),
                           (TrainConfig(model_factory=f"{MODULE}:same", epochs=2),
                            "--model-factory gsf_models:make -> gsf_models:same")):
        with pytest.raises(ConfigError, match=words):
            train(g, changed, "cpu", checkpoint=ck, resume=True)
    assert main(["train", "--dataset", SPEC, "--epochs", "2", "--device", "cpu", "--quiet", "--checkpoint", str(ck),
                 "--resume"]) == 2
    _one_error(capsys, "--resume", "name it again with --model-factory gsf_models:make")
    # the config's model fields do not apply to the factory's model: changing one does not stop the resume
    rest = train(g, TrainConfig(model_factory=f"{MODULE}:make", epochs=2, hidden=7), "cpu", checkpoint=ck,
                 resume=True)
    assert rest.summary["resumed_from_epoch"] == 1 and "hidden=7" in capsys.readouterr().err
    whole = train(g, more, "cpu")
    assert rest.history[-1]["loss"] == pytest.approx(whole.history[-1]["loss"])
    net, _ = load_model(ck / "model.pt", f"{MODULE}:make")  # the checkpoint's model.pt too
    for k, v in net.state_dict().items():
        assert torch.equal(v, rest.best_state[k]), k
    assert first.summary["model_factory"] == f"{MODULE}:make"


def test_a_model_given_to_train_is_saved_and_loaded_through_a_named_factory(here: Path) -> None:
    g = load_dataset(SPEC)
    classes = g.num_classes or 0
    torch.manual_seed(3)
    mine = Stack([GCNLayer(g.num_features, 24), GCNLayer(24, classes)], dropout=0.1)
    config = TrainConfig(epochs=2)
    res = train(g, config, "cpu", model=mine)
    assert (res.summary["model"], res.summary["model_factory"]) == ("stack", None)
    path = save_model(here / "mine.pt", res.model, config, g, res.best_state)
    with pytest.raises(ConfigError, match=r"a model of your own \(trained with train\(model=...\)\)"):
        load_model(path)  # its config's gcn is not the model: nothing is built from it
    (here / "mine_factory.py").write_text(
        "from gnnscale.nn import GCNLayer, Stack\n\n\n"
        "def make(f, c):\n    return Stack([GCNLayer(f, 24), GCNLayer(24, c)], dropout=0.1)\n")
    try:
        net, back = load_model(path, model_factory="mine_factory:make")
        assert back.model_factory == "mine_factory:make"
        for k, v in net.state_dict().items():
            assert torch.equal(v, res.best_state[k]), k
        got = predict(g, path, "cpu", model_factory="mine_factory:make")
        assert (got.numpy() == _predictions_of(mine, res.best_state)).all()
    finally:
        sys.modules.pop("mine_factory", None)
    # a built-in model given to train is saved as one: it loads from its config, with no factory
    gcn = build_model("gcn", g.num_features, 64, classes, **config.model_kwargs())
    built_in = train(g, config, "cpu", model=gcn)
    net, back = load_model(save_model(here / "gcn.pt", built_in.model, config, g))
    assert net.kind == "gcn" and back.model_factory is None


def test_plan_prices_the_factory_model(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--dataset", SPEC, "--device", "cpu", "--json"]
    assert main(argv) == 0
    builtin = {c["name"]: c for c in json.loads(capsys.readouterr().out)["candidates"]}
    assert main([*argv, "--model-factory", f"{MODULE}:make"]) == 0
    own = {c["name"]: c for c in json.loads(capsys.readouterr().out)["candidates"]}
    assert "not gcn" in " ".join(builtin["taskparallel"]["reasons"])
    assert "not a Stack of layers" in " ".join(own["taskparallel"]["reasons"])  # the factory's model was planned
    assert main(["plan", "--dataset", SPEC, "--device", "cpu", "--model-factory", "no_such_module_45:make"]) == 2
    _one_error(capsys, "cannot import no_such_module_45")


def test_launch_reads_rank_zeros_factory_model_back(here: Path) -> None:
    """``gnnscale.launch``'s parent builds the result's model as the ranks did: through the factory."""
    g = load_dataset(SPEC)
    config = TrainConfig(model_factory=f"{MODULE}:make", epochs=1)
    trained = build_from_factory(f"{MODULE}:make", g.num_features, g.num_classes or 0, 5)  # other weights
    records = {"history": [], "summary": {}, "engine": "distributed", "num_features": g.num_features,
               "num_classes": g.num_classes}
    path = here / "result.pt"
    torch.save({"records": json.dumps(records), "model": trained.state_dict(), "best_state": {}}, path)
    result = _read_result(path, config)
    assert result.model.kind == "stack"
    for k, v in result.model.state_dict().items():
        assert torch.equal(v, trained.state_dict()[k]), k
