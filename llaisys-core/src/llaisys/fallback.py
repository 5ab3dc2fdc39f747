"""Partial backends: an op whose slot a device's backend lacks runs on the CPU backend.

``Registry.launcher`` resolves (op, device type) once. Where the device's backend has no kernel for the op
(and no plugin overrides it), the launcher gets one built here around the CPU backend's kernel, with the same
C signature, so op frontends and models see no difference (and the normal path pays nothing: the kernel
cache holds the native kernel itself):

- device memory the host can address (``Backend.host_addressable``): the CPU kernel runs in place, on the
  same pointers, once the op's stream has drained (the CPU kernel runs at once, on the host: what was queued
  before must be done, and what is queued after finds its result written);
- elsewhere: the op's buffers (their bytes from the op's arguments: ``llaisys.buffers``) are copied to host
  memory, the CPU kernel runs there, and the buffers it may write are copied back. Buffers that share memory
  (an in-place op: out is x) share one host copy, so aliasing is kept.

``LLAISYS_FALLBACK=0`` (strict) makes a missing op a ``NotSupportedError`` naming the op and the backend
instead. Kernels are resolved once: after changing it in a running process, call ``llaisys.ops.clear_plans()``.

Graphs: a fallback synchronizes and copies on the host, which a graph cannot record, so it refuses to run
while a graph is being captured (``NotSupportedError``: the capture fails and nothing was recorded for it).
``llaisys.graph.why_no_graphs(device, ops)`` says so before a capture, for the ops a caller will run.

Under ``llaisys.profile()`` a fallback shows as rows of its own: ``<op> (cpu fallback)`` for the CPU kernel
and, where there are copies, ``fallback copy to host`` and ``fallback copy to device``.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from .abi import MemcpyKind
from .errors import LlaisysError, LlaisysValueError, NotSupportedError
from .transfer import capture as _capture

ENV = "LLAISYS_FALLBACK"
COPY_IN = "fallback copy to host"  # profiler rows
COPY_OUT = "fallback copy to device"
HOST_ALIGN = 64  # each buffer's host copy starts at this alignment (the CPU backend's malloc gives 64)


def enabled() -> bool:
    """Whether ops a backend lacks may run on the CPU backend: LLAISYS_FALLBACK unset or 1 (yes), 0 (no)."""
    text = os.environ.get(ENV, "").strip()
    if text in ("", "1"):
        return True
    if text == "0":
        return False
    raise LlaisysValueError(f"{ENV}={text!r}: expected 1 (an op a backend lacks runs on the cpu backend, the "
                            f"default) or 0 (it raises NotSupportedError)")


def row(op: str) -> str:
    """The profiler's name for ``op`` run by the fallback."""
    return f"{op} (cpu fallback)"


def _unwrapped(op, device_type, kernel, row=None):
    return kernel


def launcher(backend, op: str, device_type: str, cpu_kernel: Callable, cpu_fail: Callable,
             wrap: Callable | None) -> tuple[Callable, Callable]:
    """(kernel, fail) running ``op`` of ``backend`` (device type ``device_type``) with the CPU backend's
    ``cpu_kernel``; ``wrap`` is the registry's kernel wrapper (the profiler), applied to each part."""
    wrap = wrap or _unwrapped
    cpu = wrap(op, "cpu", cpu_kernel, row=row(op))
    copy_in = wrap(COPY_IN, device_type, _copy(backend, MemcpyKind.D2H))
    copy_out = wrap(COPY_OUT, device_type, _copy(backend, MemcpyKind.H2D))
    host: dict[int, bool] = {}  # device index -> host-addressable (asked once)

    def kernel(device_index: int, stream, *args) -> int:
        if getattr(_capture, "active", False):
            raise NotSupportedError(
                f"op '{op}' runs on the cpu backend (the '{device_type}' backend lacks it), which a graph cannot "
                f"capture; run it eagerly (LLAISYS_GRAPHS=0) or on a backend that implements it")
        backend.stream_synchronize(device_index, stream)
        in_place = host.get(device_index)
        if in_place is None:
            in_place = host[device_index] = backend.host_addressable(device_index)
        if in_place:
            return cpu(0, None, *args)
        return _through_host(op, device_index, args, cpu, copy_in, copy_out)

    def fail(status: int) -> None:
        try:
            cpu_fail(status)
        except LlaisysError as e:  # say where it ran: the message is the CPU kernel's
            raise type(e)(f"{e} (op '{op}' of the '{device_type}' backend, run on the cpu backend)") from None
    return kernel, fail


def _copy(backend, kind: MemcpyKind) -> Callable:
    """A kernel-like copy of (dst, src, nbytes) pairs between the device and host memory (a profiler row)."""
    def copy(device_index: int, pairs: list[tuple[int, int, int]]) -> int:
        for dst, src, nbytes in pairs:
            backend.memcpy(device_index, dst, src, nbytes, kind)
        return 0
    return copy


def _spans(pointers: list[tuple[int, int]]) -> list[list[int]]:
    """The [start, end) byte ranges covering the (pointer, bytes) buffers, overlapping ones merged."""
    spans: list[list[int]] = []
    for ptr, nbytes in sorted(pointers):
        if spans and ptr < spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], ptr + nbytes)
        else:
            spans.append([ptr, ptr + nbytes])
    return spans


def _through_host(op: str, device_index: int, args: tuple, cpu, copy_in, copy_out) -> int:
    from . import buffers
    from .device import Device
    from .storage import Storage

    positions, writes = buffers.POINTERS[op], buffers.WRITES[op]
    sizes = buffers.extents(op, args)
    used = [(args[p], n) for p, n in zip(positions, sizes) if args[p] and n]
    spans = _spans(used)
    offsets, total = [], 0
    for start, end in spans:
        offsets.append(total)
        total += -(-(end - start) // HOST_ALIGN) * HOST_ALIGN
    staging = Storage.allocate(Device("cpu", 0), max(total, HOST_ALIGN))  # the CPU allocator's cached blocks
    base = staging.ptr

    def host_of(ptr: int) -> int:
        for (start, end), offset in zip(spans, offsets):
            if start <= ptr < end:
                return base + offset + ptr - start
        return base  # a buffer of 0 bytes: any valid host pointer (the kernel reads none of it)

    host_args = list(args)
    written = set()
    for k, (p, n) in enumerate(zip(positions, sizes)):
        if args[p]:
            host_args[p] = host_of(args[p])
            if k in writes and n:
                written.add(next(i for i, (start, end) in enumerate(spans) if start <= args[p] < end))
    copy_in(device_index, [(base + offset, start, end - start) for (start, end), offset in zip(spans, offsets)])
    status = cpu(0, None, *host_args)
    if not status:
        copy_out(device_index, [(spans[i][0], base + offsets[i], spans[i][1] - spans[i][0]) for i in sorted(written)])
    del staging  # back to the CPU allocator's cache
    return status
