"""Where the time of a run goes, op by op.

    with llaisys.profile() as prof:
        model.generate(ids, 8)
    print(prof.table())

Inside the block every op call is timed: its wall time from the call until its work is done (the
profiler synchronizes the device after each call, so on an asynchronous backend the numbers are per op but
the run is slower than it would be unprofiled). Ops are grouped by name (``linear``, ``rms_norm``, ...),
with ``profile(shapes=True)`` by name and sizes (``linear 1x151936x1536``: the op's integer size
arguments before its first buffer, M x N x K for linear), or by the label the caller gives with
``prof.label("lm_head")`` around a call. Outside the block the op
path is untouched: the profiler swaps timed kernels into the kernel cache on entry and drops them on exit.
Calls made while a graph is being captured are not timed (they do not run then); replaying a graph is one
call the profiler does not see (profile eagerly, e.g. with ``LLAISYS_GRAPHS=0``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import defaultdict

from .abi import OP_SLOTS
from .device import Device
from .plugins import registry
from .transfer import capture as _capture

__all__ = ["OpProfile", "profile"]


class OpProfile:
    """Calls and seconds per op name (or label), summed over the profiled block."""

    def __init__(self):
        self.calls: dict[str, int] = defaultdict(int)
        self.seconds: dict[str, float] = defaultdict(float)
        self.wall_seconds = 0.0  # of the whole block
        self._labels = threading.local()

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
def profile(shapes: bool = False):
    """Time every op called inside the block (all threads, all devices); yields an OpProfile. With
    ``shapes`` the ops are told apart by their sizes too."""
    from .ops._dispatch import clear_plans

    reg = registry()
    if reg.kernel_wrapper is not None:
        raise RuntimeError("llaisys.profile() blocks do not nest")
    prof = OpProfile()

    def timed(op: str, device_type: str, kernel):
        sizes = _size_positions(op) if shapes else ()

        def run(device_index, *args):
            if getattr(_capture, "active", False):  # recorded into a graph, not run now
                return kernel(device_index, *args)
            start = time.perf_counter()
            status = kernel(device_index, *args)
            if not status and device_type != "cpu":
                reg.backend(Device(device_type, device_index)).synchronize(device_index)
            seconds = time.perf_counter() - start
            prof._add(f"{op} {'x'.join(str(args[i]) for i in sizes)}" if sizes else op, seconds)
            return status
        return run

    reg.kernel_wrapper = timed
    clear_plans()  # plans hold kernels: resolve them again, wrapped
    start = time.perf_counter()
    try:
        yield prof
    finally:
        prof.wall_seconds = time.perf_counter() - start
        reg.kernel_wrapper = None
        clear_plans()


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
