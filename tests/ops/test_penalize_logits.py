"""penalize_logits: logit bias, HF's repetition penalty and OpenAI's frequency / presence penalties, in place,
against float64 torch, against HF transformers' own processor bit for bit in float32, and its refusals."""

import numpy as np
import pytest
import torch

import llaisys
from helpers import FLOAT_DTYPES, TORCH_DTYPES, assert_close, from_torch, to_torch
from helpers.references.penalize_logits import entries, reference


def run(logits_ref: torch.Tensor, dtype, device, ids, counts, bias=None, **penalties) -> llaisys.Tensor:
    logits = from_torch(logits_ref.to(TORCH_DTYPES[dtype]), device)
    llaisys.ops.penalize_logits(logits, llaisys.from_numpy(np.array(ids, np.int64).reshape(-1), device),
                                llaisys.from_numpy(np.array(counts, np.int64).reshape(-1, 2), device),
                                None if bias is None else llaisys.from_numpy(np.array(bias, np.float32), device),
                                **penalties)
    return logits


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("vocab", [3, 17, 4097, 151936])
def test_penalize_logits_matches_the_float64_formula(device, dtype, vocab):
    g = torch.Generator().manual_seed(vocab)
    logits = (torch.randn(vocab, generator=g, dtype=torch.float64) * 4).to(TORCH_DTYPES[dtype]).double()
    # a prompt and generated tokens with repeats (duplicates become counts), and a bias on other ids too
    prompt = torch.randint(0, vocab, (40,), generator=g).tolist()
    generated = torch.randint(0, vocab, (25,), generator=g).tolist() + prompt[:3] * 2
    bias = {int(t): float(b) for t, b in zip(torch.randint(0, vocab, (6,), generator=g),
                                             torch.linspace(-100, 100, 6))}
    ids, counts, values = entries(prompt, generated, bias)
    penalties = dict(repetition_penalty=1.3, frequency_penalty=0.7, presence_penalty=-0.4)
    got = run(logits, dtype, device, ids, counts, values, **penalties)
    assert_close(got, reference(logits, ids, counts, values, 1.3, 0.7, -0.4))
    untouched = torch.ones(vocab, dtype=torch.bool)
    untouched[ids] = False
    assert torch.equal(to_torch(got).double()[untouched], logits[untouched]), "only the listed ids change"


def test_repetition_penalty_is_hf_transformers_bit_for_bit(device):
    """HF's RepetitionPenaltyLogitsProcessor on float32 scores, the context with repeated tokens: identical."""
    from transformers import RepetitionPenaltyLogitsProcessor

    g = torch.Generator().manual_seed(1)
    scores = torch.randn(1, 1000, generator=g) * 5
    context = torch.randint(0, 1000, (1, 300), generator=g)
    for penalty in (1.1, 1.3, 0.8, 2.0):
        want = RepetitionPenaltyLogitsProcessor(penalty)(context, scores.clone())[0]
        tokens = context[0].tolist()
        ids, counts, _ = entries(tokens[:200], tokens[200:])
        got = run(scores[0], llaisys.float32, device, ids, counts, repetition_penalty=penalty)
        assert torch.equal(to_torch(got), want), penalty


def test_frequency_and_presence_follow_openai_over_generated_tokens_only(device):
    logits = torch.tensor([2.0, 2.0, 2.0, -3.0, 0.0], dtype=torch.float64)
    ids, counts, _ = entries(prompt=[0, 0, 0], generated=[1, 1, 1, 3])
    got = run(logits, llaisys.float32, device, ids, counts, frequency_penalty=0.5, presence_penalty=1.0)
    # token 0 is in the prompt only: untouched; token 1: 2 - 3 * 0.5 - 1; token 3: -3 - 0.5 - 1
    assert to_torch(got).tolist() == [2.0, -0.5, 2.0, -4.5, 0.0]


def test_logit_bias_bans_and_forces(device):
    logits = torch.tensor([1.0, 9.0, 3.0, 2.0], dtype=torch.float64)
    got = run(logits, llaisys.float32, device, [1, 3], [(0, 0), (0, 0)], [-100.0, 100.0])
    assert to_torch(got).tolist() == [1.0, -91.0, 3.0, 102.0]
    assert int(torch.argmax(to_torch(got))) == 3


