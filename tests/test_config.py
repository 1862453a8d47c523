"""``TrainConfig`` documents itself: ``help(gnnscale.TrainConfig)`` shows every field with its meaning, and the
registry checks engine names and each engine's own options when a config is made."""

from __future__ import annotations

import pydoc
from dataclasses import fields

import pytest

from gnnscale import ConfigError, TrainConfig
from gnnscale.config import field_docs


def test_every_field_has_a_docstring() -> None:
    docs = field_docs(TrainConfig)
    missing = [f.name for f in fields(TrainConfig) if len(docs.get(f.name, "")) < 10]
    assert missing == []


def test_help_shows_each_field_with_its_meaning() -> None:
    text = pydoc.render_doc(TrainConfig, renderer=pydoc.plaintext)
    assert "lr: float = 0.01" in text and "Adam learning rate" in text
    for f in fields(TrainConfig):
        assert f"    {f.name}: " in text, f.name
    assert "(undocumented)" not in text


def test_the_registry_checks_engine_names_and_options() -> None:
    with pytest.raises(ConfigError, match="unknown engine 'nope'"):
        TrainConfig(engine="nope")
    with pytest.raises(ConfigError, match="--fanouts has 3 value"):
        TrainConfig(engine="minibatch", fanouts=(5, 5, 5))
    with pytest.raises(ConfigError, match="--eval-fanouts has 1 value"):
        TrainConfig(engine="minibatch", eval_fanouts=(5,))
    TrainConfig(engine="inmemory", fanouts=(5, 5, 5))  # an engine that does not sample leaves them alone
