"""Checkpoints: everything a run needs to go on after it dies, written so that a crash mid-write never costs the
previous one (temporary file in the same folder, fsync, rename, fsync of the folder).

A checkpoint holds the model and optimiser state, the epoch, the best-epoch bookkeeping and weights, the epoch
records so far (a resumed run's metrics file continues the old one), the config, and what the engine declares in
:meth:`gnnscale.engines.core.base.Engine.state_dict`. Dropout masks and sampling are keyed by (seed, epoch), so the
epochs after a resume are the epochs an uninterrupted run would have trained.

Models and checkpoints are files users pass around, so they hold plain data only -- tensors, numbers, strings and
lists, tuples and dicts of them (:func:`plain`) -- and are read with ``torch.load(..., weights_only=True)``: a file
that holds anything else (a pickled object, which could run code while it loads) is refused, never unpickled.

Each file carries a ``checksum`` of its content (:func:`content_digest`: blake2b over every tensor's dtype, shape
and bytes and every value, in order), verified when it loads: a file damaged after it was written (a flipped or
zeroed block, which torch's zip reader does not notice inside a tensor) is refused in one line. Files written
before checksums (no ``checksum`` key) load as they did. Checkpoints and saved models also carry the graph's
``fingerprint`` (:func:`gnnscale.graph.fingerprint.fingerprint`), so a resume on another graph is refused.
"""

from __future__ import annotations

import errno
import hashlib
import os
import pickle
import re
import struct
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gnnscale.config import TrainConfig
from gnnscale.errors import ConfigError
from gnnscale.fsutil import LOCK_OWNER, OutputLock, atomic_file, check_output, lock_output
from gnnscale.graph.fingerprint import PARTS, differing_parts
from gnnscale.nn.factory import SPEC as FACTORY_SPEC

FORMAT = "gnnscale-checkpoint"
VERSION = 1
FILE = "checkpoint.pt"

_REFUSED = re.compile(r"GLOBAL ([\w.]+)")
"""What torch's weights-only unpickler names when it refuses a global (``GLOBAL posix.system``)."""

MODEL_FIELDS = ("model", "layers", "hidden", "heads", "dropout", "lr", "weight_decay", "seed")
"""Config fields that define what is learned: a resume that changes one of them is refused. The engine and its
settings may change (every engine trains the same model)."""
FACTORY_FIELDS = ("model_factory", "lr", "weight_decay", "seed")
"""What defines what is learned when the model comes from ``--model-factory`` (the config's model fields are then
ignored): the factory's name, compared, never imported, and the optimiser's settings and the seed."""


def checkpoint_path(directory: str | os.PathLike[str]) -> Path:
    return Path(directory) / FILE


def check_checkpoint_args(directory: str | os.PathLike[str] | None, every: int, resume: bool) -> None:
    """The checkpoint flags on their own (before any data loads): a folder for --resume, a positive interval, and
    no silent overwrite of an existing checkpoint."""
    if every < 1:
        raise ConfigError(f"--checkpoint-every must be >= 1, got {every}")
    if directory is None:
        if resume:
            raise ConfigError("--resume needs --checkpoint DIR (the folder to resume from)")
        return
    d = check_output(directory, "--checkpoint", folder=True)
    if not resume and checkpoint_path(d).exists():
        raise ConfigError(f"--checkpoint {d} already holds a checkpoint; add --resume to go on from it, or give "
                          "another folder")


