"""Where the time of a run goes, op by op.

    with llaisys.profile() as prof:
        model.generate(ids, 8)
    print(prof.table())

Inside the block every op call is timed: its wall time from the call until its work is done (the
profiler synchronizes the device after each call, so on an asynchronous backend the numbers are per op but
the run is slower than it would be unprofiled). Ops are grouped by name (``linear``, ``rms_norm``, ...),
with ``profile(shapes=True)`` by name and sizes (``linear 1x151936x1536``: the op's integer size
arguments before its first buffer, M x N x K for linear), or by the label the caller gives with
``prof.label("lm_head")`` around a call. The collectives of ``llaisys.distributed`` (all_reduce, all_gather,
broadcast of a communicator group) are timed as ops of those names. Outside the block the op
path is untouched: the profiler swaps timed kernels into the kernel cache on entry and drops them on exit.
Calls made while a graph is being captured are not timed (they do not run then); replaying a graph is one
call the profiler does not see (profile eagerly, e.g. with ``LLAISYS_GRAPHS=0``).

An op that the device's backend lacks and the CPU backend runs instead (``llaisys.fallback``) shows as
``<op> (cpu fallback)``, and the copies it makes where the host cannot address the device's memory as the
rows ``fallback copy to host`` and ``fallback copy to device`` (each call's copies: one timed call).

``profile(trace="run.json")`` also records each call as an event of the Chrome Trace Event Format (open the
file in https://ui.perfetto.dev or chrome://tracing) and writes them when the block ends; see ``llaisys.trace``.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import defaultdict

from .abi import OP_SLOTS
from .device import Device
from .errors import LlaisysError
from .plugins import registry
from .trace import TraceRecorder, check_writable
from .transfer import capture as _capture

__all__ = ["OpProfile", "profile"]

# the collectives of llaisys.distributed.Group: where their size argument is among Group._call's arguments
_COLLECTIVE_SIZES = {"all_reduce": 4, "all_gather": 3, "broadcast": 3}


class OpProfile:
    """Calls and seconds per op name (or label), summed over the profiled block; with a trace, each call too
    (``trace_events``)."""

    def __init__(self, recorder: TraceRecorder | None = None):
        self.calls: dict[str, int] = defaultdict(int)
        self.seconds: dict[str, float] = defaultdict(float)
        self.wall_seconds = 0.0  # of the whole block
        self._labels = threading.local()
        self._recorder = recorder

    @contextlib.contextmanager
    def label(self, name: str):
        """Count the op calls of this block under ``name`` (e.g. "lm_head") instead of their op names."""
        previous = getattr(self._labels, "name", None)
        self._labels.name = name
        try:
            yield
        finally:
            self._labels.name = previous

    def _add(self, op: str, seconds: float) -> None:
        name = getattr(self._labels, "name", None) or op
        self.calls[name] += 1
        self.seconds[name] += seconds

    def _trace(self, op: str, category: str, start: float, seconds: float, device: str, sizes: tuple) -> None:
        """Record one call as a trace event (only with a trace: ``profile(trace=...)``)."""
        assert self._recorder is not None
        self._recorder.add(op, getattr(self._labels, "name", None), category, start, seconds, device, sizes)

    @property
    def trace_events(self) -> list[dict]:
        """The calls' Chrome trace events ("ph": "X"), in the order they ended; [] without a trace."""
        return self._recorder.events() if self._recorder is not None else []

    @property
    def op_seconds(self) -> float:
        return sum(self.seconds.values())

    def table(self, per: int = 1, unit: str = "run") -> str:
        """A table of the ops by time, slowest first, with the time outside any op ("other": Python,
        the caller's work) as the last row; times divided by ``per`` (e.g. the number of decode steps)."""
        rows = sorted(self.seconds.items(), key=lambda item: -item[1])
        other = max(self.wall_seconds - self.op_seconds, 0.0)
        total = max(self.wall_seconds, self.op_seconds) or 1.0
        width = max([24, *(len(name) + 2 for name in self.seconds)])
        lines = [f"{'op':{width}}{'calls/' + unit:>12}{'ms/' + unit:>12}{'share':>8}"]
        for name, seconds in rows + [("(outside ops)", other)]:
            calls = self.calls.get(name, 0) / per
            lines.append(f"{name:{width}}{calls:>12.1f}{1e3 * seconds / per:>12.3f}{100 * seconds / total:>7.1f}%")
        lines.append(f"{'total':{width}}{'':>12}{1e3 * total / per:>12.3f}{100.0:>7.1f}%")
        return "\n".join(lines)


