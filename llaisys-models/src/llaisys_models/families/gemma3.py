"""Gemma 3 (text), written only with ``llaisys.ops``.

    x = embed(ids) * sqrt(hidden)                      (the normalizer rounded to the model dtype, as HF does)
    for each layer i (sliding: its last `window` positions, rope base rope_local_theta; global: all of them,
                      rope_theta with its scaling; config.layer_types / sliding_window_pattern say which):
        h = rms_norm(x, 1 + w_input);  q, k, v = h Wq, h Wk, h Wv
        q, k = rms_norm(q, 1 + w_q), rms_norm(k, 1 + w_k)  per head
        cache[pos] = rope_i(k), v
        x += rms_norm(attention(rope_i(q), cache[window_i], scale = query_pre_attn_scalar^-1/2) Wo, 1 + w_post_attn)
        h = rms_norm(x, 1 + w_pre_ff)
        x += rms_norm((gelu_tanh(h Wgate) * h Wup) Wdown, 1 + w_post_ff)
    logits = rms_norm(x[last], 1 + w_final) Wembed^T                        (tied; no final soft-capping)

Every RMSNorm multiplies by 1 + w; the weights hold 1 + w in float32 (config norm_offset, norms_in_f32: HF
computes it so), and rms_norm with an f32 weight computes x * r * (1 + w) in f32 and rounds once, as HF's
Gemma3RMSNorm does. llama.cpp's converter stores the norms as 1 + w already.
"""

from __future__ import annotations

import numpy as np

import llaisys

from ..engine.kv_cache import KVPool, LayerKV
from ..engine.step_inputs import StepInputs
from ..errors import ModelLoadError, shown
from .causal_lm import CausalLM, Workspace
from .config import ConfigRules, finite, flag, integer, layer_windows
from .family import GGUF, KERNELS, LLAMA_TENSORS, QK_NORMS, Family, GGUFMetadata
from .weights import LayerWeights, embedding, linear


