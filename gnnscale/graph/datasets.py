"""``load_dataset(spec)``: one string names every dataset gnnscale can read or generate.

Grammar::

    csbm[:key=val,...]            kronecker[:key=val,...]
    planetoid:<cora|citeseer|pubmed>[:key=val,...]      (files in --root)
    npz:<file>[:key=val,...]      edgelist:<file>[:key=val,...]      ogb:<name>[:key=val,...]  (in --root)
    <directory written by `gnnscale convert`>

Every kind also takes ``feature_dtype=bf16`` (a directory as ``<dir>:feature_dtype=bf16``): the features are then
held in bfloat16, half the bytes, and every engine upcasts them to float32 for the model.

Randomness (generated graphs, random splits and features) uses the spec's ``seed`` option when given, else the
``seed`` argument (the CLI passes ``--seed``). The graph's ``meta`` records the spec, and, where anything was drawn
at random, the seed used and which parts were drawn (``generated``: some of ``graph``, ``features``, ``labels``,
``split``). A directory written by ``gnnscale convert`` keeps those parts as they were drawn: opening it with
another seed prints a one-line note saying so (the seed then only affects training: weights, dropout, sampling).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from gnnscale.errors import DatasetError, GraphError
from gnnscale.graph import edgelist, generators, io, planetoid
from gnnscale.graph.graph import Graph
from gnnscale.graph.graph import feature_dtype as graph_feature_dtype
from gnnscale.notes import note

_OPTS = re.compile(r"^\w+=[^,:]*(,\w+=[^,:]*)*$")
PLANETOID_NAMES = ("cora", "citeseer", "pubmed")


def _parse_value(key: str, raw: str, default: Any, annotation: Any = None) -> Any:
    try:
        if default is None and str(annotation).startswith("float"):  # an optional fraction ("the rest" if left out)
            default = 0.0
        if default is None:  # an optional flag ("auto" when left out): a boolean
            default = False
        if isinstance(default, bool):
            if raw.lower() in ("1", "true", "yes"):
                return True
            if raw.lower() in ("0", "false", "no"):
                return False
            raise ValueError(raw)
        return type(default)(raw)
    except ValueError:
        kind = "boolean" if isinstance(default, bool) else type(default).__name__
        raise DatasetError(f"dataset option {key}={raw!r} is not a valid {kind}") from None


def _options(fn: Callable[..., Any], text: str, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """Parse ``key=val,key=val`` against ``fn``'s keyword defaults (names and types)."""
    params = {
        n: p
        for n, p in inspect.signature(fn).parameters.items()
        if p.default is not inspect.Parameter.empty and n not in skip
    }
    out: dict[str, Any] = {}
    if not text:
        return out
    for item in text.split(","):
        key, sep, raw = item.partition("=")
        if not sep or key not in params:
            valid = ", ".join(params)
            raise DatasetError(f"unknown dataset option {key!r} in {text!r}; valid options: {valid}")
        out[key] = _parse_value(key, raw, params[key].default, params[key].annotation)
    return out


def _split_arg(rest: str) -> tuple[str, str]:
    """``'path:opts'`` -> ``('path', 'opts')``; a trailing ``:key=val,...`` is options, anything else is the path."""
    head, sep, tail = rest.rpartition(":")
    if sep and _OPTS.match(tail):
        return head, tail
    return rest, ""


def _resolve(path: str, root: str | None) -> Path:
    p = Path(path).expanduser()
    if not p.exists() and root is not None and (Path(root) / path).exists():
        p = Path(root) / path
    if not p.exists():
        raise DatasetError(f"file not found: {path}")
    return p


