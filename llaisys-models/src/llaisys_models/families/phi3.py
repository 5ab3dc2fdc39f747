"""Phi-3: the Llama decoder with q, k and v in one ``qkv_proj`` and gate and up in one ``gate_up_proj`` (each
read as row views of the fused tensor: no copy), and a sliding window on every layer when config.json sets one.
llama.cpp's converter keeps them fused (``attn_qkv``; ``ffn_up`` holding gate then up)."""

from __future__ import annotations

from .config import ConfigRules, every_layer_window
from .family import GGUF, Family
from .qwen2 import Qwen2


class Phi3(Qwen2):
    """Phi-3: the Llama decoder with fused qkv_proj / gate_up_proj weights (split into row views at load)."""


def config(raw: dict, layers: int) -> dict:
    """Phi3Config: the fused projections, Mistral's sliding windows."""
    return dict(fused_projections=True, **every_layer_window(raw, layers))


FAMILY = Family(
    model=Phi3,
    config=ConfigRules("phi3", config),
    fused={"self_attn.qkv_proj.weight": ("q_proj", "k_proj", "v_proj"), "mlp.gate_up_proj.weight": ("gate_proj", "up_proj")},
    gguf=GGUF(fused={"attn_qkv.weight": ("q_proj", "k_proj", "v_proj"), "ffn_up.weight": ("gate_proj", "up_proj")}),
)
