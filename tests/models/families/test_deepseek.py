"""DeepSeek-V2 / V3 (latent attention, DeepSeekMoE) against HF transformers on tiny random checkpoints that
transformers writes: greedy tokens identical (prompts 1, 13, 64 + 40 new) but at near-ties (f32: logits within
1e-3 of the top one; the absorbed form sums in another order than HF's expanded one), rare as DESIGN's rule says;
in bf16 also at near-tied routing choices (the rule's MoE form, judged on the scores the router ranks by); a batch
decodes as each prompt alone (bf16, int8); the KV cache holds the latent, layers x (kv_lora_rank +
qk_rope_head_dim) values a token, measured from the pool; contradictory configs and checkpoints are refused naming
the field or the tensor.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

import llaisys_models
from helpers.moe_routing import explain_by_routing
from helpers.parity_rule import MAX_NEAR_TIE_RATE, check_against_reference
from helpers.tiny_models import DEEPSEEK_SPECS, NEW_TOKENS, PROMPT_LENGTHS, prompt
from llaisys_models.errors import ModelLoadError

pytestmark = pytest.mark.slow

CLASSES = {"deepseek_v2": "DeepseekV2", "deepseek_v3": "DeepseekV3"}


def routing_rule(model, tiny_models, name: str, dtype: str):
    """The near-tie rule's MoE form (helpers/moe_routing.py): ties judged on the choice scores DeepSeek's router
    ranks experts by (sigmoid + correction bias, or softmax)."""
    hf, exact = tiny_models.hf(name, dtype), tiny_models.hf(name, "f64")
    return lambda context, mine, hf_token, where: explain_by_routing(model, hf, exact, context, mine, hf_token,
                                                                     dtype, where)


@pytest.mark.parametrize("name", list(DEEPSEEK_SPECS))
def test_deepseek_greedy_matches_hf(name, tiny_models, device):
    spec = DEEPSEEK_SPECS[name]
    model = llaisys_models.load(tiny_models.path(name), device=device)
    assert type(model).__name__ == CLASSES[spec.arch]
    ties = {length: check_against_reference(model, tiny_models.reference(name, length), spec.dtype,
                                            routing_rule(model, tiny_models, name, spec.dtype))
            for length in PROMPT_LENGTHS}
    print(f"{name}: near-ties by prompt length: {ties}")
    assert sum(map(len, ties.values())) <= MAX_NEAR_TIE_RATE[spec.dtype] * len(PROMPT_LENGTHS) * NEW_TOKENS, ties


def test_the_routing_is_what_decides_the_tokens(tiny_models, device):
    """The f32 parity above is not blind to the router: the same V3 model with its correction bias zeroed (the
    choice then by score alone) leaves HF's logits by far more than the f32 tolerance."""
    name = "deepseek_v3_f32"
    model = llaisys_models.load(tiny_models.path(name), device=device)
    ref = tiny_models.reference(name, 64)
    exact = model.logits(ref.tokens)[:-1]
    assert np.abs(exact - ref.logits).max() < 1e-3
    for layer in model.weights.layers:
        if layer.experts is not None:
            assert layer.experts.router_bias is not None
            layer.experts.router_bias.load(np.zeros(layer.experts.router_bias.shape, np.float32))
    assert np.abs(model.logits(ref.tokens)[:-1] - ref.logits).max() > 1e-2


@pytest.mark.parametrize("name, quantize", [("deepseek_v3_bf16", None), ("deepseek_v3_f32", "int8"),
                                            ("deepseek_v2_f32", None)])
def test_deepseek_batch_decodes_as_each_prompt_alone(name, quantize, tiny_models, device):
    model = llaisys_models.load(tiny_models.path(name), device=device, quantize=quantize)
    prompts = [prompt(name, n, 256) for n in (5, 31, 12)]
    alone = [model.generate(p, max_new_tokens=12) for p in prompts]
    assert model.generate_batch(prompts, max_new_tokens=12) == alone


def test_the_kv_cache_holds_the_latent_per_token(tiny_models, device):
    """layers x (kv_lora_rank + qk_rope_head_dim) values a token, whatever the heads (a GQA cache of the same
    heads would hold layers x 2 x heads x head dims)."""
    name = "deepseek_v3_f32"
    model = llaisys_models.load(tiny_models.path(name), device=device)
    extra = dict(DEEPSEEK_SPECS[name].config_extra)
    pool = model.new_kv_pool(num_blocks=8, block_size=16)
    per_token = pool.nbytes // (8 * 16)
    layers = DEEPSEEK_SPECS[name].layers
    assert per_token == layers * (extra["kv_lora_rank"] + extra["qk_rope_head_dim"]) * 4
    assert sum(t.nbytes for t in (*pool.keys, *pool.values)) == pool.nbytes
    heads, qk = DEEPSEEK_SPECS[name].heads, extra["qk_nope_head_dim"] + extra["qk_rope_head_dim"]
    assert per_token < layers * heads * (qk + extra["v_head_dim"]) * 4 / 3


