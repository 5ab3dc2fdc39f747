"""llama.cpp's "deepseek2" files: the GGUF rules DeepSeek-V2 and V3 share (deepseek_v2.py, deepseek_v3.py).

llama.cpp's converter (convert_hf_to_gguf.py's DeepseekV2Model) writes V2 and V3 as one architecture, "deepseek2";
what both families read of it (``deepseek2_config``, ``GGUF_FUSED``, ``GGUF_ASSEMBLED``) is here. Its keys:
expert_count, expert_used_count, expert_group_count / expert_group_used_count (n_group, topk_group), expert_shared_count,
expert_feed_forward_length, leading_dense_block_count (first_k_dense_replace), expert_weights_scale
(routed_scaling_factor), expert_weights_norm (norm_topk_prob, written only when true), expert_gating_func (1
softmax, 2 sigmoid: V3; written only where config.json has scoring_func, so llama.cpp reads none as softmax),
attention.q_lora_rank (absent or 0: one q projection, attn_q), attention.kv_lora_rank, rope.dimension_count
(qk_rope_head_dim), rope.scaling.yarn_log_multiplier (0.1 x mscale_all_dim). Its head sizes: newer converters write
key_length / value_length as the latent's MQA view (kv_lora_rank + rope dims, kv_lora_rank) and the heads' in
key_length_mla / value_length_mla, older ones the heads' in key_length / value_length; head_count_kv is 1 (MLA as
MQA). Its tensors are llama.cpp's usual names (family.LLAMA_CPP_TENSORS), the rows as HF stores them (nothing
permuted: llama.cpp ropes deepseek2 in adjacent pairs, the interleaved layout): attn_kv_a_mqa is
kv_a_proj_with_mqa (the latent's rows, then the rope key's); kv_b_proj is attn_kv_b in older files, and newer
converters split it per head into attn_k_b (W_uk transposed, [heads, kv_lora_rank, nope]) and attn_v_b
([heads, v_head_dim, kv_lora_rank]), which are put back together here.

A file is V2 unless its expert_gating_func says sigmoid (deepseek_v3.py claims those). llama.cpp scores a group of
experts by its two best scores, softmax or sigmoid alike, where transformers' group_limited_greedy takes the best
one: a V2 file with groups is read as its checkpoint computes (group_limited_greedy), and one whose
expert_weights_norm is true is refused (llama.cpp would renormalise the weights, transformers' V2 never does).
"""

from __future__ import annotations

import numpy as np

from ..errors import ModelLoadError, shown
from .config import ModelConfig, finite
from .deepseek import FUSED
from .family import Assembled, GGUFMetadata

SOFTMAX, SIGMOID = 1, 2  # llama.cpp's expert_gating_func (LLAMA_EXPERT_GATING_FUNC_TYPE_*)


def meta_key(meta: GGUFMetadata, key: str) -> str:
    return f"{meta.path}: metadata key {meta.architecture}.{key}"


def _size(meta: GGUFMetadata, key: str, field: str) -> int:
    """A size the file must have (``field``: what config.json calls it)."""
    if meta.get(key) is None:
        raise ModelLoadError(f"{meta_key(meta, key)} ({field}) is missing")
    return meta.size(key)


def _count(meta: GGUFMetadata, key: str, field: str, default: int | None = 0) -> int:
    """A count that may be 0 (``default`` where absent; None: required)."""
    value = meta.get(key, default)
    if value is None:
        raise ModelLoadError(f"{meta_key(meta, key)} ({field}) is missing")
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2 ** 32:
        raise ModelLoadError(f"{meta_key(meta, key)} must be a count (an integer >= 0), got {shown(value)}")
    return value


def weights_norm(meta: GGUFMetadata) -> bool:
    """expert_weights_norm: whether llama.cpp renormalises the chosen experts' weights (absent: no)."""
    value = meta.get("expert_weights_norm", False)
    if not isinstance(value, bool):
        raise ModelLoadError(f"{meta_key(meta, 'expert_weights_norm')} must be true or false, got {shown(value)}")
    return value


