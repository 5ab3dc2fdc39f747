"""The decoder's weights as its forward reads them, and the ops that read each stored kind.

A linear's weight is a tensor in the model dtype, an ``Int8Weight`` (``quantize="int8"``), a ``BlockWeight``
(int4, and a GGUF file's quantized tensors) or a ``GQWeight`` (a GPTQ / AWQ checkpoint's groups), any of them
``Adapted`` by LoRA adapters (lora/: the adapters' low-rank pairs beside the base weight); ``linear`` /
``embedding`` / ``moe_linear`` run the op of its kind, so a family's forward reads the same whichever it is. The
loaders (loading/) build these: what is read from where, and how it is quantized, is theirs.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import llaisys


@dataclasses.dataclass(frozen=True)
class Int8Weight:
    """A linear's [N, K] weight in the int8 format: the blocks ``weight`` and ``scales`` (llaisys.ops.int8)."""

    weight: llaisys.Tensor
    scales: llaisys.Tensor
    shape: tuple[int, int]  # [N, K]


@dataclasses.dataclass(frozen=True)
class BlockWeight:
    """An [N, K] matrix in one of llaisys.ops.quant's block formats (``fmt``: q8_0, q4_0, q4_1, q4_k, q6_k): the
    uint8 blocks ``weight`` and ``scales``. A linear's weight, or an embedding table (embedding_q reads it)."""

    weight: llaisys.Tensor
    scales: llaisys.Tensor
    fmt: str
    shape: tuple[int, int]  # [N, K]


@dataclasses.dataclass(frozen=True)
class GQWeight:
    """A linear's [N, K] weight as a GPTQ / AWQ checkpoint stores it (``fmt``: "gptq" or "awq"): ``bits``-bit codes
    with an integer zero point and a float16 scale per row and group of ``group_size`` inputs, w = (q - zero) *
    scale, packed by ``llaisys.ops.quant.pack_gq``; ``perm`` (act-order): column j holds input perm[j]
    (``llaisys.ops.linear_gq``, which computes with the activations unrounded)."""

    weight: llaisys.Tensor
    scales: llaisys.Tensor
    zeros: llaisys.Tensor
    bits: int
    group_size: int
    shape: tuple[int, int]  # [N, K]
    fmt: str
    perm: llaisys.Tensor | None = None


@dataclasses.dataclass(frozen=True)
class Int8Experts:
    """A mixture-of-experts layer's stacked expert matrices [E, N, K] in the int8 format: expert e's blocks at
    ``weight[e]`` and ``scales[e]`` (``llaisys.ops.moe_linear_i8``)."""

    weight: llaisys.Tensor  # int8 [E, ceil(N / 16), ceil(K / 32), 8, 16, 4]
    scales: llaisys.Tensor  # bf16 [E, ceil(N / 16), ceil(K / 32), 16]
    shape: tuple[int, int, int]  # [E, N, K]


@dataclasses.dataclass(frozen=True)
class BlockExperts:
    """A mixture-of-experts layer's stacked expert matrices [E, N, K] kept in one of llaisys.ops.quant's block
    formats (``fmt``: a GGUF file's experts as stored): expert e's blocks at ``weight[e]`` and ``scales[e]``
    (``llaisys.ops.moe_linear_q``)."""

    weight: llaisys.Tensor  # uint8 [E, *quant_shapes(fmt, N, K)[0]]
    scales: llaisys.Tensor  # uint8 [E, *quant_shapes(fmt, N, K)[1]]
    fmt: str
    shape: tuple[int, int, int]  # [E, N, K]


class AddsLoRA(Protocol):
    """An adapted linear's LoRA slots (lora/slots.py)."""

    def apply(self, out: llaisys.Tensor, x: llaisys.Tensor) -> None:
        """out += scale * (x A^T) B^T, each row with the pair of its own adapter (rows with none: untouched)."""


@dataclasses.dataclass(frozen=True)
class Adapted:
    """A linear with LoRA adapters beside its weight: ``base`` (any stored kind) and the adapters' pairs."""

    base: Int8Weight | BlockWeight | GQWeight | llaisys.Tensor
    lora: AddsLoRA

    @property
    def shape(self) -> tuple[int, int]:
        return self.base.shape  # (every kind of base is [N, K])


