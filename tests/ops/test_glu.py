"""The gated linear units, out = act(gate) * up, against torch in float64, on every SIMD path:
swiglu (act = silu) and geglu_tanh (act = gelu_tanh, HF's gelu_pytorch_tanh)."""

import math

import pytest
import torch

import llaisys
from helpers import FLOAT_DTYPES, TORCH_DTYPES, assert_close, from_torch, nan_filled, random, to_torch
from helpers.references.glu import gelu_tanh
from helpers.simd_paths import LEVELS, run_under_simd, skip_unless_level_available

SHAPES = [(1,), (3,), (17,), (4097,), (1, 8960), (64, 8960)]
SMALL_SHAPES = [(1,), (3,), (17,), (4097,), (2, 8960)]


def silu(gate):
    return gate / (1 + torch.exp(-gate))


GLUS = {"swiglu": silu, "geglu_tanh": gelu_tanh}


def run(name, out, gate, up, numerics="exact"):
    getattr(llaisys.ops, name)(out, gate, up, numerics)


def check_glu(name, shape, dtype, device="cpu", seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    gate, rgate = random(shape, dtype, device, g, scale=scale)
    up, rup = random(shape, dtype, device, g)
    out = nan_filled(shape, dtype, device)
    run(name, out, gate, up)
    assert_close(out, GLUS[name](rgate) * rup)


def check_small_shapes():
    for name in GLUS:
        for dtype in FLOAT_DTYPES:
            for i, shape in enumerate(SMALL_SHAPES):
                check_glu(name, shape, dtype, seed=i)
            check_glu(name, (4097,), dtype, seed=99, scale=40.0)  # deep into exp's tails


@pytest.mark.parametrize("name", GLUS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_torch(device, name, shape, dtype):
    check_glu(name, shape, dtype, device, seed=shape[-1])


@pytest.mark.parametrize("name", GLUS)
def test_qwen2_prefill_shape(device, name):
    check_glu(name, (512, 8960), llaisys.bfloat16, device, seed=5)


@pytest.mark.parametrize("name", GLUS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_wide_range(device, name, dtype):
    """Gate values across the whole range where exp over- or underflows (and gelu's cube)."""
    gate_ref = torch.linspace(-120, 120, 4001, dtype=torch.float64).to(TORCH_DTYPES[dtype])
    up_ref = torch.linspace(-2, 3, 4001, dtype=torch.float64).to(TORCH_DTYPES[dtype])
    out = nan_filled(gate_ref.shape, dtype, device)
    run(name, out, from_torch(gate_ref, device), from_torch(up_ref, device))
    assert_close(out, GLUS[name](gate_ref.double()) * up_ref.double())


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_gelu_tanh_where_tanh_nears_minus_one(device, dtype):
    """gelu_tanh of negative gates, where 1 + tanh(z) cancels: relatively as accurate as anywhere else."""
    gate_ref = torch.linspace(-9, -2, 3001, dtype=torch.float64).to(TORCH_DTYPES[dtype])
    up = torch.ones_like(gate_ref)
    out = nan_filled(gate_ref.shape, dtype, device)
    run("geglu_tanh", out, from_torch(gate_ref, device), from_torch(up, device))
    g64 = gate_ref.double()
    want = gelu_tanh(g64)  # from -4.5e-2 down to -1.4e-28
    # relative to each value, however small: f32 within what rounding the exponent 2z to f32 costs (|2z| ulps:
    # up to ~70 here; torch's own f32 1 + tanh(z) loses everything from z < -9 on), f16 / bf16 correctly
    # rounded but for a near-tie
    got = to_torch(out).double()
    normal = want.abs() >= torch.finfo(TORCH_DTYPES[dtype]).tiny  # (f16 flushes the smallest to subnormals, 0)
    relative = ((got - want.to(TORCH_DTYPES[dtype]).double()) / want).abs()
    two_z = (2 * math.sqrt(2 / math.pi) * (g64 + 0.044715 * g64 ** 3)).abs()
    bound = {llaisys.float32: 4 * 2.0 ** -24 * (1 + two_z), llaisys.float16: torch.full_like(g64, 2.0 ** -10),
             llaisys.bfloat16: torch.full_like(g64, 2.0 ** -7)}[dtype]
    assert normal.sum() > 500
    assert bool((relative <= bound)[normal].all()), f"max relative error {float(relative[normal].max()):.3g}"


@pytest.mark.parametrize("name", GLUS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_special_values(device, name, dtype):
    tdt = TORCH_DTYPES[dtype]
    gate = torch.tensor([float("inf"), float("nan"), 0.0, -0.0, 1.0, 2.0, -1.0, 5.0], dtype=tdt).repeat(3)
    up = torch.tensor([2.0, 1.0, 1.0, 1.0, float("nan"), float("inf"), 3.0, 0.0], dtype=tdt).repeat(3)
    out = nan_filled(gate.shape, dtype, device)
    run(name, out, from_torch(gate, device), from_torch(up, device))
    act = {"swiglu": torch.nn.functional.silu,
           "geglu_tanh": lambda g: torch.nn.functional.gelu(g, approximate="tanh")}[name]
    assert_close(out, act(gate.double()) * up.double())  # NaN and inf where torch has them


@pytest.mark.parametrize("level", LEVELS)
def test_every_simd_path(device, level):
    skip_unless_level_available(device, level)
    run_under_simd(__name__, level, "t.check_small_shapes()")


@pytest.mark.parametrize("name", GLUS)
def test_rejects_bad_arguments(device, name):
    op = getattr(llaisys.ops, name)
    f32 = lambda *s: llaisys.empty(s, llaisys.float32, device)  # noqa: E731
    with pytest.raises(ValueError, match=rf"{name}: .*\bup\b.*dtype"):
        op(f32(4), f32(4), llaisys.empty((4,), llaisys.bfloat16, device))
    with pytest.raises(ValueError, match=r"\bgate\b.*shape"):
        op(f32(2, 4), f32(4, 2), f32(2, 4))
    with pytest.raises(ValueError, match=r"\bout\b.*dtype int32"):
        op(*(llaisys.empty((4,), llaisys.int32, device) for _ in range(3)))
    with pytest.raises(ValueError, match=r"\bgate\b.*contiguous"):
        op(f32(3, 4), f32(4, 3).permute(1, 0), f32(3, 4))
    with pytest.raises(ValueError, match=rf"{name}: .*numerics"):
        op(f32(4), f32(4), f32(4), "fast")
    x = f32(8)
    with pytest.raises(ValueError, match=r"out and gate overlap"):
        op(x.slice(0, 0, 4), x.slice(0, 2, 6), f32(4))
    op(x, x, f32(8))  # in place: out = gate
