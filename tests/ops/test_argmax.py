"""argmax: first index of the maximum (NaN counts as the maximum, as torch.argmax), on every SIMD path."""


import pytest
import torch

import llaisys
from helpers import FLOAT_DTYPES, TORCH_DTYPES, from_torch, to_torch
from helpers.simd_paths import LEVELS, run_under_simd, skip_unless_level_available

SIZES = [1, 3, 17, 31, 32, 33, 4097, 151936]
NAN, INF = float("nan"), float("inf")


def run_argmax(vals: torch.Tensor, dtype, device="cpu"):
    idx = from_torch(torch.full((1,), -7, dtype=torch.int64), device)
    val = from_torch(torch.full((1,), NAN, dtype=TORCH_DTYPES[dtype]), device)
    llaisys.ops.argmax(idx, val, from_torch(vals, device))
    return int(to_torch(idx)[0]), to_torch(val)[0]


def check_argmax(vals: torch.Tensor, dtype, device="cpu"):
    vals = vals.to(TORCH_DTYPES[dtype])
    i, v = run_argmax(vals, dtype, device)
    want = int(torch.argmax(vals))
    assert i == want, f"{dtype.name} n={vals.numel()}: index {i}, torch.argmax says {want}"
    # the element itself, bit for bit (NaN payloads and the sign of zero included)
    bits = torch.int16 if vals.element_size() == 2 else torch.int32
    assert v.view(bits) == vals[want].view(bits), f"value {v} != vals[{want}] = {vals[want]}"


def tie_cases(n: int):
    """Arrays of length n with equal maxima placed at vector boundaries, in the tail, and with NaN."""
    g = torch.Generator().manual_seed(n)
    for first, second in [(0, n - 1), (n // 2, n - 1), (n - 2, n - 1), (15, 16), (7, 8), (31, 33)]:
        if not (0 <= first < second < n):
            continue
        v = torch.randn(n, generator=g)
        v[first] = v[second] = 10.0
        yield v
        v = v.clone()
        v[second] = NAN
        yield v  # NaN beats the maximum
        v = v.clone()
        v[first] = NAN
        yield v  # first of two NaN


def check_all():
    for dtype in FLOAT_DTYPES:
        for n in SIZES:
            g = torch.Generator().manual_seed(n)
            check_argmax(torch.randn(n, generator=g), dtype)
            check_argmax(-torch.rand(n, generator=g) - 1, dtype)  # all negative: padded lanes must not win
            for v in tie_cases(n):
                check_argmax(v, dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("n", SIZES)
def test_argmax_random(device, n, dtype):
    g = torch.Generator().manual_seed(n + 1)
    check_argmax(torch.randn(n, generator=g) * 5, dtype, device)
    check_argmax(-torch.rand(n, generator=g) - 1, dtype, device)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("n", [2, 17, 33, 4097, 151936])
def test_argmax_ties_and_nan(device, n, dtype):
    for v in tie_cases(n):
        check_argmax(v, dtype, device)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("values", [[-0.0, 0.0], [0.0, -0.0], [-INF, -INF, -INF], [1.0, INF, INF, NAN, 2.0],
                                    [NAN], [-INF, NAN], [3.0, 3.0, 3.0]], ids=str)
def test_argmax_special_values(device, values, dtype):
    check_argmax(torch.tensor(values), dtype, device)


@pytest.mark.parametrize("dtype", [llaisys.float32, llaisys.bfloat16], ids=lambda d: d.name)
def test_argmax_large_parallel(device, dtype):
    """>= 1M elements take the parallel path: ties across its chunks, a NaN in the last chunk."""
    n = (1 << 21) + 5
    g = torch.Generator().manual_seed(3)
    v = torch.randn(n, generator=g)
    v[1_500_000] = v[700_000] = v[n - 1] = 50.0
    check_argmax(v, dtype, device)
    v[n - 3] = NAN
    check_argmax(v, dtype, device)


@pytest.mark.parametrize("level", LEVELS)
def test_argmax_on_every_simd_path(device, level):
    skip_unless_level_available(device, level)
    run_under_simd(__name__, level, "t.check_all()")


def test_argmax_rejects_bad_arguments(device):
    idx = llaisys.empty((1,), llaisys.int64, device)
    val = llaisys.empty((1,), llaisys.float32, device)
    vals = llaisys.empty((8,), llaisys.float32, device)
    with pytest.raises(ValueError, match=r"\bvals\b.*1-d"):
        llaisys.ops.argmax(idx, val, llaisys.empty((2, 4), llaisys.float32, device))
    with pytest.raises(ValueError, match=r"\bvals\b.*empty"):
        llaisys.ops.argmax(idx, val, llaisys.empty((0,), llaisys.float32, device))
    with pytest.raises(ValueError, match=r"\bvals\b.*dtype int64"):
        llaisys.ops.argmax(idx, llaisys.empty((1,), llaisys.int64, device), llaisys.empty((8,), llaisys.int64, device))
    with pytest.raises(ValueError, match=r"\bmax_idx\b.*dtype int32"):
        llaisys.ops.argmax(llaisys.empty((1,), llaisys.int32, device), val, vals)
    with pytest.raises(ValueError, match=r"\bmax_val\b.*dtype"):
        llaisys.ops.argmax(idx, llaisys.empty((1,), llaisys.float16, device), vals)
    with pytest.raises(ValueError, match=r"\bmax_idx\b.*shape"):
        llaisys.ops.argmax(llaisys.empty((2,), llaisys.int64, device), val, vals)
    with pytest.raises(ValueError, match=r"\bvals\b.*contiguous"):
        llaisys.ops.argmax(idx, val, llaisys.empty((8, 2), llaisys.float32, device).permute(1, 0).slice(0, 0, 1).view(8))
