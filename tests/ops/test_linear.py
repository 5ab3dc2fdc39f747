"""linear: out = x @ weight.T + bias, against torch float64 on the same (rounded) inputs, on every SIMD path.

The CPU kernel computes each output as a dot product of a row of x and a row of weight, in register tiles
of up to 4 x 4 rows, or of up to 8 rows of x by one weight row where M <= 8 (vdpbf16ps for bf16 on CPUs
with AVX512-BF16). The shapes below reach every tile tail
(M, N, K not multiples of any tile or vector, odd K for the bf16 pairs) and the Qwen2-1.5B projections.
Every output is computed in one fixed order, so a row's result never depends on the rows batched with it
(checked bit for bit).
"""


import pytest
import torch

import llaisys
from helpers import FLOAT_DTYPES, TORCH_DTYPES, assert_close, from_torch, nan_filled, random, to_torch
from helpers.simd_paths import LEVELS, run_in_child, skip_unless_level_available

# (M, N, K): odd sizes 1, 3, 17, 4097 on every axis (not every combination), M past the tiles' rows and the
# chunks of x rows that stay in cache (2 MiB of x: K = 40000 makes chunks of 12 rows of f32, 24 of bf16);
# each with and without bias.
SHAPES = [
    (1, 1, 1), (1, 3, 17), (3, 17, 4097), (17, 4097, 3), (64, 17, 1), (3, 1, 4097), (1, 4097, 17),
    (17, 3, 3), (64, 100, 65), (8, 33, 300), (9, 33, 300), (15, 70, 129), (30, 33, 40000),
]
# Qwen2-1.5B projections at modest M, with bias where the model has one (q/k/v) and without (o, gate/up,
# down): (M, N, K, bias).
QWEN2_SHAPES = [
    (1, 1536, 1536, True), (1, 256, 1536, True), (1, 1536, 1536, False), (1, 8960, 1536, False),
    (1, 1536, 8960, False), (3, 256, 1536, True), (8, 1536, 1536, False), (17, 256, 1536, True),
    (64, 1536, 256, False), (17, 300, 8960, False),
]
# Cheap shapes for the per-SIMD-level child processes.
SMALL_SHAPES = [(1, 3, 17), (3, 17, 4097), (17, 33, 100), (64, 70, 129), (1, 100, 1536), (8, 40, 300),
                (9, 40, 300), (1, 17, 4097), (2, 256, 1536)]


def check_linear(shape, dtype, with_bias, device="cpu", seed=0):
    m, n, k = shape
    g = torch.Generator().manual_seed(seed)
    # x ~ N(0, 1/K), weight ~ N(0, 1): outputs are O(1) for every K
    x, rx = random((m, k), dtype, device, g, scale=k ** -0.5)
    w, rw = random((n, k), dtype, device, g)
    bias, rb = random((n,), dtype, device, g) if with_bias else (None, None)
    out = nan_filled((m, n), dtype, device)
    llaisys.ops.linear(out, x, w, bias)
    expected = rx @ rw.T
    if with_bias:
        expected = expected + rb
    assert_close(out, expected)


def check_small_shapes():
    for dtype in FLOAT_DTYPES:
        for i, shape in enumerate(SMALL_SHAPES):
            check_linear(shape, dtype, with_bias=i % 2 == 0, seed=i)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def _linear_rows(x: torch.Tensor, w, bias, start: int, m: int, device) -> torch.Tensor:
    """linear of rows [start, start + m) of x, alone."""
    out = nan_filled((m, w.shape[0]), w.dtype, device)
    llaisys.ops.linear(out, from_torch(x[start:start + m], device), w, bias)
    return to_torch(out)


def check_rows_independent(device="cpu"):
    """Each row of out, bit for bit, whether x has 1, 2, 3, 5, 6, 7, 8, 9 or 13 rows around it (so the row
    falls in the streamed tiles of up to 8 rows and in tiles of every height, at every position, and across
    chunks of rows); long K, odd K and N."""
    for dtype in FLOAT_DTYPES:
        for n, k in ((33, 300), (40, 1101), (17, 2049), (9, 100000)):  # K = 100000: chunks of 4 / 8 rows of x
            g = torch.Generator().manual_seed(n + k)
            _, rx = random((20, k), dtype, device, g, scale=k ** -0.5)
            w, _ = random((n, k), dtype, device, g)
            bias, _ = random((n,), dtype, device, g)
            xt = rx.to(TORCH_DTYPES[dtype])
            everything = _linear_rows(xt, w, bias, 0, 20, device)
            for start, m in ((0, 1), (5, 1), (19, 1), (0, 2), (1, 3), (3, 5), (14, 6), (4, 7), (0, 8), (11, 8),
                             (2, 9), (0, 13), (7, 13)):
                rows = _linear_rows(xt, w, bias, start, m, device)
                assert torch.equal(bits(rows), bits(everything[start:start + m])), (
                    f"{dtype.name} N={n} K={k}: rows [{start}, {start + m}) differ from the same rows in a batch of 20")


def test_linear_rows_do_not_depend_on_the_batch(device):
    check_rows_independent(device)


