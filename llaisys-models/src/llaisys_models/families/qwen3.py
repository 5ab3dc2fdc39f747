"""Qwen3: the Qwen2 decoder (qwen2.py) with an RMSNorm over each head of q and of k before rope
(``self_attn.q_norm`` / ``k_norm``), an explicit head_dim, and Llama's biases (``attention_bias``: none in the
released checkpoints); sliding windows as Qwen2's."""

from __future__ import annotations

from .config import ConfigRules
from .family import LLAMA_TENSORS, QK_NORMS, Family
from .qwen2 import Qwen2, windows


class Qwen3(Qwen2):
    """Qwen3: q_norm / k_norm on each head before rope, an explicit head_dim, no q/k/v bias."""


def config(raw: dict, layers: int) -> dict:
    """Qwen3Config: Qwen2's sliding windows, the q/k norms."""
    return dict(qk_norm=True, **windows(raw, layers))


FAMILY = Family(model=Qwen3, config=ConfigRules("qwen3", config), tensors={**LLAMA_TENSORS, **QK_NORMS})
