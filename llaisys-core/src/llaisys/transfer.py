"""Copies between host memory and devices, and between devices.

Which copy to make is decided by what the memory is, not by device names: a storage the host
can address (the CPU's, a mapped file, a numpy buffer) is copied with memmove or given to the
other side's memcpy as host memory; two devices of one backend use its peer copy where it has
one; anything else goes through the host.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from .abi import MemcpyKind
from .errors import LlaisysError, LlaisysValueError

capture = threading.local()  # .active: this thread is capturing a graph (set by graph.Graph.capture)


def _refuse_while_capturing(what: str) -> None:
    if getattr(capture, "active", False):
        raise LlaisysValueError(f"{what} while this thread captures a graph: copies are synchronous and are "
                                f"not recorded; load inputs before the capture or between replays")


def from_host(dst, dst_ptr: int, host_ptr: int, nbytes: int) -> None:
    """``nbytes`` from host memory to ``dst_ptr`` inside Storage ``dst``."""
    _refuse_while_capturing("a copy from the host")
    if dst.host:
        ctypes.memmove(dst_ptr, host_ptr, nbytes)
    else:
        dst.backend.memcpy(dst.device.index, dst_ptr, host_ptr, nbytes, MemcpyKind.H2D)


def to_host(host_ptr: int, src, src_ptr: int, nbytes: int) -> None:
    """``nbytes`` at ``src_ptr`` inside Storage ``src`` to host memory."""
    _refuse_while_capturing("a copy to the host")
    if src.host:
        ctypes.memmove(host_ptr, src_ptr, nbytes)
    else:
        src.backend.memcpy(src.device.index, host_ptr, src_ptr, nbytes, MemcpyKind.D2H)


def copy(dst, dst_ptr: int, src, src_ptr: int, nbytes: int) -> None:
    """``nbytes`` between two storages on any devices; complete when it returns."""
    _refuse_while_capturing("a synchronous copy")
    if src.host:
        from_host(dst, dst_ptr, src_ptr, nbytes)
    elif dst.host:
        to_host(dst_ptr, src, src_ptr, nbytes)
    elif src.device is dst.device:
        src.backend.memcpy(src.device.index, dst_ptr, src_ptr, nbytes, MemcpyKind.D2D)
    elif not _peer_copy(dst, dst_ptr, src, src_ptr, nbytes):
        staging = np.empty(nbytes, dtype=np.uint8)  # two accelerators without a peer path: through the host
        to_host(staging.ctypes.data, src, src_ptr, nbytes)
        from_host(dst, dst_ptr, staging.ctypes.data, nbytes)


def _peer_copy(dst, dst_ptr, src, src_ptr, nbytes) -> bool:
    backend = src.backend
    if dst.backend is not backend or not backend.supports("peer_copy"):
        return False
    try:
        backend.memcpy_peer(dst.device.index, dst_ptr, src.device.index, src_ptr, nbytes, None)
        backend.stream_synchronize(src.device.index, None)
    except LlaisysError:  # e.g. no peer access between these two devices: the host path still works
        return False
    return True