def test_bias_comes_before_the_repetition_penalty(device):
    logits = torch.tensor([-1.0, 1.0], dtype=torch.float64)
    got = run(logits, llaisys.float32, device, [0, 1], [(1, 0), (0, 1)], [3.0, -3.0], repetition_penalty=2.0)
    assert to_torch(got).tolist() == [1.0, -4.0]  # (-1 + 3) / 2, (1 - 3) * 2


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_empty_lists_change_nothing(device, dtype):
    logits = torch.randn(33, dtype=torch.float64).to(TORCH_DTYPES[dtype])
    got = run(logits.double(), dtype, device, [], [], [], repetition_penalty=2.0, frequency_penalty=1.0)
    assert torch.equal(to_torch(got), logits)


@pytest.mark.parametrize("ids,counts,needle", [
    ([0, 7], [(1, 0), (0, 1)], r"ids\[1\] = 7 is not a token id in \[0, 5\)"),
    ([-1, 2], [(1, 0), (0, 1)], r"ids\[0\] = -1 is not a token id"),
    ([2, 2], [(1, 0), (0, 1)], r"ids\[1\] = 2 is not above ids\[0\] = 2.*each id once"),
    ([3, 1], [(1, 0), (0, 1)], r"ids\[1\] = 1 is not above ids\[0\] = 3"),
    ([1, 3], [(1, 0), (0, -2)], r"counts\[1\] = \(0, -2\) is negative"),
], ids=["past-vocab", "negative", "duplicate", "decreasing", "negative-count"])
def test_bad_ids_and_counts_are_refused_and_nothing_is_written(device, ids, counts, needle):
    logits_ref = torch.arange(5, dtype=torch.float64) + 1
    logits = from_torch(logits_ref.float(), device)
    with pytest.raises(llaisys.LlaisysValueError, match=needle):
        llaisys.ops.penalize_logits(logits, llaisys.from_numpy(np.array(ids, np.int64), device),
                                    llaisys.from_numpy(np.array(counts, np.int64), device), repetition_penalty=2.0)
        llaisys.synchronize(device)  # an asynchronous device reports it here
    assert to_torch(logits).double().tolist() == logits_ref.tolist()


def test_bad_arguments_name_themselves(device):
    f32 = llaisys.from_numpy(np.zeros(8, np.float32), device)
    ids = llaisys.from_numpy(np.array([1, 2], np.int64), device)
    counts = llaisys.from_numpy(np.zeros((2, 2), np.int64), device)
    op = llaisys.ops.penalize_logits
    with pytest.raises(ValueError, match=r"\bids\b.*dtype int32"):
        op(f32, llaisys.from_numpy(np.array([1, 2], np.int32), device), counts)
    with pytest.raises(ValueError, match=r"\bcounts\b.*shape"):
        op(f32, ids, llaisys.from_numpy(np.zeros((2,), np.int64), device))
    with pytest.raises(ValueError, match=r"\bbias\b.*dtype float16"):
        op(f32, ids, counts, llaisys.from_numpy(np.zeros(2, np.float16), device))
    with pytest.raises(ValueError, match=r"\blogits\b.*dtype int64"):
        op(llaisys.from_numpy(np.zeros(8, np.int64), device), ids, counts)
    with pytest.raises(ValueError, match=r"repetition_penalty must be > 0"):
        op(f32, ids, counts, repetition_penalty=0.0)
    with pytest.raises(ValueError, match=r"frequency_penalty must be finite"):
        op(f32, ids, counts, frequency_penalty=float("inf"))
    with pytest.raises(ValueError, match=r"presence_penalty must not be NaN"):
        op(f32, ids, counts, presence_penalty=float("nan"))


def test_logits_overlapping_an_input_is_refused():
    buffer = bytearray(128)
    logits = llaisys.from_buffer(buffer, llaisys.float32, (16,))
    ids = llaisys.from_buffer(buffer, llaisys.int64, (2,), offset=16)
    counts = llaisys.from_numpy(np.zeros((2, 2), np.int64))
    with pytest.raises(ValueError, match=r"logits and ids overlap"):
        llaisys.ops.penalize_logits(logits, ids, counts)
    disjoint = llaisys.from_buffer(buffer, llaisys.int64, (2,), offset=64)
    disjoint.load(np.array([1, 2], np.int64))
    llaisys.ops.penalize_logits(logits, disjoint, counts)
