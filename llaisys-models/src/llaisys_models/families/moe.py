"""Mixture-of-experts decoders (mixtral.py, qwen3_moe.py): the attention of their dense kin, and in the sparse
layers an MLP that is a weighted sum of the k experts (of E) a router picks per token:

    h = rms_norm(x)
    w, e = top_k(softmax(h Wrouter))             (w / sum(w) when the family renormalises)
    for j < k:  y_j = (silu(h Wgate[e_j]) * h Wup[e_j]) Wdown[e_j]
    x += sum_j w_j y_j

moe_linear groups a step's rows by expert, so each expert a row chose is read once for all of them and the
others not at all: a decode step reads the active parameters only. With quantize="int8" the experts are int8
(weights.moe_linear runs moe_linear_i8 on them, as weights.linear runs linear_i8 on an Int8Weight).
"""

from __future__ import annotations

import llaisys

from ..errors import ModelLoadError
from .causal_lm import Workspace
from .config import integer
from .family import GGUFMetadata
from .qwen2 import Qwen2
from .weights import LayerWeights, moe_linear


class SparseMlp(Qwen2):
    """A decoder whose layers in ``config.sparse_layers`` have a mixture-of-experts MLP (``w.experts``); its
    family's kernels add family.MOE_KERNELS."""

    def activations(self) -> dict[str, tuple]:
        c = self.config
        k, inter = c.num_experts_per_tok, c.moe_intermediate_size
        return {
            **super().activations(),
            "router_logits": (c.num_experts,),
            "route_weights": (k,),  # each row's k expert weights
            "route_experts": (llaisys.int64, k),  # and the experts they weigh
            "expert_gate": (k, inter),
            "expert_up": (k, inter),
            "expert_act": (k, inter),
            "expert_out": (k, c.hidden_size),  # each chosen expert's output, before the weighted sum
        }

    def _mlp(self, w: LayerWeights, ws: Workspace) -> None:
        if w.experts is None:  # a dense layer (Qwen3-MoE's mlp_only_layers, decoder_sparse_step)
            return super()._mlp(w, ws)
        c, ops, e = self.config, llaisys.ops, w.experts
        ops.rms_norm(ws.h, ws.x, w.mlp_norm, c.rms_norm_eps, self.numerics)
        ops.linear(ws.router_logits, ws.h, e.router)
        ops.moe_router(ws.route_weights, ws.route_experts, ws.router_logits, c.norm_topk_prob)
        moe_linear(ws.expert_gate, ws.h, e.gate, ws.route_experts)
        moe_linear(ws.expert_up, ws.h, e.up, ws.route_experts)
        ops.swiglu(ws.expert_act, ws.expert_gate, ws.expert_up, self.numerics)
        moe_linear(ws.expert_out, ws.expert_act, e.down, ws.route_experts)
        ops.moe_combine(ws.out, ws.expert_out, ws.route_weights)
        llaisys.distributed.all_reduce(ws.out, self.group)  # + the other ranks' rows of each expert (parallel/)
        ops.add(ws.x, ws.x, ws.out)


def expert_counts(raw: dict, count: str) -> tuple[int, int]:
    """(experts per sparse layer, experts per token) of config.json, its count of experts named ``count``."""
    experts, per_token = integer(raw, count), integer(raw, "num_experts_per_tok")
    if per_token > experts:
        raise ModelLoadError(f"config field 'num_experts_per_tok' = {per_token} exceeds {count} = {experts}")
    return experts, per_token


def gguf_experts_per_token(meta: GGUFMetadata, raw: dict) -> None:
    """llama.cpp's expert_used_count: the experts the router picks per token (num_experts_per_tok)."""
    if meta.get("expert_used_count") is not None:
        raw["num_experts_per_tok"] = meta.size("expert_used_count")
