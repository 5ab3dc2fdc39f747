"""A device buffer shared by tensor views; returned to its allocator when the last view dies."""

from __future__ import annotations

from .device import Device
from .plugins import registry


class Storage:
    __slots__ = ("ptr", "nbytes", "device", "readonly", "host", "_allocator", "_size", "_owner")

    def __init__(self, ptr: int, nbytes: int, device: Device, readonly: bool = False, host: bool = False,
                 allocator=None, size: int = 0, owner=None):
        self.ptr = ptr
        self.nbytes = nbytes
        self.device = device
        self.readonly = readonly
        self.host = host  # the host reads and writes ptr directly (CPU memory): copies are a memmove
        self._allocator = allocator
        self._size = size  # the allocator's block size (>= nbytes)
        self._owner = owner  # keeps external memory (an mmap, a DLPack producer) alive

    @classmethod
    def allocate(cls, device: Device, nbytes: int) -> Storage:
        allocator = registry().allocator(device)  # raises, naming the cause, for a device that is not there
        if nbytes == 0:
            return cls(0, 0, device, host=allocator.host)
        ptr, size = allocator.allocate(nbytes)
        return cls(ptr, nbytes, device, host=allocator.host, allocator=allocator, size=size)

    @classmethod
    def external(cls, ptr: int, nbytes: int, device: Device, owner, readonly: bool = False,
                 host: bool | None = None) -> Storage:
        """Memory owned by someone else (kept alive through ``owner``); ``host`` None asks the device's backend."""
        if host is None:
            host = registry().host_addressable(device)
        return cls(ptr, nbytes, device, readonly=readonly, host=host, owner=owner)

    @property
    def backend(self):
        return registry().backend(self.device)

    def __del__(self):
        allocator = self._allocator
        if allocator is not None:
            self._allocator = None
            allocator.release(self.ptr, self._size)  # never blocks and never raises: safe in any finalizer
