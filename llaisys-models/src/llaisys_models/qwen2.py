"""Qwen2 (and the Llama architecture, its bias-free sibling), written only with ``llaisys.ops``.

    x = embed(ids)
    for each layer:
        h = rms_norm(x);  q, k, v = h Wq + bq, h Wk + bk, h Wv + bv
        cache[pos] = rope(k), v;  x += attention(rope(q), cache[:pos+1]) Wo
        h = rms_norm(x);  x += (silu(h Wgate) * h Wup) Wdown
    logits = rms_norm(x[last]) Wlm

One forward runs any number of sequences at once (continuous batching): their new tokens are stacked
into the rows of x, every matmul reads each weight once for all of them, and attention reads each
sequence's own keys and values through its block table in the paged KV cache (paged_kv.py). A single
sequence (``generate``) is the batch of one: one code path.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import llaisys
from llaisys.device import as_device
from llaisys.dtype import as_dtype

from . import quantize as quantization
from .config import ModelConfig, token_ids
from .decode_graph import DecodeGraphs
from .errors import ModelLoadError
from .files import model_directory, read_json
from .generation import GenerationMixin
from .locking import ModelLock
from .numerics import resolve as resolve_numerics
from .paged_kv import KVPool, KVShape, SequenceKV, StepInputs
from .quantize import linear
from .safetensors import Checkpoint
from .weights import FLOAT_WEIGHTS, LayerWeights, Weights, default_dtype, load_weights


class Workspace:
    """Activations for a forward pass over ``n`` token rows (views of a buffer kept between forwards)."""

    def __init__(self, config: ModelConfig, n: int, dtype, device, base: Workspace | None = None):
        c = config
        self.n = n
        shapes = {
            "x": (c.hidden_size,),  # the residual stream
            "h": (c.hidden_size,),  # normed input of attention / MLP
            "q": (c.q_size,),
            "q_rot": (c.num_attention_heads, c.head_dim),
            "k": (c.num_key_value_heads, c.head_dim),  # roped in place
            "v": (c.num_key_value_heads, c.head_dim),
            "attn": (c.num_attention_heads, c.head_dim),
            "out": (c.hidden_size,),  # o_proj / down_proj result, added to x
            "gate": (c.intermediate_size,),
            "up": (c.intermediate_size,),
            "act": (c.intermediate_size,),
        }
        for name, shape in shapes.items():
            t = llaisys.empty((n, *shape), dtype, device) if base is None else getattr(base, name).slice(0, 0, n)
            setattr(self, name, t)


class Qwen2(GenerationMixin):
    """A Qwen2-architecture causal LM on one llaisys device.

    ``Qwen2(path, device=None, dtype=None)``: ``device`` None picks the best available
    device; ``dtype`` None computes in the dtype the weights are stored in; ``numerics`` "exact"
    or "hf" says where f16 / bf16 ops round (``llaisys_models.numerics``; None: ``$LLAISYS_NUMERICS``).
    ``mmap`` None (the default) reads the weights into memory on the CPU (huge pages: decoding streams them
    ~10% faster than from the page cache's 4 KiB pages) and maps the files for other devices and for int8
    (quantized from the mapping, a chunk at a time); True maps them (zero copy on the CPU: instant load,
    but a file changed on disk may then crash the process); False always reads them.
    ``quantize="int8"`` stores the linears' weights in int8 (``llaisys_models.quantize``): about half the
    memory and bytes read per token of bf16, at a small, stated loss of accuracy; None (the default) keeps
    them in the model dtype.

    One model holds one KV cache, so it runs one generation at a time: calls from several
    threads take turns (``forward``, ``generate``, a ``stream_generate`` until it finishes
    or is closed); the same thread starting a second one while its stream is open gets a
    ``ModelBusyError``. To serve many users at once, use ``llaisys serve``'s engine.
    """

    architectures = ("Qwen2ForCausalLM",)

    def __init__(self, path, device=None, dtype=None, *, progress: bool | None = None, mmap: bool | None = None,
                 numerics: str | None = None, quantize: str | None = None):
        self.numerics = resolve_numerics(numerics)
        self.quantize = quantization.resolve(quantize)
        self.path = model_directory(path)
        config = ModelConfig.from_file(self.path)
        supported = {a for cls in _all_model_classes() for a in cls.architectures}
        if config.architecture not in supported:
            raise ModelLoadError(f"{self.path}/config.json: architecture {config.architecture or '(none)'!r} is "
                                 f"not supported; llaisys_models runs {', '.join(sorted(supported))}")
        self.config = config
        self.device = _pick_device(device, self.quantize)
        if mmap is None:  # CPU: weights read into memory, unless int8 (quantized in memory from the mapping)
            mmap = self.device.type != "cpu" or self.quantize is not None
        checkpoint = Checkpoint(self.path, mapped=mmap)
        self.dtype = default_dtype(checkpoint, config) if dtype is None else as_dtype(dtype)
        if self.dtype not in FLOAT_WEIGHTS:
            raise ModelLoadError(f"dtype must be float32, float16 or bfloat16, got {self.dtype.name}")
        self.eos_token_ids = _eos_token_ids(self.path, config)
        self.weights = load_weights(checkpoint, config, self.dtype, self.device, progress=progress,
                                    quantize=self.quantize)
        self.checkpoint = checkpoint  # keeps the memory maps the weights may point into
        self._prepare()

    @classmethod
    def from_weights(cls, path, config: ModelConfig, weights: Weights, *, device: llaisys.Device,
                     dtype: llaisys.DType, eos_token_ids, source=None, numerics: str | None = None,
                     quantize: str | None = None) -> "Qwen2":
        """A model over weights already placed on ``device`` in ``dtype`` (its linears quantized as
        ``quantize`` says), read from a source other than a HuggingFace directory (a GGUF file);
        ``source`` stays alive as long as the model."""
        model = cls.__new__(cls)
        model.numerics = resolve_numerics(numerics)
        model.quantize = quantization.resolve(quantize)
        model.path, model.config, model.device, model.dtype = Path(path), config, device, dtype
        model.eos_token_ids = tuple(eos_token_ids)
        model.weights, model.checkpoint = weights, source
        model._prepare()
        return model

    def _prepare(self) -> None:
        """The KV cache and decode state, once config, device, dtype and weights are set."""
        config = self.config
        self._kv_pool: KVPool | None = None  # the model's own, made on first use
        self._cache: SequenceKV | None = None
        self.scale = config.head_dim ** -0.5
        self._workspace_base: Workspace | None = None
        self._workspaces: dict[int, Workspace] = {}
        self.lock = ModelLock()
        self._decode_graphs = DecodeGraphs(self)

    def __repr__(self) -> str:
        c = self.config
        quantized = f", quantize={self.quantize!r}" if self.quantize else ""
        return (f"{type(self).__name__}({str(self.path)!r}, device={self.device}, dtype={self.dtype.name}{quantized}, "
                f"numerics={self.numerics}, layers={c.num_hidden_layers}, hidden={c.hidden_size}, vocab={c.vocab_size})")

    # -- the cache ----------------------------------------------------------------

    @property
    def kv_pool(self) -> KVPool:
        """The model's own KV pool (for ``generate`` and ``forward``): made on first use with room for 256
        positions, and grown when a sequence needs more."""
        if self._kv_pool is None:
            self._kv_pool = self.new_kv_pool(num_blocks=-(-256 // 16), prefix_caching=False)
        return self._kv_pool

    @kv_pool.setter
    def kv_pool(self, pool: KVPool) -> None:
        """Use ``pool`` (from ``new_kv_pool``) as the model's own; the default sequence starts empty in it."""
        if self._cache is not None:
            self._cache.release()
        self._kv_pool, self._cache = pool, None

    @property
    def cache(self) -> SequenceKV:
        """The sequence ``forward`` extends by default, in the model's own pool."""
        if self._cache is None:
            self._cache = self.kv_pool.sequence()
        return self._cache

    @property
    def kv_shape(self) -> KVShape:
        c = self.config
        return KVShape(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, self.dtype, self.device)

    def new_kv_pool(self, num_blocks: int | None = None, *, memory: int | None = None, block_size: int = 16,
                    prefix_caching: bool = True) -> KVPool:
        """A paged KV cache for this model: ``num_blocks`` blocks of ``block_size`` positions, or as many as
        ``memory`` bytes hold. Sequences in it (``pool.sequence()``) are what ``forward_batch`` extends."""
        if (num_blocks is None) == (memory is None):
            raise llaisys.LlaisysValueError("give the KV pool's size as num_blocks or as memory, not both")
        if num_blocks is None:
            num_blocks = memory // (block_size * self.kv_shape.bytes_per_token)
            if num_blocks < 1:
                raise llaisys.LlaisysValueError(f"a KV budget of {memory} bytes holds no block of {block_size} "
                                                f"positions ({block_size * self.kv_shape.bytes_per_token} bytes)")
        return KVPool(self.kv_shape, num_blocks, block_size, prefix_caching=prefix_caching)

    def new_cache(self) -> SequenceKV:
        """An empty sequence in the model's own KV pool: ``forward(..., cache=c)`` extends ``c`` instead of
        the model's default sequence."""
        return self.kv_pool.sequence()

    def reset(self) -> None:
        """Forget the cached tokens (their blocks go back to the pool, which keeps its memory)."""
        with self.lock.hold("reset"):
            self.cache.release()

    def truncate(self, length: int) -> None:
        """Keep only the first ``length`` cached tokens; the next forward continues from there."""
        with self.lock.hold("truncate"):
            self.cache.truncate(length)

    def reserve(self, cache: SequenceKV, length: int) -> None:
        """Blocks for ``length`` positions in ``cache``; the model's own pool grows when it must."""
        if cache.reserve(length):
            return
        pool = cache.pool
        if pool is not self.kv_pool:
            raise llaisys.LlaisysError(f"the KV pool is out of blocks: {length} positions need "
                                       f"{cache.blocks_for(length)} more, {pool.num_free} are free")
        pool.grow(pool.num_blocks + max(cache.blocks_for(length) - pool.num_free, pool.num_blocks))
        cache.reserve(length)

    # -- the forward pass ---------------------------------------------------------

    def forward(self, input_ids, all_logits: bool = False, *, cache: SequenceKV | None = None) -> llaisys.Tensor:
        """Run ``input_ids`` at the positions after the cached ones, append them to the cache and
        return the logits of the last position ([1, vocab]), or of every position ([n, vocab]).

        ``cache`` (a sequence from ``new_cache`` or a pool of ``new_kv_pool``) replaces the model's own for
        this call (the work buffers are still the model's: calls take turns, see the class docstring)."""
        with self.lock.hold("forward"):
            return self._forward(input_ids, all_logits, cache=cache)

    def _forward(self, input_ids, all_logits: bool = False, *, cache: SequenceKV | None = None) -> llaisys.Tensor:
        ids = self.check_input_ids(input_ids)
        cache = self.cache if cache is None else cache
        self.check_length(len(cache) + len(ids))
        self.reserve(cache, len(cache) + len(ids))
        return self._forward_batch([(cache, ids)], None if all_logits else [True])

    def forward_batch(self, batch: list[tuple[SequenceKV, list[int]]], logits_of: list[bool] | None = None
                      ) -> llaisys.Tensor:
        """One forward for several sequences of one pool: ``batch`` pairs a sequence (blocks reserved for
        its new length) with its new token ids. Appends them and returns the logits of the last new row
        of each sequence whose ``logits_of`` entry is true ([R, vocab], in batch order), or of every
        row when ``logits_of`` is None."""
        with self.lock.hold("forward_batch"):
            return self._forward_batch(batch, logits_of)

    def _forward_batch(self, batch: list[tuple[SequenceKV, list[int]]], logits_of: list[bool] | None
                       ) -> llaisys.Tensor:
        pool = batch[0][0].pool
        logits = self._decode_graphs.run(batch, logits_of)  # a decode step, replayed from its graph
        if logits is None:
            logits = self._run_step(pool, pool.step_inputs(batch, logits_of))
        for seq, ids in batch:
            seq.commit(ids)
        return logits

    def clear_decode_graphs(self) -> None:
        """Drop the captured decode steps (decode_graph.py) and the memory they hold; later decode steps
        capture again."""
        with self.lock.hold("clear_decode_graphs"):
            self._decode_graphs.clear()

    def _run_step(self, pool: KVPool, step: StepInputs) -> llaisys.Tensor:
        """Every layer over one step's inputs (device tensors only: what a decode graph captures)."""
        ws = self._workspace(step.num_tokens)
        llaisys.ops.embedding(ws.x, step.tokens, self.weights.embed_tokens)
        for i, layer in enumerate(self.weights.layers):
            self._attention(i, layer, ws, pool, step)
            self._mlp(layer, ws)
        if step.logit_rows is None:
            return self._lm_head(ws.x)
        last = llaisys.empty((step.logit_rows.shape[0], self.config.hidden_size), self.dtype, self.device)
        llaisys.ops.embedding(last, step.logit_rows, ws.x)  # gathers the rows
        return self._lm_head(last)

    def _attention(self, i: int, w: LayerWeights, ws: Workspace, pool: KVPool, step: StepInputs) -> None:
        c, ops, n, numerics = self.config, llaisys.ops, ws.n, self.numerics
        ops.rms_norm(ws.h, ws.x, w.input_norm, c.rms_norm_eps, numerics)
        linear(ws.q, ws.h, w.q_proj, w.q_bias)
        linear(ws.k.view(n, c.kv_size), ws.h, w.k_proj, w.k_bias)
        linear(ws.v.view(n, c.kv_size), ws.h, w.v_proj, w.v_bias)
        ops.rope(ws.q_rot, ws.q.view(n, c.num_attention_heads, c.head_dim), step.positions, c.rope_theta, numerics)
        ops.rope(ws.k, ws.k, step.positions, c.rope_theta, numerics)
        keys, values = pool.keys[i], pool.values[i]
        ops.paged_kv_write(keys, values, ws.k, ws.v, step.slots)
        ops.paged_attention(ws.attn, ws.q_rot, keys, values, step.block_tables, step.seq_lens, step.query_start,
                            self.scale, numerics)
        linear(ws.out, ws.attn.view(n, c.q_size), w.o_proj, w.o_bias)
        ops.add(ws.x, ws.x, ws.out)

    def _mlp(self, w: LayerWeights, ws: Workspace) -> None:
        c, ops, numerics = self.config, llaisys.ops, self.numerics
        ops.rms_norm(ws.h, ws.x, w.post_norm, c.rms_norm_eps, numerics)
        linear(ws.gate, ws.h, w.gate_proj, w.gate_bias)
        linear(ws.up, ws.h, w.up_proj, w.up_bias)
        ops.swiglu(ws.act, ws.gate, ws.up, numerics)
        linear(ws.out, ws.act, w.down_proj, w.down_bias)
        ops.add(ws.x, ws.x, ws.out)

    def _lm_head(self, x: llaisys.Tensor) -> llaisys.Tensor:
        c, n = self.config, x.shape[0]
        normed = llaisys.empty((n, c.hidden_size), self.dtype, self.device)
        llaisys.ops.rms_norm(normed, x, self.weights.norm, c.rms_norm_eps, self.numerics)
        logits = llaisys.empty((n, c.vocab_size), self.dtype, self.device)
        linear(logits, normed, self.weights.lm_head)
        return logits

    def _workspace(self, n: int) -> Workspace:
        """Row views of one buffer, grown (never shrunk) to the largest forward so far."""
        ws = self._workspaces.get(n)
        if ws is None:
            if self._workspace_base is None or self._workspace_base.n < n:
                self._workspace_base = Workspace(self.config, n, self.dtype, self.device)
                self._workspaces.clear()
            if len(self._workspaces) >= 64:
                self._workspaces.clear()
            ws = self._workspaces[n] = Workspace(self.config, n, self.dtype, self.device, self._workspace_base)
        return ws

    def logits(self, input_ids) -> np.ndarray:
        """Float32 logits [n, vocab] of every position of ``input_ids``, from an empty cache."""
        with self.lock.hold("logits"):
            self.cache.release()
            return self._forward(input_ids, all_logits=True).numpy().astype(np.float32)


class Llama(Qwen2):
    """Llama-architecture checkpoints: the same decoder, biases as ``attention_bias`` / ``mlp_bias`` say."""

    architectures = ("LlamaForCausalLM",)


def _all_model_classes():
    return (Qwen2, Llama)


# Every op a forward, the paged KV cache and sampling call: a device whose backend lacks one cannot run the
# model (there is no second, unpaged code path), which is said when the model loads.
KERNELS = ("embedding", "rms_norm", "linear", "rope", "paged_kv_write", "paged_attention", "swiglu", "add",
           "rearrange", "argmax", "sample")


def _missing_kernels(device: llaisys.Device) -> list[str]:
    return [op for op in KERNELS if not llaisys.ops.implemented(op, device)]


def _pick_device(device, quantize: str | None = None) -> llaisys.Device:
    """The device asked for, or (None) the best available one whose backend runs every op of KERNELS (and
    the quantized linear when ``quantize`` asks for one)."""
    if device is None:
        devices = llaisys.available_devices()
        if not devices:  # core's one line: each plugin's state (disabled, no device + why, failed + why) or what to install
            raise llaisys.BackendUnavailableError(llaisys.plugins.why_no_device())
        able = [d for d in devices if not _missing_kernels(d) and not quantization.missing_kernels(d, quantize)]
        device = able[0] if able else devices[0]  # none able: the best one's error below
    device = as_device(device)
    llaisys.empty((0,), llaisys.float32, device)  # raises, naming the cause, for a device that is not there
    missing = _missing_kernels(device)
    if missing:
        raise llaisys.BackendUnavailableError(
            f"the '{device.type}' backend does not implement {', '.join(missing)}, which the model needs (its KV "
            f"cache is paged); run it on another device (e.g. device='cpu', --device cpu)")
    quantization.check_device(device, quantize)
    return device


def _eos_token_ids(path: Path, config: ModelConfig) -> tuple[int, ...]:
    """EOS ids from config.json and generation_config.json (HF generate stops at either)."""
    ids = list(config.eos_token_ids)
    gen_path = path / "generation_config.json"
    if gen_path.exists():
        gen = read_json(gen_path)
        if isinstance(gen, dict):
            try:
                ids += [i for i in token_ids(gen.get("eos_token_id"), "eos_token_id") if i not in ids]
            except ModelLoadError as e:
                raise ModelLoadError(f"{gen_path}: {e}") from None
    return tuple(ids)
