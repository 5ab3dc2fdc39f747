"""rms_norm: per row x * weight / sqrt(mean(x^2) + eps), against torch in float64, HF's Qwen2RMSNorm and (with
an f32 weight for f16 / bf16 x) HF's Gemma3RMSNorm."""


import pytest
import torch

import llaisys
from helpers import FLOAT_DTYPES, TORCH_DTYPES, assert_close, from_torch, nan_filled, random, to_torch
from helpers.simd_paths import LEVELS, run_under_simd, skip_unless_level_available

SHAPES = [(1, 1), (3, 3), (1, 17), (2, 4097), (1, 1536), (4, 1536), (2, 5, 64)]
SMALL_SHAPES = [(1, 1), (3, 3), (2, 17), (1, 4097), (3, 1536)]


def reference(x, w, eps):
    return x * w / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def check_rms_norm(shape, dtype, device="cpu", seed=0, eps=1e-6, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    x, rx = random(shape, dtype, device, g, scale=scale)
    w, rw = random(shape[-1:], dtype, device, g)
    out = nan_filled(shape, dtype, device)
    llaisys.ops.rms_norm(out, x, w, eps)
    assert_close(out, reference(rx, rw, eps))


def check_small_shapes():
    for dtype in FLOAT_DTYPES:
        for i, shape in enumerate(SMALL_SHAPES):
            check_rms_norm(shape, dtype, seed=i)
        check_hf_parity((64, 1536), dtype)
        check_gemma_parity((17, 1536), dtype)


def check_gemma_parity(shape, dtype, device="cpu"):
    """An f32 weight, 1 + w: transformers' Gemma3RMSNorm, (x.float() * r) * (1 + w.float()) rounded once. Only
    the f32 summation order of the squares may differ (1 f32 ulp in r: a rounding moves now and then)."""
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    tdt = TORCH_DTYPES[dtype]
    g = torch.Generator().manual_seed(8)
    x = (torch.randn(shape, generator=g) * 2).to(tdt)
    w = (torch.randn(shape[-1], generator=g) * 0.5).to(tdt)  # the checkpoint's w, as stored
    norm = Gemma3RMSNorm(shape[-1], eps=1e-6)
    norm.weight.data.copy_(w.float())
    with torch.no_grad():
        want = norm(x)
    out = nan_filled(shape, dtype, device)
    llaisys.ops.rms_norm(out, from_torch(x, device), from_torch(1 + w.float(), device), 1e-6)
    got = to_torch(out)
    if dtype == llaisys.float32:  # there r's ulp shows in most outputs: within 4 ulps (r itself 1 ulp off)
        diff = (got.double() - want.double()).abs()
        assert (diff <= 4 * 2.0 ** -23 * want.double().abs()).all(), f"max diff {diff.max().item():.3g} vs HF"
        return
    assert int((got != want).sum()) <= max(1, got.numel() // 1000), f"{dtype.name}: differs from Gemma3RMSNorm"
    # the f32 weight is not rounded to the dtype, nor x * r before it: a weight folded into the dtype differs
    if got.numel() >= 100:
        folded = nan_filled(shape, dtype, device)
        llaisys.ops.rms_norm(folded, from_torch(x, device), from_torch((1 + w.float()).to(tdt), device), 1e-6)
        assert int((to_torch(folded) != want).sum()) > got.numel() // 10


def hf_qwen2_rms_norm(x, weight, eps):
    """transformers' Qwen2RMSNorm.forward (test_hf_formula_is_transformers checks this copy)."""
    input_dtype = x.dtype
    hidden_states = x.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + eps)
    return weight * hidden_states.to(input_dtype)


def check_hf_parity(shape, dtype, device="cpu"):
    """Same rounding steps as transformers' Qwen2RMSNorm: only the f32 summation order may differ."""
    tdt = TORCH_DTYPES[dtype]
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(shape, generator=g) * 2).to(tdt)
    w = torch.randn(shape[-1], generator=g).to(tdt)
    want = hf_qwen2_rms_norm(x, w, 1e-6).to(torch.float64)
    out = nan_filled(shape, dtype, device)
    llaisys.ops.rms_norm(out, from_torch(x, device), from_torch(w, device), 1e-6)
    got = to_torch(out).to(torch.float64)
    # a flipped rounding of x * r moves the output by <= 2 ulp (relative bound; + f16 subnormal spacing);
    # f32 allows 4: r itself may be 1 ulp off
    ulps = {llaisys.float32: 4 * 2.0 ** -23, llaisys.float16: 2 * 2.0 ** -10, llaisys.bfloat16: 2 * 2.0 ** -7}[dtype]
    diff = (got - want).abs()
    assert (diff <= ulps * want.abs() + 2.0 ** -23).all(), f"{dtype.name}: max diff {diff.max().item():.3g} vs HF"
    if dtype != llaisys.float32:  # f32: the variance's summation order moves ~1 ulp in many elements
        frac = (diff > 0).double().mean().item()
        assert frac < 2e-3, f"{dtype.name}: {frac:.2%} of elements differ from HF (expected ~0)"


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_rms_norm_matches_torch(device, shape, dtype):
    check_rms_norm(shape, dtype, device, seed=shape[-1])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_rms_norm_qwen2_prefill_shape(device, dtype):
    check_rms_norm((512, 1536), dtype, device, seed=11, scale=5.0)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_rms_norm_matches_hf_qwen2(device, dtype):
    check_hf_parity((128, 1536), dtype, device)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_hf_formula_is_transformers(dtype):
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm
    tdt = TORCH_DTYPES[dtype]
    g = torch.Generator().manual_seed(8)
    x, w = torch.randn(9, 96, generator=g).to(tdt), torch.randn(96, generator=g).to(tdt)
    norm = Qwen2RMSNorm(96, eps=1e-5)
    norm.weight.data = w.clone()
    with torch.no_grad():
        assert torch.equal(norm(x), hf_qwen2_rms_norm(x, w, 1e-5))


