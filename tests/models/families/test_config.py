"""config.json in every dialect the writers use (no device needed)."""

from __future__ import annotations

import json

import pytest

from llaisys_models import ModelConfig, ModelLoadError
from llaisys_models.families.registry import read_config
from llaisys_models.loading.loader import config_file

BASE = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", vocab_size=1000, hidden_size=256,
            intermediate_size=512, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
            max_position_embeddings=4096)


def config(**changes):
    raw = dict(BASE)
    for k, v in changes.items():
        if v is None:
            raw.pop(k, None)
        else:
            raw[k] = v
    return read_config(raw)


def test_derived_and_default_fields():
    c = config()
    assert c.head_dim == 32 and c.q_size == 256 and c.kv_size == 64
    assert c.rope_theta == 10000.0 and c.rms_norm_eps == 1e-6
    assert c.tie_word_embeddings is False and c.eos_token_ids == ()
    assert c.qkv_bias and not c.o_bias and not c.mlp_bias
    assert config(num_key_value_heads=None).num_key_value_heads == 8
    assert config(head_dim=128).head_dim == 128 and config(head_dim=128).q_size == 1024


@pytest.mark.parametrize("raw, theta", [
    (dict(rope_parameters={"rope_type": "default", "rope_theta": 1e6}), 1e6),  # transformers >= 5
    (dict(rope_theta=500000.0), 500000.0),  # transformers 4
    (dict(rope_theta=1234.0, rope_scaling=None), 1234.0),
    (dict(rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 7.0e4},
                           "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}), 7.0e4),
])
def test_rope_theta_in_every_form(raw, theta):
    assert config(**raw).rope_theta == theta


@pytest.mark.parametrize("eos, ids", [(151643, (151643,)), ([151645, 151643], (151645, 151643)), (None, ())])
def test_eos_forms(eos, ids):
    assert config(eos_token_id=eos).eos_token_ids == ids


def test_llama_biases_follow_attention_bias():
    llama = dict(architectures=["LlamaForCausalLM"], model_type="llama")
    assert not config(**llama).qkv_bias and not config(**llama).o_bias
    c = config(**llama, attention_bias=True, mlp_bias=True)
    assert c.qkv_bias and c.o_bias and c.mlp_bias


def windows(c: ModelConfig) -> list[int]:
    return [c.window(i) for i in range(c.num_hidden_layers)]


def test_tie_word_embeddings_and_sliding_window():
    """Each family's layers window as its HF modeling code windows them (config.py's table)."""
    assert config(tie_word_embeddings=True).tie_word_embeddings
    # Qwen2 / Qwen3: use_sliding_window, then layer_types or the layers from max_window_layers (HF default 28) on
    assert windows(config(use_sliding_window=False, sliding_window=4096)) == [0, 0]
    assert windows(config(use_sliding_window=True, sliding_window=64, max_window_layers=1)) == [0, 64]
    assert windows(config(use_sliding_window=True, sliding_window=64)) == [0, 0]  # 28 layers before any slides
    assert windows(config(use_sliding_window=True, sliding_window=64, max_window_layers=0)) == [64, 64]
    assert windows(config(use_sliding_window=True, layer_types=["sliding_attention", "full_attention"],
                          sliding_window=32)) == [32, 0]
    assert windows(config(layer_types=["full_attention"] * 2, sliding_window=32)) == [0, 0]
    # Mistral, Mixtral and Phi-3 window every layer when a window is set (whatever max_position_embeddings is),
    # and ignore layer_types as HF does; Qwen3-MoE too, when use_sliding_window
    for family in (dict(architectures=["MistralForCausalLM"], model_type="mistral"),
                   dict(architectures=["MixtralForCausalLM"], model_type="mixtral", num_local_experts=4,
                        num_experts_per_tok=2),
                   dict(architectures=["Phi3ForCausalLM"], model_type="phi3")):
        assert windows(config(**family, sliding_window=2047)) == [2047, 2047]
        assert windows(config(**family, sliding_window=8192, layer_types=["x"])) == [8192, 8192]
        assert config(**family, sliding_window=None).sliding_window is None
    moe = dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", num_experts=4, num_experts_per_tok=2,
               moe_intermediate_size=64)
    assert windows(config(**moe, sliding_window=100)) == [0, 0]
    assert windows(config(**moe, sliding_window=100, use_sliding_window=True)) == [100, 100]
    # Llama has no window
    assert windows(config(architectures=["LlamaForCausalLM"], model_type="llama", sliding_window=16)) == [0, 0]


GEMMA3 = dict(architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", num_hidden_layers=7, head_dim=64,
              hidden_size=640, num_attention_heads=4, num_key_value_heads=1)


