"""A device buffer shared by tensor views; returned to its allocator when the last view dies."""

from __future__ import annotations

from .device import Device
from .plugins import registry


class Storage:
    __slots__ = ("ptr", "nbytes", "device", "readonly", "_allocator", "_size", "_owner")

    def __init__(self, ptr: int, nbytes: int, device: Device, readonly: bool = False,
                 allocator=None, size: int = 0, owner=None):
        self.ptr = ptr
        self.nbytes = nbytes
        self.device = device
        self.readonly = readonly
        self._allocator = allocator
        self._size = size
        self._owner = owner  # keeps external memory (an mmap, a DLPack producer) alive

    @classmethod
    def allocate(cls, device: Device, nbytes: int) -> "Storage":
        if nbytes == 0:
            registry().backend(device)  # still fail for a missing device
            return cls(0, 0, device)
        allocator = registry().allocator(device)
        ptr, size = allocator.allocate(nbytes)
        return cls(ptr, nbytes, device, allocator=allocator, size=size)

    @classmethod
    def external(cls, ptr: int, nbytes: int, device: Device, owner, readonly: bool = False) -> "Storage":
        return cls(ptr, nbytes, device, readonly=readonly, owner=owner)

    @property
    def backend(self):
        return registry().backend(self.device)

    def __del__(self):
        allocator = self._allocator
        if allocator is not None:
            self._allocator = None
            try:
                allocator.release(self.ptr, self._size)
            except Exception:  # interpreter shutdown: the process frees everything anyway
                pass
