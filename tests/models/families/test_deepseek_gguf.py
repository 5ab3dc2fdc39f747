"""DeepSeek-V2 / V3 from llama.cpp's "deepseek2" GGUF files, written as its converter lays them out
(helpers/deepseek_gguf.py): each tiny checkpoint's file computes what its directory computes (the same config,
the same logits bit for bit in f32 and bf16, kv_b_proj split into attn_k_b / attn_v_b as newer converters write it
or whole as older ones did), so greedy decoding follows HF transformers as the directory does; the family is V3
where the file's expert_gating_func says sigmoid; the yarn keys give the directory's rope and attention scale; a
file with quantized experts (or the converter's q8_0 file) runs, a batch decoding as each prompt alone; metadata
llaisys cannot read, missing or contradicting another key, is refused in one line naming the key.
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest

import llaisys
import llaisys_models
from helpers import skip_without_kernels
from helpers.deepseek_gguf import write_deepseek_gguf
from helpers.moe_routing import explain_by_routing
from helpers.parity_rule import MAX_NEAR_TIE_RATE, check_against_reference
from helpers.tiny_models import DEEPSEEK_SPECS, NEW_TOKENS, prompt
from llaisys_models.errors import ModelLoadError

pytestmark = pytest.mark.slow

CLASSES = {"deepseek_v2": "DeepseekV2", "deepseek_v3": "DeepseekV3"}
# what a GGUF file does not carry: the file type's name, rms_norm_eps as float32, the MTP layers (the converter
# skips them)
NOT_IN_THE_FILE = ("dtype_name", "rms_norm_eps", "num_nextn_predict_layers")


def qtype(name: str):
    import gguf

    return gguf.GGMLQuantizationType.BF16 if name.endswith("bf16") else gguf.GGMLQuantizationType.F32


def same_config(a, b) -> None:
    a, b = dataclasses.asdict(a), dataclasses.asdict(b)
    assert {k: (a[k], b[k]) for k in a if a[k] != b[k] and k not in NOT_IN_THE_FILE} == {}
    assert a["rms_norm_eps"] == pytest.approx(b["rms_norm_eps"], rel=1e-7)


@pytest.mark.parametrize("split_kv_b", [True, False], ids=["k_b-v_b", "kv_b"])
# (not the YaRN checkpoint: a file holds mscale_all_dim as a float32 yarn_log_multiplier, 0.1 x it, which reads back
# a rounding away; the YaRN files are below)
@pytest.mark.parametrize("name", [name for name in DEEPSEEK_SPECS if "yarn" not in name])
def test_a_deepseek_gguf_computes_what_its_directory_does(name, split_kv_b, tiny_models, tmp_path, device):
    spec = DEEPSEEK_SPECS[name]
    directory = tiny_models.path(name)
    path = write_deepseek_gguf(directory, tmp_path / f"{name}.gguf", qtype(name), split_kv_b=split_kv_b)
    model = llaisys_models.load(path, device=device)
    from_dir = llaisys_models.load(directory, device=device)
    assert type(model).__name__ == CLASSES[spec.arch] and model.dtype == from_dir.dtype
    same_config(model.config, from_dir.config)
    ids = prompt(name, 40, spec.vocab)
    np.testing.assert_array_equal(model.logits(ids), from_dir.logits(ids))
    assert model.generate(ids, 16, eos_token_ids=()) == from_dir.generate(ids, 16, eos_token_ids=())
    if spec.dtype == "f32" and split_kv_b:  # greedy decoding follows HF's as the directory's does (test_deepseek.py)
        hf, exact = tiny_models.hf(name), tiny_models.hf(name, "f64")
        ties = check_against_reference(
            model, tiny_models.reference(name, 13), "f32",
            lambda context, mine, hf_token, where: explain_by_routing(model, hf, exact, context, mine, hf_token,
                                                                      "f32", where))
        # (each a near-tie the rule explains, the directory's own: the logits are its; V2's 13-token prompt has one)
        assert len(ties) <= max(1, MAX_NEAR_TIE_RATE["f32"] * NEW_TOKENS), ties


@pytest.mark.parametrize("change", [{"gating": None}, {"extra": {"attention.q_lora_rank": 0}}],
                         ids=["no gating function", "q_lora_rank 0"])
def test_v2_files_as_converters_write_them(change, tiny_models, tmp_path):
    """The converter writes expert_gating_func only where config.json has scoring_func (transformers' configs have
    none): llama.cpp reads no key as softmax, V2. llama.cpp requires attention.q_lora_rank of a file that is not
    V2-Lite's 26 or 27 layers, 0 for none (benchmarks/deepseek.py writes it so): one q projection."""
    name = "deepseek_v2_f32"
    path = write_deepseek_gguf(tiny_models.path(name), tmp_path / "v2.gguf", **change)
    model = llaisys_models.load(path, device="cpu")
    assert type(model).__name__ == "DeepseekV2" and model.config.mla.q_lora_rank == 0
    ids = prompt(name, 20, DEEPSEEK_SPECS[name].vocab)
    np.testing.assert_array_equal(model.logits(ids),
                                  llaisys_models.load(tiny_models.path(name), device="cpu").logits(ids))