def deepseek2_config(meta: GGUFMetadata, raw: dict) -> None:
    """The config.json fields V2 and V3 share, from a "deepseek2" file's keys, checked as llama.cpp needs them
    (a key missing or contradicting another: a ModelLoadError naming it)."""
    experts = _size(meta, "expert_count", "n_routed_experts")
    per_token = _size(meta, "expert_used_count", "num_experts_per_tok")
    groups = meta.size("expert_group_count") if meta.get("expert_group_count") is not None else 1
    used = meta.size("expert_group_used_count") if meta.get("expert_group_used_count") is not None else groups
    if experts % groups:
        raise ModelLoadError(f"{meta_key(meta, 'expert_group_count')} = {groups} does not divide "
                             f"{meta.architecture}.expert_count = {experts}")
    if used > groups:
        raise ModelLoadError(f"{meta_key(meta, 'expert_group_used_count')} = {used} exceeds "
                             f"{meta.architecture}.expert_group_count = {groups}")
    if per_token > used * (experts // groups):
        raise ModelLoadError(f"{meta_key(meta, 'expert_used_count')} = {per_token} exceeds the {used * (experts // groups)}"
                             f" experts of the {used} eligible groups")
    kv_rank = _size(meta, "attention.kv_lora_rank", "kv_lora_rank")
    rope = _size(meta, "rope.dimension_count", "qk_rope_head_dim")
    if meta.get("attention.key_length_mla") is not None or meta.get("attention.value_length_mla") is not None:
        # (a newer converter's: key_length / value_length are then the latent's MQA view)
        qk_key, qk = "attention.key_length_mla", _size(meta, "attention.key_length_mla", "qk_head_dim")
        v = _size(meta, "attention.value_length_mla", "v_head_dim")
        for key, want, what in (("attention.key_length", kv_rank + rope, "kv_lora_rank + rope.dimension_count"),
                                ("attention.value_length", kv_rank, "kv_lora_rank")):
            if meta.get(key) is not None and meta.get(key) != want:
                raise ModelLoadError(f"{meta_key(meta, key)} = {shown(meta.get(key))} contradicts the latent attention's "
                                     f"{want} ({what}, beside {meta.architecture}.{qk_key})")
    else:  # (an older converter's: the heads' sizes)
        qk_key, qk = "attention.key_length", _size(meta, "attention.key_length", "qk_head_dim")
        v = _size(meta, "attention.value_length", "v_head_dim")
    if qk <= rope:
        raise ModelLoadError(f"{meta_key(meta, qk_key)} = {qk} leaves no head dimension beside the {rope} of "
                             f"{meta.architecture}.rope.dimension_count")
    scale = meta.get("expert_weights_scale", 0.0)
    if not finite(scale) or not isinstance(scale, (int, float)) or scale < 0:
        raise ModelLoadError(f"{meta_key(meta, 'expert_weights_scale')} must be a finite number >= 0, got {shown(scale)}")
    q_rank = _count(meta, "attention.q_lora_rank", "q_lora_rank") or None  # (absent or 0: one q projection)
    raw.update(n_routed_experts=experts, num_experts_per_tok=per_token, n_group=groups, topk_group=used,
               moe_intermediate_size=_size(meta, "expert_feed_forward_length", "moe_intermediate_size"),
               n_shared_experts=_count(meta, "expert_shared_count", "n_shared_experts", None),
               first_k_dense_replace=_count(meta, "leading_dense_block_count", "first_k_dense_replace"),
               q_lora_rank=q_rank, kv_lora_rank=kv_rank, qk_rope_head_dim=rope, qk_nope_head_dim=qk - rope,
               v_head_dim=v, head_dim=rope, num_key_value_heads=raw["num_attention_heads"],
               routed_scaling_factor=float(scale) or 1.0)  # (llama.cpp: 0 or absent, no factor)
    rope_scaling, log_mul = raw.get("rope_scaling"), meta.get("rope.scaling.yarn_log_multiplier")
    if isinstance(rope_scaling, dict) and rope_scaling.get("rope_type") == "yarn" and log_mul is not None:
        if not finite(log_mul) or not isinstance(log_mul, (int, float)) or log_mul <= 0:
            raise ModelLoadError(f"{meta_key(meta, 'rope.scaling.yarn_log_multiplier')} must be a positive number, got "
                                 f"{shown(log_mul)}")
        # 0.1 x mscale_all_dim (in float32); llama.cpp's rope then scales cos / sin by 1, as HF's does where
        # mscale = mscale_all_dim (DeepSeek's configs)
        mscale = float(np.float32(log_mul) / np.float32(0.1))
        raw["rope_scaling"] = {**rope_scaling, "mscale": mscale, "mscale_all_dim": mscale}


def _kv_b_shapes(c: ModelConfig) -> tuple[tuple[int, ...], ...]:
    m = c.mla
    assert m is not None  # (a DeepSeek config)
    return (c.num_attention_heads, m.kv_lora_rank, m.qk_nope_head_dim), (c.num_attention_heads, m.v_head_dim,
                                                                         m.kv_lora_rank)


def _kv_b(c: ModelConfig, parts: list[np.ndarray]) -> np.ndarray:
    """kv_b_proj [heads x (nope + v), kv_lora_rank], each head's W_uk rows then its W_uv rows, from attn_k_b (W_uk
    transposed per head) and attn_v_b."""
    k_b, v_b = parts
    return np.concatenate([k_b.transpose(0, 2, 1), v_b], axis=1).reshape(-1, k_b.shape[1])


# How the converter writes both: kv_a_proj_with_mqa as attn_kv_a_mqa (fused as HF's), kv_b_proj whole or split
GGUF_FUSED = {"attn_kv_a_mqa.weight": FUSED["self_attn.kv_a_proj_with_mqa.weight"]}
GGUF_ASSEMBLED = {"kv_b_proj": Assembled(("attn_k_b.weight", "attn_v_b.weight"), _kv_b_shapes, _kv_b)}