@pytest.mark.parametrize("env", [{"LLAISYS_CPU_SIMD": "avx2"}, {"LLAISYS_CPU_SIMD": "portable"},
                                 {"LLAISYS_CPU_LINEAR_BF16DOT": "0"}], ids=["avx2", "portable", "no-bf16dot"])
def test_linear_rows_do_not_depend_on_the_batch_on_every_path(device, env):
    if device.type != "cpu":
        pytest.skip("SIMD paths belong to the CPU backend")
    run_in_child(__name__, env, "t.check_rows_independent()")


@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_linear_matches_torch(device, shape, dtype, with_bias):
    check_linear(shape, dtype, with_bias, device, seed=sum(shape) + with_bias)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("case", QWEN2_SHAPES, ids=lambda c: "x".join(map(str, c[:3])) + ("-bias" if c[3] else ""))
def test_linear_qwen2_shapes(device, case, dtype):
    *shape, with_bias = case
    check_linear(tuple(shape), dtype, with_bias, device, seed=sum(shape))


@pytest.mark.parametrize("level", LEVELS)
def test_linear_simd_paths(device, level):
    skip_unless_level_available(device, level)
    run_in_child(__name__, {"LLAISYS_CPU_SIMD": level}, "t.check_small_shapes()", expect_level=level)


def test_linear_avx512_without_bf16_dot(device):
    """bf16 on AVX-512 CPUs without AVX512-BF16: the f32 FMA chain on weights widened as they are loaded."""
    skip_unless_level_available(device, "avx512")
    run_in_child(__name__, {"LLAISYS_CPU_SIMD": "avx512", "LLAISYS_CPU_LINEAR_BF16DOT": "0"}, "t.check_small_shapes()",
                 expect_level="avx512")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("m", [1, 17])
def test_linear_nan_and_inf_propagate(device, dtype, m):
    """A NaN / inf in one row of x poisons exactly that output row (and only that one)."""
    g = torch.Generator().manual_seed(m)
    k, n = 40, 19
    rx = (torch.randn(m, k, generator=g, dtype=torch.float64) * 0.1).to(TORCH_DTYPES[dtype])
    rw = torch.randn(n, k, generator=g, dtype=torch.float64).to(TORCH_DTYPES[dtype])
    rx[0, 5] = float("nan")
    if m > 1:
        rx[m - 1, 7] = float("inf")
    out = nan_filled((m, n), dtype, device)
    llaisys.ops.linear(out, from_torch(rx, device), from_torch(rw, device))
    got = to_torch(out).to(torch.float64)
    expected = rx.to(torch.float64) @ rw.to(torch.float64).T
    assert torch.isnan(got[0]).all(), got[0]
    if m > 1:
        assert torch.equal(torch.isinf(got[m - 1]), torch.isinf(expected[m - 1]))
        assert torch.equal(torch.sign(got[m - 1]), torch.sign(expected[m - 1]))
        middle = got[1:m - 1]
        assert torch.isfinite(middle).all()
        assert_close(out.slice(0, 1, m - 1), expected[1:m - 1])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_linear_empty_k_gives_bias(device, dtype):
    """K = 0: the sum is empty, so out = bias (or 0)."""
    g = torch.Generator().manual_seed(1)
    x, w = llaisys.zeros((3, 0), dtype, device), llaisys.zeros((5, 0), dtype, device)
    bias, rb = random((5,), dtype, device, g)
    out = nan_filled((3, 5), dtype, device)
    llaisys.ops.linear(out, x, w, bias)
    assert_close(out, rb.expand(3, 5))
    llaisys.ops.linear(out, x, w)
    assert_close(out, torch.zeros(3, 5, dtype=torch.float64))


def test_linear_rejects_bad_arguments(device):
    f32, bf16 = llaisys.float32, llaisys.bfloat16
    out, x, w = llaisys.empty((3, 5), f32, device), llaisys.zeros((3, 4), f32, device), llaisys.zeros((5, 4), f32, device)
    cases = [
        ("weight", dict(weight=llaisys.zeros((5, 4), bf16, device))),          # dtype mismatch
        ("bias", dict(bias=llaisys.zeros((5,), llaisys.float16, device))),      # dtype mismatch
        ("weight", dict(weight=llaisys.zeros((5, 3), f32, device))),            # K mismatch
        ("bias", dict(bias=llaisys.zeros((4,), f32, device))),                  # N mismatch
        ("out", dict(out=llaisys.empty((3, 6), f32, device))),                  # N mismatch
        ("out", dict(out=llaisys.empty((2, 5), f32, device))),                  # M mismatch
        ("x", dict(x=llaisys.zeros((4, 3), f32, device).permute(1, 0))),        # non-contiguous
        ("x", dict(x=llaisys.zeros((12,), f32, device))),                       # not 2-D
        ("out", dict(out=llaisys.empty((3, 5), llaisys.int32, device), x=llaisys.zeros((3, 4), llaisys.int32, device),
                     weight=llaisys.zeros((5, 4), llaisys.int32, device))),  # not floating point
    ]
    for name, override in cases:
        args = dict(out=out, x=x, weight=w, bias=None)
        args.update(override)
        with pytest.raises(llaisys.LlaisysError, match=name) as info:
            llaisys.ops.linear(args["out"], args["x"], args["weight"], args["bias"])
        assert isinstance(info.value, ValueError)
