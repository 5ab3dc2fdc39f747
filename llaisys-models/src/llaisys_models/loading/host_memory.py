"""Host buffers for weights made at load time (decoded GGUF tensors, int8-quantized linears for other devices)
and writable views of a CPU weight's own buffer."""

from __future__ import annotations

import ctypes
import mmap

import numpy as np

import llaisys

MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux >= 5.14


def host_buffer(nbytes: int) -> np.ndarray:
    """A writable host buffer (uint8 [nbytes]) for one tensor made at load time: an anonymous mapping
    of base pages, faulted in by one madvise call where the kernel offers it.

    ``np.empty`` asks for transparent huge pages for large arrays; on a busy machine with fragmented
    memory the kernel then stalls compacting memory at each fault: the 1.5B-shape Q8_0 load took
    11-13 s that way, against 4-4.3 s with this (5.4 s without the populate call).
    """
    if not hasattr(mmap, "MAP_ANONYMOUS"):
        return np.empty(nbytes, np.uint8)
    buf = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        buf.madvise(MADV_POPULATE_WRITE)
    except (OSError, AttributeError):  # an older kernel: the pages fault in as they are written
        pass
    return np.frombuffer(buf, np.uint8, nbytes)


def populate(array: np.ndarray) -> None:
    """Fault in the pages of a fresh writable buffer (page-aligned, e.g. a large CPU tensor's) with one madvise
    call, where the kernel offers it: faulting them one by one as a conversion writes them cost 4 s per GiB
    on this busy 2-core VM (transparent huge pages compacting memory), the one call 0.8 s."""
    if array.nbytes < mmap.PAGESIZE or array.ctypes.data % mmap.PAGESIZE:
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise(ctypes.c_void_p(array.ctypes.data), ctypes.c_size_t(array.nbytes), MADV_POPULATE_WRITE)
    except (OSError, AttributeError):  # no madvise here: the pages fault in as they are written
        pass


def bytes_of(tensor: llaisys.Tensor) -> np.ndarray:
    """A writable uint8 numpy view of a contiguous CPU tensor's memory, for filling a weight's own buffer
    at load time (DLPack cannot carry bf16). The backend puts buffers of 4 MiB and more on huge pages,
    which decoding streams ~10% faster than base pages."""
    return np.ctypeslib.as_array((ctypes.c_uint8 * tensor.nbytes).from_address(tensor.data_ptr()))
