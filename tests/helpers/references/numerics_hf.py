"""HF's own rope arithmetic, for the numerics='hf' tests."""

from __future__ import annotations

import torch


def hf_rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """HF's Qwen2RotaryEmbedding + apply_rotary_pos_emb on x [seq, heads, d] in x's dtype."""
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding, apply_rotary_pos_emb

    seq, heads, d = x.shape
    config = Qwen2Config(hidden_size=d * heads, num_attention_heads=heads, head_dim=d, rope_theta=theta,
                         max_position_embeddings=1 << 20)
    rotary = Qwen2RotaryEmbedding(config)
    xt = x.permute(1, 0, 2)[None]  # [1, heads, seq, d], HF's layout
    cos, sin = rotary(xt, pos[None])
    out, _ = apply_rotary_pos_emb(xt, xt, cos, sin)
    return out[0].permute(1, 0, 2).contiguous()
