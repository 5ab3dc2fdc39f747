"""What every model family shares around its math: construction, forward passes over a paged KV pool,
work buffers, decode graphs, and generation (generation.py).

A family (qwen2.py) subclasses ``CausalLM`` with two things: ``activations()`` (the shapes of the
buffers one token row needs) and ``_run_step(pool, step)`` (every layer over one step's inputs).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

import llaisys
from llaisys.dtype import as_dtype
from llaisys.plugins import NATIVE, OVERRIDE

from ..engine.decode_graph import DecodeGraphs
from ..engine.generation import GenerationMixin
from ..engine.kv_cache import KVPool, KVShape, LayerGroup, check_kv_cache_dtype, layer_groups
from ..engine.runner import ModelRunner
from ..engine.step_inputs import Batch, HostStep, StepInputs, host_step, step_inputs
from ..lora.model import LoRAMixin
from ..parallel.vocab import gather_vocab
from ..text.chat import TextMixin
from . import rope_scaling
from .config import ModelConfig
from .numerics import resolve as resolve_numerics
from .weights import Weights, linear, weight_formats

if TYPE_CHECKING:
    from ..lora.adapter import LoRAAdapter
    from ..parallel.followers import Followers

MAX_WORKSPACES = 64  # row counts kept as views of the work buffer

# How a path becomes a model's parts: the loader's read_directory (loading/loader.py). The loader sits above the
# families, so it hands its reader down when it is imported (``import llaisys_models`` imports it): then
# ``Qwen2(path)`` reads a directory as ``llaisys_models.load(path)`` does.
_read_directory: Callable[..., dict] | None = None


def set_directory_reader(read_directory: Callable[..., dict]) -> None:
    """Make ``read_directory(path, device, dtype, *, progress, mmap, quantize)`` -> keyword arguments of
    ``CausalLM.from_weights`` what ``CausalLM(path, ...)`` loads with."""
    global _read_directory
    _read_directory = read_directory


class Workspace:
    """Activations for a forward pass over ``n`` token rows: views of one buffer per name, kept between forwards."""

    def __init__(self, shapes: dict[str, tuple], n: int, dtype: llaisys.DType, device: llaisys.Device,
                 base: Workspace | None = None) -> None:
        self.n = n
        for name, shape in shapes.items():
            # (a shape may start with its own dtype, e.g. int64 expert ids; else the model's)
            own, shape = (shape[0], shape[1:]) if shape and isinstance(shape[0], llaisys.DType) else (dtype, shape)
            t = llaisys.empty((n, *shape), own, device) if base is None else getattr(base, name).slice(0, 0, n)
            setattr(self, name, t)

    if TYPE_CHECKING:
        def __getattr__(self, name: str) -> llaisys.Tensor:  # (the buffers activations() names)
            ...


class Workspaces:
    """Workspaces of every row count asked for, views of one buffer per activation (``shapes()``) grown (never
    shrunk) to the largest; ``fill(buffer)`` sets a new buffer's constant rows (decode graphs read them)."""

    def __init__(self, shapes: Callable[[], dict[str, tuple]], dtype: llaisys.DType, device: llaisys.Device,
                 fill: Callable[[Workspace], None]) -> None:
        self._shapes, self.dtype, self.device, self._fill = shapes, dtype, device, fill
        self._base: Workspace | None = None
        self._views: dict[int, Workspace] = {}

    def get(self, n: int) -> Workspace:
        ws = self._views.get(n)
        if ws is None:
            shapes = self._shapes()
            if self._base is None or self._base.n < n:
                self._base = Workspace(shapes, n, self.dtype, self.device)
                self._fill(self._base)
                self._views.clear()
            if len(self._views) >= MAX_WORKSPACES:
                self._views.clear()
            ws = self._views[n] = Workspace(shapes, n, self.dtype, self.device, self._base)
        return ws