def test_multimodal_gemma3_is_refused_by_name(tmp_path):
    write(tmp_path, json.dumps({"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
                                "text_config": {"hidden_size": 2560}}))
    with pytest.raises(ModelLoadError, match="'Gemma3ForConditionalGeneration' .*vision tower.*Gemma3ForCausalLM"):
        config_file(tmp_path)


def test_gemma3_sliding_layers_need_a_window():
    with pytest.raises(ModelLoadError, match="layer 0 a sliding_attention layer, but sliding_window is null"):
        read_config(dict(BASE, **GEMMA3, sliding_window=None))  # (null, not absent: HF's default 4096)


def test_gemma3_fields():
    """Gemma 3 with HF's defaults where config.json is silent: window 4096 on all layers but every 6th, rope bases
    1e6 (global) and 1e4 (sliding), query_pre_attn_scalar 256, tied embeddings, the tanh GELU, (1 + w) norms."""
    c = config(**GEMMA3)
    assert windows(c) == [4096] * 5 + [0, 4096]
    assert (c.rope_theta, c.rope_local_theta, c.attention_scale) == (1e6, 1e4, 256 ** -0.5)
    assert c.tie_word_embeddings and c.qk_norm and c.sandwich_norms
    assert c.norm_offset == 1.0 and c.max_position_embeddings == 4096  # (BASE sets it)
    c = config(**GEMMA3, sliding_window=512, sliding_window_pattern=2, query_pre_attn_scalar=168,
               rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                                "sliding_attention": {"rope_type": "default", "rope_theta": 2e4}})
    assert windows(c) == [512, 0] * 3 + [512]
    assert c.rope_scaling.rope_type == "linear" and c.rope_local_theta == 2e4 and c.attention_scale == 168 ** -0.5
    # transformers 4 wrote rope_theta, rope_local_base_freq and rope_scaling at the top level
    c = config(**GEMMA3, rope_theta=1e6, rope_local_base_freq=1e4, rope_scaling={"rope_type": "linear", "factor": 8.0})
    assert c.rope_scaling.factor == 8.0 and c.rope_local_theta == 1e4
    kinds = ["full_attention", "sliding_attention"] * 3 + ["full_attention"]
    assert windows(config(**GEMMA3, layer_types=kinds, sliding_window=16)) == [0, 16] * 3 + [0]


def test_family_variations():
    qwen3 = config(architectures=["Qwen3ForCausalLM"], model_type="qwen3", head_dim=128, attention_bias=False)
    assert qwen3.qk_norm and qwen3.head_dim == 128 and qwen3.q_size == 1024 and not qwen3.qkv_bias
    phi3 = config(architectures=["Phi3ForCausalLM"], model_type="phi3")
    assert phi3.fused_projections and not phi3.qkv_bias and not phi3.qk_norm
    mistral = config(architectures=["MistralForCausalLM"], model_type="mistral", head_dim=128)
    assert mistral.head_dim == 128 and not mistral.qkv_bias and not mistral.qk_norm
    assert not config().qk_norm and not config().fused_projections


@pytest.mark.parametrize("raw, kind", [
    (dict(rope_scaling={"type": "linear", "factor": 2.0}), "linear"),  # transformers 4: "type"
    (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}), "yarn"),
    (dict(rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}), "llama3"),
    (dict(rope_parameters={"rope_type": "default", "rope_theta": 5e5}, rope_scaling=None), "default"),
])
def test_rope_scaling_forms(raw, kind):
    c = config(**raw)
    assert c.rope_scaling.rope_type == kind
    if kind == "llama3":
        assert c.rope_theta == 5e5 and c.rope_scaling.original_max_position_embeddings == 8192


