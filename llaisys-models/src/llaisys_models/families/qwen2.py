"""Qwen2, the decoder that Llama, Mistral, Qwen3 and Phi-3 are declared variations of (llama.py, ...), written
only with ``llaisys.ops``.

    x = embed(ids)
    for each layer:
        h = rms_norm(x);  q, k, v = h Wq + bq, h Wk + bk, h Wv + bv
        q, k = rms_norm(q), rms_norm(k)  per head, with Qwen3's q_norm / k_norm (config.qk_norm)
        cache[pos] = rope(k), v;  x += attention(rope(q), cache[pos-window+1 : pos+1]) Wo
                                  (window: the layer's sliding window, config.window(i); else all of cache[:pos+1])
        h = rms_norm(x);  x += (silu(h Wgate) * h Wup) Wdown
    logits = rms_norm(x[last]) Wlm

Split over the ranks of a tensor-parallel group (parallel/), each rank holds some heads and some of
the MLP's width: the o_proj and down_proj outputs are partial sums, all-reduced, and the logits of each
rank's rows of the vocabulary are gathered. With one rank both cost nothing.

rope's frequencies are the config's table (rope_scaling.py: plain, linear, llama3, YaRN), computed at load.
Sliding windows (Mistral, Mixtral, Phi-3: every layer; Qwen2 / Qwen3 with use_sliding_window: the layers of
layer_types / max_window_layers) are the config's per layer.
The other variations live in the config and the weights: biases (Qwen2: q/k/v; Llama, Mistral, Qwen3:
``attention_bias`` / ``mlp_bias``), an explicit head_dim, Phi-3's fused qkv / gate_up weights (read as
row views: phi3.py's ``fused``).

One forward runs any number of sequences at once (continuous batching): their new tokens are stacked
into the rows of x, every matmul reads each weight once for all of them, and attention reads each
sequence's own keys and values through its block table in the paged KV cache (kv_cache.py).
"""

from __future__ import annotations

import llaisys

from ..engine.kv_cache import KVPool, LayerKV
from ..engine.step_inputs import StepInputs
from ..errors import ModelLoadError, shown
from .causal_lm import CausalLM, Workspace
from .config import ConfigRules, flag, layer_windows
from .family import Family
from .weights import LayerWeights, embedding, linear


class Qwen2(CausalLM):
    def activations(self) -> dict[str, tuple]:
        c = self.config
        return {
            "x": (c.hidden_size,),  # the residual stream
            "h": (c.hidden_size,),  # normed input of attention / MLP
            "q": (c.q_size,),
            "q_rot": (c.num_attention_heads, c.head_dim),
            "k": (c.num_key_value_heads, c.head_dim),  # roped in place
            "v": (c.num_key_value_heads, c.head_dim),
            "attn": (c.num_attention_heads, c.head_dim),
            "out": (c.hidden_size,),  # o_proj / down_proj result, added to x
            "gate": (c.intermediate_size,),  # then the MLP's activation, swiglu(gate, up), in place
            "up": (c.intermediate_size,),
        }

    def _run_step(self, pool: KVPool, step: StepInputs) -> llaisys.Tensor:
        ws = self._workspace(step.num_tokens)
        embedding(ws.x, step.tokens, self.weights.embed_tokens)
        for i, layer in enumerate(self.weights.layers):
            self._attention(layer, ws, pool.layers[i], step, self.config.window(i))
            self._mlp(layer, ws)
        return self._logits(ws.x, step)

    def _attention(self, w: LayerWeights, ws: Workspace, kv: LayerKV, step: StepInputs, window: int) -> None:
        c, ops, n, numerics = self.config, llaisys.ops, ws.n, self.numerics
        ops.rms_norm(ws.h, ws.x, w.input_norm, c.rms_norm_eps, numerics)
        assert w.q_proj is not None and w.k_proj is not None and w.v_proj is not None  # (grouped-query)
        linear(ws.q, ws.h, w.q_proj, w.q_bias)
        linear(ws.k.view(n, c.kv_size), ws.h, w.k_proj, w.k_bias)
        linear(ws.v.view(n, c.kv_size), ws.h, w.v_proj, w.v_bias)
        q = ws.q.view(n, c.num_attention_heads, c.head_dim)
        if w.q_norm is not None:  # Qwen3: each head of q and k RMS-normed before rope
            ops.rms_norm(q, q, w.q_norm, c.rms_norm_eps, numerics)
            ops.rms_norm(ws.k, ws.k, w.k_norm, c.rms_norm_eps, numerics)
        ops.rope(ws.q_rot, q, step.positions, self.rope_inv_freq, self.rope_scale, numerics)
        ops.rope(ws.k, ws.k, step.positions, self.rope_inv_freq, self.rope_scale, numerics)
        kv.write(ws.k, ws.v, step)
        kv.attend(ws.attn, ws.q_rot, step, c.attention_scale, numerics, window)
        linear(ws.out, ws.attn.view(n, c.q_size), w.o_proj, w.o_bias)
        llaisys.distributed.all_reduce(ws.out, self.group)  # + the other ranks' heads (tensor parallelism)
        ops.add(ws.x, ws.x, ws.out)

    def _mlp(self, w: LayerWeights, ws: Workspace) -> None:
        c, ops, numerics = self.config, llaisys.ops, self.numerics
        ops.rms_norm(ws.h, ws.x, w.mlp_norm, c.rms_norm_eps, numerics)
        # a dense layer: its MLP has these three (a mixture-of-experts layer has experts instead: moe.py)
        assert w.gate_proj is not None and w.up_proj is not None and w.down_proj is not None
        linear(ws.gate, ws.h, w.gate_proj, w.gate_bias)
        linear(ws.up, ws.h, w.up_proj, w.up_bias)
        ops.swiglu(ws.gate, ws.gate, ws.up, numerics)
        linear(ws.out, ws.gate, w.down_proj, w.down_bias)
        llaisys.distributed.all_reduce(ws.out, self.group)  # + the other ranks' columns of the MLP
        ops.add(ws.x, ws.x, ws.out)


def windows(raw: dict, layers: int) -> dict:
    """Qwen2Config's sliding windows (Qwen3's too): none unless use_sliding_window; then the layers of
    layer_types, else those from max_window_layers (default 28) on."""
    window = raw.get("sliding_window")
    if not flag(raw, "use_sliding_window"):
        window = None  # (Qwen2Config: sliding_window = sliding_window if use_sliding_window else None)
        if raw.get("layer_types") is None:
            return {}

    def from_max_window_layers() -> list[str]:
        first = raw.get("max_window_layers", 28)
        if isinstance(first, bool) or not isinstance(first, int):
            raise ModelLoadError(f"config field 'max_window_layers' must be an integer, got {shown(first)}")
        return ["sliding_attention" if window is not None and i >= first else "full_attention" for i in range(layers)]

    return layer_windows(raw, layers, window, from_max_window_layers, "use_sliding_window is false")


def config(raw: dict, layers: int) -> dict:
    """Qwen2Config: q/k/v always biased, o_proj never (attention_bias does not apply); its sliding windows."""
    return dict(qkv_bias=True, o_bias=False, **windows(raw, layers))


FAMILY = Family(model=Qwen2, config=ConfigRules("qwen2", config))
