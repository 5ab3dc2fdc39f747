"""linear_q and embedding_q: the block formats q8_0, q4_0, q4_1, q4_k, q6_k (llaisys.ops.quant).

References are float64 numpy/torch built here from the contract (backend.h, ``linear_q``):
- the exact arithmetic: x quantized per row and group of 32 as linear_i8 does (test_linear_i8.quantize_x), each
  group's (or half group's, q6_k) integer dot with the format's integers, scaled by scale * sx, plus min * sx *
  sum(xq) for the formats with a min: the kernel must match it up to f32 rounding (tight);
- x @ w.T with the unquantized x and the weights the blocks hold exactly: within the bound that quantizing x
  alone can cause (|x - x'| <= sx / 2 per k; the weights are not re-quantized, so they add nothing).
The weights' values come from ``dequantize_quant``, which the tests check against the formulas below and (in
tests/models/test_gguf_blocks.py) ggml's own dequantizer. Every SIMD path runs the same checks in a child
process (LLAISYS_CPU_SIMD, and LLAISYS_CPU_LINEAR_VNNI=0 for AVX-512 CPUs without VNNI).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import llaisys
from helpers import FLOAT_DTYPES, TORCH_DTYPES, from_torch, nan_filled, skip_without_kernels, to_torch
from helpers.references.linear_q import K_FORMATS, contract_reference, random_blocks
from helpers.simd_paths import LEVELS, cpu_simd_level, run_in_child, skip_unless_level_available

FORMATS = llaisys.ops.QUANT_FORMATS
OPS = ["linear_q", "embedding_q"]
WITHOUT_THE_KERNEL = {"test_linear_q_is_refused_where_not_implemented", "test_pack_quant_round_trips_bit_exact",
                      "test_pack_quant_puts_each_weight_where_the_contract_says", "test_pack_quant_rejects_bad_input",
                      "test_dequantize_quant_follows_the_formulas"}


@pytest.fixture(autouse=True)
def _device_has_the_kernel(request):
    """A test on a device whose backend does not implement the ops is skipped, naming them."""
    if "device" in request.fixturenames and request.function.__name__ not in WITHOUT_THE_KERNEL:
        skip_without_kernels(request.getfixturevalue("device"), OPS, "this test")


# (M, N, K) for the group formats: K tails 1, 31, 33, 100, N around the 8 / 16 rows of a vector and a block,
# M = the decode sizes (1..9: groups of up to 8 rows of x per block), 17, 70.
GROUP_SHAPES = [(1, 1, 1), (2, 15, 31), (3, 17, 33), (4, 50, 100), (5, 16, 64), (6, 3, 96), (7, 33, 40),
                (8, 20, 257), (9, 17, 100), (17, 50, 33), (70, 15, 31)]
# The K formats (K % 256 == 0), and the Qwen2-1.5B projections' K (1536, 8960) at decode and prefill sizes.
K_SHAPES = [(1, 1, 256), (2, 15, 256), (3, 17, 512), (9, 50, 256), (17, 33, 768), (70, 20, 256)]
WIDE_SHAPES = [(1, 64, 1536), (3, 33, 1536), (2, 40, 8960), (16, 40, 1536), (70, 20, 8960)]


class Case:
    """Random inputs of one shape and format: llaisys tensors and their float64 references."""

    def __init__(self, fmt, shape, dtype, with_bias, device="cpu", seed=0):
        m, n, k = shape
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((m, k))
        x[rng.random((m, k)) < 0.02] *= 8  # a few large values, as activations have
        self.x_t = torch.from_numpy(x).to(TORCH_DTYPES[dtype])
        self.codes, *self.params = random_blocks(fmt, n, k, rng)
        self.w = llaisys.ops.dequantize_quant(fmt, self.codes, *self.params).astype(np.float64)
        self.bias_t = torch.from_numpy(rng.standard_normal(n)).to(TORCH_DTYPES[dtype]) if with_bias else None
        self.fmt, self.dtype, self.device, self.shape = fmt, dtype, device, shape
        weight, scales = llaisys.ops.pack_quant(fmt, self.codes, *self.params)
        self.weight, self.scales = llaisys.from_numpy(weight, device), llaisys.from_numpy(scales, device)
        self.x = from_torch(self.x_t, device)
        self.bias = None if self.bias_t is None else from_torch(self.bias_t, device)

    def run(self, x=None) -> torch.Tensor:
        x = self.x if x is None else x
        out = nan_filled((x.shape[0], self.shape[1]), self.dtype, self.device)
        llaisys.ops.linear_q(out, x, self.weight, self.scales, self.fmt, self.bias)
        return to_torch(out)

    def check(self):
        got = self.run().to(torch.float64).numpy()
        exact, tight, loose_extra = contract_reference(self.fmt, self.codes, self.params, self.w, self.x_t,
                                                       self.bias_t, self.dtype)
        bad = ~(np.abs(got - exact) <= tight)
        assert not bad.any(), (f"{self.fmt} {self.dtype.name} {self.shape}: {int(bad.sum())} outputs off the exact "
                               f"arithmetic; first {np.argwhere(bad)[0]}: got {got[bad][0]}, expected {exact[bad][0]}")
        unquantized, loose = loose_extra
        bad = ~(np.abs(got - unquantized) <= loose)
        assert not bad.any(), f"{self.fmt} {self.dtype.name} {self.shape}: {int(bad.sum())} outputs beyond the bound"


def shapes_of(fmt: str, wide: bool = True):
    return (K_SHAPES if fmt in K_FORMATS else GROUP_SHAPES) + (WIDE_SHAPES if wide else [])


def check_shapes(formats=FORMATS, dtypes=FLOAT_DTYPES, device="cpu", wide=True):
    """The tail shapes in every dtype of ``dtypes`` and the wide ones in one dtype each, in turn (the dtypes differ
    only in the loads and the final store); with wide=False (the other SIMD paths) every other tail shape, one
    dtype each (the paths share everything but the kernel's inner loop)."""
    for fmt in formats:
        tails, wides = shapes_of(fmt, wide=False), WIDE_SHAPES if wide else []
        for i, shape in enumerate(tails if wide else tails[::2]):
            for dtype in dtypes if wide else [dtypes[i % len(dtypes)]]:
                Case(fmt, shape, dtype, with_bias=i % 2 == 0, device=device, seed=i).check()
        for i, shape in enumerate(wides):
            Case(fmt, shape, dtypes[i % len(dtypes)], with_bias=i % 2 == 0, device=device, seed=i).check()


def check_rows_independent(device="cpu"):
    """Each row of out, bit for bit, alone or among 2..20 rows (groups of up to 8 rows of x per weight block)."""
    for i, fmt in enumerate(FORMATS):
        dtype = FLOAT_DTYPES[i % 3]
        case = Case(fmt, (20, 33, 512), dtype, with_bias=True, device=device, seed=len(fmt))
        everything = case.run().view(torch.int16 if dtype != llaisys.float32 else torch.int32)
        for start, m in ((0, 1), (19, 1), (3, 5), (11, 8), (2, 9), (7, 13)):
            rows = case.run(from_torch(case.x_t[start:start + m], device))
            assert torch.equal(rows.view(everything.dtype), everything[start:start + m]), (
                f"{fmt} {dtype.name}: rows [{start}, {start + m}) differ from the same rows in a batch of 20")


def check_embedding(device="cpu"):
    """embedding_q gives the rows dequantize_quant gives: exactly in f32, rounded once in f16 / bf16."""
    rng = np.random.default_rng(5)
    for fmt in FORMATS:
        vocab, dim = 37, (512 if fmt in K_FORMATS else 100)
        codes, *params = random_blocks(fmt, vocab, dim, rng)
        expected = torch.from_numpy(llaisys.ops.dequantize_quant(fmt, codes, *params))
        weight, scales = (llaisys.from_numpy(a, device) for a in llaisys.ops.pack_quant(fmt, codes, *params))
        index = np.array([0, 36, 17, 16, 15, 17], np.int64)
        for dtype in FLOAT_DTYPES:
            out = nan_filled((len(index), dim), dtype, device)
            llaisys.ops.embedding_q(out, llaisys.from_numpy(index, device), weight, scales, fmt, vocab)
            want = expected[index].to(TORCH_DTYPES[dtype])
            assert torch.equal(to_torch(out), want), f"{fmt} {dtype.name}: rows differ from dequantize_quant"


def check_all():
    check_shapes(wide=False)
    check_rows_independent()
    check_embedding()


@pytest.mark.parametrize("fmt", FORMATS)
def test_linear_q_matches_the_references(device, fmt):
    check_shapes(formats=[fmt], device=device)


def test_linear_q_rows_do_not_depend_on_the_batch(device):
    check_rows_independent(device)


def test_embedding_q_decodes_the_rows_it_reads(device):
    check_embedding(device)


# Every path of the CPU kernel: portable (scalar), avx2 (vpmaddubsw), avx512 without VNNI (vpmaddubsw on zmm),
# avx512 with VNNI (vpdpbusd; this process's path where the CPU has it).
PATHS = {level: {"LLAISYS_CPU_SIMD": level} for level in LEVELS}
PATHS["avx512-no-vnni"] = {"LLAISYS_CPU_SIMD": "avx512", "LLAISYS_CPU_LINEAR_VNNI": "0"}


@pytest.mark.parametrize("path", list(PATHS))
def test_block_linears_every_simd_path(device, path):
    """linear_i8's checks (test_linear_i8.check_all), moe_linear_i8's (test_moe_linear_i8.check_all),
    moe_linear_q's (test_moe_linear_q.check_all) and linear_q's, in one child process per path (they share the
    kernel; a child's start costs more than its checks)."""
    env = PATHS[path]
    skip_unless_level_available(device, env["LLAISYS_CPU_SIMD"])
    if env == {"LLAISYS_CPU_SIMD": cpu_simd_level()}:
        pytest.skip("this process's own path: the tests above ran it")
    run_in_child(__name__, env, "import ops.test_linear_i8 as i8; i8.check_all(); "
                 "import test_moe_linear_i8 as moe; moe.check_all(); import test_moe_linear_q as moe_q; "
                 "moe_q.check_all(); t.check_all()", expect_level=env["LLAISYS_CPU_SIMD"])


def test_linear_q_nan_in_a_group_poisons_its_row(device):
    case = Case("q4_k", (3, 20, 256), llaisys.float32, with_bias=False, device=device)
    x = case.x_t.clone()
    x[1, 40] = float("nan")
    got = case.run(from_torch(x, device))
    assert torch.isnan(got[1]).all() and torch.isfinite(got[[0, 2]]).all()


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_linear_q_empty_k_gives_bias(device, dtype):
    bias_t = torch.arange(5, dtype=TORCH_DTYPES[dtype])
    out = nan_filled((3, 5), dtype, device)
    x = llaisys.zeros((3, 0), dtype, device)
    w, s = llaisys.zeros((1, 0, 256), llaisys.uint8, device), llaisys.zeros((1, 0, 32), llaisys.uint8, device)
    llaisys.ops.linear_q(out, x, w, s, "q4_0", from_torch(bias_t, device))
    assert torch.equal(to_torch(out), bias_t.expand(3, 5))


def test_linear_q_rejects_bad_arguments(device):
    f32, u8 = llaisys.float32, llaisys.uint8
    m, n, k = 3, 5, 256
    out, x = llaisys.empty((m, n), f32, device), llaisys.zeros((m, k), f32, device)
    w, s = llaisys.zeros((1, 4, 512), u8, device), llaisys.zeros((1, 1, 320), u8, device)  # q4_k
    cases = [
        ("fmt", dict(fmt="q5_0")), ("fmt", dict(fmt=None)),
        ("weight", dict(weight=llaisys.zeros((1, 4, 512), llaisys.int8, device))),
        ("weight", dict(weight=llaisys.zeros((1, 8, 256), u8, device))),          # q4_0's shape
        ("scales", dict(scales=llaisys.zeros((1, 8, 32), u8, device))),
        ("scales", dict(scales=llaisys.zeros((1, 1, 320), f32, device))),
        ("multiple of 256", dict(x=llaisys.zeros((m, 100), f32, device))),
        ("bias", dict(bias=llaisys.zeros((n,), llaisys.float16, device))),
        ("out", dict(out=llaisys.empty((m + 1, n), f32, device))),
        ("x", dict(x=llaisys.zeros((k, m), f32, device).permute(1, 0))),
        ("bias", dict(bias=out.slice(0, 0, 1).view(n))),
    ]
    for what, override in cases:
        args = dict(out=out, x=x, weight=w, scales=s, fmt="q4_k", bias=None)
        args.update(override)
        with pytest.raises(llaisys.LlaisysError, match=what) as info:
            llaisys.ops.linear_q(args["out"], args["x"], args["weight"], args["scales"], args["fmt"], args["bias"])
        assert isinstance(info.value, ValueError), info.value


def test_embedding_q_rejects_bad_arguments(device):
    f32, u8 = llaisys.float32, llaisys.uint8
    w, s = llaisys.zeros((2, 4, 256), u8, device), llaisys.zeros((2, 4, 32), u8, device)  # q4_0 [20, 128]
    index = llaisys.from_numpy(np.array([0, 19], np.int64), device)
    out = llaisys.empty((2, 128), f32, device)
    with pytest.raises(llaisys.LlaisysError, match="index value 20 at position 1"):
        llaisys.ops.embedding_q(out, llaisys.from_numpy(np.array([0, 20], np.int64), device), w, s, "q4_0", 20)
    with pytest.raises(llaisys.LlaisysError, match="weight has shape"):
        llaisys.ops.embedding_q(out, index, w, s, "q4_0", 40)  # 3 blocks of rows
    with pytest.raises(llaisys.LlaisysError, match="vocab"):
        llaisys.ops.embedding_q(out, index, w, s, "q4_0", -1)
    with pytest.raises(llaisys.LlaisysError, match="out has shape"):
        llaisys.ops.embedding_q(llaisys.empty((3, 128), f32, device), index, w, s, "q4_0", 20)


def test_linear_q_is_refused_where_not_implemented(device):
    if llaisys.ops.implemented("linear_q", device):
        pytest.skip(f"the '{device.type}' backend implements linear_q (the tests above run it)")
    out, x = llaisys.empty((3, 5), llaisys.float32, device), llaisys.zeros((3, 32), llaisys.float32, device)
    w, s = llaisys.zeros((1, 1, 256), llaisys.uint8, device), llaisys.zeros((1, 1, 32), llaisys.uint8, device)
    with pytest.raises(llaisys.LlaisysError, match=rf"op 'linear_q' is not implemented by the '{device.type}' backend"):
        llaisys.ops.linear_q(out, x, w, s, "q4_0")


# -- the layouts ------------------------------------------------------------------------------------------------


def contract_bytes(fmt: str, codes: np.ndarray, n: int, k: int) -> dict:
    """{(block, unit, byte): value} of some bytes of the weight blocks, read off backend.h's description."""
    rng = np.random.default_rng(1)
    expected = {}
    for _ in range(200):
        b, r = rng.integers(0, -(-n // 16)), rng.integers(0, 16)
        row = 16 * b + r
        code = (lambda kk, row=row: int(codes[row, kk]) & 0xFF if row < n and kk < k else 0)  # noqa: E731
        if fmt == "q8_0":
            g, s, i = rng.integers(0, -(-k // 32)), rng.integers(0, 8), rng.integers(0, 4)
            expected[(b, g, s * 64 + r * 4 + i)] = code(32 * g + 4 * s + i)
        elif fmt in ("q4_0", "q4_1"):
            g, c, i = rng.integers(0, -(-k // 32)), rng.integers(0, 4), rng.integers(0, 4)
            expected[(b, g, c * 64 + r * 4 + i)] = code(32 * g + 4 * c + i) | code(32 * g + 4 * c + i + 16) << 4
        elif fmt == "q4_k":
            u, c, i = rng.integers(0, k // 64), rng.integers(0, 8), rng.integers(0, 4)
            expected[(b, u, c * 64 + r * 4 + i)] = code(64 * u + 4 * c + i) | code(64 * u + 4 * c + i + 32) << 4
        else:  # nibble chunk c at 2 c (c < 8) or 16 + c - 8, field chunk c at 2 c + 1
            u, c, i, j = rng.integers(0, k // 128), rng.integers(0, 16), rng.integers(0, 4), rng.integers(0, 4)
            kk = 128 * u + 4 * c + i
            expected[(b, u, (2 * c if c < 8 else 8 + c) * 64 + r * 4 + i)] = (code(kk) & 15) | (code(kk + 64) & 15) << 4
            kk = 128 * u + 32 * j + 4 * (c % 8) + i
            key = (b, u, (2 * (c % 8) + 1) * 64 + r * 4 + i)
            expected[key] = expected.get(key, 0) | ((code(kk) >> 4) << (2 * j))
    return expected


@pytest.mark.parametrize("fmt", FORMATS)
def test_pack_quant_puts_each_weight_where_the_contract_says(fmt):
    rng = np.random.default_rng(2)
    n, k = 37, (512 if fmt in K_FORMATS else 100)
    codes, *params = random_blocks(fmt, n, k, rng)
    weight, scales = llaisys.ops.pack_quant(fmt, codes, *params)
    assert (weight.shape, scales.shape) == llaisys.ops.quant_shapes(fmt, n, k)
    expected = contract_bytes(fmt, codes, n, k)
    if fmt == "q6_k":  # the 2-bit fields (odd chunks of the first 1 KiB): only the nibbles' bytes are whole
        expected = {key: v for key, v in expected.items() if key[2] >= 1024 or key[2] // 64 % 2 == 0}
    for (b, u, byte), value in expected.items():
        assert weight[b, u, byte] == value, (fmt, b, u, byte)
    # the first scale record's first field is row 0's (and row 15's at byte 30) f16 scale d
    d = params[0]
    assert scales[0, 0, :2].view(np.float16)[0] == d[0, 0] and scales[0, 0, 30:32].view(np.float16)[0] == d[15, 0]


@pytest.mark.parametrize("fmt", FORMATS)
def test_pack_quant_round_trips_bit_exact(fmt):
    rng = np.random.default_rng(3)
    for n, k in ((1, 256), (16, 512), (37, 768)) if fmt in K_FORMATS else ((1, 1), (16, 32), (17, 33), (40, 100)):
        codes, *params = random_blocks(fmt, n, k, rng)
        back = llaisys.ops.unpack_quant(fmt, *llaisys.ops.pack_quant(fmt, codes, *params), n, k)
        for got, want in zip(back, (codes, *params)):
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def test_pack_quant_rejects_bad_input():
    codes, d = np.zeros((5, 40), np.uint8), np.zeros((5, 2), np.float16)
    for args, what in (((codes.astype(np.int8), d), "codes must be uint8"), ((codes + 16, d), r"in \[0, 15\]"),
                       ((codes, d.astype(np.float32)), "d must be float16"), ((codes, d, d), "takes the codes and d")):
        with pytest.raises(ValueError, match=what):
            llaisys.ops.pack_quant("q4_0", *args)
    with pytest.raises(ValueError, match="multiple of 256"):
        llaisys.ops.pack_quant("q4_k", codes, d, d, codes[:, :2], codes[:, :2])
    with pytest.raises(ValueError, match="unknown weight format"):
        llaisys.ops.quant_shapes("q3_k", 1, 256)


def test_dequantize_quant_follows_the_formulas():
    """A hand-made row per format: w = d q, d (u - 8), d u + m, (D sc) u - (Dm mn), (D sc) (q - 32)."""
    half = lambda v: np.array([[v]], np.float16)  # noqa: E731
    u = np.arange(32, dtype=np.uint8)[None] % 16
    assert llaisys.ops.dequantize_quant("q4_0", u, half(0.5))[0, 3] == 0.5 * (3 - 8)
    assert llaisys.ops.dequantize_quant("q4_1", u, half(0.5), half(-2))[0, 3] == 0.5 * 3 - 2
    assert llaisys.ops.dequantize_quant("q8_0", u.astype(np.int8) - 4, half(0.25))[0, 1] == 0.25 * -3
    u256 = np.tile(u, (1, 8))
    sc, mn = np.arange(8, dtype=np.uint8)[None] + 1, np.arange(8, dtype=np.uint8)[None] + 10
    w = llaisys.ops.dequantize_quant("q4_k", u256, half(0.5), half(0.25), sc, mn)
    assert w[0, 32 * 2 + 5] == 0.5 * 3 * 5 - 0.25 * 12
    sc16 = (np.arange(16, dtype=np.int8)[None] - 8)
    q = np.arange(256, dtype=np.uint8)[None] % 64
    w = llaisys.ops.dequantize_quant("q6_k", q, half(0.5), sc16)
    assert w[0, 16 * 3 + 2] == 0.5 * (3 - 8) * ((16 * 3 + 2) % 64 - 32)
