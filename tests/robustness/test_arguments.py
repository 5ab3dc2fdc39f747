"""Integer arguments checked against their C types before they reach them, and clear messages.

Before: ``top_k = 2**64 + 1`` wrapped to 1 (greedy) and ``top_k = 2**63`` showed as negative;
``self_attention`` with d = 0 said "null data pointer"; ``slice``/``permute`` refused numpy integers
as "out of range"; out-of-memory errors did not say how many bytes were asked for.
"""

import numpy as np
import pytest
import torch

import llaisys
from helpers import from_torch, random

INT64_MAX, UINT64_MAX = 2**63 - 1, 2**64 - 1


@pytest.fixture
def sample_args(device):
    logits, _ = random((16,), llaisys.float32, device, torch.Generator().manual_seed(0))
    return llaisys.empty((1,), llaisys.int64, device), logits


@pytest.mark.parametrize("name,value,needle", [
    ("top_k", 2**64 + 1, f"top_k must be <= {INT64_MAX}"),
    ("top_k", 2**63, f"top_k must be <= {INT64_MAX}"),
    ("top_k", -1, "top_k must be >= 0"),
    ("top_k", 2.0, "top_k must be an int"),
    ("seed", 2**64, f"seed must be <= {UINT64_MAX}"),
    ("seed", -1, "seed must be >= 0"),
    ("temperature", float("nan"), "temperature must not be NaN"),
    ("top_p", 0.0, "top_p must be > 0"),
])
def test_sample_integers_are_range_checked(sample_args, name, value, needle):
    out, logits = sample_args
    kwargs = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "seed": 0, name: value}
    with pytest.raises(llaisys.LlaisysValueError, match=needle):
        llaisys.ops.sample(out, logits, **kwargs)


def test_numpy_scalars_are_numbers(sample_args):
    out, logits = sample_args
    llaisys.ops.sample(out, logits, np.float32(0.5), np.int64(3), np.float64(0.9), np.uint64(UINT64_MAX))
    llaisys.ops.sample(out, logits, 1.0, INT64_MAX, 1.0, 0)  # the largest top_k that fits
    assert 0 <= int(out.numpy()[0]) < 16


def test_attention_with_an_empty_head_dim_says_so(device):
    q = llaisys.zeros((2, 2, 0), llaisys.float32, device)
    v = llaisys.zeros((2, 2, 4), llaisys.float32, device)
    out = llaisys.empty((2, 2, 4), llaisys.float32, device)
    with pytest.raises(llaisys.LlaisysValueError, match="head dim d of q and k is 0"):
        llaisys.ops.self_attention(out, q, q, v, 1.0)


def test_views_take_numpy_integers(device):
    base = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    t = from_torch(torch.from_numpy(base), device)
    s = t.slice(np.int64(2), np.int64(1), np.int32(3))
    np.testing.assert_array_equal(s.numpy(), base[:, :, 1:3])
    p = t.permute(np.int64(2), np.int64(0), np.int8(1))
    np.testing.assert_array_equal(p.numpy(), base.transpose(2, 0, 1))
    np.testing.assert_array_equal(t.view(np.int64(6), np.int64(4)).numpy(), base.reshape(6, 4))
    with pytest.raises(llaisys.LlaisysValueError, match="dim must be an int"):
        t.slice(1.0, 0, 1)
    with pytest.raises(llaisys.LlaisysValueError, match="slice start must be an int"):
        t.slice(0, True, 1)
    with pytest.raises(llaisys.LlaisysValueError, match="dim 3 is out of range"):
        t.slice(np.int64(3), 0, 1)