@pytest.mark.parametrize("changes, match", [
    (dict(vocab_size=None), "vocab_size"),
    (dict(num_attention_heads=6), "multiple"),
    (dict(hidden_size=250, num_attention_heads=8, num_key_value_heads=8), "head_dim"),
    (dict(head_dim=33), "even"),
    (dict(rope_scaling={"type": "ntk", "factor": 2.0}), r"type 'ntk' \(rope_scaling.rope_type\) is not supported"),
    (dict(rope_parameters={"rope_type": "longrope", "rope_theta": 1e4}), "longrope.*sequence length"),
    (dict(rope_scaling={"type": "su", "short_factor": [1.0]}), "'su'"),
    (dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "dynamic"),
    (dict(rope_scaling={"rope_type": "linear"}), "'rope_scaling.factor' is missing"),
    (dict(rope_scaling={"rope_type": "linear", "factor": -2.0}), "'rope_scaling.factor' must be a finite positive"),
    (dict(rope_scaling=[1]), "'rope_scaling' must be an object"),
    (dict(rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0}), "'rope_parameters.original_max_position_embeddings' is missing"),
    (dict(rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 4.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
     "'rope_parameters.high_freq_factor' \\(4\\) must exceed 'rope_parameters.low_freq_factor'"),
    (dict(rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 0}),
     "'rope_scaling.original_max_position_embeddings' must be a positive integer"),
    (dict(rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "truncate": 1}),
     "'rope_scaling.truncate' must be true or false"),
    (dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", head_dim=None, hidden_size=250,
          num_attention_heads=8, num_key_value_heads=8), "hidden_size 250 is not a multiple of num_attention_heads"),
    (dict(architectures=["MistralForCausalLM"], model_type="mistral", head_dim=0), "'head_dim' must be a positive"),
    (dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}), "partial"),
    (dict(eos_token_id="x"), "eos_token_id"),
    (dict(hidden_size=-4), "hidden_size"),
    # values a careless writer (or a hostile file) puts where another type belongs
    (dict(architectures=5), "'architectures' must be a list of class names, got 5"),
    (dict(architectures=[5]), "architectures"),
    (dict(model_type=["qwen2"]), "model_type"),
    (dict(tie_word_embeddings="false"), "'tie_word_embeddings' must be true or false, got 'false'"),
    (dict(attention_bias=1), "attention_bias"),
    (dict(use_sliding_window="true"), "use_sliding_window"),
    (dict(num_hidden_layers=10**9), "'num_hidden_layers' = 1000000000 is more than llaisys runs"),
    (dict(use_sliding_window=True, max_window_layers="2"), "max_window_layers"),
    (dict(use_sliding_window=True, layer_types=["full_attention"]), "'layer_types' names 1 layers, but "
                                                                    "num_hidden_layers is 2"),
    (dict(use_sliding_window=True, layer_types=["full_attention", "chunked_attention"]),
     "'layer_types\\[1\\]' is 'chunked_attention'"),
    (dict(use_sliding_window=True, layer_types="full_attention"), "'layer_types' must be a list"),
    (dict(layer_types=["sliding_attention", "full_attention"]), "layer 0 a sliding_attention layer, but "
                                                                "use_sliding_window is false"),
    (dict(use_sliding_window=True, sliding_window=0, max_window_layers=0), "'sliding_window' must be a positive"),
    (dict(architectures=["MistralForCausalLM"], model_type="mistral", sliding_window="4096"), "'sliding_window'"),
    (dict(GEMMA3, final_logit_softcapping=30.0), "'final_logit_softcapping' is 30.0: logit soft-capping"),
    (dict(GEMMA3, attn_logit_softcapping=50.0), "'attn_logit_softcapping'"),
    (dict(GEMMA3, use_bidirectional_attention=True), "'use_bidirectional_attention' is true"),
    (dict(GEMMA3, hidden_activation="gelu"), "'hidden_activation' is 'gelu'"),
    (dict(GEMMA3, query_pre_attn_scalar=0), "'query_pre_attn_scalar' must be a finite positive"),
    (dict(GEMMA3, sliding_window_pattern=0), "'sliding_window_pattern' must be a positive"),
    (dict(GEMMA3, layer_types=["sliding_attention"] * 6), "'layer_types' names 6 layers, but num_hidden_layers is 7"),
    (dict(GEMMA3, rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                   "sliding_attention": {"rope_type": "yarn", "factor": 2.0}}),
     "sliding_attention.rope_type"),
    (dict(GEMMA3, rope_local_base_freq=-1), "'rope_local_base_freq' must be a finite positive"),
    (dict(rope_theta=float("inf")), "'rope_theta' must be a finite positive number, got inf"),
    (dict(rope_parameters={"rope_type": "default", "rope_theta": float("nan")}), "rope_theta"),
    (dict(rms_norm_eps=float("inf")), "rms_norm_eps"),
])
def test_bad_configs(changes, match):
    with pytest.raises(ModelLoadError, match=match):
        config(**changes)


def write(tmp_path, text: str):
    (tmp_path / "config.json").write_text(text)
    return tmp_path


@pytest.mark.parametrize("text, match", [
    (json.dumps(dict(BASE, rope_theta=float("inf"))), "rope_theta.*inf"),  # the file says Infinity: json reads it
    ('{"a": ' * 100_000 + "1" + "}" * 100_000, "nested too deeply"),
    ('{"vocab_size": ' + "9" * 5000 + "}", "not valid JSON.*digits"),
    ("[1, 2]", "must hold a JSON object"),
    (b"\xff\xfe{".decode("latin-1"), "not"),
])
def test_bad_config_files_name_the_file(tmp_path, text, match):
    path = write(tmp_path, text)
    with pytest.raises(ModelLoadError, match=match) as e:
        config_file(path)
    assert str(path / "config.json") in str(e.value)