@pytest.mark.parametrize("eps", [0.0, 1e-5, 0.5, 3.0])
def test_rms_norm_eps(device, eps):
    check_rms_norm((4, 100), llaisys.float32, device, seed=3, eps=eps, scale=0.5)


def test_rms_norm_zero_row(device):
    x = from_torch(torch.zeros(2, 33), device)
    w = from_torch(torch.ones(33), device)
    out = nan_filled((2, 33), llaisys.float32, device)
    llaisys.ops.rms_norm(out, x, w, 1e-6)
    assert torch.equal(to_torch(out), torch.zeros(2, 33))


@pytest.mark.parametrize("level", LEVELS)
def test_rms_norm_on_every_simd_path(device, level):
    skip_unless_level_available(device, level)
    run_under_simd(__name__, level, "t.check_small_shapes()")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (5, 2, 256)], ids=str)
def test_f32_weight_is_gemmas_norm(device, dtype, shape):
    check_gemma_parity(shape, dtype, device)


def test_rms_norm_rejects_bad_arguments(device):
    f32 = lambda *s: llaisys.empty(s, llaisys.float32, device)  # noqa: E731
    with pytest.raises(ValueError, match=r"\bweight\b.*shape"):
        llaisys.ops.rms_norm(f32(2, 8), f32(2, 8), f32(7), 1e-6)
    with pytest.raises(ValueError, match=r"\bweight\b.*dtype"):
        llaisys.ops.rms_norm(f32(2, 8), f32(2, 8), llaisys.empty((8,), llaisys.bfloat16, device), 1e-6)
    f16 = lambda *s: llaisys.empty(s, llaisys.float16, device)  # noqa: E731
    with pytest.raises(ValueError, match=r"\bweight\b.*dtype"):  # f16 x: an f16 or an f32 weight, no other
        llaisys.ops.rms_norm(f16(2, 8), f16(2, 8), llaisys.empty((8,), llaisys.bfloat16, device), 1e-6)
    with pytest.raises(ValueError, match=r"\bout\b.*shape"):
        llaisys.ops.rms_norm(f32(2, 9), f32(2, 8), f32(8), 1e-6)
    with pytest.raises(ValueError, match=r"\beps\b"):
        llaisys.ops.rms_norm(f32(2, 8), f32(2, 8), f32(8), -1.0)
    with pytest.raises(ValueError, match=r"\beps\b"):
        llaisys.ops.rms_norm(f32(2, 8), f32(2, 8), f32(8), float("nan"))
    with pytest.raises(ValueError, match=r"\bx\b.*contiguous"):
        llaisys.ops.rms_norm(f32(8, 2), f32(2, 8).permute(1, 0), f32(2), 1e-6)