class Gemma3(CausalLM):
    @property
    def embed_scale(self) -> float:
        """sqrt(hidden) as HF multiplies the embeddings by it: an f32 rounded to the model dtype."""
        return float(np.float32(self.config.hidden_size ** 0.5).astype(self.dtype.numpy))

    def activations(self) -> dict[str, tuple]:
        c = self.config
        return {
            "x": (c.hidden_size,),  # the residual stream
            "h": (c.hidden_size,),  # normed input of attention / MLP
            "q": (c.num_attention_heads, c.head_dim),  # normed and roped in place
            "k": (c.num_key_value_heads, c.head_dim),
            "v": (c.num_key_value_heads, c.head_dim),
            "attn": (c.num_attention_heads, c.head_dim),
            "out": (c.hidden_size,),  # o_proj / down_proj result, normed in place, added to x
            "gate": (c.intermediate_size,),  # then the MLP's activation, geglu_tanh(gate, up), in place
            "up": (c.intermediate_size,),
        }

    def _run_step(self, pool: KVPool, step: StepInputs) -> llaisys.Tensor:
        ws = self._workspace(step.num_tokens)
        embedding(ws.x, step.tokens, self.weights.embed_tokens)
        llaisys.ops.scale(ws.x, ws.x, self.embed_scale)
        for i, layer in enumerate(self.weights.layers):
            self._attention(layer, ws, pool.layers[i], step, self.config.window(i))
            self._mlp(layer, ws)
        return self._logits(ws.x, step)

    def _attention(self, w: LayerWeights, ws: Workspace, kv: LayerKV, step: StepInputs, window: int) -> None:
        c, ops, n, numerics, eps = self.config, llaisys.ops, ws.n, self.numerics, self.config.rms_norm_eps
        # a sliding layer's rope is plain, of base rope_local_theta; a global layer's the config's (scaled) one
        inv_freq, rope_scale = (self.local_rope_inv_freq, 1.0) if window else (self.rope_inv_freq, self.rope_scale)
        ops.rms_norm(ws.h, ws.x, w.input_norm, eps, numerics)
        assert w.q_proj is not None and w.k_proj is not None and w.v_proj is not None  # (grouped-query)
        linear(ws.q.view(n, c.q_size), ws.h, w.q_proj, w.q_bias)
        linear(ws.k.view(n, c.kv_size), ws.h, w.k_proj, w.k_bias)
        linear(ws.v.view(n, c.kv_size), ws.h, w.v_proj, w.v_bias)
        ops.rms_norm(ws.q, ws.q, w.q_norm, eps, numerics)
        ops.rms_norm(ws.k, ws.k, w.k_norm, eps, numerics)
        ops.rope(ws.q, ws.q, step.positions, inv_freq, rope_scale, numerics)
        ops.rope(ws.k, ws.k, step.positions, inv_freq, rope_scale, numerics)
        kv.write(ws.k, ws.v, step)
        kv.attend(ws.attn, ws.q, step, c.attention_scale, numerics, window)
        linear(ws.out, ws.attn.view(n, c.q_size), w.o_proj, w.o_bias)
        llaisys.distributed.all_reduce(ws.out, self.group)  # + the other ranks' heads (tensor parallelism)
        ops.rms_norm(ws.out, ws.out, w.attn_out_norm, eps, numerics)
        ops.add(ws.x, ws.x, ws.out)

    def _mlp(self, w: LayerWeights, ws: Workspace) -> None:
        ops, numerics, eps = llaisys.ops, self.numerics, self.config.rms_norm_eps
        ops.rms_norm(ws.h, ws.x, w.mlp_norm, eps, numerics)
        # a dense layer: its MLP has these three (a mixture-of-experts layer has experts instead: moe.py)
        assert w.gate_proj is not None and w.up_proj is not None and w.down_proj is not None
        linear(ws.gate, ws.h, w.gate_proj, w.gate_bias)
        linear(ws.up, ws.h, w.up_proj, w.up_bias)
        ops.geglu_tanh(ws.gate, ws.gate, ws.up, numerics)
        linear(ws.out, ws.gate, w.down_proj, w.down_bias)
        llaisys.distributed.all_reduce(ws.out, self.group)  # + the other ranks' columns of the MLP
        ops.rms_norm(ws.out, ws.out, w.mlp_out_norm, eps, numerics)
        ops.add(ws.x, ws.x, ws.out)


# -- what Gemma3TextConfig reads (transformers 5) ----------------------------------------------------------------

DEFAULT_LOCAL_THETA = 10_000.0  # Gemma3TextConfig.default_theta of the sliding layers (the global ones: 1e6)


def check_activation(raw: dict) -> None:
    """The MLP gate's activation: the tanh GELU (hidden_activation; a GeGLU MLP)."""
    act = raw.get("hidden_activation", raw.get("hidden_act", "gelu_pytorch_tanh"))
    if act != "gelu_pytorch_tanh":
        raise ModelLoadError(f"config field 'hidden_activation' is {shown(act)}; Gemma 3 runs gelu_pytorch_tanh "
                             f"(a GeGLU MLP with the tanh GELU)")


def config(raw: dict, layers: int) -> dict:
    """Gemma 3's own fields: its sliding layers (layer_types, else every layer but each sliding_window_pattern-th,
    default 6; window 4096 where config.json is silent), the attention scale, the sliding layers' rope base, the
    (1 + w) norms before and after both blocks; what it must not set."""
    window = raw.get("sliding_window", 4096)

    def from_pattern() -> list[str]:
        pattern = integer(raw, "sliding_window_pattern", raw.get("_sliding_window_pattern", 6))
        return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]

    windows = layer_windows(raw, layers, window, from_pattern, "sliding_window is null")
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if raw.get(key) is not None:
            raise ModelLoadError(f"config field {key!r} is {shown(raw[key])}: logit soft-capping (Gemma 2) is not "
                                 f"implemented; Gemma 3 sets it to null")
    if flag(raw, "use_bidirectional_attention"):
        raise ModelLoadError("config field 'use_bidirectional_attention' is true (an embedding model, EmbeddingGemma): "
                             "llaisys runs causal language models")
    scalar = raw.get("query_pre_attn_scalar", 256)
    if not finite(scalar) or scalar <= 0:
        raise ModelLoadError(f"config field 'query_pre_attn_scalar' must be a finite positive number, got {shown(scalar)}")
    return dict(**windows, qk_norm=True, query_pre_attn_scalar=float(scalar), rope_local_theta=local_rope_theta(raw),
                sandwich_norms=True, norm_offset=1.0, norms_in_f32=True)