def load_dataset(spec: str, root: str | Path | None = None, seed: int = 0, keep_ids: bool = False,
                 feature_dtype: str | None = None) -> Graph:
    """Load or generate the graph named by ``spec`` (see the module docstring); never downloads.

    Args:
        spec: the dataset spec, e.g. ``"csbm:nodes=5000"``, ``"planetoid:cora"``, ``"npz:computers.npz"``.
        root: folder holding Planetoid/OGB files (and a fallback folder for relative file paths).
        seed: default seed for generated graphs and random splits/features.
        keep_ids: an edge list's vertex ids are kept as given (``max id + 1`` vertices) instead of renumbered
            ``0..n-1`` (the CLI's ``--keep-ids``; the spec's ``keep_ids`` option wins). Other kinds number their
            vertices ``0..n-1`` already.
        feature_dtype: ``bf16`` stores the features in bfloat16 (half the bytes; engines upcast them for the
            model), ``fp32`` in float32; ``None`` keeps them as read (float32, or what a converted directory
            holds). The spec's ``feature_dtype`` option, which every kind takes, wins.

    Raises:
        DatasetError: unknown kind, bad option, missing or corrupt file; the message names the problem.
    """
    spec = spec.strip()
    if not spec:
        raise DatasetError("empty dataset spec")
    spec, spec_dtype = _take_feature_dtype(spec)
    name = feature_dtype if spec_dtype is None else spec_dtype
    try:
        dtype = None if name is None else graph_feature_dtype(name)
    except GraphError as exc:
        raise DatasetError(str(exc)) from None
    g = _load(spec, root, seed, keep_ids)
    return _record(g if dtype is None else g.with_feature_dtype(dtype), spec)


def _record(g: Graph, spec: str) -> Graph:
    """``g`` with ``meta["spec"]`` saying what was loaded (a run's summary records it as ``dataset_spec``, convert
    writes it to meta.json): a converted directory by its path, the spec it was converted from appended to
    ``meta["converted_from"]`` (oldest first); ``feature_dtype=bf16`` added for bfloat16 features (for a directory
    either dtype), so a bfloat16 run is told from a float32 one and the record loads the same data again. A
    launcher's transient copy of a Graph keeps its own record."""
    meta = dict(g.meta)  # not the loaded graph's dict: with_feature_dtype shares it
    if meta.pop("transient", False):
        g.meta = meta
        return g
    base = meta.get("spec", spec)
    if Path(spec).is_dir():
        meta["converted_from"] = [*(meta.get("converted_from") or []), *([meta["spec"]] if "spec" in meta else [])]
        base = spec
    bf16 = g.x is not None and g.x.dtype == torch.bfloat16
    if g.x is not None and (bf16 or Path(spec).is_dir()):  # a directory's stored dtype is no default: say it
        base = f"{base}:feature_dtype={'bf16' if bf16 else 'fp32'}"
    meta["spec"] = base
    g.meta = meta
    return g


def kronecker_spec(spec: str, seed: int = 0, feature_dtype: str | None = None) -> tuple[dict[str, Any], str] | None:
    """For a ``kronecker[:opts]`` spec: the generator's options (the spec's ``seed`` winning over ``seed``) and the
    feature dtype's name (``fp32`` or ``bf16``: the spec's ``feature_dtype`` option winning over ``feature_dtype``,
    float32 by default), as :func:`load_dataset` reads them; ``None`` for any other spec."""
    spec, spec_dtype = _take_feature_dtype(spec.strip())
    kind, _, rest = spec.partition(":")
    if kind.lower() != "kronecker" or Path(spec).is_dir():
        return None
    name = feature_dtype if spec_dtype is None else spec_dtype
    try:
        graph_feature_dtype(name or "fp32")
    except GraphError as exc:
        raise DatasetError(str(exc)) from None
    return {"seed": seed, **_options(generators.kronecker, rest)}, name or "fp32"


def _take_feature_dtype(spec: str) -> tuple[str, str | None]:
    """``spec`` without its ``feature_dtype=...`` option (every kind takes it, a directory too), and its value."""
    head, sep, tail = spec.rpartition(":")
    if not sep or not _OPTS.match(tail):
        return spec, None
    items = tail.split(",")
    found = [i for i in items if i.partition("=")[0] == "feature_dtype"]
    if not found:
        return spec, None
    rest = ",".join(i for i in items if i.partition("=")[0] != "feature_dtype")
    return (f"{head}:{rest}" if rest else head), found[-1].partition("=")[2]


