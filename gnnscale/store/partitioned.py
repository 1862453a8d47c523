"""One rank's part of the feature matrix (distributed training: each rank holds the features of its own
partition only).

The rows are read from the graph's feature tensor by index, in sorted row order and in pieces: for a graph in
gnnscale's on-disk format that tensor is a memory map, so only the pages holding this rank's rows are read and
the whole matrix is never materialised. (Formats parsed into memory -- Planetoid, npz, edge lists -- are whole in
every rank while they load; convert them with ``gnnscale convert`` for the per-rank bound.)
"""

from __future__ import annotations

import torch
from torch import Tensor

READ_ROWS = 1 << 16
"""Rows per read from the source features."""


class PartitionedFeatures:
    """The rows of the vertices ``owner == rank``: ``rows[local_index[v]]`` is vertex ``v``'s feature row."""

    def __init__(self, x: Tensor, owner: Tensor, rank: int, device: torch.device | None = None):
        self.rank = rank
        self.owner = owner
        self.own = torch.nonzero(owner == rank).view(-1)
        """``[n_own]`` int64, ascending: the global ids of this rank's vertices."""
        self.local_index = torch.full((owner.numel(),), -1, dtype=torch.int64)
        self.local_index[self.own] = torch.arange(self.own.numel())
        rows = torch.empty((self.own.numel(), x.shape[1]), dtype=x.dtype)
        self.rows_read = 0
        """Rows read from the source, counted as they come (this rank's, each once)."""
        for lo in range(0, self.own.numel(), READ_ROWS):
            piece = x[self.own[lo : lo + READ_ROWS]]
            rows[lo : lo + piece.shape[0]] = piece
            self.rows_read += int(piece.shape[0])
        self.rows = rows if device is None else rows.to(device)

    @property
    def width(self) -> int:
        return int(self.rows.shape[1])

    @property
    def nbytes(self) -> int:
        return self.rows.numel() * self.rows.element_size()

    def local(self, ids: Tensor) -> Tensor:
        """Rows of ``ids``, every one of them this rank's (a foreign id is an error, never a silent zero row)."""
        idx = self.local_index[ids.cpu()]
        if idx.numel() and bool((idx < 0).any()):
            bad = ids.cpu()[idx < 0][:5].tolist()
            raise IndexError(f"rank {self.rank} asked for vertices it does not hold: {bad}")
        return self.rows[idx.to(self.rows.device)]