class CausalLM(GenerationMixin, TextMixin, LoRAMixin):
    """A decoder-only language model on one llaisys device.

    ``Family(path, device=None, dtype=None)`` loads a HuggingFace directory (``llaisys_models.load`` picks
    the family from config.json, and reads GGUF files too): ``device`` None picks the best available device;
    ``dtype`` None computes in the dtype the weights are stored in; ``numerics`` "exact" or "hf" says where
    f16 / bf16 ops round (``llaisys_models.families.numerics``; None: ``$LLAISYS_NUMERICS``); ``mmap`` and
    ``quantize`` as ``llaisys_models.load`` says.

    ``generate`` / ``stream_generate`` run one sequence at a time (calls from several threads take turns);
    ``generate_batch`` runs several together. To serve many users at once, use ``llaisys serve``'s engine.
    ``chat`` / ``complete`` take and return text (text.py), through ``tokenizer`` (loaded on first use).
    ``load_lora`` / ``generate(..., lora=name)``: LoRA adapters beside the weights (lora/model.py).
    """

    def __init__(self, path: str | Path, device: str | llaisys.Device | None = None,
                 dtype: str | llaisys.DType | None = None, *, progress: bool | None = None, mmap: bool | None = None,
                 numerics: str | None = None, quantize: str | None = None) -> None:
        if _read_directory is None:
            raise RuntimeError("no loader: import llaisys_models (its loader reads model directories)")
        parts = _read_directory(path, device, dtype, progress=progress, mmap=mmap, quantize=quantize)
        self._setup(**parts, numerics=numerics)

    @classmethod
    def from_weights(cls, path: str | Path, config: ModelConfig, weights: Weights, *, device: llaisys.Device,
                     dtype: str | llaisys.DType, eos_token_ids: Sequence[int], source: object = None,
                     numerics: str | None = None, quantize: str | None = None,
                     group: llaisys.distributed.Group | None = None) -> CausalLM:
        """A model over weights already placed on ``device`` in ``dtype`` (its linears quantized as
        ``quantize`` says: "int8", "int4" or None), read by a loader (a HuggingFace directory, a GGUF file);
        ``source`` stays alive as long as the model (the memory maps its weights may point into). ``group``:
        the ranks of a tensor-parallel model (``config`` and ``weights`` are then this rank's part, parallel/)."""
        model = cls.__new__(cls)
        model._setup(path, config, weights, device, as_dtype(dtype), eos_token_ids, source, quantize, numerics, group)
        return model

    def _setup(self, path: str | Path, config: ModelConfig, weights: Weights, device: llaisys.Device,
               dtype: llaisys.DType, eos_token_ids: Sequence[int], source: object, quantize: str | None,
               numerics: str | None, group: llaisys.distributed.Group | None = None) -> None:
        self.path, self.config, self.weights, self.device, self.dtype = Path(path), config, weights, device, dtype
        # the ranks this model is split over (their partial sums are all-reduced, their logits gathered): one
        # rank, costing nothing, unless loaded with tensor_parallel
        self.group = group if group is not None else llaisys.distributed.local_group(device)
        self.followers: Followers | None = None  # rank 0 of a tensor-parallel group: the other ranks (parallel/followers.py)
        self.eos_token_ids = tuple(eos_token_ids)
        self.checkpoint = source
        self.quantize = quantize  # as the loader checked it
        self.weight_formats = weight_formats(weights)  # ("q4_k", "q6_k"), ("int8",), () for floats
        self.numerics = resolve_numerics(numerics)
        self._step_lock = threading.Lock()  # one forward at a time: the work buffers are shared
        self._workspaces = Workspaces(self.activations, dtype, device, self.fill_constants)
        self._decode_graphs = DecodeGraphs(self)
        self.loras = {}  # LoRA adapters by name, once loaded (lora/model.py)
        self._kv_cache_dtype = "auto"
        # called after each forward_batch with its batch and the residual stream x [rows, hidden] of its rows (before
        # the final norm), while the step lock is held: a drafter that reads the model's hidden states (deepseek_mtp)
        self.hidden_listener: Callable[[Batch, llaisys.Tensor], None] | None = None
        self.set_rope()

    def set_rope(self) -> None:
        """The rope table (rope_scaling.py) of ``self.config`` on the device, with its cos/sin scale; and where
        the sliding layers have a rope base of their own (Gemma 3), their plain table ``local_rope_inv_freq``."""
        c = self.config
        inv_freq, self.rope_scale = rope_scaling.table(c.head_dim, c.rope_theta, c.rope_scaling,
                                                       c.max_position_embeddings)
        self.rope_inv_freq = llaisys.from_numpy(inv_freq, self.device)
        self.local_rope_inv_freq = None if c.rope_local_theta is None else llaisys.from_numpy(
            llaisys.ops.rope_inv_freq(c.head_dim, c.rope_local_theta), self.device)

    def __repr__(self) -> str:
        c = self.config
        quantized = (f", quantize={self.quantize!r}" if self.quantize else
                     f", weights={'/'.join(self.weight_formats)}" if self.weight_formats else "")
        if self.group.world_size > 1:
            quantized += f", tensor_parallel={self.group.world_size}"
        return (f"{type(self).__name__}({str(self.path)!r}, device={self.device}, dtype={self.dtype.name}{quantized}, "
                f"numerics={self.numerics}, layers={c.num_hidden_layers}, hidden={c.hidden_size}, vocab={c.vocab_size})")

    # -- what the family provides (the ops its forward calls are its family's kernels: family.py) ----------------

    def activations(self) -> dict[str, tuple]:
        """Name -> shape (after the row dimension) of each work buffer ``_run_step`` uses."""
        raise NotImplementedError

    def _run_step(self, pool: KVPool, step: StepInputs) -> llaisys.Tensor:
        """Every layer over one step's inputs (device tensors only: what a decode graph captures); the logits
        of the rows ``step.logit_rows`` names (every row when None)."""
        raise NotImplementedError

    def _logits(self, x: llaisys.Tensor, step: StepInputs) -> llaisys.Tensor:
        """The logits of the rows of the residual stream x that ``step.logit_rows`` names (every row when None):
        the final RMSNorm, then the lm_head."""
        if step.logit_rows is not None:
            last = llaisys.empty((step.logit_rows.shape[0], self.config.hidden_size), self.dtype, self.device)
            llaisys.ops.embedding(last, step.logit_rows, x)  # gathers the rows
            x = last
        c, n = self.config, x.shape[0]
        normed = llaisys.empty((n, c.hidden_size), self.dtype, self.device)
        llaisys.ops.rms_norm(normed, x, self.weights.norm, c.rms_norm_eps, self.numerics)
        logits = llaisys.empty((n, self.weights.lm_head.shape[0]), self.dtype, self.device)  # this rank's vocab rows
        linear(logits, normed, self.weights.lm_head)
        return gather_vocab(logits, c.vocab_size, self.group)

    # -- limits and inputs ------------------------------------------------------------

    @property
    def context_length(self) -> int:
        """The most positions (prompt + new tokens) one sequence may take."""
        return self.config.max_position_embeddings

    def check_length(self, total: int) -> None:
        limit = self.config.max_position_embeddings
        if total > limit:
            raise llaisys.LlaisysValueError(f"prompt + max_new_tokens = {total} positions exceed the model's "
                                            f"max_position_embeddings = {limit}")

    def check_input_ids(self, input_ids: object) -> list[int]:
        """The prompt as a list of ints, each a valid token id (else a LlaisysValueError naming it)."""
        if isinstance(input_ids, llaisys.Tensor):
            input_ids = input_ids.numpy()
        if isinstance(input_ids, np.ndarray):
            if input_ids.ndim != 1 or input_ids.dtype.kind not in "iu":
                raise llaisys.LlaisysValueError(f"input_ids must be a 1-D integer array, got shape "
                                                f"{input_ids.shape} of {input_ids.dtype}")
            input_ids = input_ids.tolist()
        if isinstance(input_ids, (str, bytes)) or not isinstance(input_ids, Sequence):
            raise llaisys.LlaisysValueError(f"input_ids must be a sequence of token ids, got "
                                            f"{type(input_ids).__name__} (tokenize text first)")
        ids = list(input_ids)
        if not ids:
            raise llaisys.LlaisysValueError("input_ids is empty: the prompt needs at least one token")
        vocab = self.config.vocab_size
        for i, t in enumerate(ids):
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < vocab:
                raise llaisys.LlaisysValueError(f"input_ids[{i}] = {t!r} is not a token id in [0, {vocab})")
        return [int(t) for t in ids]

    # -- the KV cache -------------------------------------------------------------------

    @property
    def kv_cache_dtype(self) -> str:
        """How the KV pools made from now on store keys and values: "auto" (the model's dtype), "int8" or "fp8"
        (one byte each and an f16 scale per token and kv head: engine/kv_cache.py)."""
        return self._kv_cache_dtype

    @kv_cache_dtype.setter
    def kv_cache_dtype(self, value: str) -> None:
        value = check_kv_cache_dtype(value)
        if value != "auto":
            sources = llaisys.capabilities(self.device)
            for op in ("paged_kv_write_q", "paged_attention_q"):
                if sources[op] not in (NATIVE, OVERRIDE):
                    raise llaisys.LlaisysValueError(
                        f"kv_cache_dtype={value!r}: the {self.device.type} backend has no {op} kernel (it would run "
                        f"on the CPU through host copies); choose 'auto' there, or update the backend")
        if value != self._kv_cache_dtype:
            self._kv_cache_dtype = value
            self._drop_generator()  # (its pool was made for the old dtype)

    @property
    def kv_shape(self) -> KVShape:
        c = self.config
        return KVShape(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, self.dtype, self.device,
                       self._kv_cache_dtype)

    @property
    def kv_window(self) -> int:
        """The widest sliding window where every layer slides (Mistral, Phi-3, ...): a sequence's blocks wholly
        before it are given back as it grows (kv_blocks.SequenceKV.drop_outside_window); 0 where a layer sees
        every position (no window, or global layers beside sliding ones, as Gemma 3's: kv_layer_groups)."""
        windows = [self.config.window(i) for i in range(self.config.num_hidden_layers)]
        return max(windows) if windows and all(windows) else 0

    @property
    def kv_layer_groups(self) -> tuple[LayerGroup, ...]:
        """The KV cache's layer groups (kv_cache.layer_groups): one, where every layer has the same window (or
        every layer slides: kv_window); else a group per run of layers of one window, each with a block table
        of its own, so the sliding ones give their blocks back while the global ones keep theirs."""
        windows = [self.config.window(i) for i in range(self.config.num_hidden_layers)]
        if self.kv_window or len(set(windows)) == 1:
            return (LayerGroup(0, tuple(range(len(windows)))),)
        return layer_groups(windows)

    def new_kv_pool(self, num_blocks: int | None = None, *, memory: int | None = None, block_size: int = 16,
                    prefix_caching: bool = True, cache_dtype: str | None = None) -> KVPool:
        """A paged KV cache for this model: ``num_blocks`` blocks of ``block_size`` positions, or as many as
        ``memory`` bytes hold, storing ``cache_dtype`` (None: ``kv_cache_dtype``). Sequences in it
        (``pool.sequence()``) are what ``forward_batch`` extends."""
        shape = self.kv_shape
        if cache_dtype is not None:
            shape = dataclasses.replace(shape, cache_dtype=check_kv_cache_dtype(cache_dtype))
        if (num_blocks is None) == (memory is None):
            raise llaisys.LlaisysValueError("give the KV pool's size as num_blocks or as memory, not both")
        groups = self.kv_layer_groups
        if num_blocks is None:
            assert memory is not None  # (one of the two is given: checked above)
            block_bytes = block_size * shape.bytes_per_token * len(groups[0].layers) // shape.num_layers
            num_blocks = memory // block_bytes
            if num_blocks < len(groups):
                raise llaisys.LlaisysValueError(f"a KV budget of {memory} bytes holds no block of {block_size} "
                                                f"positions ({block_bytes * len(groups)} bytes)")
        pool = KVPool(shape, num_blocks, block_size, prefix_caching=prefix_caching, groups=groups)
        pool.window = self.kv_window
        if self.followers is not None:  # the other ranks hold their kv heads of it
            self.followers.new_pool(pool)
        return pool

    def release_kv_pool(self, pool: KVPool) -> None:
        """Drop what the model keeps for ``pool`` (its captured decode steps), when its owner is done with it."""
        with self._step_lock:
            self._decode_graphs.release(pool)

    # -- forward passes -------------------------------------------------------------------

    def forward_batch(self, pool: KVPool, batch: Batch, logits_of: list[int] | None = None) -> llaisys.Tensor:
        """One forward for several sequences of ``pool``: ``batch`` pairs a sequence (blocks reserved for its
        new length) with its new token ids. Appends them and returns the logits of the last ``logits_of[i]``
        new rows of each sequence i (true: its last row; a verify step of speculative decoding asks for
        several), [R, vocab] in batch order, or of every row when ``logits_of`` is None."""
        host = host_step(batch, logits_of)
        with self._step_lock:
            if self.lora is not None:  # each row's LoRA slot, its adapters placed in slots (None: no adapter)
                host.adapters = self.lora.rows(batch)
            if self.followers is not None:  # every rank runs the step (rank 0 sends it first)
                logits = self.followers.run_step(pool, host, self._forward)
            else:
                logits = self._forward(pool, host)
            if self.hidden_listener is not None:  # (a multi-token-prediction drafter: the rows' last hidden states)
                self.hidden_listener(batch, self._workspace(len(host.tokens)).x)
        for seq, ids in batch:
            seq.commit(ids)
        return logits

    def _forward(self, pool: KVPool, host: HostStep) -> llaisys.Tensor:
        """One step on this model's device (and, in a tensor-parallel group, on every rank: the others run
        what rank 0 sends them, tensor_parallel/); the caller holds the step lock."""
        logits = self._decode_graphs.run(pool, host)  # a decode step, replayed from its graph
        if logits is None:
            logits = self._step(pool, step_inputs(host, self.device))
        return logits

    def _step(self, pool: KVPool, step: StepInputs) -> llaisys.Tensor:
        """``_run_step``, its adapted linears reading the step's LoRA slots (eager, and when a graph is captured)."""
        if self.lora is not None:
            self.lora.step.adapters = step.adapters
        return self._run_step(pool, step)

    def session(self, lora: str | None = None) -> Session:
        """One sequence fed by hand (teacher forcing, step-by-step checks), in a KV pool of its own; ``lora``: the
        name of a loaded LoRA adapter it runs under."""
        return Session(self, adapter=self.lora_for(lora))

    def logits(self, input_ids, lora: str | None = None) -> np.ndarray:
        """Float32 logits [n, vocab] of every position of ``input_ids``, computed from scratch (under the LoRA
        adapter ``lora``, if named)."""
        return self.session(lora).forward(input_ids, all_logits=True).numpy().astype(np.float32)

    def clear_decode_graphs(self) -> None:
        """Drop the captured decode steps (decode_graph.py) and the memory they hold; later decode steps
        capture again."""
        with self._step_lock:
            self._graphs_stale()

    def _graphs_stale(self) -> None:
        self._decode_graphs.clear()
        if self.followers is not None:
            self.followers.clear_graphs()

    def _drop_generator(self) -> None:
        if self._generator is not None:
            self.release_kv_pool(self._generator.pool)
            self._generator = None

    def close(self) -> None:
        """End what the model holds beyond memory: a tensor-parallel model's other ranks leave and exit (they
        also do when this process ends)."""
        if self.followers is not None:
            self.followers.close()

    def _workspace(self, n: int) -> Workspace:
        """Row views of one buffer, grown (never shrunk) to the largest forward so far."""
        return self._workspaces.get(n)

    def fill_constants(self, ws: Workspace) -> None:
        """Set a new work buffer's constant rows (a family whose forward reads some: none here)."""


