"""Mixtral: Llama attention (llama.py), every layer's MLP a mixture of experts (moe.py: 8 experts, the router
picks 2, their weights renormalised), Mistral's sliding windows. llama.cpp's converter writes it as "llama"
with llama.expert_count."""

from __future__ import annotations

from .config import ConfigRules, every_layer_window, integer
from .family import GGUF, KERNELS, MOE_KERNELS, Experts, Family, GGUFMetadata
from .llama import Llama
from .moe import SparseMlp, expert_counts, gguf_experts_per_token


class Mixtral(SparseMlp, Llama):
    """Mixtral: Llama attention, every layer's MLP 8 experts of which the router picks 2 (renormalised)."""


def config(raw: dict, layers: int) -> dict:
    """MixtralConfig: Mistral's sliding windows; num_local_experts experts of intermediate_size on every layer,
    the top-k weights always renormalised."""
    windows = every_layer_window(raw, layers)
    experts, per_token = expert_counts(raw, "num_local_experts")
    return dict(**windows, num_experts=experts, num_experts_per_tok=per_token, norm_topk_prob=True,
                moe_intermediate_size=integer(raw, "intermediate_size"), sparse_layers=tuple(range(layers)))


def gguf_config(meta: GGUFMetadata, raw: dict) -> None:
    """A "llama" file with experts (llama.expert_count), as the converter writes Mixtral."""
    raw["num_local_experts"] = meta.size("expert_count")
    gguf_experts_per_token(meta, raw)


FAMILY = Family(
    model=Mixtral,
    config=ConfigRules("mixtral", config),
    experts=Experts(router="block_sparse_moe.gate.weight", gate="block_sparse_moe.experts.{}.w1.weight",
                    up="block_sparse_moe.experts.{}.w3.weight", down="block_sparse_moe.experts.{}.w2.weight"),
    gguf=GGUF(config=gguf_config, permuted_qk=True, claims=lambda meta: bool(meta.get("expert_count"))),
    kernels=(*KERNELS, *MOE_KERNELS),
)
