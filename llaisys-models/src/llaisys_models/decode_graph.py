"""Decode steps replayed from a captured graph: one call per step instead of ~15 op calls per layer.

A decode step (each sequence of the batch adds one token and wants its logits) has the same shapes from
one step to the next. What changes is data: the token ids, positions, KV slots, block tables and lengths,
which the paged ops read from device buffers (backend.h). So a decode step of B sequences is captured
once into a ``llaisys.Graph`` over static input buffers; each later step of B sequences loads its values
into those buffers and replays the graph. Prefill and mixed steps stay eager, and so do the verify steps of
speculative decoding (several rows per sequence; a step where nothing was drafted is a decode step).

A captured step is the same kernels on the same buffers as the eager step, so its logits are bit for bit
the eager ones. On by default wherever the backend can capture graphs (CUDA, and the CPU, where it only
saves the Python per op); ``LLAISYS_GRAPHS=0`` turns it off.
"""

from __future__ import annotations

import contextlib
import weakref

import llaisys

from .kv_cache import KVPool
from .step_inputs import Batch, load_step_inputs, static_step_inputs

# Eager decode steps of a batch size on its static buffers before it is captured: the first one fills the
# allocator's cache with the blocks the step needs, which the capture then takes without asking the backend
# (a GPU forbids that). A capture that fails all the same (the cache gave those blocks away) is retried after
# another eager step, at most MAX_CAPTURE_FAILURES times for a batch size.
WARM_UP_STEPS = 1
MAX_CAPTURE_FAILURES = 3
MAX_SIZES = 16  # batch sizes kept captured at once (a serving engine runs 1 .. max_running)


class _DecodeStep:
    """One batch size: its static input buffers, and once captured the graph reading them. It refers to its
    pool weakly: a graph holds the pool's tensors, so a pool that is gone (or grown: new tensors) must take
    its graphs with it, never be kept alive by them."""

    def __init__(self, pool: KVPool, size: int):
        self.step = static_step_inputs(size, pool.num_blocks, pool.shape.device)  # tables as wide as the pool
        self.pool, self.generation = weakref.ref(pool), pool.generation
        self.graph: llaisys.Graph | None = None
        self.numerics = None  # the model's numerics when captured (a benchmark may switch it)
        self.logits: llaisys.Tensor | None = None  # what the graph writes
        self.workspace = None  # the activations the graph writes: kept alive as long as the graph
        self.eager_steps = 0
        self.failures = 0

    def fits(self, pool: KVPool) -> bool:
        """Whether the graph still points at ``pool``'s memory (growing a pool reallocates it)."""
        return self.pool() is pool and pool.generation == self.generation

    def close(self) -> None:
        if self.graph is not None:
            self.graph.close()
            self.graph = None


class DecodeGraphs:
    """Captures and replays the decode steps of one model (``model._run_step``)."""

    def __init__(self, model):
        self.model = model
        self.enabled = llaisys.graphs_supported(model.device)
        self._steps: dict[int, _DecodeStep] = {}
        self.replays = 0  # decode steps served by a graph (tests and benchmarks read it)

    def run(self, pool: KVPool, batch: Batch, logits_of: list[int] | None) -> llaisys.Tensor | None:
        """The logits [B, vocab] of a decode step (one new token per sequence, logits for each), run from its
        graph once captured; None for any other forward, which the caller runs as usual."""
        if not self.enabled or any(len(ids) != 1 for _, ids in batch):
            return None
        if logits_of is not None and not all(logits_of):
            return None
        self.release(None)  # the graphs of pools that are gone
        size = len(batch)
        entry = self._steps.get(size)
        if entry is not None and not (entry.fits(pool) and entry.numerics in (None, self.model.numerics)):
            self._drop(size)
            entry = None
        if entry is None:
            if len(self._steps) >= MAX_SIZES:
                self._drop(next(iter(self._steps)))
            entry = self._steps[size] = _DecodeStep(pool, size)
        load_step_inputs(entry.step, batch)
        if entry.graph is None and not self._ready(pool, entry):
            entry.eager_steps += 1
            return self.model._run_step(pool, entry.step)
        entry.graph.replay()
        self.replays += 1
        # a new tensor per step, as the eager path returns: a caller may keep one step's logits
        logits = llaisys.empty(entry.logits.shape, entry.logits.dtype, entry.logits.device)
        llaisys.ops.rearrange(logits, entry.logits)
        return logits

    def _ready(self, pool: KVPool, entry: _DecodeStep) -> bool:
        """Capture ``entry`` if it is time; whether it now has a graph."""
        if entry.eager_steps < WARM_UP_STEPS or entry.failures >= MAX_CAPTURE_FAILURES:
            return False
        graph = llaisys.Graph(self.model.device)
        workspace = self.model._workspace(entry.step.num_tokens)
        try:
            with graph.capture():
                logits = self.model._run_step(pool, entry.step)
        except llaisys.LlaisysError:
            graph.close()
            entry.failures += 1
            entry.eager_steps = 0
            return False
        entry.graph, entry.logits, entry.workspace = graph, logits, workspace
        entry.numerics = self.model.numerics
        return True

    def release(self, pool: KVPool | None) -> None:
        """Drop the graphs captured on ``pool`` (a pool its owner is done with), and those of pools gone."""
        for size in [size for size, entry in self._steps.items() if entry.pool() in (None, pool)]:
            self._drop(size)

    def _drop(self, size: int) -> None:
        entry = self._steps.pop(size)
        with contextlib.suppress(llaisys.LlaisysError):
            entry.close()

    def clear(self) -> None:
        for size in list(self._steps):
            self._drop(size)
