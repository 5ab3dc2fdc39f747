"""LoRA adapters from PEFT directories: greedy tokens identical to HF's PeftModel (DESIGN §6's near-tie rule
in bf16), alone and with the base model and other adapters in one batch; the prefix cache keyed by adapter;
adapters over quantized bases; bad adapters refused with one line."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

import llaisys
import llaisys_models
from helpers.lora_adapters import ADAPTERS, TinyAdapters, UnderAdapter
from helpers.parity_rule import MAX_NEAR_TIE_RATE, check_against_reference
from helpers.tiny_models import ALL_SPECS, NEW_TOKENS, prompt
from llaisys_models.errors import ModelLoadError

BASES = ("f32_gqa2_hd32", "llama_f32_tied")  # Qwen2 (q/k/v biases), Llama (tied embeddings)
PROMPT_LENGTHS = (1, 13, 64)


@pytest.fixture(scope="module")
def adapters(tiny_models, tmp_path_factory) -> TinyAdapters:
    return TinyAdapters(tiny_models, tmp_path_factory.mktemp("lora"))


def loaded(tiny_models, adapters, base: str, names=tuple(ADAPTERS), **load):
    model = llaisys_models.load(tiny_models.path(base), device="cpu", **load)
    for name in names:
        model.load_lora(name, adapters.path(base, name))
    return model


@pytest.mark.slow
@pytest.mark.parametrize("base", BASES)
def test_each_adapter_alone_matches_peft(tiny_models, adapters, base):
    model = loaded(tiny_models, adapters, base)
    dtype = ALL_SPECS[base].dtype
    for name in ADAPTERS:
        for length in PROMPT_LENGTHS:
            ref = adapters.reference(base, name, prompt(base, length, ALL_SPECS[base].vocab))
            ties = check_against_reference(UnderAdapter(model, name), ref, dtype)
            assert len(ties) <= max(1, MAX_NEAR_TIE_RATE["f32"] * NEW_TOKENS), f"{base} + {name}, {length}: {ties}"


def test_adapter_changes_the_output_and_the_base_stays(tiny_models, adapters):
    """One adapter vs PeftModel (fast tier), and the base model's tokens untouched by a loaded adapter."""
    base = "f32_gqa2_hd32"
    ids = prompt(base, 13, ALL_SPECS[base].vocab)
    plain = llaisys_models.load(tiny_models.path(base), device="cpu").generate(ids, 20, eos_token_ids=())
    model = loaded(tiny_models, adapters, base, names=("all_r8",))
    ref = adapters.reference(base, "all_r8", ids)
    assert check_against_reference(UnderAdapter(model, "all_r8"), ref, "f32") == []
    assert model.generate(ids, 20, eos_token_ids=()) == plain
    assert model.generate(ids, 20, eos_token_ids=(), lora="all_r8") != plain


@pytest.mark.slow
def test_mixed_batch_equals_each_alone(tiny_models, adapters):
    base = "f32_gqa2_hd32"
    model = loaded(tiny_models, adapters, base)
    vocab = ALL_SPECS[base].vocab
    prompts = [prompt(base, n, vocab) for n in (13, 1, 64, 13, 30, 5, 64)]
    names = [None, "all_r8", "qv_r16_rslora", "all_r8", "patterns", None, "patterns"]
    batch = model.generate_batch(prompts, 24, lora=names, eos_token_ids=())
    for p, name, got in zip(prompts, names, batch):
        assert got == model.generate(p, 24, lora=name, eos_token_ids=()), name


def test_more_adapters_than_slots_take_turns(tiny_models, adapters):
    base = "f32_gqa2_hd32"
    model = llaisys_models.load(tiny_models.path(base), device="cpu")
    model.enable_lora(max_loras=1, max_lora_rank=16)
    for name in ADAPTERS:
        model.load_lora(name, adapters.path(base, name))
    vocab = ALL_SPECS[base].vocab
    prompts = [prompt(base, 9, vocab)] * 4
    names = ["all_r8", "qv_r16_rslora", None, "patterns"]
    batch = model.generate_batch(prompts, 8, lora=names, eos_token_ids=())
    assert [model.generate(p, 8, lora=n, eos_token_ids=()) for p, n in zip(prompts, names)] == batch
    assert len({tuple(b) for b in batch}) == 4  # the adapters do change the output


