"""A model of the user's, named on the command line: ``--model-factory module:function``.

The function is called as ``function(in_features, num_classes)`` and returns a :class:`~gnnscale.nn.Stack` or a
PyG ``BasicGNN``. Naming it imports ``module``: that is code the user chose to run, as ``python module.py`` would
be. A saved model keeps the factory's *name* only; nothing that loads a file ever imports a module the file names
(``predict`` rebuilds the model through a factory the user names again).
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from gnnscale.errors import ConfigError
from gnnscale.nn.stack import Stack, as_stack

SPEC = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")
"""``module.path:function`` (dotted names; the function may be an attribute path such as ``Class.build``)."""


def check_spec(spec: str) -> None:
    """A :class:`~gnnscale.errors.ConfigError` unless ``spec`` reads ``module:function``."""
    if not SPEC.match(spec):
        raise ConfigError(f"--model-factory must be module:function (a module you can import and a function in "
                          f"it), got {spec!r}")


def load_factory(spec: str) -> Callable[..., Any]:
    """The function ``spec`` (``module:function``) names, its module imported (from the working directory too,
    as ``python -m`` would); one :class:`~gnnscale.errors.ConfigError` line when it cannot be."""
    check_spec(spec)
    module_name, attr = spec.split(":")
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 -- the user's module: any error it raises, in one line
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise ConfigError(f"--model-factory {spec}: cannot import {module_name} ({type(exc).__name__}: {first})"
                          ) from None
    finally:
        if added:
            sys.path.remove(cwd)
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ConfigError(f"--model-factory {spec}: {module_name} has no {attr}")
        target = getattr(target, part)
    if not callable(target):
        raise ConfigError(f"--model-factory {spec}: {attr} is not a function")
    return target  # type: ignore[no-any-return]


def build_from_factory(spec: str, in_features: int, num_classes: int, seed: int) -> Stack:
    """The model ``spec``'s function makes for ``in_features`` and ``num_classes``, its initial weights drawn
    under ``seed`` (the same weights in every process of a job, and every run with that seed)."""
    factory = load_factory(spec)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            model = factory(in_features, num_classes)
        except Exception as exc:  # noqa: BLE001 -- the user's function: its error in one line
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise ConfigError(f"--model-factory {spec} failed for {in_features} features and {num_classes} "
                              f"classes ({type(exc).__name__}: {first})") from None
    if not isinstance(model, nn.Module):
        raise ConfigError(f"--model-factory {spec} returned {type(model).__name__}, not a model (a "
                          "gnnscale.nn.Stack or a PyG BasicGNN)")
    return as_stack(model)
