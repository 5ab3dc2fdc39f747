"""OLMo 2 (AI2's fully open models), written only with ``llaisys.ops``: the Qwen2 decoder with its norms moved
from the inputs of attention and MLP to their outputs, and q and k each RMS-normed as a whole before rope.

    x = embed(ids)
    for each layer:
        q, k, v = x Wq, x Wk, x Wv
        q, k = rms_norm(q), rms_norm(k)              over all heads at once (weights [q_size], [kv_size])
        cache[pos] = rope(k), v;  x += rms_norm(attention(rope(q), cache[:pos+1]) Wo)
        x += rms_norm((silu(x Wgate) * x Wup) Wdown)
    logits = rms_norm(x[last]) Wlm

HF's Olmo2RMSNorm multiplies by its weight in float32 and rounds once: the norm weights are kept in float32
(norms_in_f32), which is what rms_norm with an f32 weight computes; its rope computes in float32 and rounds
once too (the exact rope, whatever ``numerics`` says). transformers: models/olmo2; llama.cpp: the
"olmo2" architecture (its converter writes the tensors unpermuted, under llama.cpp's usual names).
"""

from __future__ import annotations

import llaisys

from ..engine.kv_cache import LayerKV
from ..engine.step_inputs import StepInputs
from .causal_lm import Workspace
from .config import ConfigRules
from .family import LLAMA_TENSORS, QK_NORMS, Family
from .qwen2 import Qwen2
from .weights import LayerWeights, linear


class Olmo2(Qwen2):
    """OLMo 2: attention and MLP read the residual stream unnormed; their outputs are RMS-normed before they are
    added to it; q and k are RMS-normed over all heads together."""

    def _attention(self, w: LayerWeights, ws: Workspace, kv: LayerKV, step: StepInputs, window: int) -> None:
        c, ops, n, numerics, eps = self.config, llaisys.ops, ws.n, self.numerics, self.config.rms_norm_eps
        k = ws.k.view(n, c.kv_size)
        assert w.q_proj is not None and w.k_proj is not None and w.v_proj is not None  # (grouped-query)
        linear(ws.q, ws.x, w.q_proj, w.q_bias)
        linear(k, ws.x, w.k_proj, w.k_bias)
        linear(ws.v.view(n, c.kv_size), ws.x, w.v_proj, w.v_bias)
        ops.rms_norm(ws.q, ws.q, w.q_norm, eps, numerics)  # each row of q as one vector: all heads together
        ops.rms_norm(k, k, w.k_norm, eps, numerics)
        # HF's OLMo 2 keeps cos / sin in f32 and rounds q, k once: the "exact" rope, in either numerics mode
        ops.rope(ws.q_rot, ws.q.view(n, c.num_attention_heads, c.head_dim), step.positions, self.rope_inv_freq,
                 self.rope_scale, "exact")
        ops.rope(ws.k, ws.k, step.positions, self.rope_inv_freq, self.rope_scale, "exact")
        kv.write(ws.k, ws.v, step)
        kv.attend(ws.attn, ws.q_rot, step, c.attention_scale, numerics, window)
        linear(ws.out, ws.attn.view(n, c.q_size), w.o_proj, w.o_bias)
        llaisys.distributed.all_reduce(ws.out, self.group)  # (one rank: OLMo 2 is not split, parallel/layout.py)
        ops.rms_norm(ws.out, ws.out, w.attn_out_norm, eps, numerics)
        ops.add(ws.x, ws.x, ws.out)

    def _mlp(self, w: LayerWeights, ws: Workspace) -> None:
        ops, numerics, eps = llaisys.ops, self.numerics, self.config.rms_norm_eps
        # a dense layer: its MLP has these three (a mixture-of-experts layer has experts instead: moe.py)
        assert w.gate_proj is not None and w.up_proj is not None and w.down_proj is not None
        linear(ws.gate, ws.x, w.gate_proj, w.gate_bias)
        linear(ws.up, ws.x, w.up_proj, w.up_bias)
        ops.swiglu(ws.gate, ws.gate, ws.up, numerics)
        linear(ws.out, ws.gate, w.down_proj, w.down_bias)
        llaisys.distributed.all_reduce(ws.out, self.group)
        ops.rms_norm(ws.out, ws.out, w.mlp_out_norm, eps, numerics)
        ops.add(ws.x, ws.x, ws.out)


def config(raw: dict, layers: int) -> dict:
    """Olmo2Config: Llama's biases (attention_bias), no sliding window; q/k norms over all heads; the output
    norms; f32 norm weights."""
    return dict(qk_norm=True, qk_norm_all_heads=True, sandwich_norms=True, norms_in_f32=True)


FAMILY = Family(
    model=Olmo2,
    config=ConfigRules("olmo2", config, defaults={"rms_norm_eps": 1e-5, "max_position_embeddings": 2048}),
    tensors={**{field: name for field, name in LLAMA_TENSORS.items() if field not in ("input_norm", "mlp_norm")},
             **QK_NORMS, "attn_out_norm": "post_attention_layernorm.weight",
             "mlp_out_norm": "post_feedforward_layernorm.weight"},
)
