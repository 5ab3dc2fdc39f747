"""What a model family is, declared in the family's own file as ``FAMILY = Family(...)``:

    model     the CausalLM subclass that runs it: its forward (and the buffers the forward uses)
    config    how its HF configuration class reads config.json (config.ConfigRules: biases, windows, norms...)
    tensors   the HF checkpoint name of each weight its forward reads (a ``LayerWeights`` field), after
              "model.layers.{i}."; ``fused``: tensors that hold several of them as rows; ``experts``: a sparse
              layer's router and experts
    gguf      how llama.cpp's converter writes it: tensor names where they are not llama.cpp's usual ones,
              what its metadata keys mean, whether Q/K rows are permuted (None: llaisys reads no GGUF of it)
    kernels   the ops its forward calls (a device whose backend lacks one is refused before loading)

The registry (registry.py) names the family's module for an HF architecture and a GGUF general.architecture;
the loaders (loading/) read every family through these declarations and hold no branch per family. The
shared pieces (the Llama layer's names, llama.cpp's names, the decoder's kernels) are here, for the families
to start from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

import numpy as np

from .causal_lm import CausalLM
from .config import ConfigRules, ModelConfig

# Every op a forward, the paged KV cache and sampling call: a device whose backend lacks one cannot run the
# model (there is no second, unpaged code path). A family that calls more says so (its ``kernels``).
KERNELS = ("embedding", "rms_norm", "linear", "rope", "paged_kv_write", "paged_attention", "swiglu", "add",
           "rearrange", "argmax", "sample")
MOE_KERNELS = ("moe_router", "moe_linear", "moe_combine")  # ... and a mixture-of-experts model's sparse layers

# The weights outside the layers, as HF checkpoints and llama.cpp name them (every family here)
HF_TOP = {"embed_tokens": "model.embed_tokens.weight", "norm": "model.norm.weight", "lm_head": "lm_head.weight"}
GGUF_TOP = {"embed_tokens": "token_embd.weight", "norm": "output_norm.weight", "lm_head": "output.weight"}
HF_LAYER = "model.layers.{}."  # a layer's HF names start so; its GGUF names "blk.{i}."

# A Llama layer's weights as HF names them (after "model.layers.{i}."). The biases are read where the config
# says the layer has them (qkv_bias, o_bias, mlp_bias).
LLAMA_TENSORS = {
    "input_norm": "input_layernorm.weight",
    "q_proj": "self_attn.q_proj.weight", "k_proj": "self_attn.k_proj.weight", "v_proj": "self_attn.v_proj.weight",
    "o_proj": "self_attn.o_proj.weight",
    "mlp_norm": "post_attention_layernorm.weight",
    "gate_proj": "mlp.gate_proj.weight", "up_proj": "mlp.up_proj.weight", "down_proj": "mlp.down_proj.weight",
    "q_bias": "self_attn.q_proj.bias", "k_bias": "self_attn.k_proj.bias", "v_bias": "self_attn.v_proj.bias",
    "o_bias": "self_attn.o_proj.bias",
    "gate_bias": "mlp.gate_proj.bias", "up_bias": "mlp.up_proj.bias", "down_bias": "mlp.down_proj.bias",
}
QK_NORMS = {"q_norm": "self_attn.q_norm.weight", "k_norm": "self_attn.k_norm.weight"}  # Qwen3, Gemma 3, OLMo 2

# llama.cpp's name of each weight (after "blk.{i}."): one name per kind of tensor, whatever the architecture
# (gguf-py's MODEL_TENSOR names), so a family declares only where its converter writes another
LLAMA_CPP_TENSORS = {
    "input_norm": "attn_norm.weight", "mlp_norm": "ffn_norm.weight",
    "q_proj": "attn_q.weight", "k_proj": "attn_k.weight", "v_proj": "attn_v.weight", "o_proj": "attn_output.weight",
    "q_bias": "attn_q.bias", "k_bias": "attn_k.bias", "v_bias": "attn_v.bias", "o_bias": "attn_output.bias",
    "gate_proj": "ffn_gate.weight", "up_proj": "ffn_up.weight", "down_proj": "ffn_down.weight",
    "gate_bias": "ffn_gate.bias", "up_bias": "ffn_up.bias", "down_bias": "ffn_down.bias",
    "q_norm": "attn_q_norm.weight", "k_norm": "attn_k_norm.weight",
    "attn_out_norm": "post_attention_norm.weight", "mlp_out_norm": "post_ffw_norm.weight",
    # a sparse layer: the router, the experts' matrices stacked [E, rows, cols]
    "router": "ffn_gate_inp.weight", "experts_gate": "ffn_gate_exps.weight", "experts_up": "ffn_up_exps.weight",
    "experts_down": "ffn_down_exps.weight",
    # latent attention (DeepSeek; kv_a_proj and kv_rope_proj are the rows of attn_kv_a_mqa: the family's fused), the
    # shared experts and the router's correction bias
    "q_a_proj": "attn_q_a.weight", "q_a_norm": "attn_q_a_norm.weight", "q_b_proj": "attn_q_b.weight",
    "kv_a_norm": "attn_kv_a_norm.weight", "kv_b_proj": "attn_kv_b.weight",
    "shared_gate": "ffn_gate_shexp.weight", "shared_up": "ffn_up_shexp.weight", "shared_down": "ffn_down_shexp.weight",
    "router_bias": "exp_probs_b.bias",
}


@dataclasses.dataclass(frozen=True)
class Experts:
    """A sparse layer's weights as HF names them (after "model.layers.{i}."): the router, and each expert's
    matrices ("{}": the expert's index)."""
    router: str
    gate: str
    up: str
    down: str


class GGUFMetadata(Protocol):
    """A GGUF file's metadata, as a family's GGUF rules read it (loading/gguf/config.py gives one)."""

    path: Path
    architecture: str  # general.architecture: its keys start so

    def get(self, key: str, default: object = None) -> object:
        """The value of "{architecture}.{key}" (``default`` where the file has none)."""

    def size(self, key: str) -> int:
        """The value of "{architecture}.{key}", checked to be a size as llama.cpp bounds sizes."""


def _no_metadata(meta: GGUFMetadata, raw: dict) -> None:
    return None


@dataclasses.dataclass(frozen=True)
class Assembled:
    """A weight a converter writes as several tensors (DeepSeek's kv_b_proj as attn_k_b and attn_v_b): their names
    (after "blk.{i}."), the shape of each (numpy order) as the config implies, and how their values (decoded to
    float32, in that order) make the weight as HF lays it out."""
    parts: tuple[str, ...]
    shapes: Callable[[ModelConfig], tuple[tuple[int, ...], ...]]
    join: Callable[[ModelConfig, list[np.ndarray]], np.ndarray]


@dataclasses.dataclass(frozen=True)
class GGUF:
    """How llama.cpp's converter (convert_hf_to_gguf.py) writes a family."""

    # its own metadata keys -> config.json's fields in ``raw`` (the keys every architecture has, such as
    # block_count or rope.freq_base, are read for all: loading/gguf/config.py)
    config: Callable[[GGUFMetadata, dict], None] = _no_metadata
    tensors: Mapping[str, str] = dataclasses.field(default_factory=lambda: LLAMA_CPP_TENSORS)
    fused: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)  # as Family.fused
    permuted_qk: bool = False  # Q/K rows in ggml's interleaved rope order (the converter's LlamaModel permutes)
    window_pattern: int = 0  # llama.cpp's attention.sliding_window_pattern where the file has none (0: all layers)
    # a file of the architecture is this family's only if ``claims(metadata)`` (several families one name)
    claims: Callable[[GGUFMetadata], bool] | None = None
    # weights a file may hold as parts instead (read so in a file without the tensor ``tensors`` names)
    assembled: Mapping[str, Assembled] = dataclasses.field(default_factory=dict)
    # latent attention: attention.key_length, value_length and rope.dimension_count are its sizes, which ``config``
    # reads (not one head size for keys, values and rope, as the decoder's are checked)
    latent_attention: bool = False


@dataclasses.dataclass(frozen=True)
class Family:
    """A model family (see the module's docstring)."""

    model: type[CausalLM]
    config: ConfigRules
    tensors: Mapping[str, str] = dataclasses.field(default_factory=lambda: LLAMA_TENSORS)
    # HF tensors that hold several weights as rows, in order: {name after "model.layers.{i}.": (fields...)}
    fused: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    experts: Experts | None = None
    gguf: GGUF | None = dataclasses.field(default_factory=GGUF)
    kernels: tuple[str, ...] = KERNELS
    refused: Mapping[str, str] = dataclasses.field(default_factory=dict)  # kin architectures llaisys does not run: why

    def read_config(self, raw: dict, architecture: str) -> ModelConfig:
        """config.json's object as this family's configuration class reads it."""
        return ModelConfig.from_dict(raw, self.config, architecture)
