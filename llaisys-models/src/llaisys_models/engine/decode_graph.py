"""Decode steps replayed from a captured graph: one call per step instead of ~15 op calls per layer.

A decode step (each sequence of the batch adds one token and wants its logits) has the same shapes from
one step to the next. What changes is data: the token ids, positions, KV slots, block tables and lengths,
which the paged ops read from device buffers (backend.h). So a decode step of B sequences is captured
once into a ``llaisys.Graph`` over static input buffers; each later step of B sequences loads its values
into those buffers and replays the graph. A verify step of speculative decoding (sequence i appends its
last token and d_i drafts, and wants the logits of all 1 + d_i rows) is captured the same way, keyed by its
rows per sequence: (1, 1, 1) is a decode step of three sequences, (5, 1) a verify of four drafts beside a
plain decode. Prefill and mixed steps (rows whose logits nobody wants) stay eager.

A captured step is the same kernels on the same buffers as the eager step, so its logits are bit for bit
the eager ones. On by default wherever the backend can capture graphs (CUDA, and the CPU, where it only
saves the Python per op); ``LLAISYS_GRAPHS=0`` turns it off.
"""

from __future__ import annotations

import contextlib
import weakref

import llaisys

from .kv_cache import KVPool
from .step_inputs import HostStep, load_step_inputs, static_step_inputs

# Eager steps of a shape on its static buffers before it is captured: the first one fills the
# allocator's cache with the blocks the step needs, which the capture then takes without asking the backend
# (a GPU forbids that). A capture that fails all the same (the cache gave those blocks away) is retried after
# another eager step, at most MAX_CAPTURE_FAILURES times for a shape.
WARM_UP_STEPS = 1
MAX_CAPTURE_FAILURES = 3
MAX_SHAPES = 16  # step shapes kept captured at once (a serving engine runs 1 .. max_running sequences)
MAX_ROWS = 1 + 16  # rows per sequence of a captured step: a verify of up to 16 drafts (longer ones: eager)


class _DecodeStep:
    """One step shape (rows per sequence): its static input buffers, and once captured the graph reading
    them. It refers to its pool weakly: a graph holds the pool's tensors, so a pool that is gone (or grown:
    new tensors) must take its graphs with it, never be kept alive by them."""

    def __init__(self, pool: KVPool, rows: tuple[int, ...], adapters: bool):
        # tables as wide as the pool; each row's LoRA slot where the step has adapters
        self.step = static_step_inputs(rows, pool.num_blocks, pool.shape.device, adapters, pool.num_groups)
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
        # why decode steps run op by op ("" while graphs may be captured): the device's, or (found at the first
        # capture) an op of the step that runs on the CPU backend, which a graph cannot record (llaisys.fallback)
        self.why_off = llaisys.why_no_graphs(model.device)
        self.enabled = not self.why_off
        # by rows per sequence, and whether rows have LoRA adapters (the step then runs their ops)
        self._steps: dict[tuple[tuple[int, ...], bool], _DecodeStep] = {}
        self.replays = 0  # decode steps served by a graph (tests and benchmarks read it)

    def run(self, pool: KVPool, host: HostStep) -> llaisys.Tensor | None:
        """The logits [rows, vocab] of a decode or verify step (logits of every new row), run from its graph
        once captured; None for any other forward, which the caller runs as usual."""
        if not self.enabled or host.logits_of is None:
            return None
        rows = host.rows
        if rows != host.logits_of or max(rows) > MAX_ROWS:
            return None  # a prefill chunk (rows whose logits nobody wants), or a long verify
        self.release(None)  # the graphs of pools that are gone
        key = rows, host.adapters is not None
        entry = self._steps.get(key)
        if entry is not None and not (entry.fits(pool) and entry.numerics in (None, self.model.numerics)):
            self._drop(key)
            entry = None
        if entry is None:
            if len(self._steps) >= MAX_SHAPES:
                self._drop(next(iter(self._steps)))
            entry = self._steps[key] = _DecodeStep(pool, rows, host.adapters is not None)
        load_step_inputs(entry.step, host)
        if entry.graph is None and not self._ready(pool, entry):
            entry.eager_steps += 1
            return self.model._step(pool, entry.step)
        assert entry.graph is not None and entry.logits is not None  # captured: the graph and the logits it writes
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
                logits = self.model._step(pool, entry.step)
        except llaisys.NotSupportedError as e:  # e.g. an op that falls back: no step of this model can be captured
            graph.close()
            self.enabled, self.why_off = False, str(e)
            return False
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
        for key in [key for key, entry in self._steps.items() if entry.pool() in (None, pool)]:
            self._drop(key)

    def _drop(self, key: tuple[tuple[int, ...], bool]) -> None:
        entry = self._steps.pop(key)
        with contextlib.suppress(llaisys.LlaisysError):
            entry.close()

    def clear(self) -> None:
        for key in list(self._steps):
            self._drop(key)