# a linear's weight: in the model dtype, int8, blocks (int4, and a GGUF file's quantized tensors), or a GPTQ / AWQ
# checkpoint's groups; with LoRA adapters beside it or not
Linear = llaisys.Tensor | Int8Weight | BlockWeight | GQWeight | Adapted
Experts = llaisys.Tensor | Int8Experts | BlockExperts  # stacked expert matrices: in the model dtype, int8 or blocks
Weight = Linear | Int8Experts | BlockExperts  # any weight a loader places (a linear, stacked experts, a norm, a bias,
# a table)


@dataclasses.dataclass
class ExpertWeights:
    """A mixture-of-experts MLP: the router and every expert's matrices, stacked (expert e at [e])."""
    router: llaisys.Tensor  # [E, hidden]
    gate: Experts  # [E, moe_intermediate, hidden]
    up: Experts  # [E, moe_intermediate, hidden]
    down: Experts  # [E, hidden, moe_intermediate]
    router_bias: llaisys.Tensor | None = None  # f32 [E]: DeepSeek-V3's e_score_correction_bias (for the choice)


@dataclasses.dataclass
class LayerWeights:
    """One decoder layer's weights, each named as its forward reads it (a family's ``tensors`` say where each
    comes from in a checkpoint: family.py); None where the family has no such weight."""
    o_proj: Linear
    q_proj: Linear | None = None  # (None: MLA with q_lora_rank, whose q is q_a_proj then q_b_proj)
    k_proj: Linear | None = None  # (None: MLA, whose keys and values come from kv_a_proj's latent)
    v_proj: Linear | None = None
    input_norm: llaisys.Tensor | None = None  # of the attention's input (None: OLMo 2 norms the outputs alone)
    mlp_norm: llaisys.Tensor | None = None  # of the MLP's input (HF: post_attention_layernorm; Gemma:
    # pre_feedforward_layernorm)
    gate_proj: Linear | None = None  # (None in a mixture-of-experts layer: its MLP is `experts`)
    up_proj: Linear | None = None
    down_proj: Linear | None = None
    experts: ExpertWeights | None = None
    q_norm: llaisys.Tensor | None = None  # Qwen3, Gemma 3: RMSNorm weights [head_dim] of each q head, each k head
    k_norm: llaisys.Tensor | None = None  # (OLMo 2: [q_size], [kv_size]: one norm over all heads)
    attn_out_norm: llaisys.Tensor | None = None  # Gemma, OLMo 2: of the attention's output (post_attention_layernorm)
    mlp_out_norm: llaisys.Tensor | None = None  # Gemma, OLMo 2: of the MLP's output (post_feedforward_layernorm)
    q_bias: llaisys.Tensor | None = None
    k_bias: llaisys.Tensor | None = None
    v_bias: llaisys.Tensor | None = None
    o_bias: llaisys.Tensor | None = None
    gate_bias: llaisys.Tensor | None = None
    up_bias: llaisys.Tensor | None = None
    down_bias: llaisys.Tensor | None = None
    # DeepSeek's latent attention (deepseek.py): q's low-rank pair and its norm, the latent's and the rope key's
    # rows of kv_a_proj_with_mqa, the latent's norm, kv_b_proj (every head's W_uk and W_uv rows, from which the
    # model derives the absorbed matrices at load)
    q_a_proj: Linear | None = None
    q_a_norm: llaisys.Tensor | None = None
    q_b_proj: Linear | None = None
    kv_a_proj: Linear | None = None
    kv_rope_proj: Linear | None = None
    kv_a_norm: llaisys.Tensor | None = None
    kv_b_proj: llaisys.Tensor | None = None
    # DeepSeekMoE's shared experts, beside the routed ones (one MLP moe_intermediate_size x n_shared wide)
    shared_gate: Linear | None = None
    shared_up: Linear | None = None
    shared_down: Linear | None = None


