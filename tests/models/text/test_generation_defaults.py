"""The sampling settings a model ships (generation_defaults.py): read as HF and llama.cpp read them, applied by
chat() / complete() and ``llaisys generate`` for what the caller leaves unset, never by generate()."""

from __future__ import annotations

import json
import shutil

import gguf
import pytest
import torch
from gguf import GGMLQuantizationType as Q

import llaisys_models
from helpers.gguf_files import write_gguf
from llaisys import LlaisysValueError
from llaisys.cli import main
from llaisys_models.text import generation_defaults as gd

F32 = "f32_gqa2_hd32"
QWEN = {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}  # Qwen2.5's
EXPLICIT = dict(temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05)


def test_generation_config_read_as_hf_reads_it():
    assert gd.from_generation_config(QWEN).settings() == EXPLICIT
    # do_sample false (HF's default): greedy, the repetition penalty alone applies
    assert gd.from_generation_config({**QWEN, "do_sample": False}).settings() == {"repetition_penalty": 1.05}
    assert gd.from_generation_config({"temperature": 0.6}).settings() == {}
    # sampling without top_k / temperature / top_p: HF's own defaults (top_k 50)
    assert gd.from_generation_config({"do_sample": True}).settings() == dict(temperature=1.0, top_k=50, top_p=1.0)
    assert gd.from_generation_config({"bos_token_id": 1, "eos_token_id": 2}).describe() == ""
    unsupported = gd.from_generation_config({**QWEN, "min_p": 0.05})
    assert "not applied: min_p" in unsupported.describe() and unsupported.settings() == EXPLICIT


@pytest.mark.parametrize("key, value", [("temperature", -1), ("top_p", 0), ("top_p", 1.5), ("top_k", 2.5),
                                        ("repetition_penalty", 0), ("temperature", "hot"), ("top_k", True),
                                        ("temperature", float("inf"))])
def test_a_bad_setting_names_the_file_and_the_key(key, value):
    with pytest.raises(LlaisysValueError, match=rf"generation_config.json: {key} = .* is not a valid setting"):
        gd.from_generation_config({**QWEN, key: value})


def test_gguf_sampling_keys_read_as_llama_cpp_reads_them():
    meta = {"general.sampling.temp": 0.6, "general.sampling.top_k": 40, "general.sampling.top_p": 0.95,
            "general.sampling.penalty_repeat": 1.1, "general.sampling.min_p": 0.05}
    defaults = gd.from_gguf(meta, "model.gguf")
    assert defaults.settings() == dict(temperature=0.6, top_k=40, top_p=0.95, repetition_penalty=1.1)
    assert defaults.describe().endswith("not applied: min_p (model.gguf: general.sampling)")
    assert gd.from_gguf({"general.architecture": "llama"}, "model.gguf").describe() == ""


@pytest.fixture(scope="module")
def sampling_model_dir(tiny_models, tmp_path_factory):
    """The tiny f32 checkpoint with Qwen2.5's sampling settings in its generation_config.json."""
    path = tmp_path_factory.mktemp("sampling") / "model"
    shutil.copytree(tiny_models.path(F32), path)
    config = json.loads((path / "generation_config.json").read_text())
    (path / "generation_config.json").write_text(json.dumps({**config, **QWEN}))
    return path


def greedy_reply(model, question: str) -> str:
    """``model``'s reply with llaisys' own defaults (greedy, no penalty)."""
    saved, model.generation_defaults = model.generation_defaults, gd.NONE
    try:
        return model.chat(question, max_new_tokens=8)
    finally:
        model.generation_defaults = saved


def first_differing_seed(model, question: str) -> int:
    """A seed whose sampled reply differs from the greedy one (so the comparisons below can fail)."""
    greedy = greedy_reply(model, question)
    for seed in range(20):
        if model.chat(question, max_new_tokens=8, seed=seed, **EXPLICIT) != greedy:
            return seed
    raise AssertionError("20 seeds sampled the greedy reply")


def test_chat_takes_the_model_settings_left_unset(sampling_model_dir, device):
    model = llaisys_models.load(sampling_model_dir, device=device)
    assert model.generation_defaults.settings() == EXPLICIT
    seed = first_differing_seed(model, "hello")
    assert model.chat("hello", max_new_tokens=8, seed=seed) == model.chat("hello", max_new_tokens=8, seed=seed,
                                                                          **EXPLICIT)
    assert model.complete("hello", max_new_tokens=8, seed=seed) == model.complete("hello", max_new_tokens=8,
                                                                                  seed=seed, **EXPLICIT)
    greedy = greedy_reply(model, "hello")
    given = model.chat("hello", max_new_tokens=8, seed=seed, temperature=0, repetition_penalty=1.0)
    assert given == greedy  # settings given win
    ids = model.tokenizer("hello")["input_ids"]
    assert model.generate(ids, 8) == model.generate(ids, 8, top_k=1)  # generate() stays greedy
    model.generation_defaults = gd.NONE
    assert model.chat("hello", max_new_tokens=8, seed=seed) == greedy


def test_generate_command_says_and_applies_the_model_settings(sampling_model_dir, device, capsys):
    model = llaisys_models.load(sampling_model_dir, device=device)
    seed = first_differing_seed(model, "hello")
    common = ["generate", "--model", str(sampling_model_dir), "--device", str(device), "--prompt", "hello",
              "--max-new-tokens", "8", "--seed", str(seed)]
    assert main(common) == 0
    by_default, err = capsys.readouterr()
    assert ("sampling as the model says: temperature 0.7, top_k 20, top_p 0.8, repetition_penalty 1.05 "
            "(generation_config.json)") in err
    assert main([*common, "--generation-config", "none", "--temperature", "0.7", "--top-k", "20", "--top-p", "0.8",
                 "--repetition-penalty", "1.05"]) == 0
    assert capsys.readouterr().out == by_default
    assert main([*common, "--generation-config", "none"]) == 0
    out, err = capsys.readouterr()
    assert out != by_default and "sampling as the model says" not in err
    assert out == greedy_reply(model, "hello") + "\n"


def test_a_gguf_file_s_sampling_keys(tiny_models, device, tmp_path):
    from transformers import AutoModelForCausalLM

    directory = tiny_models.path(F32)
    hf = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    extra = {"general.sampling.temp": 0.7, "general.sampling.top_k": (20, gguf.GGUFValueType.INT32),
             "general.sampling.top_p": 0.8, "general.sampling.penalty_repeat": 1.05}
    path = write_gguf(hf, directory, tmp_path / "sampling.gguf", Q.F32, extra=extra)
    model = llaisys_models.load(path, device=device)
    assert model.generation_defaults.settings() == pytest.approx(EXPLICIT)  # (f32 metadata)
    seed = first_differing_seed(model, "hello")
    assert model.chat("hello", max_new_tokens=8, seed=seed) == model.chat("hello", max_new_tokens=8, seed=seed,
                                                                          **model.generation_defaults.settings())
