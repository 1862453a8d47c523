"""Predicted epoch time: what every engine's performance model returns, and the work counts they share.

Each engine prices one training epoch with its seed system's model (HongTu's Eq. 4 for offload, NeutronTask's
Eqs. 5-8 for taskparallel, HyScale-GNN's Eqs. 5-13 for hybrid, XGNN's placement cost for minibatch, HopGNN's
traffic model for distributed), fed with this machine's rates (:class:`~gnnscale.plan.rates.Rates`, measured once
and cached). The answer is an :class:`EpochTime`: the seconds, the named terms they are made of (so a test can
remove one and see the prediction change), and the bytes the epoch moves per tier.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gnnscale.units import format_bytes

TIERS = ("disk", "host", "device", "network")
"""Where an epoch's bytes move: read from disk, gathered in host memory, copied to or inside a device, sent
between machines (or ranks)."""


@dataclass(frozen=True)
class Cluster:
    """A what-if past this box (``gnnscale plan --machines N --devices-per-machine G --network 25Gbit,latency=50us``):
    the machines an engine would train on. The default is this machine as it is."""

    machines: int = 1
    devices_per_machine: int | None = None
    """Devices per machine sharing its host bus (``None``: the devices ``--devices`` names here)."""
    network: float | None = None
    """Bytes/s of each machine's link (``None``: this machine's measured rate between processes)."""
    latency: float | None = None
    """Seconds per message (``None``: measured)."""


HERE = Cluster()
"""This machine as it is: what ``train`` predicts for."""


@dataclass
class EpochTime:
    """One engine's predicted training epoch (forward, backward and optimiser step over the training vertices).

    Its ``bytes`` are the bytes moved per epoch per tier of :data:`TIERS` (a tier the engine does not touch is
    absent)."""

    seconds: float
    """The predicted wall time of one epoch."""
    terms: dict[str, float] = field(default_factory=dict)
    """Named seconds the prediction combines (``aggregate``, ``update``, ``h2d``, ``network``, ...): how they
    combine (a sum, a pipeline's maximum) is the engine's model; each is reported as it is."""
    bytes: dict[str, int] = field(default_factory=dict)  # per tier (documented above: no second "bytes" target)
    model: str = ""
    """Which model priced it, in a few words (``HongTu Eq. 4 + compute``)."""

    def line(self) -> str:
        """One line for ``gnnscale plan``: ``about 1.2 s/epoch (host 3.1 GiB, device 1.0 GiB)``."""
        moved = ", ".join(f"{t} {format_bytes(self.bytes[t])}" for t in TIERS if self.bytes.get(t))
        return f"about {_seconds(self.seconds)}/epoch" + (f" ({moved})" if moved else "")

    def as_dict(self) -> dict[str, object]:
        """What ``gnnscale plan --json`` prints for it."""
        return {"seconds": self.seconds, "terms": dict(self.terms), "bytes": dict(self.bytes), "model": self.model}


def _seconds(s: float) -> str:
    if s >= 100:
        return f"{s:.0f} s"
    if s >= 1:
        return f"{s:.1f} s"
    return f"{s * 1000:.0f} ms"