def test_prefix_cache_is_keyed_by_adapter(tiny_models, adapters):
    base = "f32_gqa2_hd32"
    model = loaded(tiny_models, adapters, base, names=("all_r8", "patterns"))
    ids = prompt(base, 64, ALL_SPECS[base].vocab)
    model.generate(ids, 1, lora="all_r8")
    model.generate(ids, 1, lora="all_r8")
    assert model.last_stats.prompt_tokens < 16  # the same adapter: the prompt came from the cache
    model.generate(ids, 1, lora="patterns")
    assert model.last_stats.prompt_tokens == 64  # another adapter: computed again
    model.generate(ids, 1)
    assert model.last_stats.prompt_tokens == 64  # the base: again
    # an adapter unloaded and loaded again under its name is a new adapter: nothing of the old one is reused
    model.unload_lora("all_r8")
    model.load_lora("all_r8", adapters.path(base, "patterns"))
    model.generate(ids, 1, lora="all_r8")
    assert model.last_stats.prompt_tokens == 64


@pytest.mark.slow
def test_bf16_base_within_the_near_tie_rule(tiny_models, adapters):
    base = "bf16_mha_hd64"
    model = loaded(tiny_models, adapters, base, names=("all_r8",))
    ties = 0
    for length in PROMPT_LENGTHS:
        ref = adapters.reference(base, "all_r8", prompt(base, length, ALL_SPECS[base].vocab))
        ties += len(check_against_reference(UnderAdapter(model, "all_r8"), ref, "bf16"))
    assert ties <= MAX_NEAR_TIE_RATE["bf16"] * NEW_TOKENS * len(PROMPT_LENGTHS)


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_adapter_over_a_quantized_base(tiny_models, adapters, quantize):
    """The adapter stays in the compute dtype beside quantized weights: the adapted quantized model is as far from
    the adapted float model as the quantized base is from the float base (the quantization's own error), while
    the adapter moves the logits much further than that."""
    base = "f32_gqa2_hd32"
    ids = prompt(base, 13, ALL_SPECS[base].vocab)
    exact = loaded(tiny_models, adapters, base, names=("all_r8",))
    quant = loaded(tiny_models, adapters, base, names=("all_r8",), quantize=quantize)
    assert quant.weight_formats  # (the base really is quantized)
    base_error = np.abs(quant.logits(ids) - exact.logits(ids)).max()
    adapted_error = np.abs(quant.logits(ids, lora="all_r8") - exact.logits(ids, lora="all_r8")).max()
    adapter_effect = np.abs(exact.logits(ids, lora="all_r8") - exact.logits(ids)).max()
    assert adapted_error <= 2 * base_error + 1e-3
    assert adapter_effect > 2 * adapted_error


def test_merge_lora_equals_the_adapter(tiny_models, adapters):
    base = "f32_gqa2_hd32"
    ids = prompt(base, 13, ALL_SPECS[base].vocab)
    model = loaded(tiny_models, adapters, base, names=("all_r8",))
    adapted = model.logits(ids, lora="all_r8")
    want = model.generate(ids, 16, lora="all_r8", eos_token_ids=())
    model.merge_lora("all_r8")
    assert "all_r8" not in model.loras
    np.testing.assert_allclose(model.logits(ids), adapted, atol=1e-4, rtol=1e-4)
    assert model.generate(ids, 16, eos_token_ids=()) == want


