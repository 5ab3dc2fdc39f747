"""add: c = a + b, and scale: out = x * factor (Gemma's embedding scale), against torch in float64, on every
SIMD path of the CPU backend."""


import pytest
import torch

import llaisys
from helpers import FLOAT_DTYPES, TORCH_DTYPES, assert_close, from_torch, nan_filled, random, to_torch
from helpers.simd_paths import LEVELS, run_under_simd, skip_unless_level_available

SHAPES = [(1,), (3,), (17,), (4097,), (2, 3, 5), (1, 1536), (512, 1536)]
SMALL_SHAPES = [(1,), (3,), (17,), (4097,), (7, 1536)]
TOL = {llaisys.float32: 1e-5, llaisys.float16: 1e-3, llaisys.bfloat16: 1e-3}  # DESIGN §6: bf16 add 1e-3


def check_add(shape, dtype, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    a, ra = random(shape, dtype, device, g)
    b, rb = random(shape, dtype, device, g, scale=3.0)
    c = nan_filled(shape, dtype, device)
    llaisys.ops.add(c, a, b)
    assert_close(c, ra + rb, TOL[dtype])
    # a single correctly rounded addition: bit-exact against the exact sum rounded to the dtype
    assert torch.equal(to_torch(c), (ra + rb).to(TORCH_DTYPES[dtype])), f"{shape} {dtype.name} not bit-exact"


def check_small_shapes():
    for dtype in FLOAT_DTYPES:
        for i, shape in enumerate(SMALL_SHAPES):
            check_add(shape, dtype, seed=i)
            check_scale(shape, dtype, 8.9375 if i % 2 else -0.3, seed=i)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_add_matches_torch(device, shape, dtype):
    check_add(shape, dtype, device, seed=len(shape) * 1000 + shape[-1])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_add_special_values(device, dtype):
    tdt = TORCH_DTYPES[dtype]
    a_ref = torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0, -0.0, 1.0, 65504.0, -1e-3] * 3, dtype=tdt)
    b_ref = torch.tensor([1.0, -1.0, 2.0, -0.0, -0.0, float("inf"), 65504.0, 1e-3] * 3, dtype=tdt)
    c = nan_filled(a_ref.shape, dtype, device)
    llaisys.ops.add(c, from_torch(a_ref, device), from_torch(b_ref, device))
    want = a_ref.to(torch.float64) + b_ref.to(torch.float64)
    got = to_torch(c).to(torch.float64)
    want = want.to(tdt).to(torch.float64)
    same = (got == want) | (torch.isnan(got) & torch.isnan(want))
    assert same.all(), f"got {got.tolist()}, expected {want.tolist()}"
    assert torch.equal(torch.signbit(got[4::8]), torch.signbit(want[4::8])), "-0 + -0 must be -0"


def test_add_in_place(device):
    g = torch.Generator().manual_seed(3)
    a, ra = random((33,), llaisys.float32, device, g)
    b, rb = random((33,), llaisys.float32, device, g)
    llaisys.ops.add(a, a, b)
    assert_close(a, ra + rb)


@pytest.mark.parametrize("level", LEVELS)
def test_add_on_every_simd_path(device, level):
    skip_unless_level_available(device, level)
    run_under_simd(__name__, level, "t.check_small_shapes()")


def test_add_rejects_bad_arguments(device):
    f32 = lambda *s: llaisys.empty(s, llaisys.float32, device)  # noqa: E731
    with pytest.raises(ValueError, match=r"\bb\b.*dtype"):
        llaisys.ops.add(f32(4), f32(4), llaisys.empty((4,), llaisys.float16, device))
    with pytest.raises(llaisys.LlaisysError, match=r"\ba\b.*shape"):
        llaisys.ops.add(f32(4), f32(5), f32(4))
    with pytest.raises(ValueError, match=r"\bc\b.*dtype int64"):
        llaisys.ops.add(*(llaisys.empty((4,), llaisys.int64, device) for _ in range(3)))
    with pytest.raises(ValueError, match=r"\bb\b.*contiguous"):
        llaisys.ops.add(f32(3, 4), f32(3, 4), f32(4, 3).permute(1, 0))
    with pytest.raises(ValueError, match=r"\ba\b.*llaisys.Tensor"):
        llaisys.ops.add(f32(4), torch.zeros(4), f32(4))


# ---- scale ----------------------------------------------------------------------------------------------

SCALE_SHAPES = [(1,), (3,), (17,), (4097,), (7, 1536)]


def check_scale(shape, dtype, factor, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    x, rx = random(shape, dtype, device, g)
    out = nan_filled(shape, dtype, device)
    llaisys.ops.scale(out, x, factor)
    assert_close(out, rx * float(torch.tensor(factor, dtype=torch.float32)))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("shape", SCALE_SHAPES, ids=str)
def test_scale_matches_torch(device, shape, dtype):
    check_scale(shape, dtype, 50.5, device, seed=shape[-1])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_scale_is_hf_scaled_embedding(device, dtype):
    """HF's Gemma3TextScaledWordEmbedding: embedding * embed_scale.to(dtype), one product rounded once: the
    same bits when llaisys is given that rounded normalizer (sqrt(2560) in bf16 is 50.5)."""
    tdt = TORCH_DTYPES[dtype]
    x = (torch.randn(5, 2560, generator=torch.Generator().manual_seed(1)) * 0.05).to(tdt)
    normalizer = torch.tensor(2560 ** 0.5).to(tdt)
    out = nan_filled((5, 2560), dtype, device)
    llaisys.ops.scale(out, from_torch(x, device), float(normalizer))
    assert torch.equal(to_torch(out), x * normalizer)


def test_scale_in_place_and_special_values(device):
    x = from_torch(torch.tensor([1.0, float("inf"), float("nan"), -0.0, 3e38]), device)
    llaisys.ops.scale(x, x, -2.0)
    got = to_torch(x)
    assert got[0] == -2.0 and got[1] == float("-inf") and torch.isnan(got[2]) and got[4] == float("-inf")
    assert got[3] == 0.0 and not torch.signbit(got[3])


def test_scale_rejects_bad_arguments(device):
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
