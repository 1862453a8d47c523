"""User-facing errors.

Everything a user can cause with bad input (a flag, a file, a graph, a budget) raises a subclass of
:class:`GnnscaleError`. The CLI turns these into one ``error: ...`` line and exit status 2; anything else is a bug
and keeps its traceback.
"""

from __future__ import annotations


class GnnscaleError(ValueError):
    """Base class of errors caused by user input."""


class GraphError(GnnscaleError):
    """The graph is invalid (ids out of range, shape mismatches, NaN features, ...)."""


class DatasetError(GnnscaleError):
    """A dataset spec is unknown or malformed, or its files are missing or corrupt."""


class ConfigError(GnnscaleError):
    """A configuration value is out of range or inconsistent."""


class EngineError(GnnscaleError):
    """No engine can run the requested configuration; the message lists every engine and why."""


class TrainingError(GnnscaleError):
    """Training cannot go on (a loss that is no longer finite); the message says what to try."""


class RankFailure(RuntimeError):
    """A peer rank of a distributed job died, raised or hung: the job cannot go on. The message names the rank.
    Not bad input: the CLI prints it as one ``error:`` line with exit status 1."""