def _load(spec: str, root: str | Path | None, seed: int, keep_ids: bool) -> Graph:
    root_s = None if root is None else str(root)
    if Path(spec).is_dir():
        if io.is_graph_dir(spec):
            opened = io.open_dir(spec)
            _note_fixed_draws(opened, spec, seed)
            return opened
        if io.is_partial_dir(spec):
            raise DatasetError(f"{spec} is the partial output of a 'gnnscale convert' that was interrupted (no "
                               "meta.json: it never finished); run the convert again (it removes what is left) and "
                               "pass its --out directory")
        raise DatasetError(f"{spec} is a directory but not one written by 'gnnscale convert' (no meta.json)")
    kind, _, rest = spec.partition(":")
    kind = kind.lower()
    g: Graph
    if kind in ("csbm", "kronecker"):
        fn = getattr(generators, kind)
        opts = {"seed": seed, **_options(fn, rest)}
        g = fn(**opts)
        g.meta["spec"] = f"{kind}:" + ",".join(f"{k}={v}" for k, v in sorted(opts.items()))
        return _drawn(g, opts["seed"], ("graph", "features", "labels", "split"))
    if kind in ("planetoid", "npz", "edgelist", "ogb"):
        arg, opt_text = _split_arg(rest)
        if not arg:
            what = "name" if kind in ("planetoid", "ogb") else "file"
            raise DatasetError(f"dataset spec {spec!r} needs an argument: {kind}:<{what}>")
        if kind == "planetoid":
            if arg.lower() not in PLANETOID_NAMES:
                raise DatasetError(f"unknown Planetoid dataset {arg!r}; choose one of {', '.join(PLANETOID_NAMES)}")
            base = planetoid.find_planetoid(Path(root_s or "."), arg)
            g = planetoid.read_planetoid(base, arg, **_options(planetoid.read_planetoid, opt_text, ("name",)))
        elif kind == "npz":
            opts = {"seed": seed, **_options(io.read_npz, opt_text)}
            g = _drawn(io.read_npz(_resolve(arg, root_s), **opts), opts["seed"], ("split",))
        elif kind == "edgelist":
            opts = {"seed": seed, "keep_ids": keep_ids, **_options(edgelist.read_edgelist, opt_text)}
            g = edgelist.read_edgelist(_resolve(arg, root_s), **opts)
            parts = (("features",) if g.x is not None else ()) + (("labels", "split") if g.y is not None else ())
            g = _drawn(g, opts["seed"], parts)
        else:
            g = io.read_ogb(Path(root_s or "."), arg, **_options(io.read_ogb, opt_text, ("name",)))
        g.meta["spec"] = spec
        return g
    _missing_path(spec)
    raise DatasetError(
        f"unknown dataset {spec!r}; expected csbm[:opts], kronecker[:opts], planetoid:<name>, npz:<file>, "
        "edgelist:<file>, ogb:<name>, or a directory written by 'gnnscale convert'"
    )


def _missing_path(spec: str) -> None:
    """A spec of no known kind that names a path: say what is there (nothing, a file, what an interrupted convert
    left) rather than calling it an unknown dataset."""
    p = Path(spec).expanduser()
    stale = sorted(p.parent.glob(f".{p.name}.*{io.PARTIAL_SUFFIX}")) if p.name and p.parent.is_dir() else []
    if stale:
        raise DatasetError(f"{spec} does not exist; {stale[0]} is what an interrupted 'gnnscale convert' to it left: "
                           "run the convert again (it removes that folder)")
    if p.is_file():
        raise DatasetError(f"{spec} is a file; name its format: npz:{spec} or edgelist:{spec}")
    if "/" in spec or spec.startswith((".", "~")) or (":" not in spec and "." in p.name):
        raise DatasetError(f"dataset path {spec} does not exist (no such file or directory)")


def _drawn(g: Graph, seed: int, parts: tuple[str, ...]) -> Graph:
    """Record in ``g.meta`` (saved by ``convert``) that ``parts`` of ``g`` were drawn at random with ``seed``."""
    if parts:
        g.meta["seed"] = int(seed)
        g.meta["generated"] = list(parts)
    return g


def _note_fixed_draws(g: Graph, path: str, seed: int) -> None:
    """A converted directory holds what was drawn at convert time: when ``seed`` differs from the seed recorded,
    say in one line that its random parts stay as drawn (the seed only affects training)."""
    drawn, parts = g.meta.get("seed"), g.meta.get("generated") or []
    if drawn is None or not parts or int(drawn) == int(seed):
        return
    what = ", ".join(parts[:-1]) + f" and {parts[-1]}" if len(parts) > 1 else parts[0]
    source = f" from {g.meta['spec']!r}" if g.meta.get("spec") else ""
    note(f"{path} holds the {what} drawn with seed {drawn} when it was converted{source}; they stay fixed, and "
         f"seed {seed} only changes training (weight initialisation, dropout, sampling). Convert again with "
         f"seed {seed} to redraw them")