def test_bad_adapters_are_refused_in_one_line(tiny_models, adapters, tmp_path):
    base = "f32_gqa2_hd32"
    model = llaisys_models.load(tiny_models.path(base), device="cpu")
    good = adapters.path(base, "all_r8")

    def variant(name: str, **config) -> object:
        target = tmp_path / name
        shutil.copytree(good, target)
        raw = json.loads((target / "adapter_config.json").read_text())
        raw.update(config)
        (target / "adapter_config.json").write_text(json.dumps(raw))
        return target

    cases = {
        "dora": (variant("dora", use_dora=True), "DoRA"),
        "saved": (variant("saved", modules_to_save=["lm_head"]), "modules_to_save"),
        "other model": (adapters.path("llama_f32_tied", "all_r8"), "another model"),
        "not lora": (variant("ia3", peft_type="IA3"), "LoRA adapters only"),
        "missing": (tmp_path / "nowhere", "neither a PEFT adapter"),
        "rank": (variant("rank", r=4), "r = 4"),
    }
    for what, (path, message) in cases.items():
        with pytest.raises(ModelLoadError) as error:
            model.load_lora(what, path)
        assert message in str(error.value) and "\n" not in str(error.value), what
    model.enable_lora(max_loras=2, max_lora_rank=8)
    with pytest.raises(llaisys.LlaisysValueError, match="rank 16, over max_lora_rank 8"):
        model.load_lora("big", adapters.path(base, "qv_r16_rslora"))
    model.load_lora("ok", good)
    with pytest.raises(llaisys.LlaisysValueError, match="already loaded"):
        model.load_lora("ok", good)
    with pytest.raises(llaisys.LlaisysValueError, match="no LoRA adapter named 'nope'.*'ok'"):
        model.generate([1, 2], 2, lora="nope")
    assert model.loras.keys() == {"ok"}  # nothing half-loaded


def test_peft_scales(tiny_models, adapters):
    """alpha / r, alpha / sqrt(r) with rsLoRA, and rank_pattern / alpha_pattern per module, as PEFT applies them."""
    from helpers.lora_adapters import ADAPTERS as SPECS

    base = "f32_gqa2_hd32"
    model = loaded(tiny_models, adapters, base)
    peft = adapters.peft_model(base, "patterns", torch.float32)
    for (layer, field), pair in model.loras["patterns"].pairs.items():
        block = "self_attn" if field[0] in "qkvo" else "mlp"
        module = dict(peft.named_modules())[f"base_model.model.model.layers.{layer}.{block}.{field}"]
        assert pair.scale == pytest.approx(module.scaling["default"]), (layer, field)
        assert pair.rank == module.r["default"]
    spec = SPECS["qv_r16_rslora"]
    assert all(p.scale == pytest.approx(spec.alpha / spec.r ** 0.5) for p in model.loras["qv_r16_rslora"].pairs.values())


def test_the_guide_s_example_runs(tiny_models, adapters, tmp_path):
    """docs/lora.md's Python example, run as written over a tiny Qwen2 base, a PEFT adapter and its GGUF form."""
    from helpers.doc_blocks import ROOT, blocks
    from helpers.lora_gguf import write_gguf_adapter

    base = "f32_gqa2_hd32"
    (example,) = [b for b in blocks(ROOT / "docs" / "lora.md")[0] if b.lang == "python"]
    gguf_adapter = write_gguf_adapter(adapters.path(base, "all_r8"), tmp_path / "adapter.gguf", "qwen2",
                                      base_dir=tiny_models.path(base))
    code = (example.text.replace("path/to/model", str(tiny_models.path(base)))
            .replace("path/to/peft-adapter", str(adapters.path(base, "patterns")))
            .replace("path/to/adapter.gguf", str(gguf_adapter)))
    vocab = ALL_SPECS[base].vocab
    scope = {"prompt_ids": prompt(base, 13, vocab), "prompts": [prompt(base, n, vocab) for n in (3, 13, 20)]}
    exec(compile(code, "docs/lora.md", "exec"), scope)
    model = scope["model"]
    assert len(scope["outs"]) == 3 and scope["logits"].shape == (13, vocab)
    assert set(model.loras) == set() and model.max_loras == 4  # chat unloaded, sql merged
    # after the merge, the base is the fine-tune
    assert model.generate(scope["prompt_ids"], 32) == scope["ids"]
