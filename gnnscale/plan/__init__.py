"""Pure cost and memory models used by engines to say why not, and by the planner to choose."""

from gnnscale.plan.memory import available_device_bytes, estimate_inmemory_bytes

__all__ = ["available_device_bytes", "estimate_inmemory_bytes"]
