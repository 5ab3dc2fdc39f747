"""swiglu: out = up * gate / (1 + exp(-gate)), against torch in float64, on every SIMD path."""


import pytest
import torch
from simd_paths import LEVELS, run_under_simd, skip_unless_level_available

import llaisys
from helpers import FLOAT_DTYPES, TORCH_DTYPES, assert_close, from_torch, nan_filled, random

SHAPES = [(1,), (3,), (17,), (4097,), (1, 8960), (64, 8960)]
SMALL_SHAPES = [(1,), (3,), (17,), (4097,), (2, 8960)]


def reference(gate, up):
    return up * gate / (1 + torch.exp(-gate))


def check_swiglu(shape, dtype, device="cpu", seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    gate, rgate = random(shape, dtype, device, g, scale=scale)
    up, rup = random(shape, dtype, device, g)
    out = nan_filled(shape, dtype, device)
    llaisys.ops.swiglu(out, gate, up)
    assert_close(out, reference(rgate, rup))


def check_small_shapes():
    for dtype in FLOAT_DTYPES:
        for i, shape in enumerate(SMALL_SHAPES):
            check_swiglu(shape, dtype, seed=i)
        check_swiglu((4097,), dtype, seed=99, scale=40.0)  # deep into exp's tails


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_swiglu_matches_torch(device, shape, dtype):
    check_swiglu(shape, dtype, device, seed=shape[-1])


def test_swiglu_qwen2_prefill_shape(device):
    check_swiglu((512, 8960), llaisys.bfloat16, device, seed=5)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_swiglu_wide_range(device, dtype):
    """Gate values across the whole range where exp over- or underflows."""
    gate_ref = torch.linspace(-120, 120, 4001, dtype=torch.float64).to(TORCH_DTYPES[dtype])
    up_ref = torch.linspace(-2, 3, 4001, dtype=torch.float64).to(TORCH_DTYPES[dtype])
    out = nan_filled(gate_ref.shape, dtype, device)
    llaisys.ops.swiglu(out, from_torch(gate_ref, device), from_torch(up_ref, device))
    assert_close(out, reference(gate_ref.double(), up_ref.double()))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_swiglu_special_values(device, dtype):
    tdt = TORCH_DTYPES[dtype]
    gate = torch.tensor([float("inf"), float("nan"), 0.0, -0.0, 1.0, 2.0, -1.0, 5.0], dtype=tdt).repeat(3)
    up = torch.tensor([2.0, 1.0, 1.0, 1.0, float("nan"), float("inf"), 3.0, 0.0], dtype=tdt).repeat(3)
    out = nan_filled(gate.shape, dtype, device)
    llaisys.ops.swiglu(out, from_torch(gate, device), from_torch(up, device))
    assert_close(out, torch.nn.functional.silu(gate.double()) * up.double())  # NaN and inf where torch has them


@pytest.mark.parametrize("level", LEVELS)
def test_swiglu_on_every_simd_path(device, level):
    skip_unless_level_available(device, level)
    run_under_simd(__name__, level, "t.check_small_shapes()")


def test_swiglu_rejects_bad_arguments(device):
    f32 = lambda *s: llaisys.empty(s, llaisys.float32, device)  # noqa: E731
    with pytest.raises(ValueError, match=r"\bup\b.*dtype"):
        llaisys.ops.swiglu(f32(4), f32(4), llaisys.empty((4,), llaisys.bfloat16, device))
    with pytest.raises(ValueError, match=r"\bgate\b.*shape"):
        llaisys.ops.swiglu(f32(2, 4), f32(4, 2), f32(2, 4))
    with pytest.raises(ValueError, match=r"\bout\b.*dtype int32"):
        llaisys.ops.swiglu(*(llaisys.empty((4,), llaisys.int32, device) for _ in range(3)))
    with pytest.raises(ValueError, match=r"\bgate\b.*contiguous"):
        llaisys.ops.swiglu(f32(3, 4), f32(4, 3).permute(1, 0), f32(3, 4))
