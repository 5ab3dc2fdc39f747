"""DeepSeek-V2 (and V2-Lite): latent attention and DeepSeekMoE (deepseek.py) with softmax router scores, plain
top-k ("greedy") or within the topk_group groups of the best single scores ("group_limited_greedy"), the chosen
weights times routed_scaling_factor (never renormalised: transformers' DeepseekV2TopkRouter ignores
norm_topk_prob). Its rope turns interleaved pairs (a complex product)."""

from __future__ import annotations

from ..errors import ModelLoadError, shown
from .config import ConfigRules
from .deepseek import DEEPSEEK_KERNELS, EXPERTS, FUSED, TENSORS, DeepSeek, deepseek_fields, refuse_attention_bias
from .family import Family

TOPK_METHODS = ("greedy", "group_limited_greedy")


class DeepseekV2(DeepSeek):
    """DeepSeek-V2: MLA, and from first_k_dense_replace on, n_shared_experts shared experts beside k of
    n_routed_experts chosen by softmax scores (in groups with group_limited_greedy)."""


def config(raw: dict, layers: int) -> dict:
    """DeepseekV2Config: topk_method "greedy" (every expert eligible: one group) or "group_limited_greedy"."""
    refuse_attention_bias(raw)
    method = raw.get("topk_method", "greedy")
    if method not in TOPK_METHODS:
        raise ModelLoadError(f"config field 'topk_method' = {shown(method)} is not supported (only "
                             f"{', '.join(TOPK_METHODS)})")
    if method == "greedy":
        raw = {**raw, "n_group": 1, "topk_group": 1}
    return deepseek_fields(raw, layers, scoring="softmax", group_top=1, corrected=False, interleaved=True,
                           normalize=False)


FAMILY = Family(
    model=DeepseekV2,
    config=ConfigRules("deepseek_v2", config),
    tensors=TENSORS,
    fused=FUSED,
    experts=EXPERTS,
    gguf=None,  # (llama.cpp's "deepseek2" files: not read yet)
    kernels=DEEPSEEK_KERNELS,
)
