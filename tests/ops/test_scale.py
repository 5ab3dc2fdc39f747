"""scale: out = x * factor (Gemma's embedding scale), against torch in float64, on every SIMD path."""

import pytest
import torch
from simd_paths import LEVELS, run_under_simd, skip_unless_level_available

import llaisys
from helpers import FLOAT_DTYPES, TORCH_DTYPES, assert_close, from_torch, nan_filled, random, to_torch

SHAPES = [(1,), (3,), (17,), (4097,), (7, 1536)]


def check_scale(shape, dtype, factor, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    x, rx = random(shape, dtype, device, g)
    out = nan_filled(shape, dtype, device)
    llaisys.ops.scale(out, x, factor)
    assert_close(out, rx * float(torch.tensor(factor, dtype=torch.float32)))


def check_shapes():
    for dtype in FLOAT_DTYPES:
        for i, shape in enumerate(SHAPES):
            check_scale(shape, dtype, 8.9375 if i % 2 else -0.3, seed=i)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_torch(device, shape, dtype):
    check_scale(shape, dtype, 50.5, device, seed=shape[-1])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_is_hf_scaled_embedding(device, dtype):
    """HF's Gemma3TextScaledWordEmbedding: embedding * embed_scale.to(dtype), one product rounded once: the
    same bits when llaisys is given that rounded normalizer (sqrt(2560) in bf16 is 50.5)."""
    tdt = TORCH_DTYPES[dtype]
    x = (torch.randn(5, 2560, generator=torch.Generator().manual_seed(1)) * 0.05).to(tdt)
    normalizer = torch.tensor(2560 ** 0.5).to(tdt)
    out = nan_filled((5, 2560), dtype, device)
    llaisys.ops.scale(out, from_torch(x, device), float(normalizer))
    assert torch.equal(to_torch(out), x * normalizer)


def test_in_place_and_special_values(device):
    x = from_torch(torch.tensor([1.0, float("inf"), float("nan"), -0.0, 3e38]), device)
    llaisys.ops.scale(x, x, -2.0)
    got = to_torch(x)
    assert got[0] == -2.0 and got[1] == float("-inf") and torch.isnan(got[2]) and got[4] == float("-inf")
    assert got[3] == 0.0 and not torch.signbit(got[3])


@pytest.mark.parametrize("level", LEVELS)
def test_every_simd_path(device, level):
    skip_unless_level_available(device, level)
    run_under_simd(__name__, level, "t.check_shapes()")


def test_rejects_bad_arguments(device):
    f32 = lambda *s: llaisys.empty(s, llaisys.float32, device)  # noqa: E731
    with pytest.raises(ValueError, match=r"scale: .*\bx\b.*dtype"):
        llaisys.ops.scale(f32(4), llaisys.empty((4,), llaisys.bfloat16, device), 2.0)
    with pytest.raises(ValueError, match=r"\bx\b.*shape"):
        llaisys.ops.scale(f32(4), f32(5), 2.0)
    with pytest.raises(ValueError, match=r"\bfactor\b"):
        llaisys.ops.scale(f32(4), f32(4), float("nan"))
    with pytest.raises(ValueError, match=r"\bfactor\b"):
        llaisys.ops.scale(f32(4), f32(4), 1e39)  # not an f32
    with pytest.raises(ValueError, match=r"\bfactor\b"):
        llaisys.ops.scale(f32(4), f32(4), "2")
    x = f32(8)
    with pytest.raises(ValueError, match=r"out and x overlap"):
        llaisys.ops.scale(x.slice(0, 0, 4), x.slice(0, 2, 6), 2.0)
