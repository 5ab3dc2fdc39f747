"""Graphs: ops captured once on a stream, then replayed as one call with no Python between them.

    g = llaisys.Graph("cuda:0")
    with g.capture():        # ops in this block are recorded, not run
        step(inputs, outputs)
    inputs.copy_from(...)    # new values in the same buffers
    g.replay()               # runs every recorded op again, reading the buffers' current contents

A replay reuses the pointers seen at capture: the tensors the captured ops read and write must stay
alive (keep them with the graph) and keep their storage. Tensors the capture allocated come from a pool
reserved for this graph while it lives (``allocator.GraphPool``), so no one else can be handed memory a
replay writes. The capturing thread may not allocate from the backend, free, synchronize or copy
synchronously (GPU rules; the CPU backend enforces them too): run the step once eagerly first, so that
the allocator's cache already holds what the capture asks for.

Ops that a device's backend lacks run on the CPU backend (``llaisys.fallback``), which synchronizes and
copies on the host: they cannot be captured. ``why_no_graphs(device, ops)`` says so before a capture (graphs
are off for a step that needs them); a capture that meets one fails with NotSupportedError naming it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable

from .device import as_device
from .errors import NotSupportedError
from .plugins import FALLBACK, registry
from .stream import Stream, stream
from .transfer import capture as _transfer_capture

GRAPHS_ENV = "LLAISYS_GRAPHS"


def why_no_graphs(device, ops: Iterable[str] = ()) -> str:
    """Why ops cannot be captured into graphs on ``device`` ("" if they can): LLAISYS_GRAPHS or the device
    type's own switch (LLAISYS_CUDA_GRAPHS, LLAISYS_CPU_GRAPHS, ...) is 0, the backend cannot capture graphs,
    or one of ``ops`` (op slot names: those the caller will capture) runs on the CPU backend because the
    device's backend lacks it (``llaisys.capabilities``): a fallback synchronizes and copies on the host, which
    a graph cannot record, so graphs are off for such a step rather than captured half."""
    device = as_device(device)
    for name in (GRAPHS_ENV, f"LLAISYS_{device.type.upper()}_GRAPHS"):
        if os.environ.get(name, "").strip() == "0":
            return f"{name}=0"
    reg = registry()
    backend = reg.backend(device)
    if not backend.supports("graphs"):
        return f"the '{backend.name}' backend cannot capture graphs"
    fallbacks = [op for op in ops if reg.op_source(op, device.type) == FALLBACK]
    if fallbacks:
        return (f"the '{backend.name}' backend lacks {', '.join(fallbacks)}, which run on the cpu backend "
                f"(a fallback a graph cannot capture)")
    return ""


def graphs_supported(device, ops: Iterable[str] = ()) -> bool:
    """Whether ``device`` can capture and replay graphs of ``ops`` (op slot names; none: whether the backend
    can capture at all): ``why_no_graphs`` is empty. Without ``ops``, a capture that meets an op run on the
    CPU backend still fails, with NotSupportedError naming it (and nothing of it is kept)."""
    return not why_no_graphs(device, ops)


class Graph:
    """A captured sequence of ops on one device (see the module docstring)."""

    def __init__(self, device):
        from .allocator import GraphPool

        self.device = as_device(device)
        self._backend = registry().backend(self.device)
        if not self._backend.supports("graphs"):
            raise NotSupportedError(f"the '{self._backend.name}' backend cannot capture graphs ({self.device})")
        self._allocator = registry().allocator(self.device)
        self._pool: GraphPool | None = GraphPool()
        self.stream: Stream | None = None
        self._handle = 0

    @contextlib.contextmanager
    def capture(self, on: Stream | None = None):
        """Record the ops of the block on ``on`` (default: a new stream of the device) into this graph."""
        if self._handle or self.stream is not None:
            raise NotSupportedError("this graph is already captured: make a new Graph to capture again")
        self.stream = Stream(self.device) if on is None else on
        index, handle = self.device.index, self.stream.handle
        self._backend.graph_begin_capture(index, handle)
        self._allocator.begin_graph_capture(self._pool)
        _transfer_capture.active = True
        try:
            with stream(self.stream):
                yield self
        except BaseException:
            self._end_capture_state()
            with contextlib.suppress(Exception):  # the capture failed: end it and drop what it recorded
                self._backend.graph_destroy(index, self._backend.graph_end_capture(index, handle))
            raise
        self._end_capture_state()
        self._handle = self._backend.graph_end_capture(index, handle)

    def _end_capture_state(self) -> None:
        self._allocator.end_graph_capture()
        _transfer_capture.active = False

    def replay(self) -> None:
        """Run the recorded ops again on the capture's stream, then wait for them."""
        if not self._handle or self.stream is None:
            raise NotSupportedError("replay() of a graph that has not been captured")
        self._backend.graph_launch(self.device.index, self._handle, self.stream.handle)
        self.stream.synchronize()

    def close(self) -> None:
        """Destroy the graph; the memory its capture allocated goes back to the allocator."""
        handle, self._handle = self._handle, 0
        if handle:
            self._backend.graph_destroy(self.device.index, handle)
        if self._pool is not None:
            pool, self._pool = self._pool, None
            self._allocator.release_graph_pool(pool)

    def __del__(self):
        with contextlib.suppress(Exception):
            self.close()

    def __repr__(self) -> str:
        state = "captured" if self._handle else "empty"
        return f"llaisys.Graph({self.device}, {state})"
