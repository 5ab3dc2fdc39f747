"""mask_logits: disallowed logits become -inf in place, allowed ones keep their bits; against torch."""

import numpy as np
import pytest
import torch

import llaisys
from helpers import FLOAT_DTYPES, TORCH_DTYPES, from_torch, to_torch

SHAPES = [(1,), (31,), (32,), (33,), (2, 100), (3, 151936)]


def random_bitmask(rows, vocab, generator, allowed=0.5):
    """int32 [rows, ceil(vocab / 32)] with each token allowed with probability ``allowed``, its bits past the
    vocabulary random too (the kernel must ignore them), and the allowed tokens as a bool [rows, vocab]."""
    words = (vocab + 31) // 32
    keep = torch.rand((rows, words * 32), generator=generator) < allowed
    packed = np.packbits(keep.numpy(), axis=1, bitorder="little").view(np.int32)
    return torch.from_numpy(packed.copy()), keep[:, :vocab]


def check_mask(shape, dtype, device, seed, allowed=0.5):
    g = torch.Generator().manual_seed(seed)
    rows, vocab = (1, shape[0]) if len(shape) == 1 else shape
    x = (torch.randn((rows, vocab), generator=g, dtype=torch.float64) * 3).to(TORCH_DTYPES[dtype])
    bitmask, keep = random_bitmask(rows, vocab, g, allowed)
    logits = from_torch(x.reshape(shape), device)
    llaisys.ops.mask_logits(logits, from_torch(bitmask.reshape(*shape[:-1], -1), device))
    want = torch.where(keep, x.double(), torch.tensor(-torch.inf, dtype=torch.float64))
    got = to_torch(logits).double().reshape(rows, vocab)
    assert torch.equal(got, want), f"{int((got != want).sum())} of {got.numel()} logits differ"


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_mask_logits_matches_torch(device, shape, dtype):
    check_mask(shape, dtype, device, seed=shape[-1])


@pytest.mark.parametrize("allowed", [0.0, 1.0, 0.001], ids=["none", "all", "few"])
def test_mask_logits_all_none_or_few_allowed(device, allowed):
    for dtype in FLOAT_DTYPES:
        check_mask((2, 1000), dtype, device, seed=7, allowed=allowed)


def test_mask_logits_then_argmax_picks_an_allowed_token(device):
    """The use: the best allowed token wins even when a banned one has the largest logit."""
    logits = from_torch(torch.tensor([9.0, 1.0, 8.0, 2.0] * 10), device)
    bitmask = from_torch(torch.tensor([1 << 6, 0], dtype=torch.int32), device)  # token 6 only
    llaisys.ops.mask_logits(logits, bitmask)
    idx, val = llaisys.empty((1,), llaisys.int64, device), llaisys.empty((1,), llaisys.float32, device)
    llaisys.ops.argmax(idx, val, logits)
    assert int(idx.numpy()[0]) == 6 and float(val.numpy()[0]) == 8.0


def test_mask_logits_bad_arguments(device):
    logits = llaisys.empty((2, 64), llaisys.float32, device)
    ok = llaisys.empty((2, 2), llaisys.int32, device)
    with pytest.raises(llaisys.LlaisysValueError, match="bitmask"):
        llaisys.ops.mask_logits(logits, llaisys.empty((2, 3), llaisys.int32, device))
    with pytest.raises(llaisys.LlaisysValueError, match="bitmask"):
        llaisys.ops.mask_logits(logits, llaisys.empty((2, 2), llaisys.int64, device))
    with pytest.raises(llaisys.LlaisysValueError, match="logits"):
        llaisys.ops.mask_logits(llaisys.empty((2, 64), llaisys.int32, device), ok)
    with pytest.raises(llaisys.LlaisysValueError, match="logits"):
        llaisys.ops.mask_logits(llaisys.empty((1, 2, 64), llaisys.float32, device), ok)
    with pytest.raises(llaisys.LlaisysValueError, match="empty"):
        llaisys.ops.mask_logits(llaisys.empty((0,), llaisys.float32, device), llaisys.empty((0,), llaisys.int32, device))