@contextlib.contextmanager
def profile(shapes: bool = False, trace: str | os.PathLike | None = None):
    """Time every op called inside the block (all threads, all devices); yields an OpProfile. With
    ``shapes`` the ops are told apart by their sizes too. With ``trace`` (a file path) every call is also
    recorded as a Chrome trace event (``prof.trace_events``), written to that file when the block ends
    (at most ``llaisys.trace.TRACE_EVENT_LIMIT`` events: the calls past it are counted, not recorded).
    A path that cannot be written is an error before the block runs."""
    from .ops._dispatch import clear_plans

    reg = registry()
    if reg.kernel_wrapper is not None:
        raise RuntimeError("llaisys.profile() blocks do not nest")
    path = None if trace is None else check_writable(trace)
    prof = OpProfile(TraceRecorder() if path is not None else None)
    reg.kernel_wrapper = _timed_kernels(prof, reg, shapes)
    clear_plans()  # plans hold kernels: resolve them again, wrapped
    restore_collectives = _time_collectives(prof, reg)
    start = time.perf_counter()
    if prof._recorder is not None:
        prof._recorder.origin = start
    failed: BaseException | None = None
    try:
        yield prof
    except BaseException as e:
        failed = e
        raise
    finally:
        prof.wall_seconds = time.perf_counter() - start
        reg.kernel_wrapper = None
        clear_plans()
        restore_collectives()
        if path is not None:
            _write(prof, path, failed)


def _write(prof: OpProfile, path, failed: BaseException | None) -> None:
    """Write the trace; a failed block's calls too (they show where it was), its own error never masked."""
    assert prof._recorder is not None
    try:
        prof._recorder.write(path)
    except LlaisysError as e:
        if failed is None:
            raise
        if hasattr(failed, "add_note"):  # Python 3.11+
            failed.add_note(str(e))


def _timed_kernels(prof: OpProfile, reg, shapes: bool):
    """The registry's kernel wrapper: each kernel resolved inside the block, timed (and traced)."""
    tracing = prof._recorder is not None

    def timed(op: str, device_type: str, kernel, row: str | None = None):
        """``kernel`` timed under ``row`` (default: the op's name; the CPU fallback's parts have their own)."""
        sizes = _size_positions(op) if shapes or tracing else ()
        name = row or op

        def run(device_index, *args):
            if getattr(_capture, "active", False):  # recorded into a graph, not run now
                return kernel(device_index, *args)
            start = time.perf_counter()
            status = kernel(device_index, *args)
            if not status and device_type != "cpu":
                reg.backend(Device(device_type, device_index)).synchronize(device_index)
            seconds = time.perf_counter() - start
            prof._add(f"{name} {'x'.join(str(args[i]) for i in sizes)}" if shapes and sizes else name, seconds)
            if tracing:
                prof._trace(name, "op", start, seconds, f"{device_type}:{device_index}", tuple(args[i] for i in sizes))
            return status
        return run
    return timed


def _time_collectives(prof: OpProfile, reg):
    """Time the collectives of ``llaisys.distributed`` groups inside the block; returns what undoes it.

    They do not go through the kernel cache: a ``Group`` calls its backend's ``comm_*`` functions through
    ``Group._call``, which is swapped for a timed one for the block's duration (as the kernels are)."""
    from .distributed import Group

    plain = Group.__dict__["_call"]

    def timed_call(group, what: str, fn, *args):
        position = _COLLECTIVE_SIZES.get(what)
        if position is None or getattr(_capture, "active", False):  # init, abort, destroy; or captured
            return plain(group, what, fn, *args)
        start = time.perf_counter()
        result = plain(group, what, fn, *args)
        device = group.device
        if device.type != "cpu":
            reg.backend(device).synchronize(device.index)
        seconds = time.perf_counter() - start
        prof._add(what, seconds)
        if prof._recorder is not None:
            prof._trace(what, "collective", start, seconds, str(device), (args[position],))
        return result

    setattr(Group, "_call", timed_call)  # noqa: B010 (a class attribute, swapped back by restore)

    def restore() -> None:
        setattr(Group, "_call", plain)  # noqa: B010
    return restore


def _size_positions(op: str) -> tuple[int, ...]:
    """Positions (after the stream) of the op's int64 size arguments that come before its first pointer."""
    import ctypes

    positions = []
    for i, kind in enumerate(OP_SLOTS.get(op, ())):
        if kind is ctypes.c_void_p or (isinstance(kind, type) and issubclass(kind, ctypes._Pointer)):
            break
        if kind is ctypes.c_int64:
            positions.append(i + 1)  # args[0] is the stream
    return tuple(positions)
