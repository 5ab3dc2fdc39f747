"""Qwen2 (and the Llama architecture, its bias-free sibling), written only with ``llaisys.ops``.

    x = embed(ids)
    for each layer:
        h = rms_norm(x);  q, k, v = h Wq + bq, h Wk + bk, h Wv + bv
        cache[pos] = rope(k), v;  x += attention(rope(q), cache[:pos+1]) Wo
        h = rms_norm(x);  x += (silu(h Wgate) * h Wup) Wdown
    logits = rms_norm(x[last]) Wlm
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import llaisys
from llaisys.device import as_device
from llaisys.dtype import as_dtype

from .config import ModelConfig, token_ids
from .errors import ModelLoadError
from .files import model_directory, read_json
from .generation import GenerationMixin
from .kv_cache import KVCache
from .locking import ModelLock
from .numerics import resolve as resolve_numerics
from .safetensors import Checkpoint
from .weights import FLOAT_WEIGHTS, LayerWeights, Weights, default_dtype, load_weights


class Workspace:
    """Activations for a forward pass over ``n`` positions (kept and reused for decode steps)."""

    def __init__(self, config: ModelConfig, n: int, dtype, device):
        c = config

        def new(*shape):
            return llaisys.empty(shape, dtype, device)

        self.x = new(n, c.hidden_size)  # the residual stream
        self.h = new(n, c.hidden_size)  # normed input of attention / MLP
        self.q = new(n, c.q_size)
        self.q_rot = new(n, c.num_attention_heads, c.head_dim)
        self.k = new(n, c.kv_size)
        self.attn = new(n, c.num_attention_heads, c.head_dim)
        self.out = new(n, c.hidden_size)  # o_proj / down_proj result, added to x
        self.gate = new(n, c.intermediate_size)
        self.up = new(n, c.intermediate_size)
        self.act = new(n, c.intermediate_size)


class Qwen2(GenerationMixin):
    """A Qwen2-architecture causal LM on one llaisys device.

    ``Qwen2(path, device=None, dtype=None)``: ``device`` None picks the best available
    device; ``dtype`` None computes in the dtype the weights are stored in; ``numerics`` "exact"
    or "hf" says where f16 / bf16 ops round (``llaisys_models.numerics``; None: ``$LLAISYS_NUMERICS``).
    ``mmap=False`` reads the weights into memory instead of mapping the files (a file changed on
    disk then cannot affect, or crash, the loaded model).

    One model holds one KV cache, so it runs one generation at a time: calls from several
    threads take turns (``forward``, ``generate``, a ``stream_generate`` until it finishes
    or is closed); the same thread starting a second one while its stream is open gets a
    ``ModelBusyError``. To serve many users at once, use ``llaisys serve``'s engine.
    """

    architectures = ("Qwen2ForCausalLM",)

    def __init__(self, path, device=None, dtype=None, *, progress: bool | None = None, mmap: bool = True,
                 numerics: str | None = None):
        self.numerics = resolve_numerics(numerics)
        self.path = model_directory(path)
        config = ModelConfig.from_file(self.path)
        supported = {a for cls in _all_model_classes() for a in cls.architectures}
        if config.architecture not in supported:
            raise ModelLoadError(f"{self.path}/config.json: architecture {config.architecture or '(none)'!r} is "
                                 f"not supported; llaisys_models runs {', '.join(sorted(supported))}")
        self.config = config
        self.device = _pick_device(device)
        checkpoint = Checkpoint(self.path, mapped=mmap)
        self.dtype = default_dtype(checkpoint, config) if dtype is None else as_dtype(dtype)
        if self.dtype not in FLOAT_WEIGHTS:
            raise ModelLoadError(f"dtype must be float32, float16 or bfloat16, got {self.dtype.name}")
        self.eos_token_ids = _eos_token_ids(self.path, config)
        self.weights = load_weights(checkpoint, config, self.dtype, self.device, progress=progress)
        self.checkpoint = checkpoint  # keeps the memory maps the weights may point into
        self._prepare()

    @classmethod
    def from_weights(cls, path, config: ModelConfig, weights: Weights, *, device: llaisys.Device,
                     dtype: llaisys.DType, eos_token_ids, source=None, numerics: str | None = None) -> "Qwen2":
        """A model over weights already placed on ``device`` in ``dtype``, read from a source other
        than a HuggingFace directory (a GGUF file); ``source`` stays alive as long as the model."""
        model = cls.__new__(cls)
        model.numerics = resolve_numerics(numerics)
        model.path, model.config, model.device, model.dtype = Path(path), config, device, dtype
        model.eos_token_ids = tuple(eos_token_ids)
        model.weights, model.checkpoint = weights, source
        model._prepare()
        return model

    def _prepare(self) -> None:
        """The KV cache and decode state, once config, device, dtype and weights are set."""
        config = self.config
        self.cache = self.new_cache()
        self.scale = config.head_dim ** -0.5
        self._decode_workspace: Workspace | None = None
        self.lock = ModelLock()

    def __repr__(self) -> str:
        c = self.config
        return (f"{type(self).__name__}({str(self.path)!r}, device={self.device}, dtype={self.dtype.name}, "
                f"numerics={self.numerics}, layers={c.num_hidden_layers}, hidden={c.hidden_size}, vocab={c.vocab_size})")

    # -- the cache ----------------------------------------------------------------

    def new_cache(self) -> KVCache:
        """An empty KV cache shaped for this model. ``forward(..., cache=c)`` extends ``c`` instead of
        the model's own cache, so a caller (the server's engine) can keep one per conversation."""
        c = self.config
        return KVCache(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, self.dtype, self.device,
                       c.max_position_embeddings)

    def reset(self) -> None:
        """Forget the cached tokens (buffers stay allocated for the next generation)."""
        with self.lock.hold("reset"):
            self.cache.reset()

    def truncate(self, length: int) -> None:
        """Keep only the first ``length`` cached tokens; the next forward continues from there."""
        with self.lock.hold("truncate"):
            self.cache.truncate(length)

    # -- the forward pass ---------------------------------------------------------

    def forward(self, input_ids, all_logits: bool = False, *, cache: KVCache | None = None) -> llaisys.Tensor:
        """Run ``input_ids`` at the positions after the cached ones, append them to the cache and
        return the logits of the last position ([1, vocab]), or of every position ([n, vocab]).

        ``cache`` (from ``new_cache``) replaces the model's own cache for this call (the work buffers
        are still the model's: calls take turns, see the class docstring)."""
        with self.lock.hold("forward"):
            return self._forward(input_ids, all_logits, cache=cache)

    def _forward(self, input_ids, all_logits: bool = False, *, cache: KVCache | None = None) -> llaisys.Tensor:
        ids = self.check_input_ids(input_ids)
        cache = self.cache if cache is None else cache
        start, n = len(cache), len(ids)
        end = start + n
        self.check_length(end)
        cache.reserve(end)
        ws = self._workspace(n)
        positions = cache.positions.slice(0, start, end)
        tokens = llaisys.from_numpy(np.asarray(ids, dtype=np.int64), self.device)

        llaisys.ops.embedding(ws.x, tokens, self.weights.embed_tokens)
        for i, layer in enumerate(self.weights.layers):
            self._attention(i, layer, ws, cache, positions, start, end)
            self._mlp(layer, ws)
        cache.tokens.extend(ids)
        return self._lm_head(ws.x if all_logits else ws.x.slice(0, n - 1, n))

    def _attention(self, i: int, w: LayerWeights, ws: Workspace, cache: KVCache, positions, start: int,
                   end: int) -> None:
        c, ops, n, numerics = self.config, llaisys.ops, end - start, self.numerics
        key_slot, value_slot = cache.slot(i, start, end)
        ops.rms_norm(ws.h, ws.x, w.input_norm, c.rms_norm_eps, numerics)
        ops.linear(ws.q, ws.h, w.q_proj, w.q_bias)
        ops.linear(ws.k, ws.h, w.k_proj, w.k_bias)
        ops.linear(value_slot.view(n, c.kv_size), ws.h, w.v_proj, w.v_bias)  # values straight into the cache
        ops.rope(ws.q_rot, ws.q.view(n, c.num_attention_heads, c.head_dim), positions, c.rope_theta, numerics)
        ops.rope(key_slot, ws.k.view(n, c.num_key_value_heads, c.head_dim), positions, c.rope_theta, numerics)
        keys, values = cache.slot(i, 0, end)
        ops.self_attention(ws.attn, ws.q_rot, keys, values, self.scale, numerics)
        ops.linear(ws.out, ws.attn.view(n, c.q_size), w.o_proj, w.o_bias)
        ops.add(ws.x, ws.x, ws.out)

    def _mlp(self, w: LayerWeights, ws: Workspace) -> None:
        c, ops, numerics = self.config, llaisys.ops, self.numerics
        ops.rms_norm(ws.h, ws.x, w.post_norm, c.rms_norm_eps, numerics)
        ops.linear(ws.gate, ws.h, w.gate_proj, w.gate_bias)
        ops.linear(ws.up, ws.h, w.up_proj, w.up_bias)
        ops.swiglu(ws.act, ws.gate, ws.up, numerics)
        ops.linear(ws.out, ws.act, w.down_proj, w.down_bias)
        ops.add(ws.x, ws.x, ws.out)

    def _lm_head(self, x: llaisys.Tensor) -> llaisys.Tensor:
        c, n = self.config, x.shape[0]
        normed = llaisys.empty((n, c.hidden_size), self.dtype, self.device)
        llaisys.ops.rms_norm(normed, x, self.weights.norm, c.rms_norm_eps, self.numerics)
        logits = llaisys.empty((n, c.vocab_size), self.dtype, self.device)
        llaisys.ops.linear(logits, normed, self.weights.lm_head)
        return logits

    def _workspace(self, n: int) -> Workspace:
        if n != 1:
            return Workspace(self.config, n, self.dtype, self.device)
        if self._decode_workspace is None:
            self._decode_workspace = Workspace(self.config, 1, self.dtype, self.device)
        return self._decode_workspace

    def logits(self, input_ids) -> np.ndarray:
        """Float32 logits [n, vocab] of every position of ``input_ids``, from an empty cache."""
        with self.lock.hold("logits"):
            self.cache.reset()
            return self._forward(input_ids, all_logits=True).numpy().astype(np.float32)


class Llama(Qwen2):
    """Llama-architecture checkpoints: the same decoder, biases as ``attention_bias`` / ``mlp_bias`` say."""

    architectures = ("LlamaForCausalLM",)


def _all_model_classes():
    return (Qwen2, Llama)


def _pick_device(device) -> llaisys.Device:
    if device is None:
        devices = llaisys.available_devices()
        if not devices:  # core's one line: each plugin's state (disabled, no device + why, failed + why) or what to install
            raise llaisys.BackendUnavailableError(llaisys.plugins.why_no_device())
        return devices[0]
    device = as_device(device)
    llaisys.empty((0,), llaisys.float32, device)  # raises, naming the cause, for a device that is not there
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