def local_rope_theta(raw: dict) -> float:
    """The sliding layers' rope base: rope_parameters.sliding_attention (transformers >= 5, a plain rope), else
    rope_local_base_freq (older writers), else 10000."""
    params = raw.get("rope_parameters")
    local = params.get("sliding_attention") if isinstance(params, dict) else None
    if local is not None:
        if not isinstance(local, dict):
            raise ModelLoadError(f"config field 'rope_parameters.sliding_attention' must be an object, got {shown(local)}")
        kind = local.get("rope_type", "default")
        if kind not in (None, "default"):
            raise ModelLoadError(f"rope scaling of type {shown(kind)} (rope_parameters.sliding_attention.rope_type) "
                                 f"is not supported on the sliding layers (Gemma 3 scales the global layers' rope only)")
        theta, name = local.get("rope_theta", DEFAULT_LOCAL_THETA), "rope_parameters.sliding_attention.rope_theta"
    else:
        theta, name = raw.get("rope_local_base_freq", DEFAULT_LOCAL_THETA), "rope_local_base_freq"
    if not finite(theta) or theta <= 0:
        raise ModelLoadError(f"config field {name!r} must be a finite positive number, got {shown(theta)}")
    return float(theta)


def gguf_config(meta: GGUFMetadata, raw: dict) -> None:
    """Gemma 3's fields as llama.cpp reads them: the tanh GELU, the sliding layers' rope base
    (rope.freq_base_swa, else 10000), the attention scale (not in the file: 1 / sqrt(head_dim), or
    1 / sqrt(hidden / heads) for the 62-layer 27B, whose query_pre_attn_scalar that is), a final logit
    soft-capping (refused above); the window and its layers are the file's (loading/gguf/config.py)."""
    raw["hidden_activation"] = "gelu_pytorch_tanh"
    raw.setdefault("rope_theta", 10000.0)  # (llama.cpp's default, where HF's is 1e6; converters write it)
    raw["rope_local_base_freq"] = meta.get("rope.freq_base_swa", 10000.0)
    head_dim = raw.get("head_dim") or raw["hidden_size"] // raw["num_attention_heads"]
    raw["query_pre_attn_scalar"] = (raw["hidden_size"] // raw["num_attention_heads"]
                                    if raw["num_hidden_layers"] == 62 else head_dim)
    raw["final_logit_softcapping"] = meta.get("final_logit_softcapping")
    raw["sliding_window"] = None  # (the file's window is read after the config)
    raw["layer_types"] = ["full_attention"] * raw["num_hidden_layers"]


FAMILY = Family(
    model=Gemma3,
    config=ConfigRules("gemma3_text", config, activation=check_activation,
                       defaults={"rope_theta": 1_000_000.0, "max_position_embeddings": 131072,
                                 "tie_word_embeddings": True}),
    tensors={**LLAMA_TENSORS, **QK_NORMS, "mlp_norm": "pre_feedforward_layernorm.weight",
             "attn_out_norm": "post_attention_layernorm.weight", "mlp_out_norm": "post_feedforward_layernorm.weight"},
    gguf=GGUF(config=gguf_config, window_pattern=6),
    kernels=(*KERNELS, "geglu_tanh", "scale"),
    refused={"Gemma3ForConditionalGeneration": "(Gemma 3 with its vision tower) is not supported: llaisys runs "
                                               "Gemma 3's text model, Gemma3ForCausalLM (gemma-3-1b and the text-only "
                                               "checkpoints)"},
)
