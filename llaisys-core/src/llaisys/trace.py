"""Chrome Trace Event Format files: what ``llaisys.profile(trace=...)`` writes (and ``llaisys serve --trace-dir``).

A trace file is one JSON object, ``{"traceEvents": [...], "displayTimeUnit": "ms"}``, that
https://ui.perfetto.dev and chrome://tracing open. Each op call is a complete event::

    {"name": "linear", "cat": "op", "ph": "X", "ts": 1520.125, "dur": 84.5, "pid": 4242, "tid": 4243,
     "args": {"device": "cpu:0", "sizes": [2, 8, 16]}}

``ts`` and ``dur`` are microseconds (``time.perf_counter``), ``ts`` from the start of the profiled block; ``tid``
is the calling thread's native id (a "thread_name" metadata event names it). ``cat`` is "op" for a kernel call,
"collective" for a ``llaisys.distributed`` collective (a future fallback copy between devices would be
"fallback"). A call made inside ``prof.label("head")`` is named "head", its op in ``args["op"]``. ``sizes``:
the op's integer size arguments before its first buffer (what ``profile(shapes=True)`` groups by), the element
count of an all_reduce, the bytes of an all_gather or broadcast.

Memory is bounded: past ``TRACE_EVENT_LIMIT`` events the calls are counted, not recorded, and the file says
how many were dropped (``otherData.dropped_events`` and a "trace truncated" instant event where it began).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
from pathlib import Path

from .errors import LlaisysError, LlaisysValueError

__all__ = ["TRACE_EVENT_LIMIT", "TraceRecorder", "check_writable", "write_trace"]

TRACE_EVENT_LIMIT = 1_000_000  # events one profiled block keeps (~150 bytes each while recording)


class TraceRecorder:
    """Op calls as compact tuples while the block runs (any thread), Chrome trace events on demand."""

    def __init__(self, limit: int | None = None):
        self.limit = TRACE_EVENT_LIMIT if limit is None else limit
        self.origin = 0.0  # perf_counter at the block's start: ts 0
        self.dropped = 0
        self._first_drop: float | None = None
        self._calls: list[tuple] = []
        self._threads: dict[int, str] = {}  # native id -> name, of every thread that made a call
        self._lock = threading.Lock()  # the limit is exact however many threads call

    def add(self, op: str, label: str | None, category: str, start: float, seconds: float, device: str,
            sizes: tuple) -> None:
        tid = threading.get_native_id()
        with self._lock:
            if len(self._calls) >= self.limit:
                self.dropped += 1
                if self._first_drop is None:
                    self._first_drop = start
                return
            self._calls.append((op, label, category, start, seconds, tid, device, sizes))
            if tid not in self._threads:
                self._threads[tid] = threading.current_thread().name

    def events(self) -> list[dict]:
        """Every recorded call as a "ph": "X" event, in the order the calls ended."""
        pid = os.getpid()
        events = []
        for op, label, category, start, seconds, tid, device, sizes in self._calls:
            args: dict = {"device": device, "sizes": list(sizes)}
            if label is not None:
                args["op"] = op
            events.append({"name": label or op, "cat": category, "ph": "X", "ts": self._us(start),
                           "dur": round(seconds * 1e6, 3), "pid": pid, "tid": tid, "args": args})
        return events

    def metadata(self) -> list[dict]:
        """Thread names, and where the trace was cut short if it was."""
        pid = os.getpid()
        meta = [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}
                for tid, name in self._threads.items()]
        if self._first_drop is not None:
            meta.append({"name": "trace truncated", "cat": "trace", "ph": "i", "s": "g", "ts": self._us(self._first_drop),
                         "pid": pid, "tid": 0, "args": {"dropped_events": self.dropped, "event_limit": self.limit}})
        return meta

    def write(self, path: str | os.PathLike) -> None:
        other = {"dropped_events": self.dropped, "event_limit": self.limit} if self.dropped else {}
        write_trace(path, self.metadata() + self.events(), other)

    def _us(self, t: float) -> float:
        return round((t - self.origin) * 1e6, 3)


def check_writable(path: str | os.PathLike) -> Path:
    """``path`` as a Path, if a trace file can be written there (its folder exists and is writable), else a
    LlaisysValueError that says why."""
    try:
        target = Path(os.fspath(path))
    except TypeError:
        raise LlaisysValueError(f"trace must be a file path (str or os.PathLike), got {type(path).__name__}") from None
    folder = target.parent
    if target.is_dir():
        raise LlaisysValueError(f"cannot write the trace to {target}: it is a directory")
    if not folder.is_dir():
        raise LlaisysValueError(f"cannot write the trace to {target}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise LlaisysValueError(f"cannot write the trace to {target}: the folder {folder} is not writable")
    return target


def write_trace(path: str | os.PathLike, events: list[dict], other: dict | None = None) -> None:
    """Write ``{"traceEvents": events, "displayTimeUnit": "ms"}`` (and ``otherData``) to ``path`` atomically: a
    temporary file in the same folder, then renamed over it, so a reader never sees half a trace. A failure is
    a LlaisysError naming the path."""
    target = Path(os.fspath(path))
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            # event by event: a million events never become one string in memory
            f.write('{"traceEvents": [\n')
            for i, event in enumerate(events):
                f.write((",\n" if i else "") + json.dumps(event, separators=(",", ":")))
            f.write('\n], "displayTimeUnit": "ms"')
            if other:
                f.write(', "otherData": ' + json.dumps(other))
            f.write("}\n")
        os.replace(tmp, target)
    except OSError as e:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise LlaisysError(f"cannot write the trace to {target}: {e.strerror or e}") from None