class Session:
    """A sequence fed by hand: ``forward(ids)`` runs ``ids`` at the positions after the cached ones and
    appends them; ``truncate(n)`` keeps the first ``n``. Its KV pool (no prefix caching) grows as needed; its
    forwards go through a model runner of that pool (engine/runner.py), as the scheduler's do."""

    def __init__(self, model: CausalLM, block_size: int = 16, adapter: LoRAAdapter | None = None) -> None:
        self.model = model
        self.pool = model.new_kv_pool(num_blocks=1, block_size=block_size, prefix_caching=False)
        self.kv = self.pool.sequence(adapter=adapter)
        self.runner = ModelRunner(model, self.pool)

    def __len__(self) -> int:
        return len(self.kv)

    @property
    def tokens(self) -> list[int]:
        return list(self.kv.tokens)

    def forward(self, input_ids: object, all_logits: bool = False) -> llaisys.Tensor:
        """The logits of the last new position ([1, vocab]), or of every new position ([n, vocab])."""
        ids = self.model.check_input_ids(input_ids)
        length = len(self.kv) + len(ids)
        self.model.check_length(length)
        self.pool.reserve_growing(self.kv, length)
        return self.runner.forward([(self.kv, ids)], None if all_logits else [True])

    def truncate(self, length: int) -> None:
        self.kv.truncate(length)
