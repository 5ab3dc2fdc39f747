"""The rope tables of rope scaling (rope_scaling.py) against HF transformers' own (modeling_rope_utils),
computed by HF from the same config: equal but for torch's Sleef powf (1 f32 ulp in a few entries, which
the plain table has too), with the same cos/sin scale. No device needed."""

from __future__ import annotations

import numpy as np
import pytest

from llaisys_models import ModelConfig
from llaisys_models.families.rope_scaling import table

BASE = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=1000, hidden_size=512,
            intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=131072)

CASES = {
    "llama3.1": dict(rope_theta=5e5, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    "llama3.2": dict(rope_theta=5e5, head_dim=64, rope_scaling={
        "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}),
    "llama3_tiny": dict(rope_theta=5e5, head_dim=32, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32}),
    "qwen2.5_yarn": dict(rope_theta=1e6, rope_scaling={"type": "yarn", "factor": 4.0,
                                                       "original_max_position_embeddings": 32768}),
    "yarn_tiny": dict(rope_theta=1e6, head_dim=32, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                                 "original_max_position_embeddings": 32}),
    "yarn_untruncated_betas": dict(rope_theta=1e4, rope_scaling={
        "rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 4096, "beta_fast": 16,
        "beta_slow": 2, "truncate": False}),
    "yarn_mscale": dict(rope_theta=1e4, rope_scaling={
        "rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 1.0,
        "mscale_all_dim": 0.707}),
    "yarn_attention_factor": dict(rope_theta=1e4, rope_scaling={
        "rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 4096, "attention_factor": 1.5}),
    "yarn_no_factor": dict(rope_theta=1e4, max_position_embeddings=16384, rope_scaling={
        "rope_type": "yarn", "factor": None, "original_max_position_embeddings": 4096}),
    "linear": dict(rope_theta=1e4, rope_scaling={"type": "linear", "factor": 4.0}),
    "default": dict(rope_theta=1e6),
}


def hf_table(raw: dict):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    hf_config = LlamaConfig(**{k: v for k, v in raw.items() if k not in ("architectures", "model_type")})
    kind = hf_config.rope_parameters["rope_type"]
    if kind == "default":
        rotary = LlamaRotaryEmbedding(hf_config)
        return rotary.inv_freq.numpy(), rotary.attention_scaling
    inv, scale = ROPE_INIT_FUNCTIONS[kind](hf_config, "cpu")
    return inv.numpy(), scale


@pytest.mark.parametrize("name", list(CASES))
def test_table_is_hf(name):
    raw = dict(BASE, **CASES[name])
    c = ModelConfig.from_dict(raw)
    ours, our_scale = table(c.head_dim, c.rope_theta, c.rope_scaling, c.max_position_embeddings)
    hf, hf_scale = hf_table(raw)
    assert ours.dtype == np.float32 and ours.shape == hf.shape == (c.head_dim // 2,)
    assert our_scale == pytest.approx(hf_scale, rel=1e-15)
    ulps = np.abs(ours.view(np.int32).astype(np.int64) - hf.view(np.int32))
    assert ulps.max() <= 2 and (ulps == 0).mean() >= 0.8, f"{name}: ulps {ulps}"
    if name != "default":  # the comparison sees the scaling: the plain table differs
        plain, _ = table(c.head_dim, c.rope_theta, ModelConfig.from_dict(dict(BASE, rope_theta=c.rope_theta,
                                                                               head_dim=c.head_dim)).rope_scaling,
                         c.max_position_embeddings)
        assert (np.abs(plain - hf) / hf).max() > 0.1 or our_scale != 1.0
