"""DeepSeek-V3's multi-token-prediction module as a drafter (``speculative="mtp"``), on a tiny V3 checkpoint given
a random module (helpers/deepseek_mtp.py: transformers writes none). Its guesses are what the module computes (a
float64 reference on HF's own decoder layer and HF's hidden states); speculative decoding with it gives the plain
tokens (greedy and seeded, one prompt and a batch sharing a cached prefix, int8); a model without a module is
refused naming what is missing; ``llaisys generate --speculative mtp`` (docs/speculative-decoding.md) runs.

A random module guesses at random, so what share of drafts a real checkpoint's module gets kept is not measured
here (DeepSeek-V3's report gives 85-90% for the second token).
"""

from __future__ import annotations

import re
import shutil
import types

import pytest
import torch

import llaisys
import llaisys_models
from helpers.deepseek_mtp import add_mtp_module, mtp_reference_guess
from helpers.tiny_models import prompt
from llaisys.cli import main
from llaisys_models.errors import ModelLoadError

pytestmark = pytest.mark.slow

NAME = "deepseek_v3_f32"


@pytest.fixture(scope="module")
def mtp_directory(tiny_models, tmp_path_factory):
    directory = tmp_path_factory.mktemp("mtp") / "deepseek-v3"
    shutil.copytree(tiny_models.path(NAME), directory)
    add_mtp_module(directory, seed=3)
    return directory


def test_the_module_s_guess_is_what_it_computes(mtp_directory, device):
    """The drafter's first guess after a sequence equals the float64 reference's (HF's decoder layer, HF's hidden
    states), at several lengths; the guesses are not all one token (the module is not ignored)."""
    from transformers import AutoModelForCausalLM

    model = llaisys_models.load(mtp_directory, device=device)
    hf = AutoModelForCausalLM.from_pretrained(mtp_directory, dtype=torch.float32).eval()
    drafter = model.mtp_drafter()
    guesses = []
    for i, length in enumerate((1, 2, 9, 33)):
        tokens = prompt(f"mtp{i}", length, 256)
        session = model.session()
        if length > 1:  # the model's hidden states up to N - 2 (the drafter listens; before position 0: zero)
            session.forward(tokens[:-1])
        seq = types.SimpleNamespace(id=1000 + i, tokens=tokens, kv=session.kv)
        mine = drafter.propose(seq, 1)
        drafter.release(seq)
        assert mine == [mtp_reference_guess(hf, mtp_directory, tokens)], length
        guesses.append(mine[0])
    assert len(set(guesses)) > 1


@pytest.mark.parametrize("quantize", [None, "int8"])
def test_mtp_speculation_gives_the_plain_tokens(mtp_directory, device, quantize):
    model = llaisys_models.load(mtp_directory, device=device, quantize=quantize)
    prompts = [prompt("shared", 20, 256) + prompt(f"tail{i}", 3 + 4 * i, 256) for i in range(3)]
    plain = [model.generate(p, max_new_tokens=16) for p in prompts]
    for k in (1, 3):
        assert [model.generate(p, max_new_tokens=16, speculative="mtp", num_speculative_tokens=k)
                for p in prompts] == plain
        stats = model.last_stats
        assert stats.draft_tokens > 0 and 0 <= stats.accepted_tokens <= stats.draft_tokens
    # a batch whose prompts share a cached prefix: the positions the model reused enter the module with zero
    # hidden states, which changes guesses, never tokens
    assert model.generate_batch(prompts, max_new_tokens=16, speculative="mtp", num_speculative_tokens=2) == plain
    seeded = dict(max_new_tokens=12, top_k=20, temperature=0.9, seed=5)
    assert model.generate(prompts[0], speculative="mtp", **seeded) == model.generate(prompts[0], **seeded)


def test_a_model_without_a_module_is_refused(tiny_models, tmp_path, device):
    # a V3 checkpoint whose config counts a module (transformers writes num_nextn_predict_layers 1) but holds none
    model = llaisys_models.load(tiny_models.path(NAME), device=device)
    with pytest.raises(ModelLoadError, match=r"no multi-token-prediction module: model\.layers\.3\.eh_proj\.weight"):
        model.generate([1, 2, 3], max_new_tokens=2, speculative="mtp")
    qwen2 = llaisys_models.load(tiny_models.path("f32_gqa2_hd32"), device=device)
    with pytest.raises(llaisys.LlaisysValueError, match="Qwen2 has no multi-token-prediction module"):
        qwen2.generate([1, 2, 3], max_new_tokens=2, speculative="mtp")


def test_llaisys_generate_speculative_mtp(mtp_directory, device, capsys):
    """docs/speculative-decoding.md's command: the plain reply, drafts counted."""
    common = ["generate", "--model", str(mtp_directory), "--device", str(device), "--raw", "--prompt",
              "one two three", "--max-new-tokens", "12"]
    assert main(common) == 0
    plain = capsys.readouterr().out
    assert main([*common, "--speculative", "mtp", "--num-speculative-tokens", "1"]) == 0
    captured = capsys.readouterr()
    assert captured.out == plain
    drafted, kept = map(int, re.search(r"drafted (\d+), kept (\d+)", captured.err).groups())
    assert drafted > 0 and 0 <= kept <= drafted
