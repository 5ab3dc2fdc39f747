"""DeepSeek-V3 (and R1, and V3's MLA/MoE shape in other models): latent attention and DeepSeekMoE (deepseek.py)
with sigmoid router scores, the e_score_correction_bias added for the choice only (noaux_tc), groups scored by
their two best experts, the chosen weights normalised when norm_topk_prob, times routed_scaling_factor."""

from __future__ import annotations

from .config import ConfigRules, flag
from .deepseek import DEEPSEEK_KERNELS, EXPERTS, FUSED, TENSORS, DeepSeek, deepseek_fields, refuse_attention_bias
from .family import Family


class DeepseekV3(DeepSeek):
    """DeepSeek-V3: MLA, and from first_k_dense_replace on, 1 (or n_shared_experts) shared expert beside k of
    n_routed_experts chosen by sigmoid scores plus a correction bias, in groups."""


def config(raw: dict, layers: int) -> dict:
    """DeepseekV3Config: rope_interleave (default true); the router transformers' DeepseekV3TopkRouter runs."""
    refuse_attention_bias(raw)
    return deepseek_fields(raw, layers, scoring="sigmoid", group_top=2, corrected=True,
                           interleaved=flag(raw, "rope_interleave", True), normalize=flag(raw, "norm_topk_prob"))


FAMILY = Family(
    model=DeepseekV3,
    config=ConfigRules("deepseek_v3", config),
    tensors=TENSORS,
    fused=FUSED,
    experts=EXPERTS,
    gguf=None,  # (llama.cpp's "deepseek2" files: not read yet)
    kernels=DEEPSEEK_KERNELS,
)
