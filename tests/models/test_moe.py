"""Mixture-of-experts families against HF transformers on tiny random checkpoints that transformers writes.

Greedy generation follows HF's token for token (f32), within the near-tie rule in bf16, teacher-forced
(test_parity.check_against_reference); a batch of prompts decodes as each prompt alone; a config whose
expert fields contradict each other is refused naming the field.
"""

from __future__ import annotations

import json
import shutil

import pytest

import llaisys_models
from llaisys_models.errors import ModelLoadError
from test_parity import MAX_NEAR_TIE_RATE, check_against_reference
from tiny_models import MOE_SPECS, NEW_TOKENS, PROMPT_LENGTHS, prompt

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
