"""What a backend plugin provides: a device runtime, its capabilities and kernels, behind one object.

This is the abstract interface only; ``llaisys.native.NativeBackend`` implements it over a
compiled library, and a pure-Python backend may implement it directly.
"""

from __future__ import annotations

from typing import NoReturn

from .abi import CAPABILITIES, DeviceAttr, MemcpyKind
from .errors import LlaisysError, NotSupportedError

DLPACK_CPU = 1
DLPACK_CUDA = 2


class Backend:
    """Base class of the object a ``BackendSpec.load()`` returns.

    Device pointers, host pointers and stream/event/graph handles are plain ints; ``stream=None``
    is the default stream. ``kernel(op)`` returns a callable with the op's C ABI signature
    (``llaisys.abi.OP_SLOTS``): ``fn(device_index, stream, *c_args) -> status``, where the op
    arguments are what the ``llaisys.ops`` frontend has validated and packed (dtype codes, sizes,
    data pointers); or None when the backend does not implement ``op`` (core then runs it with the CPU
    backend's kernel: ``llaisys.fallback``). A non-zero status is turned into an exception by ``raise_status``.

    Optional capabilities (``llaisys.abi.CAPABILITIES``: events, graphs, collectives, pinned host memory,
    peer copy, memory info, device attributes, ...) are reported by ``supports(name)``; the
    methods of one that is not supported raise NotSupportedError.
    """

    name: str = "?"
    dlpack_device_type: int = DLPACK_CUDA

    # -- required runtime ----------------------------------------------------------------------

    def device_count(self) -> int: raise NotImplementedError
    def malloc(self, device_index: int, nbytes: int) -> int: raise NotImplementedError
    def free(self, device_index: int, ptr: int) -> None: raise NotImplementedError
    def memset(self, device_index: int, ptr: int, value: int, nbytes: int, stream=None) -> None:
        raise NotImplementedError
    def memcpy(self, device_index: int, dst: int, src: int, nbytes: int, kind: MemcpyKind) -> None:
        raise NotImplementedError
    def memcpy_async(self, device_index: int, dst: int, src: int, nbytes: int, kind: MemcpyKind,
                     stream) -> None: raise NotImplementedError
    def stream_create(self, device_index: int) -> int: raise NotImplementedError
    def stream_destroy(self, device_index: int, stream: int) -> None: raise NotImplementedError
    def stream_synchronize(self, device_index: int, stream) -> None: raise NotImplementedError
    def synchronize(self, device_index: int) -> None: raise NotImplementedError
    def kernel(self, op: str): return None

    def raise_status(self, status: int, what: str):
        """Raise the exception for a kernel's non-zero ``status`` (the backend's own message where it has one)."""
        raise LlaisysError(f"{what} failed with status {status}")

    def no_device_reason(self) -> str:
        """Why ``device_count()`` returned 0 (e.g. "no NVIDIA driver"), or ""."""
        return ""

    # -- optional capabilities -------------------------------------------------------------------

    def supports(self, capability: str) -> bool:
        """Whether the optional ``capability`` (a key of ``llaisys.abi.CAPABILITIES``) is available."""
        if capability not in CAPABILITIES:
            raise LlaisysError(f"unknown capability {capability!r}; known: {', '.join(CAPABILITIES)}")
        return False

    def capabilities(self) -> dict[str, bool]:
        return {name: self.supports(name) for name in CAPABILITIES}

    def _unsupported(self, capability: str) -> NoReturn:
        raise NotSupportedError(f"the '{self.name}' backend does not support {capability.replace('_', ' ')}")

    def device_attribute(self, device_index: int, attr: DeviceAttr) -> int | None:
        """The attribute's value, or None where the backend does not know it."""
        return None

    def host_addressable(self, device_index: int) -> bool:
        """True if the host reads and writes this device's pointers directly (the CPU): copies are memmove."""
        return self.device_attribute(device_index, DeviceAttr.HOST_ADDRESSABLE) == 1

    def device_name(self, device_index: int) -> str:
        return f"{self.name}:{device_index}"

    def mem_info(self, device_index: int) -> tuple[int, int] | None:
        """(free bytes, total bytes) as the driver sees them now, or None."""
        return None

    def build_info(self) -> str:
        return ""

    def malloc_host(self, nbytes: int) -> int: self._unsupported("pinned_host")
    def free_host(self, ptr: int) -> None: self._unsupported("pinned_host")

    def memcpy_peer(self, dst_device: int, dst: int, src_device: int, src: int, nbytes: int, stream=None) -> None:
        self._unsupported("peer_copy")

    def event_create(self, device_index: int) -> int: self._unsupported("events")
    def event_destroy(self, device_index: int, event: int) -> None: self._unsupported("events")
    def event_record(self, device_index: int, event: int, stream=None) -> None: self._unsupported("events")
    def event_synchronize(self, device_index: int, event: int) -> None: self._unsupported("events")
    def stream_wait_event(self, device_index: int, stream, event: int) -> None: self._unsupported("events")
    def event_elapsed_ms(self, device_index: int, start: int, end: int) -> float: self._unsupported("event_timing")

    def graph_begin_capture(self, device_index: int, stream) -> None: self._unsupported("graphs")
    def graph_end_capture(self, device_index: int, stream) -> int: self._unsupported("graphs")
    def graph_launch(self, device_index: int, graph: int, stream=None) -> None: self._unsupported("graphs")
    def graph_destroy(self, device_index: int, graph: int) -> None: self._unsupported("graphs")

    # collectives (backend.h): communicator handles are ints like streams; llaisys.distributed wraps them
    def comm_unique_id(self, device_index: int) -> bytes: self._unsupported("collectives")
    def comm_create(self, device_index: int, unique_id: bytes, rank: int, world_size: int,
                    timeout_ms: int) -> int: self._unsupported("collectives")
    def comm_destroy(self, comm: int) -> None: self._unsupported("collectives")
    def comm_abort(self, comm: int, reason: str) -> None: self._unsupported("collectives")
    def comm_all_reduce(self, device_index: int, stream, comm: int, dtype_code: int, n: int, out: int,
                        src: int) -> None: self._unsupported("collectives")
    def comm_all_gather(self, device_index: int, stream, comm: int, nbytes: int, out: int,
                        src: int) -> None: self._unsupported("collectives")
    def comm_broadcast(self, device_index: int, stream, comm: int, nbytes: int, data: int,
                       root: int) -> None: self._unsupported("collectives")