def test_a_latent_cache_is_kept_in_the_model_dtype(tiny_models, device):
    model = llaisys_models.load(tiny_models.path("deepseek_v2_f32"), device=device)
    model.kv_cache_dtype = "int8"
    with pytest.raises(Exception, match="latent .MLA. cache is kept in the model's dtype"):
        model.generate([1, 2, 3], max_new_tokens=2)


def rewritten(tiny_models, tmp_path, name: str, **changes):
    """A copy of checkpoint ``name`` whose config.json has ``changes`` (None: the key removed)."""
    out = tmp_path / "copy"
    shutil.copytree(tiny_models.path(name), out)
    raw = json.loads((out / "config.json").read_text())
    for key, value in changes.items():
        raw.pop(key, None) if value is None else raw.__setitem__(key, value)
    (out / "config.json").write_text(json.dumps(raw))
    return out


@pytest.mark.parametrize("name, changes, message", [
    ("deepseek_v3_f32", {"topk_group": 5}, r"'topk_group' = 5 must be in \[1, n_group = 4\]"),
    ("deepseek_v3_f32", {"n_group": 3}, r"'n_group' = 3 does not divide n_routed_experts = 8"),
    ("deepseek_v3_f32", {"topk_group": 1, "num_experts_per_tok": 3}, r"'num_experts_per_tok' = 3 exceeds"),
    ("deepseek_v3_f32", {"qk_rope_head_dim": 7}, r"'qk_rope_head_dim' = 7 must be even"),
    ("deepseek_v3_f32", {"kv_lora_rank": 24}, r"has shape \(32,\), but config.json implies \(24,\)"),
    ("deepseek_v3_f32", {"v_head_dim": 16}, r"has shape .* config.json implies"),
    ("deepseek_v2_f32", {"topk_method": "noaux_tc"}, r"'topk_method' = 'noaux_tc' is not supported"),
    ("deepseek_v3_f32", {"attention_bias": True}, r"'attention_bias' = true"),
])
def test_contradictory_deepseek_configs_are_refused(tiny_models, tmp_path, name, changes, message):
    with pytest.raises(ModelLoadError, match=message):
        llaisys_models.load(rewritten(tiny_models, tmp_path, name, **changes), device="cpu")


def test_a_v3_checkpoint_without_its_correction_bias_is_refused(tiny_models, tmp_path):
    """noaux_tc routing needs e_score_correction_bias: a checkpoint without it is refused naming the tensor."""
    from safetensors.numpy import load_file, save_file

    out = tmp_path / "no_bias"
    shutil.copytree(tiny_models.path("deepseek_v3_f32"), out)
    tensors = load_file(out / "model.safetensors")
    save_file({k: v for k, v in tensors.items() if "e_score_correction_bias" not in k}, out / "model.safetensors",
              metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="e_score_correction_bias"):
        llaisys_models.load(out, device="cpu")


def test_tensor_parallel_latent_attention_is_refused(tiny_models):
    with pytest.raises(ModelLoadError, match="does not split latent attention"):
        llaisys_models.load(tiny_models.path("deepseek_v2_f32"), device="cpu", tensor_parallel=2)


def test_a_lora_adapter_on_latent_attention_is_what_peft_computes(tiny_models, tmp_path, device):
    """A PEFT adapter of V2's q_proj and o_proj (the linears of latent attention LoRA names as a GQA layer's) runs
    beside the weights: llaisys' logits are PeftModel's (the adapter moves them by far more)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from helpers.lora_adapters import AdapterSpec, make_adapter

    base = tiny_models.path("deepseek_v2_f32")
    adapter = make_adapter(base, tmp_path / "adapter", AdapterSpec(targets=("q_proj", "o_proj"), seed=1))
    hf = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    peft = PeftModel.from_pretrained(hf, adapter).eval()
    model = llaisys_models.load(base, device=device)
    model.load_lora("latent", adapter)
    ids = prompt("lora", 30, 256)
    with torch.no_grad():
        want = peft(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(model.logits(ids, lora="latent") - want).max() < 1e-4
    assert np.abs(model.logits(ids) - want).max() > 1.0
