"""Mixture-of-experts families against HF transformers on tiny random checkpoints that transformers writes.

Greedy generation follows HF's token for token (f32), within the near-tie rule in bf16, teacher-forced
(test_parity.check_against_reference); a batch of prompts decodes as each prompt alone; a config whose
expert fields contradict each other is refused naming the field.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import llaisys_models
from llaisys_models.errors import ModelLoadError
from test_parity import MAX_NEAR_TIE_RATE, check_against_reference
from tiny_models import EOS_ID, MOE_SPECS, NEW_TOKENS, PROMPT_LENGTHS, prompt

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", list(MOE_SPECS))
def test_moe_greedy_matches_hf(name, tiny_models, device):
    model = llaisys_models.load(tiny_models.path(name), device=device)
    assert type(model).__name__ == {"mixtral": "Mixtral", "qwen3_moe": "Qwen3Moe"}[MOE_SPECS[name].arch]
    ties = {}
    for length in PROMPT_LENGTHS:
        ties[length] = check_against_reference(model, tiny_models.reference(name, length), MOE_SPECS[name].dtype)
    print(f"{name}: near-ties by prompt length: {ties}")
    steps = len(PROMPT_LENGTHS) * NEW_TOKENS
    assert sum(map(len, ties.values())) <= MAX_NEAR_TIE_RATE[MOE_SPECS[name].dtype] * steps, ties


@pytest.mark.parametrize("name", ["mixtral_bf16"])
def test_moe_batch_decodes_as_each_prompt_alone(name, tiny_models, device):
    """Rows of a batch pick their experts and sum their outputs on their own: the same tokens either way."""
    model = llaisys_models.load(tiny_models.path(name), device=device)
    prompts = [prompt(name, n, MOE_SPECS[name].vocab) for n in (5, 17, 30)]
    batched = model.generate_batch(prompts, 12, eos_token_ids=())
    assert batched == [model.generate(p, 12, eos_token_ids=()) for p in prompts]


@pytest.mark.parametrize("field, value, message", [
    ("num_experts_per_tok", 9, "'num_experts_per_tok' = 9 exceeds num_local_experts = 8"),
    ("num_local_experts", 0, "'num_local_experts' must be a positive integer"),
    ("num_experts_per_tok", None, "'num_experts_per_tok' is missing"),
])
def test_moe_config_contradictions_are_refused(tiny_models, tmp_path, field, value, message):
    directory = tmp_path / "bad"
    shutil.copytree(tiny_models.path("mixtral_f32"), directory)
    raw = json.loads((directory / "config.json").read_text())
    if value is None:
        raw.pop(field)
    else:
        raw[field] = value
    (directory / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ModelLoadError, match=message):
        llaisys_models.load(directory, device="cpu")


def write_mixtral_gguf(directory, path):
    """The HF Mixtral checkpoint as llama.cpp's converter writes it: arch llama with llama.expert_count, the
    experts of a layer stacked into ffn_{gate,up,down}_exps (w1, w3, w2), the router as ffn_gate_inp, Q/K
    rows permuted; every tensor F32 (the weights exactly)."""
    import gguf
    from safetensors.numpy import load_file

    from gguf_files import gguf_name, llama_permute

    c = json.loads((directory / "config.json").read_text())
    state = load_file(directory / "model.safetensors")
    writer = gguf.GGUFWriter(path, "llama")
    head_dim = c["hidden_size"] // c["num_attention_heads"]
    for add, value in ((writer.add_context_length, c["max_position_embeddings"]),
                       (writer.add_embedding_length, c["hidden_size"]), (writer.add_block_count, c["num_hidden_layers"]),
                       (writer.add_feed_forward_length, c["intermediate_size"]),
                       (writer.add_head_count, c["num_attention_heads"]),
                       (writer.add_head_count_kv, c["num_key_value_heads"]), (writer.add_key_length, head_dim),
                       (writer.add_value_length, head_dim), (writer.add_rope_dimension_count, head_dim),
                       (writer.add_rope_freq_base, float(c["rope_parameters"]["rope_theta"])),
                       (writer.add_layer_norm_rms_eps, c["rms_norm_eps"]), (writer.add_vocab_size, c["vocab_size"]),
                       (writer.add_expert_count, c["num_local_experts"]),
                       (writer.add_expert_used_count, c["num_experts_per_tok"]), (writer.add_eos_token_id, EOS_ID)):
        add(value)
    tensors = {}
    for name, w in state.items():
        if ".block_sparse_moe." not in name:
            gname = gguf_name(name)
            if ".attn_q." in gname:
                w = llama_permute(w, c["num_attention_heads"])
            elif ".attn_k." in gname:
                w = llama_permute(w, c["num_key_value_heads"])
            tensors[gname] = w
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}.block_sparse_moe."
        tensors[f"blk.{i}.ffn_gate_inp.weight"] = state[p + "gate.weight"]
        for hf, part in (("w1", "gate"), ("w3", "up"), ("w2", "down")):
            tensors[f"blk.{i}.ffn_{part}_exps.weight"] = np.stack(
                [state[f"{p}experts.{e}.{hf}.weight"] for e in range(c["num_local_experts"])])
    for name, w in tensors.items():
        writer.add_tensor(name, np.ascontiguousarray(w, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_mixtral_from_a_gguf_file_matches_hf(tiny_models, tmp_path, device):
    """transformers' GGUF loader does not read Mixtral (arch llama with experts), so the reference is HF on
    the checkpoint the file was written from: an F32 file holds its weights exactly."""
    name = "mixtral_f32"
    path = write_mixtral_gguf(tiny_models.path(name), tmp_path / "mixtral.gguf")
    model = llaisys_models.load(path, device=device)
    assert type(model).__name__ == "Mixtral" and model.config.num_experts == 8
    ties = check_against_reference(model, tiny_models.reference(name, 13), "f32")
    assert len(ties) <= MAX_NEAR_TIE_RATE["f32"] * NEW_TOKENS, ties


def test_mixtral_int8_stays_close_to_bf16(tiny_models, device):
    """quantize="int8": the dense linears in int8, the experts (and router) in the model dtype. A rounding
    difference can flip a near-tied routing choice, which changes that position's logits wholesale (llaisys'
    own bf16 model is 0.79 off HF's bf16 at one of 103 positions), so the measures are the median relative
    logit error and the argmax agreement, held to test_int8's mean and agreement bounds (measured: 0.038 and
    0.90; bf16 alone 0.034 mean and 0.94)."""
    import torch
    from test_int8 import MEAN_RELATIVE_ERROR, MIN_ARGMAX_AGREEMENT, relative_errors

    from helpers import skip_without_kernels
    from llaisys_models.quantize import Int8Weight

    skip_without_kernels(device, ["linear_i8"], "quantize='int8'")
    name = "mixtral_f32"
    sequence = tiny_models.reference(name, 64).tokens[:-1]
    with torch.no_grad():
        want = tiny_models.hf(name, "bf16")(torch.tensor([sequence])).logits[0].float().numpy()
    model = llaisys_models.load(tiny_models.path(name), device=device, dtype="bfloat16", quantize="int8")
    layer = model.weights.layers[0]
    assert isinstance(layer.q_proj, Int8Weight) and layer.experts.gate.dtype == model.dtype
    got = model.logits(sequence)
    err = relative_errors(got, want)
    agreement = np.mean(got.argmax(axis=1) == want.argmax(axis=1))
    print(f"int8 Mixtral: relative logit error median {np.median(err):.4f}, argmax agreement {agreement:.3f}")
    assert np.median(err) <= MEAN_RELATIVE_ERROR, (np.median(err), agreement)
    assert agreement >= MIN_ARGMAX_AGREEMENT, agreement
