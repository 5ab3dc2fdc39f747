"""Qwen3-MoE: Qwen3 attention (qwen3.py: q/k norms per head, explicit head_dim, no bias), the MLP of the layers
of ``decoder_sparse_step`` not in ``mlp_only_layers`` a mixture of experts (moe.py), their top-k weights
renormalised if ``norm_topk_prob``; a sliding window on every layer with ``use_sliding_window``."""

from __future__ import annotations

from ..errors import ModelLoadError, shown
from .config import ConfigRules, every_layer_window, flag, integer
from .family import GGUF, KERNELS, LLAMA_TENSORS, MOE_KERNELS, QK_NORMS, Experts, Family, GGUFMetadata
from .moe import SparseMlp, expert_counts, gguf_experts_per_token
from .qwen3 import Qwen3


class Qwen3Moe(SparseMlp, Qwen3):
    """Qwen3-MoE: Qwen3 attention (q_norm / k_norm per head, explicit head_dim, no bias); the layers of
    ``decoder_sparse_step`` not in ``mlp_only_layers`` sparse, their weights renormalised if norm_topk_prob."""


def config(raw: dict, layers: int) -> dict:
    """Qwen3MoeConfig: the q/k norms; a window on every layer when use_sliding_window; num_experts (older
    writers: num_local_experts) experts of moe_intermediate_size."""
    windows = every_layer_window(raw, layers) if flag(raw, "use_sliding_window") else {}
    experts, per_token = expert_counts(raw, "num_experts" if "num_experts" in raw else "num_local_experts")
    step = integer(raw, "decoder_sparse_step", 1)
    dense = raw.get("mlp_only_layers") or []
    if not isinstance(dense, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in dense):
        raise ModelLoadError(f"config field 'mlp_only_layers' must be a list of layer indices, got {shown(dense)}")
    return dict(**windows, qk_norm=True, num_experts=experts, num_experts_per_tok=per_token,
                norm_topk_prob=flag(raw, "norm_topk_prob"), moe_intermediate_size=integer(raw, "moe_intermediate_size"),
                sparse_layers=tuple(i for i in range(layers) if i not in dense and (i + 1) % step == 0))


def gguf_config(meta: GGUFMetadata, raw: dict) -> None:
    """The experts as llama.cpp reads them: every layer sparse (llama.cpp makes every layer a MoE layer, so the
    converter's files of checkpoints with mlp_only_layers do not load there either), the top-k weights always
    renormalised (llama.cpp passes norm_w = true, whatever norm_topk_prob was; transformers' GGUF loader sets
    norm_topk_prob so too), each expert expert_feed_forward_length wide (absent: n_ff / n_expert_used)."""
    if meta.get("expert_count") is None:
        raise ModelLoadError(f"{meta.path}: metadata key {meta.architecture}.expert_count (num_experts) is missing")
    raw.update(num_experts=meta.size("expert_count"), norm_topk_prob=True)
    if meta.get("expert_feed_forward_length") is not None:
        raw["moe_intermediate_size"] = meta.size("expert_feed_forward_length")
    scale = meta.get("expert_weights_scale", 0.0)
    if scale not in (0.0, 1.0):  # llama.cpp scales the top-k weights by it (converters write it for others)
        raise ModelLoadError(f"{meta.path}: {meta.architecture}.expert_weights_scale = {shown(scale)} (a factor on "
                             f"the expert weights) is not supported")
    gguf_experts_per_token(meta, raw)
    if "moe_intermediate_size" not in raw and "num_experts_per_tok" in raw:
        raw["moe_intermediate_size"] = raw["intermediate_size"] // raw["num_experts_per_tok"]


FAMILY = Family(
    model=Qwen3Moe,
    config=ConfigRules("qwen3_moe", config),
    tensors={**LLAMA_TENSORS, **QK_NORMS},
    experts=Experts(router="mlp.gate.weight", gate="mlp.experts.{}.gate_proj.weight",
                    up="mlp.experts.{}.up_proj.weight", down="mlp.experts.{}.down_proj.weight"),
    gguf=GGUF(config=gguf_config),
    kernels=(*KERNELS, *MOE_KERNELS),
)