YARN = {  # DeepSeek-V3's and V2-Lite's rope scaling (mscale = mscale_all_dim), smaller
    "deepseek_v3_f32": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 128,
                        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
    "deepseek_v2_f32": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0, "original_max_position_embeddings": 64,
                        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707},
}


@pytest.mark.parametrize("name", list(YARN))
def test_yarn_files_give_the_directory_s_rope_and_attention_scale(name, tiny_models, tmp_path):
    """rope.scaling.yarn_log_multiplier is 0.1 x mscale_all_dim: the attention scale's factor (and the rope's
    cos / sin unscaled, as HF's where mscale = mscale_all_dim), as the directory's."""
    directory = tmp_path / "yarn"
    shutil.copytree(tiny_models.path(name), directory)
    raw = json.loads((directory / "config.json").read_text())
    raw["rope_parameters"] = YARN[name]
    (directory / "config.json").write_text(json.dumps(raw))
    path = write_deepseek_gguf(directory, tmp_path / "yarn.gguf")
    model, from_dir = llaisys_models.load(path, device="cpu"), llaisys_models.load(directory, device="cpu")
    assert model.config.rope_scaling.rope_type == "yarn"
    assert model.attention_scale == pytest.approx(from_dir.attention_scale, rel=1e-7)
    assert model.attention_scale != pytest.approx((raw["qk_nope_head_dim"] + raw["qk_rope_head_dim"]) ** -0.5)
    ids = prompt(name, 150, DEEPSEEK_SPECS[name].vocab)  # (past original_max_position_embeddings)
    ours, want = model.logits(ids), from_dir.logits(ids)
    np.testing.assert_allclose(ours, want, rtol=0, atol=1e-5 * np.abs(want).max())
    assert model.generate(ids, 12, eos_token_ids=()) == from_dir.generate(ids, 12, eos_token_ids=())


# ---- quantized files ------------------------------------------------------------------------------------------
# (V2's matrices are whole blocks of 32: hidden 96, moe_intermediate_size 32; V3's experts' 48 are not)

@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
def test_a_gguf_file_with_quantized_experts_runs(fmt, tiny_models, tmp_path, device):
    """Its experts in their blocks where the device has moe_linear_q (the rest F32): close to the same file
    decoded, and a batch decodes as each prompt alone."""
    import gguf

    from llaisys_models.families.weights import BlockExperts

    name = "deepseek_v2_f32"
    path = write_deepseek_gguf(tiny_models.path(name), tmp_path / f"experts-{fmt}.gguf",
                               experts_qtype=gguf.GGMLQuantizationType[fmt.upper()])
    model = llaisys_models.load(path, device=device)
    if llaisys.ops.implemented("moe_linear_q", device):
        assert model.weight_formats == (fmt,)
        assert all(isinstance(layer.experts.gate, BlockExperts) for layer in model.weights.layers[1:])
    check_close_to_decoded(model, path, name, device)
    prompts = [prompt(name, n, 256) for n in (5, 31, 12)]
    assert model.generate_batch(prompts, 12, eos_token_ids=()) == \
        [model.generate(p, 12, eos_token_ids=()) for p in prompts]


def test_the_converters_q8_0_file_runs(tiny_models, tmp_path, device):
    """The converter's q8_0 file (every matrix of whole blocks Q8_0, attn_k_b F16: its rows are 16 wide; the
    router, norms and biases F32): its Q8_0 matrices kept in their blocks, a batch decodes as each prompt alone."""
    import gguf

    skip_without_kernels(device, ["linear_q"], "a GGUF file's Q8_0 matrices in their blocks")
    name = "deepseek_v3_f32"
    path = write_deepseek_gguf(tiny_models.path(name), tmp_path / "q8_0.gguf", gguf.GGMLQuantizationType.Q8_0)
    model = llaisys_models.load(path, device=device)
    assert "q8_0" in model.weight_formats and model.dtype == llaisys.float32
    check_close_to_decoded(model, path, name, device)
    prompts = [prompt(name, n, 256) for n in (5, 31, 12)]
    assert model.generate_batch(prompts, 12, eos_token_ids=()) == \
        [model.generate(p, 12, eos_token_ids=()) for p in prompts]


