"""One rank's part of the feature matrix (distributed training: each rank holds the features of its own
partition only), as a feature source whose other rows come from their owners.

The rows are read from the graph's feature tensor by index, in sorted row order and in pieces: for a graph in
gnnscale's on-disk format that tensor is a memory map, so only the pages holding this rank's rows are read and
the whole matrix is never materialised. (Formats parsed into memory -- Planetoid, npz, edge lists -- are whole in
every rank while they load; convert them with ``gnnscale convert`` for the per-rank bound.) Given the disk tier
instead (``--host-memory``: a :class:`~gnnscale.store.disk.DiskSource` of the directory's ``x.npy``), the rows are
read by sorted positional reads, no page of a whole-matrix map touched, and the source counts the bytes.

Given an exchange (the job's :class:`~gnnscale.distributed.comm.Comm`: one batched, de-duplicated request per
peer and one reply, ``Comm.exchange``), :meth:`PartitionedFeatures.gather` serves any vertex: its own rows from
memory (tier ``"local"``), the others from their owners (tier ``"remote"``). That gather is collective: every rank
calls it together, with or without remote ids. :meth:`PartitionedFeatures.fetch` makes the exchange earlier: it
fetches the remote rows of a set of ids once and returns a :class:`FetchedRows` source that serves them (HopGNN's
pre-gathering).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import Tensor

from gnnscale import runtime as rt
from gnnscale.store.features import FeatureIndexError, FeatureSource, FeatureSourceError
from gnnscale.store.transfer import as_device, place

__all__ = ["READ_ROWS", "Exchange", "FetchedRows", "PartitionedFeatures"]

READ_ROWS = 1 << 16
"""Rows per read from the source features."""


class Exchange(Protocol):
    """Fetches rows from their owners (:meth:`gnnscale.distributed.comm.Comm.exchange` is one)."""

    def exchange(self, ids: Tensor, owner: Tensor, serve: Callable[[Tensor], Tensor], width: int,
                 dtype: torch.dtype, what: str = ...) -> Tensor:
        """Rows of ``ids`` (de-duplicated, none this rank's) in ``ids``' order; every rank calls it together and
        ``serve(req)`` answers the peers' requests from this rank's rows."""
        ...


class PartitionedFeatures(FeatureSource):
    """The rows of the vertices ``owner == rank``: ``rows[local_index[v]]`` is vertex ``v``'s feature row.

    Args:
        x: the whole feature table, anything indexable by a row-id tensor with ``shape`` and ``dtype`` (a memory
            map), or a :class:`~gnnscale.store.features.FeatureSource` over it (the disk tier: a
            :class:`~gnnscale.store.disk.DiskSource` of a converted directory's ``x.npy``, read by sorted positional
            reads, counted by its read counters): only this rank's rows are read from it, each once.
        owner: ``[N]`` int64 owning rank of each vertex.
        rank: this rank.
        device: where the rows are kept (and :meth:`gather` puts them): a ``torch.device`` or a sim device;
            ``None``: the CPU.
        exchange: fetches the other ranks' rows for :meth:`gather`; ``None``: only own rows can be gathered.
    """

    def __init__(self, x: Any, owner: Tensor, rank: int, device: rt.Device | str | None = None,
                 exchange: Exchange | None = None, *, tier: str = "local"):
        super().__init__(tier)
        self.rank = rank
        self.owner = owner
        self.exchange = exchange
        self.own = torch.nonzero(owner == rank).view(-1)
        """``[n_own]`` int64, ascending: the global ids of this rank's vertices."""
        self.local_index = torch.full((owner.numel(),), -1, dtype=torch.int64)
        self.local_index[self.own] = torch.arange(self.own.numel())
        source = x if isinstance(x, FeatureSource) else None
        width = x.dim if source is not None else x.shape[1]
        rows = torch.empty((self.own.numel(), width), dtype=x.dtype)
        self.rows_read = 0
        """Rows read from the source, counted as they come (this rank's, each once)."""
        if source is not None and source.num_rows != owner.numel():
            raise FeatureSourceError(f"rank {rank}: the feature source holds {source.num_rows} rows, the graph "
                                     f"{owner.numel()} vertices")
        for lo in range(0, self.own.numel(), READ_ROWS):
            ids = self.own[lo : lo + READ_ROWS]
            if source is not None:  # read straight into this rank's rows
                source.gather_unchecked(ids, out=rows[lo : lo + ids.numel()])
            else:
                rows[lo : lo + ids.numel()] = x[ids]
            self.rows_read += int(ids.numel())
        self.rows = rows if device is None else place(rows, as_device(device))
        self._device = rt.device_of(self.rows)

    @property
    def width(self) -> int:
        return int(self.rows.shape[1])

    @property
    def nbytes(self) -> int:
        return self.rows.numel() * self.rows.element_size()

    # ------------------------------------------------------------------------------------------------ the table
    @property
    def num_rows(self) -> int:
        return int(self.owner.numel())

    @property
    def dim(self) -> int:
        return self.width

    @property
    def dtype(self) -> torch.dtype:
        return self.rows.dtype

    @property
    def device(self) -> rt.Device:
        return self._device

    # ------------------------------------------------------------------------------------------------ reads
    def local(self, ids: Tensor) -> Tensor:
        """Rows of ``ids``, every one of them this rank's (a foreign id is an error, never a silent zero row)."""
        ids = place(ids, torch.device("cpu"))
        idx = self.local_index[ids]
        if idx.numel() and bool((idx < 0).any()):
            bad = ids[idx < 0][:5].tolist()
            raise FeatureIndexError(f"rank {self.rank} asked for vertices it does not hold: {bad}")
        return self.rows[place(idx, self._device)]

    def gather_unchecked(self, ids: Tensor, out: Tensor | None = None) -> Tensor:
        """:meth:`FeatureSource.gather_unchecked`; collective when an exchange is given: every rank calls it
        together, even with no ids (its peers may ask for its rows)."""
        if self.exchange is not None and ids.numel() == 0:
            self._gather(ids.long(), None)  # take part in the exchange
            return rt.empty((0, self.dim), dtype=self.dtype, device=self.device) if out is None else out[:0]
        return super().gather_unchecked(ids, out)

    def _gather(self, ids: Tensor, out: Tensor | None) -> Tensor:
        ids = place(ids, torch.device("cpu"))
        mine = self.owner[ids] == self.rank  # [n]
        if self.exchange is None:
            if not bool(mine.all()):
                bad = ids[~mine][:5].tolist()
                raise FeatureIndexError(f"rank {self.rank} asked for vertices it does not hold: {bad} (their "
                                        "owners serve them only through an exchange)")
            got = self.rows.index_select(0, place(self.local_index[ids], self.device))
            self._record(ids.numel())
            return got
        remote = torch.unique(ids[~mine])  # [k] ascending
        fetched = place(self.exchange.exchange(remote, self.owner, self.local, self.dim, self.dtype), self.device)
        out = _stitch(ids, mine, self.rows, self.local_index, remote, fetched, out)
        self._record(int(mine.sum()))
        self._record(int((~mine).sum()), tier="remote")  # rows served; the exchange moved each distinct one once
        return out

    def fetch(self, ids: Tensor, what: str = "feature fetch") -> FetchedRows:
        """The rows of ``ids`` that other ranks own, fetched now in one exchange (collective: every rank calls it
        together, with or without ids), as a source that serves any of ``ids`` -- this rank's rows from its part,
        the others from what was fetched -- with no exchange of its own (HopGNN's pre-gathering: one iteration's
        remote rows fetched before its first step). The fetched rows are counted here, under ``"remote"`` (each
        distinct one once); the returned source counts what it serves."""
        if self.exchange is None:
            raise FeatureSourceError(f"rank {self.rank}: fetching other ranks' rows needs an exchange")
        ids = place(self.check_ids(ids), torch.device("cpu"))
        remote = torch.unique(ids[self.owner[ids] != self.rank])  # [k] ascending
        fetched = self.exchange.exchange(remote, self.owner, self.local, self.dim, self.dtype, what)
        self._record(remote.numel(), tier="remote")
        return FetchedRows(self, remote, fetched)


class FetchedRows(FeatureSource):
    """A rank's rows and rows of other ranks' vertices fetched before (:meth:`PartitionedFeatures.fetch`), as one
    source: ``gather`` serves this rank's vertices from ``own`` (counted under ``"local"``) and the fetched ones
    from ``fetched`` (under ``"fetched"``); any other id is an error. It makes no exchange.

    Args:
        part: the rank's part (its owners, its rank, its local index).
        remote: ``[k]`` ascending ids of the fetched rows (none of them this rank's).
        fetched: ``[k, dim]`` their rows.
        own: ``[n_own, dim]`` the rank's rows in ``part.own`` order; ``None``: its features (``part.rows``). (Exact
            layer-wise inference passes a layer's activations.)
    """

    def __init__(self, part: PartitionedFeatures, remote: Tensor, fetched: Tensor, own: Tensor | None = None, *,
                 tier: str = "local", fetched_tier: str = "fetched"):
        super().__init__(tier)
        self.part, self.remote, self.fetched_tier = part, remote, fetched_tier
        self.own_rows = part.rows if own is None else own
        self._device = rt.device_of(self.own_rows)
        self.fetched = place(fetched, self._device)

    @property
    def num_rows(self) -> int:
        return self.part.num_rows

    @property
    def dim(self) -> int:
        return int(self.own_rows.shape[1])

    @property
    def dtype(self) -> torch.dtype:
        return self.own_rows.dtype

    @property
    def device(self) -> rt.Device:
        return self._device

    @property
    def nbytes(self) -> int:
        """Bytes of the fetched rows held."""
        return self.fetched.numel() * self.fetched.element_size()

    def _gather(self, ids: Tensor, out: Tensor | None) -> Tensor:
        ids = place(ids, torch.device("cpu"))
        mine = self.part.owner[ids] == self.part.rank  # [n]
        rem = ids[~mine]
        if rem.numel():
            pos = torch.searchsorted(self.remote, rem).clamp_(max=max(self.remote.numel() - 1, 0))
            missing = (self.remote[pos] != rem) if self.remote.numel() else torch.ones_like(rem, dtype=torch.bool)
            if bool(missing.any()):
                raise FeatureIndexError(f"rank {self.part.rank}: rows {rem[missing][:5].tolist()} were not fetched")
        out = _stitch(ids, mine, self.own_rows, self.part.local_index, self.remote, self.fetched, out)
        self._record(int(mine.sum()))
        self._record(int(rem.numel()), tier=self.fetched_tier)
        return out


def _stitch(ids: Tensor, mine: Tensor, own: Tensor, local_index: Tensor, remote: Tensor, fetched: Tensor,
            out: Tensor | None) -> Tensor:
    """``[n, dim]`` rows of ``ids`` (CPU) on ``own``'s device: ``own[local_index[id]]`` where ``mine``, else the
    fetched row of ``id`` (``remote`` ascending, every other id among them)."""
    dev = rt.device_of(own)
    if out is None:
        out = rt.empty((ids.numel(), own.shape[1]), dtype=own.dtype, device=dev)
    on = place(mine, dev)
    out[on] = own[place(local_index[ids[mine]], dev)]
    if remote.numel():
        out[~on] = fetched[place(torch.searchsorted(remote, ids[~mine]), dev)]
    return out
