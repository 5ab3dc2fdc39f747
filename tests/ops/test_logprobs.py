"""logprobs: the chosen token's log-probability and the top-k alternatives of one row of logits, against
float64 torch log_softmax (after temperature; temperature 0 = the raw logits), ties by lower id, k = 0, a
151936-token vocabulary in bf16, and the refusals."""

import re

import pytest
import torch

import llaisys
from helpers import FLOAT_DTYPES, TORCH_DTYPES, from_torch
from helpers.references.logprobs import reference


def run(logits: torch.Tensor, device, chosen: int, temperature: float, k: int):
    top_ids = llaisys.empty((k,), llaisys.int64, device)
    values = llaisys.empty((k + 1,), llaisys.float32, device)
    llaisys.ops.logprobs(top_ids, values, from_torch(logits, device), chosen, temperature)
    return float(values.numpy()[0]), top_ids.numpy().tolist(), values.numpy()[1:].tolist()


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("n,k,temperature", [(1, 1, 1.0), (7, 0, 0.7), (33, 5, 0.0), (4099, 20, 1.3)])
def test_logprobs_match_float64_log_softmax(device, dtype, n, k, temperature):
    g = torch.Generator().manual_seed(n)
    logits = (torch.randn(n, generator=g, dtype=torch.float64) * 3).to(TORCH_DTYPES[dtype])
    chosen = n // 2
    got = run(logits, device, chosen, temperature, k)
    want = reference(logits, chosen, temperature, k)
    assert got[0] == pytest.approx(want[0], abs=1e-4)
    assert got[1] == want[1]
    assert got[2] == pytest.approx(want[2], abs=1e-4)


def test_logprobs_full_qwen_vocabulary_in_bf16(device):
    g = torch.Generator().manual_seed(151936)
    logits = (torch.randn(151936, generator=g, dtype=torch.float64) * 4).to(torch.bfloat16)
    logits[151935] = logits.float().max() + 2  # the best token last: the top-k scan reaches the end
    got = run(logits, device, 17, 0.8, 20)
    want = reference(logits, 17, 0.8, 20)
    assert got[0] == pytest.approx(want[0], abs=1e-4)
    assert got[1] == want[1] and got[1][0] == 151935
    assert got[2] == pytest.approx(want[2], abs=1e-4)
    assert got[2] == sorted(got[2], reverse=True)


def test_logprobs_ties_take_the_lower_id_first(device):
    logits = torch.tensor([1.0, 3.0, 2.0, 3.0, 3.0, -float("inf"), 2.0])
    lp, ids, vals = run(logits, device, 5, 1.0, 6)
    assert ids == [1, 3, 4, 2, 6, 0]
    assert lp == -float("inf")  # a banned (-inf) token has probability 0
    assert vals[0] == vals[1] == vals[2] == pytest.approx(reference(logits, 1, 1.0, 1)[0], abs=1e-6)


def test_logprobs_of_a_one_hot_row_are_exact(device):
    logits = torch.full((9,), -1e4)
    logits[4] = 0.0
    lp, ids, vals = run(logits, device, 4, 1.0, 2)
    assert lp == 0.0 and ids == [4, 0] and vals[0] == 0.0


@pytest.mark.parametrize("values,message", [
    ([0.0, float("nan"), 1.0], "logits[1] is NaN"),
    ([0.0, float("inf")], "logits[1] is +inf"),
    ([-float("inf")] * 3, "every logit is -inf"),
])
def test_logprobs_refuse_logits_without_a_distribution(device, values, message):
    with pytest.raises(llaisys.LlaisysValueError, match=re.escape(message)):
        run(torch.tensor(values), device, 0, 1.0, 1)


def test_logprobs_refuse_bad_arguments(device):
    logits = from_torch(torch.zeros(5), device)
    values = llaisys.empty((2,), llaisys.float32, device)
    ids = llaisys.empty((1,), llaisys.int64, device)
    with pytest.raises(llaisys.LlaisysValueError, match="chosen"):
        llaisys.ops.logprobs(ids, values, logits, 5)
    with pytest.raises(llaisys.LlaisysValueError, match="temperature"):
        llaisys.ops.logprobs(ids, values, logits, 0, float("inf"))
    with pytest.raises(llaisys.LlaisysValueError, match="values"):
        llaisys.ops.logprobs(ids, llaisys.empty((3,), llaisys.float32, device), logits, 0)
    with pytest.raises(llaisys.LlaisysValueError, match="at most 20"):
        llaisys.ops.logprobs(llaisys.empty((21,), llaisys.int64, device), llaisys.empty((22,), llaisys.float32, device),
                             from_torch(torch.zeros(30), device), 0)
    with pytest.raises(llaisys.LlaisysValueError, match="at most the 5"):
        llaisys.ops.logprobs(llaisys.empty((6,), llaisys.int64, device), llaisys.empty((7,), llaisys.float32, device),
                             logits, 0)
    with pytest.raises(llaisys.LlaisysValueError, match="overlap|share"):
        llaisys.ops.logprobs(ids, values, values, 0)
