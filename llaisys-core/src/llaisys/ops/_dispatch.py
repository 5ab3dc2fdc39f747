"""Per-op dispatch: the kernel for (op, device type) is resolved once, then a dict lookup."""

from __future__ import annotations

from ..device import as_device
from ..errors import LlaisysError
from ..plugins import registry
from ..stream import current_stream_handle

_kernels: dict[tuple[str, str], object] = {}


def run(op: str, device, *args) -> None:
    kernel = _kernels.get((op, device.type))
    if kernel is None:
        kernel = _kernels[(op, device.type)] = registry().kernel(op, device.type)
    kernel(device.index, current_stream_handle(device), *args)


def implemented(op: str, device) -> bool:
    """Whether ``device``'s backend has a kernel for ``op`` (so a caller can refuse, or choose another
    device, before a model runs instead of failing at its first call)."""
    try:
        registry().kernel(op, as_device(device).type)
    except LlaisysError:
        return False
    return True


def clear_cache() -> None:
    _kernels.clear()
