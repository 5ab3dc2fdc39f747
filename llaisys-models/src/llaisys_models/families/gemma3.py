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

Every RMSNorm multiplies by 1 + w; the weights hold 1 + w in float32 (weights.py: HF computes it so), and
rms_norm with an f32 weight computes x * r * (1 + w) in f32 and rounds once, as HF's Gemma3RMSNorm does.
"""

from __future__ import annotations

import numpy as np

import llaisys

from ..engine.kv_cache import KVPool
from ..engine.step_inputs import StepInputs
from ..loading.loader import KERNELS
from ..loading.quantize import embedding, linear
from ..loading.weights import LayerWeights
from .causal_lm import CausalLM


class Gemma3(CausalLM):
    KERNELS = (*KERNELS, "geglu_tanh", "scale")

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
            self._attention(layer, ws, pool.keys[i], pool.values[i], step, self.config.window(i))
            self._mlp(layer, ws)
        return self._logits(ws.x, step)

    def _attention(self, w: LayerWeights, ws, keys, values, step: StepInputs, window: int) -> None:
        c, ops, n, numerics, eps = self.config, llaisys.ops, ws.n, self.numerics, self.config.rms_norm_eps
        # a sliding layer's rope is plain, of base rope_local_theta; a global layer's the config's (scaled) one
        inv_freq, rope_scale = (self.local_rope_inv_freq, 1.0) if window else (self.rope_inv_freq, self.rope_scale)
        ops.rms_norm(ws.h, ws.x, w.input_norm, eps, numerics)
        linear(ws.q.view(n, c.q_size), ws.h, w.q_proj, w.q_bias)
        linear(ws.k.view(n, c.kv_size), ws.h, w.k_proj, w.k_bias)
        linear(ws.v.view(n, c.kv_size), ws.h, w.v_proj, w.v_bias)
        ops.rms_norm(ws.q, ws.q, w.q_norm, eps, numerics)
        ops.rms_norm(ws.k, ws.k, w.k_norm, eps, numerics)
        ops.rope(ws.q, ws.q, step.positions, inv_freq, rope_scale, numerics)
        ops.rope(ws.k, ws.k, step.positions, inv_freq, rope_scale, numerics)
        ops.paged_kv_write(keys, values, ws.k, ws.v, step.slots)
        ops.paged_attention(ws.attn, ws.q, keys, values, step.block_tables, step.seq_lens, step.query_start,
                            c.attention_scale, numerics, window)
        linear(ws.out, ws.attn.view(n, c.q_size), w.o_proj, w.o_bias)
        llaisys.distributed.all_reduce(ws.out, self.group)  # + the other ranks' heads (tensor parallelism)
        ops.rms_norm(ws.out, ws.out, w.attn_out_norm, eps, numerics)
        ops.add(ws.x, ws.x, ws.out)

    def _mlp(self, w: LayerWeights, ws) -> None:
        ops, numerics, eps = llaisys.ops, self.numerics, self.config.rms_norm_eps
        ops.rms_norm(ws.h, ws.x, w.mlp_norm, eps, numerics)
        linear(ws.gate, ws.h, w.gate_proj, w.gate_bias)
        linear(ws.up, ws.h, w.up_proj, w.up_bias)
        ops.geglu_tanh(ws.gate, ws.gate, ws.up, numerics)
        linear(ws.out, ws.gate, w.down_proj, w.down_bias)
        llaisys.distributed.all_reduce(ws.out, self.group)  # + the other ranks' columns of the MLP
        ops.rms_norm(ws.out, ws.out, w.mlp_out_norm, eps, numerics)
        ops.add(ws.x, ws.x, ws.out)
