"""DeepSeek-V2 (and V2-Lite): latent attention and DeepSeekMoE (deepseek.py) with softmax router scores, plain
top-k ("greedy") or within the topk_group groups of the best single scores ("group_limited_greedy"), the chosen
weights times routed_scaling_factor (never renormalised: transformers' DeepseekV2TopkRouter ignores
norm_topk_prob). Its rope turns interleaved pairs (a complex product).

Its llama.cpp files ("deepseek2" with softmax scores) are read by deepseek2.py's rules (a V2 file with groups
as its checkpoint computes, group_limited_greedy; one whose expert_weights_norm is true is refused).
"""

from __future__ import annotations

from ..errors import ModelLoadError, shown
from .config import ConfigRules
from .deepseek import DEEPSEEK_KERNELS, EXPERTS, FUSED, TENSORS, DeepSeek, deepseek_fields, refuse_attention_bias
from .deepseek2 import GGUF_ASSEMBLED, GGUF_FUSED, SOFTMAX, deepseek2_config, meta_key, weights_norm
from .family import GGUF, Family, GGUFMetadata

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


def gguf_config(meta: GGUFMetadata, raw: dict) -> None:
    """A "deepseek2" file of softmax scores (expert_gating_func 1, or none: llama.cpp reads none as softmax): groups
    of experts mean group_limited_greedy; renormalised weights (expert_weights_norm) are refused."""
    gating = meta.get("expert_gating_func")
    if gating is not None and (isinstance(gating, bool) or gating != SOFTMAX):
        raise ModelLoadError(f"{meta_key(meta, 'expert_gating_func')} = {shown(gating)} is not supported (1: softmax, "
                             f"DeepSeek-V2; 2: sigmoid, DeepSeek-V3)")
    if weights_norm(meta):
        raise ModelLoadError(f"{meta_key(meta, 'expert_weights_norm')} = true with softmax scores is not supported: "
                             f"llama.cpp renormalises the chosen weights, transformers' DeepSeek-V2 never does")
    deepseek2_config(meta, raw)
    raw["topk_method"] = "group_limited_greedy" if raw["n_group"] > 1 else "greedy"


FAMILY = Family(
    model=DeepseekV2,
    config=ConfigRules("deepseek_v2", config),
    tensors=TENSORS,
    fused=FUSED,
    experts=EXPERTS,
    gguf=GGUF(config=gguf_config, fused=GGUF_FUSED, assembled=GGUF_ASSEMBLED, latent_attention=True),
    kernels=DEEPSEEK_KERNELS,
)