@dataclasses.dataclass
class Weights:
    embed_tokens: llaisys.Tensor | BlockWeight  # blocks: a GGUF file's quantized table, decoded per row read
    layers: list[LayerWeights]
    norm: llaisys.Tensor
    lm_head: Linear  # the embedding itself when tie_word_embeddings (its own int8 copy when quantized; the same
    # blocks when the embedding is a GGUF file's quantized table)


def layer_weights(fields: dict) -> LayerWeights:
    """A layer from its plan's fields (a sparse layer's router and experts_* fields become its ExpertWeights)."""
    if "router" in fields:
        fields = dict(fields)
        router, bias = fields.pop("router"), fields.pop("router_bias", None)
        gate, up, down = (fields.pop("experts_" + f) for f in ("gate", "up", "down"))
        fields["experts"] = ExpertWeights(router, gate, up, down, router_bias=bias)
    return LayerWeights(**fields)


def linear(out: llaisys.Tensor, x: llaisys.Tensor, weight: Linear, bias: llaisys.Tensor | None = None) -> None:
    """out = x @ weight.T + bias, whichever kind the weight is: a tensor in the model dtype, int8 or blocks (and
    + each row's LoRA adapter's update where it is ``Adapted``)."""
    if isinstance(weight, Adapted):
        linear(out, x, weight.base, bias)
        weight.lora.apply(out, x)
    elif isinstance(weight, BlockWeight):
        llaisys.ops.linear_q(out, x, weight.weight, weight.scales, weight.fmt, bias)
    elif isinstance(weight, Int8Weight):
        llaisys.ops.linear_i8(out, x, weight.weight, weight.scales, bias)
    elif isinstance(weight, GQWeight):
        llaisys.ops.linear_gq(out, x, weight.weight, weight.scales, weight.zeros, weight.bits, weight.group_size, bias,
                              weight.perm)
    else:
        llaisys.ops.linear(out, x, weight, bias)


def embedding(out: llaisys.Tensor, index: llaisys.Tensor, table: llaisys.Tensor | BlockWeight) -> None:
    """out[i] = table[index[i]], whichever kind the table is: a tensor in the model dtype, or blocks (only the
    rows read are decoded)."""
    if isinstance(table, BlockWeight):
        llaisys.ops.embedding_q(out, index, table.weight, table.scales, table.fmt, table.shape[0])
    else:
        llaisys.ops.embedding(out, index, table)


def moe_linear(out: llaisys.Tensor, x: llaisys.Tensor, weight: Experts, experts: llaisys.Tensor) -> None:
    """out[m, j] = x[m] (or x[m, j]) @ weight[experts[m, j]].T, whichever kind the stacked experts are: a tensor
    [E, N, K] in the model dtype, int8, or a GGUF file's blocks."""
    if isinstance(weight, Int8Experts):
        llaisys.ops.moe_linear_i8(out, x, weight.weight, weight.scales, experts)
    elif isinstance(weight, BlockExperts):
        llaisys.ops.moe_linear_q(out, x, weight.weight, weight.scales, experts, weight.fmt)
    else:
        llaisys.ops.moe_linear(out, x, weight, experts)


def weight_formats(weights: Weights) -> tuple[str, ...]:
    """The quantized formats a model's matrices are held in ("int8", "q4_k", ...; none for float weights)."""
    matrices: list[object] = [weights.embed_tokens, weights.lm_head]
    for layer in weights.layers:
        linears = (layer.q_proj, layer.k_proj, layer.v_proj, layer.o_proj, layer.gate_proj, layer.up_proj,
                   layer.down_proj, layer.q_a_proj, layer.q_b_proj, layer.kv_a_proj, layer.kv_rope_proj,
                   layer.shared_gate, layer.shared_up, layer.shared_down)
        matrices += [m.base if isinstance(m, Adapted) else m for m in linears]
    for layer in weights.layers:
        if layer.experts is not None:
            matrices += [layer.experts.gate, layer.experts.up, layer.experts.down]
    kinds = {m.fmt if isinstance(m, (BlockWeight, BlockExperts))
             else f"{m.fmt}-{m.bits}bit" if isinstance(m, GQWeight) else "int8"
             for m in matrices if isinstance(m, (BlockWeight, Int8Weight, Int8Experts, BlockExperts, GQWeight))}
    return tuple(sorted(kinds))
