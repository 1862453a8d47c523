"""The device runtime: the only code of gnnscale that talks to an accelerator (in :mod:`.backend`), and its
deterministic test device for CPU (the *sim* device).

One set of functions serves the CPU, a real accelerator (CUDA, ROCm, XPU: torch's device-generic API where
it has one) and the sim device: resolve a device spec, make and use streams and events, copy asynchronously between
host and device, allocate, read memory statistics, pin host buffers, and count every synchronisation. On the CPU
streams and events are None and the stream functions do nothing, so engine code has one path.

The sim device (``--device sim``, or ``GNNSCALE_DEVICE=sim`` for a whole test run) keeps its tensors in host
memory, in a bounded pool, and defers every asynchronous copy until its stream is waited on: the destination
reads NaN until then, and a copy that races with another stream's use of a buffer raises
:class:`StreamOrderError`. A missing wait then always shows on a CPU. See docs/runtime.md.
"""

from gnnscale.runtime.copies import adopt, copy_async, empty, record_stream, to_device, to_host, zeros
from gnnscale.runtime.device import (
    DEVICE_ENV,
    Device,
    accelerator_type,
    can_access_peer,
    default_device,
    device_count,
    device_key,
    device_name,
    device_of,
    is_accelerator,
    is_available,
    is_sim,
    mem_get_info,
    memory_allocated,
    peak_bytes,
    reset_counts,
    reset_peak,
    resolve_device,
    sync_count,
    torch_device,
    wait_count,
)
from gnnscale.runtime.errors import DeviceOutOfMemory, StreamOrderError
from gnnscale.runtime.host import HOST_ALLOCATORS, set_host_allocator
from gnnscale.runtime.pinned import (
    HOST_REGISTER_FLAGS,
    PinnedRegion,
    needs_pinning,
    pin_in_place,
    pinned_empty,
    pinned_host,
)
from gnnscale.runtime.sim import SIM_DEVICES_ENV, SIM_MEMORY_ENV, sim_device
from gnnscale.runtime.simdevice import SimDevice, SimEvent, SimStream, poison
from gnnscale.runtime.streams import (
    Event,
    Stream,
    current_stream,
    host_list,
    item,
    new_event,
    new_stream,
    on_device,
    record_event,
    synchronize,
    use_stream,
    wait_event,
    wait_stream,
)

__all__ = [
    "DEVICE_ENV", "HOST_ALLOCATORS", "HOST_REGISTER_FLAGS", "SIM_DEVICES_ENV", "SIM_MEMORY_ENV", "Device",
    "DeviceOutOfMemory", "Event", "PinnedRegion", "SimDevice", "SimEvent", "SimStream", "Stream",
    "StreamOrderError", "accelerator_type", "adopt", "can_access_peer", "copy_async", "current_stream",
    "default_device", "device_count", "device_key", "device_name", "device_of", "empty", "host_list", "is_accelerator",
    "is_available", "is_sim", "item", "mem_get_info", "memory_allocated", "needs_pinning", "new_event",
    "new_stream", "on_device", "peak_bytes", "pin_in_place", "pinned_empty", "pinned_host", "poison",
    "record_event", "record_stream", "reset_counts", "reset_peak", "resolve_device", "set_host_allocator",
    "sim_device", "sync_count", "synchronize", "to_device", "to_host", "torch_device", "use_stream", "wait_count",
    "wait_event", "wait_stream", "zeros"
]
