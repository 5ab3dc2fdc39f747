"""The families beyond Qwen2 / Llama 2 (Qwen3, Mistral, Phi-3, Llama 3.1's llama3 rope, Qwen2.5's YaRN rope,
Gemma 3, OLMo 2), with sliding windows where the family has them: the family table of tiny_models.SPECS (the
specs with a ``family``, the llaisys class that must run them).

Their greedy parity with HF transformers (f32 and bf16) is test_parity's, over tiny_models.SPECS; int8
against HF bf16 is test_int8's (also over SPECS). Here: each family batched (the scheduler, chunked
prefill) and through decode graphs gives the tokens it gives alone and eager, in its dtype and in int8;
each family from a GGUF file written as llama.cpp writes it, against HF (reading the same file where
transformers reads that architecture's GGUF, else the directory the file was written from); the CLI's
``infer --test`` (tokenizer, chat template, HF comparison) on each.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType

import llaisys_models
from helpers.gguf_files import write_gguf, write_tiny_gguf
from helpers.hf_gguf import hf_reference
from helpers.parity_rule import MAX_NEAR_TIE_RATE, check_against_reference
from helpers.tiny_models import SPECS, Spec, make_checkpoint, prompt
from llaisys_models import ModelLoadError
from llaisys_models.loading.gguf.config import model_config
from llaisys_models.loading.gguf.reader import GGUFFile

FAMILIES = {name: spec.family for name, spec in SPECS.items() if spec.family and spec.dtype == "f32"}
# llama.cpp's converter writes no sliding window for Llama-architecture (Mistral) and Qwen2 files (llama.cpp runs
# them without one): such a file is its directory only up to the window
WINDOW_DROPPED = {"mistral_f32", "qwen2_yarn_f32"}
# architectures whose GGUF files transformers reads (Llama's loader ignores llama.cpp's rope scaling and
# head_dim keys, so Mistral / llama3 / YaRN files are compared with their directories instead)
HF_READS_GGUF = {"qwen3": Spec(arch="qwen3", hidden=128, heads=2, kv_heads=1, head_dim=128, seed=13),
                 "phi3": Spec(arch="phi3", hidden=128, heads=4, kv_heads=2, inter=192, seed=14)}
NEW_TOKENS = 16  # (test_gguf's hf_reference generates as many)


@pytest.mark.parametrize("quantize", [None, "int8"])
@pytest.mark.parametrize("name", list(FAMILIES))
def test_batched_and_graphed_generation_is_generation_alone(tiny_models, device, monkeypatch, name, quantize):
    if quantize == "int8":
        from helpers import skip_without_kernels
        skip_without_kernels(device, ["linear_i8"], "quantize='int8'")
    graphed = llaisys_models.load(tiny_models.path(name), device=device, quantize=quantize)
    assert type(graphed).__name__ == FAMILIES[name]
    monkeypatch.setenv("LLAISYS_GRAPHS", "0")
    eager = llaisys_models.load(tiny_models.path(name), device=device, quantize=quantize)
    prompts = [prompt(name, n, SPECS[name].vocab) for n in (1, 5, 17, 40)]
    alone = [eager.generate(p, NEW_TOKENS, eos_token_ids=()) for p in prompts]
    assert [graphed.generate(p, NEW_TOKENS, eos_token_ids=()) for p in prompts] == alone
    assert graphed.generate_batch(prompts, NEW_TOKENS, eos_token_ids=(), max_batch_tokens=16) == alone
    assert eager.generate_batch(prompts, NEW_TOKENS, eos_token_ids=(), max_batch_tokens=16) == alone
    if graphed._decode_graphs.enabled:
        assert graphed._decode_graphs.replays > 0


@pytest.mark.parametrize("name", [n for n in FAMILIES if n != "gemma3_f32"])
def test_gguf_file_of_each_family(tiny_models, tmp_path, device, name):
    directory = tiny_models.path(name)
    path = write_gguf(tiny_models.hf(name), directory, tmp_path / f"{name}.gguf", Q.F32)
    model = llaisys_models.load(path, device=device)
    assert type(model).__name__ == FAMILIES[name]
    # an F32 file holds the checkpoint: the directory's forward (a llama3 file's rope table is llama.cpp's
    # rope_freqs.weight divisors, a few f32 ulps from HF's formula, so its logits are close, not equal)
    window = SPECS[name].sliding_window
    assert model.config.sliding_window == (None if name in WINDOW_DROPPED else window)
    ids = prompt(name, min(64, window) if name in WINDOW_DROPPED else 64, SPECS[name].vocab)
    from_gguf, from_dir = model.logits(ids), llaisys_models.load(directory, device=device).logits(ids)
    if name == "llama3_f32":
        assert model.config.rope_scaling.rope_type == "freq_factors"
        np.testing.assert_allclose(from_gguf, from_dir, rtol=0, atol=1e-4 * np.abs(from_dir).max())
    else:
        np.testing.assert_array_equal(from_gguf, from_dir)
    ties = check_against_reference(model, tiny_models.reference(name, 13), "f32")
    assert len(ties) <= max(1, MAX_NEAR_TIE_RATE["f32"] * 40), f"near-ties at steps {ties}"


@pytest.mark.parametrize("arch", list(HF_READS_GGUF))
def test_quantized_gguf_against_hf_reading_the_file(tmp_path, device, arch):
    """A Q8_0 file against HF transformers reading that very file (its GGUF loader takes head_dim from its
    own config defaults, not from the file: a Qwen3 of head_dim 128, as the released ones)."""
    from transformers import AutoModelForCausalLM

    directory = tmp_path / arch
    directory.mkdir()
    make_checkpoint(directory, HF_READS_GGUF[arch])
    hf = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    path = write_gguf(hf, directory, tmp_path / f"{arch}-q8.gguf", Q.Q8_0)
    model = llaisys_models.load(path, device=device, dtype="float32", dequantize=True)
    assert type(model).__name__ == {"qwen3": "Qwen3", "phi3": "Phi3"}[arch]
    ties = check_against_reference(model, hf_reference(path, prompt(arch, 13, HF_READS_GGUF[arch].vocab)), "f32")
    assert len(ties) <= 1, f"near-ties at steps {ties}"
    int8 = llaisys_models.load(path, device=device, quantize="int8")  # (Phi-3's fused parts through int8)
    ids = prompt(arch, 13, HF_READS_GGUF[arch].vocab)
    assert np.mean(int8.logits(ids).argmax(1) == model.logits(ids).argmax(1)) >= 0.8
    stored = llaisys_models.load(path, device=device, dtype="float32")  # (Phi-3's fused parts in q8_0 blocks)
    assert np.mean(stored.logits(ids).argmax(1) == model.logits(ids).argmax(1)) >= 0.8


@pytest.mark.parametrize("name", list(FAMILIES))
def test_cli_infer_test_passes(tiny_models, device, capsys, name):
    from llaisys.cli import main

    rc = main(["infer", "--model", str(tiny_models.path(name)), "--device", str(device), "--prompt", "Hi",
               "--max-new-tokens", "8", "--test"])
    out = capsys.readouterr().out
    assert rc == 0 and "PASS: identical" in out, out


def test_gemma3_gguf_file_is_its_directory(tmp_path, device):
    """A Gemma 3 F32 file as llama.cpp's converter writes it (norms 1 + w, rope.freq_base_swa, the window; the
    sliding layers' pattern, which llama.cpp reads) == the directory it was written from, bit for bit, and that
    directory's forward is HF's. The file cannot say query_pre_attn_scalar (llama.cpp takes head_dim, or
    hidden / heads for the 27B), so this checkpoint's is head_dim."""
    from transformers import AutoModelForCausalLM

    spec = dataclasses.replace(SPECS["gemma3_f32"], query_pre_attn_scalar=SPECS["gemma3_f32"].head_dim)
    directory = make_checkpoint(tmp_path / "gemma3", spec)
    hf = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    path = write_gguf(hf, directory, tmp_path / "gemma3.gguf", Q.F32)
    model = llaisys_models.load(path, device=device)
    assert type(model).__name__ == "Gemma3"
    c = model.config
    assert (c.sliding_window, c.sliding_layers, c.rope_local_theta) == (24, (0, 2), 10000.0)
    assert model.weights.norm.dtype.name == "float32"
    ids = prompt("gemma3_f32", 64, spec.vocab)
    from_gguf = model.logits(ids)
    np.testing.assert_array_equal(from_gguf, llaisys_models.load(directory, device=device).logits(ids))
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0].numpy()
    np.testing.assert_allclose(from_gguf, want, rtol=0, atol=1e-5 * np.abs(want).max())
    # layers as Gemma 3's releases have them (every 6th global: here all 3 slide): no pattern key in the file,
    # llama.cpp's default read
    spec = dataclasses.replace(spec, window_pattern=6)
    directory = make_checkpoint(tmp_path / "gemma3-6", spec)
    hf = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    f = GGUFFile(write_gguf(hf, directory, tmp_path / "gemma3-6.gguf", Q.F32))
    assert "gemma3.attention.sliding_window_pattern" not in f.metadata
    assert model_config(f).sliding_layers == (0, 1, 2)


