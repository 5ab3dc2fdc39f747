"""add: c = a + b, against torch in float64, on every SIMD path of the CPU backend."""


import pytest
import torch
from simd_paths import LEVELS, run_under_simd, skip_unless_level_available

import llaisys
from helpers import FLOAT_DTYPES, TORCH_DTYPES, assert_close, from_torch, nan_filled, random, to_torch

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
