"""A graph's content fingerprint: one digest per part (topology, features, labels, split), stored in checkpoints
and saved models so that a resume on another graph -- another seed of a generator, another split of the same
data -- is refused by name of the part that differs, not only by the dataset's name and vertex count.

Cheap at any scale: each array is hashed (blake2b) over its shape, its (canonical) dtype and :data:`SLICES` evenly
spaced slices of :data:`SLICE` elements, first and last included; an array no longer than that is hashed whole.
Slicing a memory-mapped array reads only those pages, so a converted directory on disk is fingerprinted without
reading it. Two graphs that differ only between the slices of a large array get the same fingerprint: the
fingerprint tells different graphs apart, it does not prove two the same.
"""

from __future__ import annotations

import hashlib

import torch
from torch import Tensor

from gnnscale.graph.graph import MASK_NAMES, Graph

SLICES = 64
"""Slices hashed per array (when it is longer than ``SLICES * SLICE`` elements)."""
SLICE = 4096
"""Elements per slice."""
PARTS = {
    "topology": ("indptr", "indices", "edge_weight"),
    "features": ("x",),
    "labels": ("y",),
    "split": MASK_NAMES,
}
"""The parts of a graph the fingerprint names, and the :class:`Graph` fields each is made of."""
_CANONICAL = {torch.int32: torch.int64, torch.int16: torch.int64, torch.uint8: torch.int64}
"""Index arrays hash as int64 whatever their width: the same graph with int32 indices is the same graph."""


def array_digest(t: Tensor | None, h: hashlib.blake2b) -> None:
    """Feed ``t`` (its shape, its dtype and sampled slices of its elements in row-major order) to ``h``."""
    if t is None:
        h.update(b"none;")
        return
    dtype = t.dtype if t.dtype.is_floating_point or t.dtype == torch.bool else _CANONICAL.get(t.dtype, t.dtype)
    h.update(f"{tuple(t.shape)};{dtype};".encode())
    flat = t.detach().reshape(-1)  # a view of a contiguous (memory-mapped) array: nothing is read yet
    n = flat.numel()
    if n <= SLICES * SLICE:
        starts = [0]
        size = n
    else:
        step = (n - SLICE) / (SLICES - 1)
        starts = [round(i * step) for i in range(SLICES)]
        size = SLICE
    for lo in starts:
        part = flat[lo : lo + size].to("cpu", dtype).contiguous()
        if part.numel():
            h.update(part.view(torch.uint8).numpy().data)


def fingerprint(graph: Graph) -> dict[str, str]:
    """``{part: hex digest}`` for each of :data:`PARTS` (the graph's name is not part of it)."""
    out = {}
    for part, fields in PARTS.items():
        h = hashlib.blake2b(digest_size=16)
        for name in fields:
            h.update(f"{name}:".encode())
            array_digest(getattr(graph, name), h)
        out[part] = h.hexdigest()
    return out


def differing_parts(old: dict[str, str], new: dict[str, str]) -> list[str]:
    """The parts (of :data:`PARTS`, in its order) whose digests differ between two fingerprints; a part one of them
    lacks is not compared."""
    return [p for p in PARTS if p in old and p in new and old[p] != new[p]]