V = GGUFValueType
WINDOW = "qwen2.attention.sliding_window"


@pytest.mark.parametrize("extra, window, layers", [
    ({}, None, ()),
    ({WINDOW: 0}, None, ()),  # (Phi-3's converter writes 0 for none)
    ({WINDOW: 8}, 8, (0, 1, 2)),  # every layer (Phi-3; HF's Mistral)
    ({WINDOW: 8, "qwen2.attention.sliding_window_pattern": 3}, 8, (0, 1)),  # i % 3 < 2 (llama.cpp's n)
    ({WINDOW: 8, "qwen2.attention.sliding_window_pattern": ([False, True, True], V.ARRAY, V.BOOL)}, 8, (1, 2)),
])
def test_gguf_sliding_window_metadata(tmp_path, extra, window, layers):
    f = GGUFFile(write_tiny_gguf(tmp_path / "w.gguf", layers=3, extra=extra))
    c = model_config(f)
    assert (c.sliding_window, c.sliding_layers) == (window, layers)


def test_gguf_sliding_window_pattern_of_the_wrong_length(tmp_path):
    pattern = ([True, False], V.ARRAY, V.BOOL)
    f = GGUFFile(write_tiny_gguf(tmp_path / "w.gguf", layers=3, extra={WINDOW: 8,
                                                                      "qwen2.attention.sliding_window_pattern": pattern}))
    with pytest.raises(ModelLoadError, match="sliding_window_pattern must hold one true/false per layer"):
        model_config(f)


ROOT = Path(__file__).resolve().parents[3]
GUIDE = ROOT / "docs" / "guides" / "adding-a-family.md"


def test_the_guide_s_family_is_the_one_added_here():
    """docs/guides/adding-a-family.md adds OLMo 2 (the family table's olmo2 rows: every test here runs it): the
    file it shows, its first line naming it, is that file whole; each line its diffs keep or add is in the file
    the diff names, and each line they take out is not."""
    assert FAMILIES["olmo2_f32"] == "Olmo2"
    blocks = re.findall(r"^```(python|diff)\n(.*?)^```", GUIDE.read_text(), re.M | re.S)
    assert [lang for lang, _ in blocks] == ["python", "diff", "diff"]
    first, _, code = blocks[0][1].partition("\n")
    assert first.startswith("# ") and (ROOT / first[2:]).read_text() == code
    for _, diff in blocks[1:]:
        lines = diff.splitlines()
        text = (ROOT / lines[1].removeprefix("+++ b/")).read_text().splitlines()
        for line in lines[2:]:
            if line.startswith("@@"):
                continue
            assert (line[1:] in text) == (line[0] != "-"), f"{lines[1]}: {line!r}"
