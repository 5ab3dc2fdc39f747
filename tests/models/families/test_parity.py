"""llaisys greedy decoding == HF transformers greedy decoding, on tiny random checkpoints.

Compared teacher-forced (DESIGN §6): ``generate`` must reproduce HF's greedy tokens; at a
divergence, llaisys' token must have an HF logit within a dtype-scaled tolerance of HF's
maximum (a near-tie: a few ulps of the top logit in bf16/f16, 1e-4 of it in f32), and
generation goes on from HF's token. The same holds for the argmax of a single forward over
HF's whole sequence (the prefill path). Near-ties must be rare, and the logits must be as
close to the exact (float64) logits as HF's own are.
"""

from __future__ import annotations

import pytest

import llaisys_models
from helpers.parity_rule import MAX_NEAR_TIE_RATE, check_against_reference
from helpers.tiny_models import NEW_TOKENS, PROMPT_LENGTHS, SPECS

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", list(SPECS))
def test_greedy_matches_hf(name, tiny_models, device):
    model = llaisys_models.load(tiny_models.path(name), device=device)
    ties = {}
    for length in PROMPT_LENGTHS:
        ties[length] = check_against_reference(model, tiny_models.reference(name, length), SPECS[name].dtype)
    print(f"{name}: steps where llaisys and HF chose differently (near-ties), by prompt length: {ties}")
    steps = len(PROMPT_LENGTHS) * NEW_TOKENS
    assert sum(map(len, ties.values())) <= MAX_NEAR_TIE_RATE[SPECS[name].dtype] * steps, (
        f"too many near-ties in {steps} steps, by prompt length: {ties}")


def test_converted_dtype_matches_hf(tiny_models, device):
    """An f32 checkpoint computed in bf16 (converted at load) matches HF loading it as bf16."""
    import copy

    import torch

    from helpers.tiny_models import Reference, prompt

    name = "f32_gqa2_hd32"
    model = llaisys_models.load(tiny_models.path(name), device=device, dtype="bfloat16")
    hf = tiny_models.hf(name, "bf16")
    ids = prompt(name, 13, SPECS[name].vocab)
    with torch.no_grad():
        x = torch.tensor([ids])
        tokens = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NEW_TOKENS,
                             min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)[0].tolist()
        seq = torch.tensor([tokens[:-1]])
        logits = hf(seq).logits[0].float().numpy()
        exact_model = copy.deepcopy(hf).to(torch.float64)  # the bf16-rounded weights, exactly
        exact = exact_model(seq).logits[0].numpy()
    assert model.dtype.name == "bfloat16"
    ties = check_against_reference(model, Reference(ids, tokens, logits, exact), "bf16")
    assert len(ties) <= max(1, MAX_NEAR_TIE_RATE["bf16"] * NEW_TOKENS), f"near-ties at steps {ties}"
