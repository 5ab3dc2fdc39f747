"""Streams: ordered queues of work on one device; ops run on the device's current stream."""

from __future__ import annotations

import contextlib
import threading

from .device import Device, as_device
from .plugins import registry

_local = threading.local()
_count_lock = threading.Lock()
active = 0  # stream contexts entered and not left, in any thread: while 0, every op uses the default stream


def _current() -> dict:
    streams = getattr(_local, "streams", None)
    if streams is None:
        streams = _local.streams = {}
    return streams


def current_stream_handle(device: Device):
    """The native handle ops on ``device`` are queued on (None: the default stream)."""
    if not active:
        return None
    stream = getattr(_local, "streams", {}).get(device)
    return stream.handle if stream is not None else None


class Stream:
    """A backend stream; destroyed with the object. On the CPU every stream is synchronous."""

    def __init__(self, device="cpu"):
        self.device = as_device(device)
        self._backend = registry().backend(self.device)
        self.handle: int | None = self._backend.stream_create(self.device.index)

    def synchronize(self) -> None:
        self._backend.stream_synchronize(self.device.index, self.handle)

    def __del__(self):
        handle, self.handle = getattr(self, "handle", None), None
        if handle:
            try:
                self._backend.stream_destroy(self.device.index, handle)
            except Exception:
                pass

    def __repr__(self) -> str:
        return f"llaisys.Stream(device={self.device})"


@contextlib.contextmanager
def stream(s: Stream):
    """Run the ops of this block on ``s`` (for its device)."""
    global active
    streams = _current()
    previous = streams.get(s.device)
    streams[s.device] = s
    with _count_lock:
        active += 1
    try:
        yield s
    finally:
        with _count_lock:
            active -= 1
        if previous is None:
            streams.pop(s.device, None)
        else:
            streams[s.device] = previous


def synchronize(device="cpu") -> None:
    """Wait for all work queued on ``device``."""
    device = as_device(device)
    registry().backend(device).synchronize(device.index)
