"""Per-op dispatch: the kernel for (op, device type) is resolved once, then a dict lookup."""

from __future__ import annotations

from ..plugins import registry
from ..stream import current_stream_handle

_kernels: dict[tuple[str, str], object] = {}


def run(op: str, device, *args) -> None:
    kernel = _kernels.get((op, device.type))
    if kernel is None:
        kernel = _kernels[(op, device.type)] = registry().kernel(op, device.type)
    kernel(device.index, current_stream_handle(device), *args)


def clear_cache() -> None:
    _kernels.clear()
