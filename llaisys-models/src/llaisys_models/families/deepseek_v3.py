"""DeepSeek-V3 (and R1, and V3's MLA/MoE shape in other models): latent attention and DeepSeekMoE (deepseek.py)
with sigmoid router scores, the e_score_correction_bias added for the choice only (noaux_tc), groups scored by
their two best experts, the chosen weights normalised when norm_topk_prob, times routed_scaling_factor.

llama.cpp writes it as "deepseek2" (deepseek_v2.py reads the architecture): a file whose expert_gating_func is 2
(sigmoid) is V3's, its correction bias exp_probs_b.bias, its weights renormalised where expert_weights_norm."""

from __future__ import annotations

from .config import ConfigRules, flag
from .deepseek import DEEPSEEK_KERNELS, EXPERTS, FUSED, TENSORS, DeepSeek, deepseek_fields, refuse_attention_bias
from .deepseek2 import GGUF_ASSEMBLED, GGUF_FUSED, SIGMOID, deepseek2_config, weights_norm
from .family import GGUF, Family, GGUFMetadata


class DeepseekV3(DeepSeek):
    """DeepSeek-V3: MLA, and from first_k_dense_replace on, 1 (or n_shared_experts) shared expert beside k of
    n_routed_experts chosen by sigmoid scores plus a correction bias, in groups."""


def config(raw: dict, layers: int) -> dict:
    """DeepseekV3Config: rope_interleave (default true); the router transformers' DeepseekV3TopkRouter runs."""
    refuse_attention_bias(raw)
    return deepseek_fields(raw, layers, scoring="sigmoid", group_top=2, corrected=True,
                           interleaved=flag(raw, "rope_interleave", True), normalize=flag(raw, "norm_topk_prob"))


def gguf_config(meta: GGUFMetadata, raw: dict) -> None:
    """A "deepseek2" file of sigmoid scores: norm_topk_prob is expert_weights_norm; the rope dims are pairs
    (llama.cpp ropes them so, whatever rope_interleave was)."""
    deepseek2_config(meta, raw)
    raw.update(norm_topk_prob=weights_norm(meta), rope_interleave=True)


def sigmoid_scores(meta: GGUFMetadata) -> bool:
    gating = meta.get("expert_gating_func")
    return not isinstance(gating, bool) and gating == SIGMOID


FAMILY = Family(
    model=DeepseekV3,
    config=ConfigRules("deepseek_v3", config),
    tensors=TENSORS,
    fused=FUSED,
    experts=EXPERTS,
    gguf=GGUF(config=gguf_config, fused=GGUF_FUSED, assembled=GGUF_ASSEMBLED, latent_attention=True,
              claims=sigmoid_scores),
    kernels=DEEPSEEK_KERNELS,
)