def check_close_to_decoded(model, path, name: str, device) -> None:
    """The model against the same file decoded to float32, along the latter's greedy tokens: its error is the int8
    activations of the block kernels (and any near-tied routing choice they flip), so the median relative logit
    error within test_moe_families' bound for block experts."""
    exact = llaisys_models.load(path, device=device, dtype="float32", dequantize=True)
    tokens = exact.generate(prompt(name, 13, 256), 16, eos_token_ids=())
    ours, want = (np.asarray(m.logits(tokens[:-1]), np.float64) for m in (model, exact))
    err = np.linalg.norm(ours - want, axis=1) / np.linalg.norm(want, axis=1)
    print(f"relative logit error median {np.median(err):.4f} max {err.max():.4f}")
    assert np.median(err) <= 0.08, err


# ---- refused files --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, change, message", [
    ("deepseek_v3_f32", {"without": ("expert_count",)}, r"deepseek2\.expert_count \(n_routed_experts\) is missing"),
    ("deepseek_v3_f32", {"without": ("expert_used_count",)}, r"deepseek2\.expert_used_count .* is missing"),
    ("deepseek_v3_f32", {"without": ("expert_feed_forward_length",)},
     r"deepseek2\.expert_feed_forward_length \(moe_intermediate_size\) is missing"),
    ("deepseek_v3_f32", {"without": ("expert_shared_count",)}, r"deepseek2\.expert_shared_count .* is missing"),
    ("deepseek_v3_f32", {"without": ("attention.kv_lora_rank",)},
     r"deepseek2\.attention\.kv_lora_rank \(kv_lora_rank\) is missing"),
    ("deepseek_v3_f32", {"without": ("rope.dimension_count",)},
     r"deepseek2\.rope\.dimension_count \(qk_rope_head_dim\) is missing"),
    ("deepseek_v3_f32", {"without": ("attention.value_length_mla",)},
     r"deepseek2\.attention\.value_length_mla \(v_head_dim\) is missing"),
    ("deepseek_v3_f32", {"extra": {"attention.key_length": 48}},
     r"deepseek2\.attention\.key_length = 48 contradicts the latent attention's 40"),
    ("deepseek_v3_f32", {"extra": {"attention.value_length": 24}},
     r"deepseek2\.attention\.value_length = 24 contradicts the latent attention's 32"),
    ("deepseek_v3_f32", {"extra": {"attention.key_length_mla": 8}},
     r"deepseek2\.attention\.key_length_mla = 8 leaves no head dimension"),
    ("deepseek_v3_f32", {"extra": {"expert_group_count": 3}}, r"deepseek2\.expert_group_count = 3 does not divide"),
    ("deepseek_v3_f32", {"extra": {"expert_group_used_count": 5}},
     r"deepseek2\.expert_group_used_count = 5 exceeds deepseek2\.expert_group_count = 4"),
    ("deepseek_v3_f32", {"extra": {"expert_group_used_count": 1}}, r"deepseek2\.expert_used_count = 3 exceeds"),
    ("deepseek_v3_f32", {"extra": {"expert_weights_scale": -1.0}}, r"deepseek2\.expert_weights_scale must be"),
    ("deepseek_v3_f32", {"extra": {"expert_gating_func": 3}}, r"deepseek2\.expert_gating_func = 3 is not supported"),
    # a V3 checkpoint whose config.json has no scoring_func: the converter writes no gating function, and llama.cpp
    # would run it as V2 (softmax), renormalised: refused, not run so
    ("deepseek_v3_f32", {"gating": None}, r"deepseek2\.expert_weights_norm = true with softmax scores"),
    ("deepseek_v2_f32", {"without": ("attention.key_length",), "split_kv_b": False},
     r"deepseek2\.attention\.key_length \(qk_head_dim\) is missing"),
    ("deepseek_v2_f32", {"extra": {"leading_dense_block_count": 1.5}},
     r"deepseek2\.leading_dense_block_count must be a count"),
])
def test_deepseek_gguf_metadata_llaisys_cannot_read_is_refused(name, change, message, tiny_models, tmp_path):
    path = write_deepseek_gguf(tiny_models.path(name), tmp_path / "bad.gguf", **change)
    with pytest.raises(ModelLoadError, match=message) as e:
        llaisys_models.load(path, device="cpu")
    assert "\n" not in str(e.value) and str(path) in str(e.value)


def test_a_v3_file_without_its_correction_bias_is_refused(tiny_models, tmp_path):
    path = write_deepseek_gguf(tiny_models.path("deepseek_v3_f32"), tmp_path / "no-bias.gguf",
                               without_tensors=("blk.1.exp_probs_b.bias",))
    with pytest.raises(ModelLoadError, match=r"tensor 'blk\.1\.exp_probs_b\.bias' is missing"):
        llaisys_models.load(path, device="cpu")