def plain(obj: Any, where: str = "") -> Any:
    """``obj`` as what ``torch.load(..., weights_only=True)`` reads: tensors, numbers, strings, ``None`` and lists,
    tuples and dicts of them; numpy arrays become tensors, numpy scalars numbers, paths strings. Anything else is a
    bug of the writer (``TypeError`` naming where it sits)."""
    if obj is None or isinstance(obj, (bool, int, float, str, torch.Tensor, torch.dtype, torch.device, torch.Size)):
        return obj
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.array(obj))
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if isinstance(obj, dict):
        items = {k: plain(v, f"{where}[{k!r}]") for k, v in obj.items()}
        if all(items[k] is obj[k] for k in obj):
            return obj  # unchanged: keeps an OrderedDict's metadata (a state dict's version numbers)
        return items
    if isinstance(obj, (list, tuple)):
        seq = [plain(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        return type(obj)(seq) if isinstance(obj, list) or type(obj) is tuple else tuple(seq)
    raise TypeError(f"cannot save {type(obj).__name__} at {where or 'top level'}: a model or checkpoint holds "
                    "plain data only (weights_only loading)")


def _digest(obj: Any, h: hashlib.blake2b) -> None:
    if obj is None:
        h.update(b"N")
    elif isinstance(obj, bool):
        h.update(b"T" if obj else b"F")
    elif isinstance(obj, int):
        h.update(b"i%d;" % obj)
    elif isinstance(obj, float):
        h.update(b"f" + struct.pack("<d", obj))
    elif isinstance(obj, str):
        data = obj.encode("utf-8", "surrogatepass")
        h.update(b"s%d;" % len(data) + data)
    elif isinstance(obj, torch.Tensor):
        t = obj.detach().to("cpu").contiguous().reshape(-1)  # [numel]
        h.update(f"t{obj.dtype};{tuple(obj.shape)};".encode())
        if t.numel():
            h.update(t.view(torch.uint8).numpy().data)
    elif isinstance(obj, (torch.dtype, torch.device)):
        h.update(f"d{obj};".encode())
    elif isinstance(obj, dict):
        h.update(b"{%d;" % len(obj))
        for k, v in obj.items():
            _digest(k, h)
            _digest(v, h)
    elif isinstance(obj, (list, tuple)):
        h.update(b"%s%d;" % (b"[" if isinstance(obj, list) else b"(", len(obj)))
        for v in obj:
            _digest(v, h)
    else:
        raise TypeError(f"cannot checksum {type(obj).__name__}: not plain data")


def content_digest(obj: Any) -> str:
    """A checksum of the :func:`plain` data ``obj`` (``blake2b-256:HEX``), the same for the object saved and the
    object ``torch.load`` reads back from the file."""
    h = hashlib.blake2b(digest_size=32)
    _digest(obj, h)
    return f"blake2b-256:{h.hexdigest()}"


class _Writes:
    """A file for ``torch.save`` that keeps the ``OSError`` of a failed write: torch's zip writer turns it into a
    ``RuntimeError`` (``[enforce fail at inline_container.cc] unexpected pos``) that names neither the file nor
    the reason (a full disk)."""

    def __init__(self, fh: Any):
        self.fh = fh
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return int(self.fh.write(data))
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        self.fh.flush()


def atomic_save(obj: Any, path: str | os.PathLike[str]) -> Path:
    """``torch.save(obj)`` to ``path`` durably and atomically (:func:`gnnscale.fsutil.atomic_file`), as
    :func:`plain` data; a dict gets its ``checksum`` (:func:`content_digest`). A write that fails (a full disk) is
    an ``OSError``, whatever torch made of it."""
    obj = plain(obj)
    if isinstance(obj, dict):
        obj = {k: v for k, v in obj.items() if k != "checksum"}
        obj["checksum"] = content_digest(obj)
    with atomic_file(path, durable=True) as fh:
        out = _Writes(fh)
        try:
            torch.save(obj, out)  # type: ignore[arg-type]  # a file: write() is all torch's zip writer uses
        except RuntimeError as exc:
            if out.error is not None:
                raise out.error from exc
            if "unexpected pos" in str(exc) or "file write failed" in str(exc):
                raise OSError(errno.EIO, f"torch.save could not write the file ({str(exc).splitlines()[0]})"
                              ) from exc
            raise
    return Path(path)


def save_checkpoint(directory: str | os.PathLike[str], state: dict[str, Any]) -> Path:
    """Write ``state`` to ``directory/checkpoint.pt`` atomically; the previous checkpoint stays whole until the
    new one is on disk."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    return atomic_save({"format": FORMAT, "version": VERSION, **state}, d / FILE)


def load_versioned(path: Path, fmt: str, version: int, kind: str, what: str, hint: str = "") -> dict[str, Any]:
    """A dict written by :func:`atomic_save` with ``format`` ``fmt`` and ``version``: anything else (unreadable,
    another kind of file, another version) is one :class:`ConfigError` starting with ``what`` (the flag and path).
    """
    try:
        with warnings.catch_warnings():  # a raw pickle makes torch warn before it fails: the error below says it
            warnings.simplefilter("ignore")
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = _REFUSED.search(str(exc))
        if found is None:  # not a pickle torch can read at all
            raise ConfigError(f"{what} is not a readable {kind} file ({type(exc).__name__})") from None
        raise ConfigError(f"{what}: refused to load it: the file holds Python objects ({found.group(1)}) besides "
                          f"tensors and plain data, and loading those could run code; a gnnscale {kind} holds none"
                          ) from None
    except Exception as exc:  # noqa: BLE001 -- any unreadable file is the same user-facing problem
        raise ConfigError(f"{what} is not a readable {kind} file ({type(exc).__name__})") from None
    if not isinstance(obj, dict) or obj.get("format") != fmt:
        raise ConfigError(f"{what} is not a gnnscale {kind}{hint}")
    found = obj.get("version")
    if type(found) is not int or found != version:  # (a damaged file may hold anything there: a tensor, a list)
        raise ConfigError(f"{what} has {kind} format version {found!r:.40}; this gnnscale reads {version}")
    if "checksum" in obj:  # files written before checksums have none, and load as they did
        stored = obj.pop("checksum")
        try:
            digest = content_digest(obj)
        except Exception:  # noqa: BLE001 -- content no gnnscale file holds (a sparse tensor): damaged as well
            digest = None
        if stored != digest:
            raise ConfigError(f"{what} is damaged: its content does not match the checksum it was written with (the "
                              f"file changed since); use another copy of the {kind}")
    return obj


def load_checkpoint(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The checkpoint in ``directory``, or ``None`` when there is none yet."""
    path = checkpoint_path(directory)
    if not path.exists():
        return None
    return load_versioned(path, FORMAT, VERSION, "checkpoint", f"--resume: {path}")


def lock_checkpoint(directory: str | os.PathLike[str]) -> OutputLock:
    """This run's lock on the ``--checkpoint`` folder (:func:`gnnscale.fsutil.lock_output`): a second run on the
    same folder is refused while this one lives."""
    return lock_output(checkpoint_path(directory), "--checkpoint", shown=directory)


RESUME_FIELDS: dict[str, type | tuple[type, ...]] = {
    "epoch": int, "config": dict, "dataset": str, "num_nodes": int, "model": dict, "optimizer": dict, "engine": dict,
    "history": list, "best_state": dict}
"""What a resume reads from a checkpoint, with its type (:func:`check_fields`)."""


def check_fields(obj: dict[str, Any], fields: dict[str, type | tuple[type, ...]], what: str, kind: str) -> None:
    """Each of ``fields`` is in ``obj`` with its type: a file that reads but lacks one (damaged, or edited) is one
    :class:`ConfigError` naming the field, not a ``KeyError`` later."""
    for key, typ in fields.items():
        if not isinstance(obj.get(key), typ) or isinstance(obj.get(key), bool) and typ is int:
            raise ConfigError(f"{what} is damaged: its {key!r} entry is missing or not a {_names(typ)}; it is not "
                              f"a {kind} this gnnscale wrote")


def check_resume_records(state: dict[str, Any], what: str) -> None:
    """The epoch records a resume goes on from: ``history`` a list of records (an integer ``epoch``, numbers for
    ``loss``, ``epoch_time_s`` and the accuracies), ``best`` ``None`` or a record of the best epoch (``_val``,
    ``epoch``, ``test_acc``); one ConfigError otherwise."""
    def number(v: Any, none: bool = True) -> bool:
        return type(v) in (float, int) or (none and v is None)

    ok = all(isinstance(r, dict) and type(r.get("epoch")) is int and number(r.get("loss"), none=False)
             and number(r.get("epoch_time_s"), none=False) and all(number(r.get(f"{s}_acc")) and f"{s}_acc" in r
                                                                  for s in ("train", "val", "test"))
             for r in state["history"])
    best = state.get("best")
    ok = ok and (best is None or (isinstance(best, dict) and type(best.get("epoch")) is int and all(
        type(best.get(k)) in (float, int, type(None)) for k in ("_val", "test_acc")) and best.get("_val") is not None))
    if not ok:
        raise ConfigError(f"{what} is damaged: its epoch records (history, best) are not what gnnscale writes")
    if not _settings(state["config"]):
        raise ConfigError(f"{what} is damaged: its config holds values no setting takes")


def _settings(v: Any, depth: int = 0) -> bool:
    """``v`` is made of what a config's fields hold: ``None``, numbers, strings, lists, tuples and dicts of them,
    a few levels deep (a damaged pickle can make a list that holds itself)."""
    if v is None or type(v) in (bool, int, float, str):
        return True
    if depth > 4:
        return False
    if isinstance(v, (list, tuple)):
        return all(_settings(x, depth + 1) for x in v)
    return isinstance(v, dict) and all(type(k) is str and _settings(x, depth + 1) for k, x in v.items())


def check_optimizer_state(optimizer: torch.optim.Optimizer, state: Any, what: str) -> None:
    """``state`` is what ``optimizer.state_dict()`` gives for these parameters: the same parameter groups with
    settings of the same types (finite numbers), and per parameter floating-point tensors of its shape (``step``: one
    value). torch's ``load_state_dict`` takes a damaged one and fails at the next step, mid-epoch; this is one
    ConfigError before training resumes."""
    fresh = optimizer.state_dict()
    params = [p for g in optimizer.param_groups for p in g["params"]]
    ok = (isinstance(state, dict) and set(state) == set(fresh) and isinstance(state.get("state"), dict)
          and isinstance(state.get("param_groups"), list) and len(state["param_groups"]) == len(fresh["param_groups"]))
    if ok:
        ok = all(isinstance(g, dict) and set(g) == set(f) and g["params"] == f["params"]
                 and all(_alike(g[k], f[k]) for k in f if k != "params")
                 for g, f in zip(state["param_groups"], fresh["param_groups"], strict=True))
    names = _state_names(optimizer)
    if ok:
        ok = all(type(i) is int and 0 <= i < len(params) and isinstance(per, dict)
                 and (names is None or set(per) == names) and all(
            isinstance(t, torch.Tensor) and t.dtype.is_floating_point and bool(torch.isfinite(t).all())
            and (t.numel() == 1 if name == "step" else t.shape == params[i].shape) for name, t in per.items())
            for i, per in state["state"].items())
    if not ok:
        raise ConfigError(f"{what} is damaged: its optimiser state is not that of this model's optimiser")


def _state_names(optimizer: torch.optim.Optimizer) -> set[str] | None:
    """The names of the per-parameter state ``optimizer``'s kind keeps (Adam: ``step``, ``exp_avg``,
    ``exp_avg_sq``), from one step of a like optimizer over a probe parameter; ``None`` if that cannot be made."""
    probe = torch.zeros(1, requires_grad=True)
    probe.grad = torch.zeros(1)
    try:
        like = type(optimizer)([probe], **optimizer.defaults)
        like.step()
    except Exception:  # noqa: BLE001 -- an optimiser without that constructor: no names to check
        return None
    return set(like.state[probe])


def _alike(a: Any, b: Any) -> bool:
    """``a`` has ``b``'s type (and shape, for tuples); a number is finite."""
    if type(a) is not type(b):
        return False
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_alike(x, y) for x, y in zip(a, b, strict=True))
    return not isinstance(a, float) or a == a and abs(a) != float("inf")


def _names(typ: type | tuple[type, ...]) -> str:
    return " or ".join(t.__name__ for t in (typ if isinstance(typ, tuple) else (typ,)))


def check_resumable(state: dict[str, Any], config: TrainConfig, dataset: str, num_nodes: int,
                    fingerprint: dict[str, str] | None = None) -> None:
    """Refuse a resume whose config would train a different model, or on another graph (one line naming the
    differing fields): another name or vertex count, or another content (``fingerprint``, the graph's
    :func:`gnnscale.graph.fingerprint.fingerprint`, against the checkpoint's: topology, features, labels or
    split). A checkpoint written before fingerprints is compared by name and vertex count only."""
    old = state["config"]
    new = asdict(config)
    named = old.get("model_factory")
    if named is not None and not (isinstance(named, str) and FACTORY_SPEC.match(named)):
        raise ConfigError(f"--resume: the checkpoint is damaged: its config's model_factory {named!r:.40} is not a "
                          "module:function name")
    if named is not None and config.model_factory is None:
        raise ConfigError(f"--resume: the checkpoint trained the model of --model-factory {named}: name it again with "
                          f"--model-factory {named} (a checkpoint never imports the module it names)")
    fields = MODEL_FIELDS if named is None and config.model_factory is None else FACTORY_FIELDS
    diff = [f"--{k.replace('_', '-')} {old.get(k)} -> {new[k]}" for k in fields if old.get(k) != new[k]]
    if diff:
        raise ConfigError(f"--resume: the checkpoint trained a different model ({'; '.join(diff)}); use the "
                          "checkpoint's settings or a new --checkpoint folder")
    if (state["dataset"], state["num_nodes"]) != (dataset, num_nodes):
        raise ConfigError(f"--resume: the checkpoint was trained on {state['dataset']} ({state['num_nodes']:,} "
                          f"vertices), not {dataset} ({num_nodes:,})")
    old_print = state.get("fingerprint")
    if fingerprint is not None and isinstance(old_print, dict):
        differ = differing_parts(old_print, fingerprint)
        if differ:
            parts = ", ".join(differ[:-1]) + (" and " if len(differ) > 1 else "") + differ[-1]
            raise ConfigError(f"--resume: the checkpoint was trained on another {dataset} graph: its {parts} "
                              f"differ{'s' * (len(differ) == 1)} (same name and {num_nodes:,} vertices; parts "
                              f"compared: {', '.join(PARTS)}); resume on the graph it was trained on, or give a new "
                              "--checkpoint folder")
    if state["epoch"] >= config.epochs:
        raise ConfigError(f"--resume: the checkpoint already has {state['epoch']} epochs; raise --epochs above it "
                          "to train on")


@contextmanager
def job_locks(*, metrics: str | None = None, checkpoint: str | os.PathLike[str] | None = None) -> Iterator[None]:
    """The locks of a job's outputs (``--metrics`` FILE, ``--checkpoint`` DIR), held by the process that starts its
    ranks while they run; the ranks find them held by it (:data:`gnnscale.fsutil.LOCK_OWNER`) and go on."""
    locks = []
    before = os.environ.get(LOCK_OWNER)
    try:
        if metrics:
            locks.append(lock_output(check_output(metrics, "--metrics"), "--metrics"))
        if checkpoint is not None:
            locks.append(lock_checkpoint(checkpoint))
        os.environ[LOCK_OWNER] = str(os.getpid())
        yield
    finally:
        if before is None:
            os.environ.pop(LOCK_OWNER, None)
        else:
            os.environ[LOCK_OWNER] = before
        for lock in reversed(locks):
            lock.release()
