"""linear_gq: group-quantized weights (GPTQ, AWQ) kept in their width, the activations as they are
(llaisys.ops.gq, backend.h ``linear_gq``).

The reference is torch in float64: x (the dtype's values, gathered through perm) @ the exactly dequantized weights
(q - z) * s, plus the bias, rounded once to the dtype; the kernel sums in f32, so it must be within the dtype's
tolerance (f32 1e-5, f16 1e-3, bf16 1e-2; atol = rtol). Every SIMD path of the CPU kernel runs the same checks in a
child process (LLAISYS_CPU_SIMD).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import llaisys
from helpers import FLOAT_DTYPES, nan_filled, skip_without_kernels
from helpers.simd_paths import LEVELS, cpu_simd_level, run_in_child, skip_unless_level_available
from llaisys.testing.compare import TOLERANCE, close

WITHOUT_THE_KERNEL = {"test_pack_gq_round_trips_and_follows_the_contract", "test_pack_gq_rejects_bad_input",
                      "test_gq_perm_sorts_columns_by_group", "test_linear_gq_is_refused_where_not_implemented"}


@pytest.fixture(autouse=True)
def _device_has_the_kernel(request):
    if "device" in request.fixturenames and request.function.__name__ not in WITHOUT_THE_KERNEL:
        skip_without_kernels(request.getfixturevalue("device"), ["linear_gq"], "this test")


def random_gq(rng, n, k, bits, gs, symmetric):
    """(q uint8 [n, k], scales f16 [n, G], zeros uint8 [n, G]): every code, both scale signs, weights ~ 1/sqrt(K)."""
    top = (1 << bits) - 1
    groups = k // gs if gs else 0
    q = rng.integers(0, top + 1, (n, k)).astype(np.uint8)
    size = max(k, 1) ** -0.5 / (top / 2)
    scales = (rng.choice([-1.0, 1.0], (n, groups)) * size * (0.5 + rng.random((n, groups)))).astype(np.float16)
    zeros = np.full((n, groups), 1 << (bits - 1)) if symmetric else rng.integers(0, top + 1, (n, groups))
    return q, scales, zeros.astype(np.uint8)


class Case:
    """Random inputs of one configuration: llaisys tensors and their float64 reference."""

    def __init__(self, m, n, k, bits=4, group_size=128, dtype=llaisys.float32, symmetric=False, bias=False,
                 perm=None, device="cpu", seed=0):
        rng = np.random.default_rng(seed)
        self.m, self.n, self.k, self.bits, self.group_size = m, n, k, bits, group_size
        self.dtype, self.device = dtype, device
        gs = k if group_size == -1 else group_size
        x = rng.standard_normal((m, k))
        x[rng.random((m, k)) < 0.02] *= 8  # a few large activations
        self.x_host = x.astype(dtype.numpy)
        self.q, self.scales, self.zeros = random_gq(rng, n, k, bits, gs, symmetric)
        self.w64 = torch.from_numpy(llaisys.ops.dequantize_gq(self.q, self.scales, self.zeros, group_size)).double()
        self.blocks = [llaisys.from_numpy(a, device)
                       for a in llaisys.ops.pack_gq(self.q, self.scales, self.zeros, bits, group_size)]
        self.bias_host = rng.standard_normal(n).astype(dtype.numpy) if bias else None
        self.bias = None if self.bias_host is None else llaisys.from_numpy(self.bias_host, device)
        self.order = rng.permutation(k) if perm else np.arange(k)
        self.perm = llaisys.from_numpy(self.order.astype(perm), device) if perm else None

    def run(self, x_host=None) -> np.ndarray:
        x_host = self.x_host if x_host is None else x_host
        out = nan_filled((x_host.shape[0], self.n), self.dtype, self.device)
        llaisys.ops.linear_gq(out, llaisys.from_numpy(x_host, self.device), *self.blocks, self.bits, self.group_size,
                              self.bias, self.perm)
        return out.numpy()

    def reference(self) -> np.ndarray:
        x = torch.from_numpy(self.x_host.astype(np.float64))[:, torch.from_numpy(self.order)]
        want = x @ self.w64.T
        if self.bias_host is not None:
            want = want + torch.from_numpy(self.bias_host.astype(np.float64))
        return want.numpy()

    def check(self):
        close(self.run(), self.reference(), self.dtype, TOLERANCE[self.dtype],
              f"{self.bits}-bit gs {self.group_size} {self.dtype.name} {self.m}x{self.n}x{self.k}")


# (M, N, K, group size): M = 1 and 3 (decode, unpacked on the fly), 17 and 64 (tiles of rows and their tails); N
# around a vector (8), a block (16) and a decode tile; K not a multiple of 256; group sizes 32 / 64 / 128 / K.
SHAPES = [(1, 17, 96, 32), (3, 33, 160, 32), (17, 50, 192, 64), (64, 40, 384, 128), (1, 64, 416, 32),
          (3, 7, 128, -1), (17, 1, 64, 64), (64, 24, 96, -1), (2, 100, 256, 128), (5, 16, 320, 64),
          (20, 100, 256, 128)]
# The Qwen2-1.5B projections' K (1536, 8960) at decode and prefill sizes, and more rows than one pass takes (256).
WIDE = [(1, 70, 1536, 128), (4, 33, 8960, 128), (64, 48, 1536, -1), (20, 30, 8960, 64), (300, 40, 512, 128)]


def check_all(device="cpu", dtypes=FLOAT_DTYPES, wide=True):
    i = 0
    for bits in (4, 8):
        for shape in SHAPES:
            for dtype in dtypes:
                m, n, k, gs = shape
                perm = (None, "int32", "int64")[i % 3]
                Case(m, n, k, bits, gs, dtype, symmetric=i % 4 == 1, bias=i % 2 == 0, perm=perm, device=device,
                     seed=i).check()
                i += 1
    for j, (m, n, k, gs) in enumerate(WIDE if wide else []):
        Case(m, n, k, 4 if j % 2 == 0 else 8, gs, dtypes[j % len(dtypes)], bias=True, perm="int32" if j % 2 else None,
             device=device, seed=100 + j).check()


def check_rows_independent(device="cpu"):
    """Row m computed alone (M = 1: the decode path) or in a batch of 2..64 (or 300: two passes of rows) is the same
    bits."""
    for j, (bits, gs, perm) in enumerate(((4, 128, None), (8, 64, "int32"), (4, -1, "int64"), (8, 32, None))):
        dtype = FLOAT_DTYPES[j % 3]
        m_all = 300 if j == 0 else 64
        case = Case(m_all, 40, 512, bits, gs, dtype, bias=True, perm=perm, device=device, seed=7 + j)
        batch = case.run()
        for start, m in ((0, 1), (63, 1), (17, 1), (5, 3), (9, 4), (11, 5), (30, 17)) + ((299, 1), (250, 9)) * (j == 0):
            rows = case.run(case.x_host[start:start + m])
            assert rows.view(np.uint8).tobytes() == batch[start:start + m].view(np.uint8).tobytes(), (
                f"{bits}-bit gs {gs} {dtype.name}: rows [{start}, {start + m}) alone differ from the batch of {m_all}")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_linear_gq_matches_the_float64_reference(device, dtype):
    check_all(device, [dtype], wide=dtype == llaisys.bfloat16)


def test_linear_gq_rows_do_not_depend_on_the_batch(device):
    check_rows_independent(device)


@pytest.mark.parametrize("level", LEVELS)
def test_linear_gq_every_simd_path(device, level):
    """The same checks on each build of the CPU kernel (portable, avx2, avx512), in a child process."""
    skip_unless_level_available(device, level)
    if level == cpu_simd_level():
        pytest.skip("this process's own path: the tests above ran it")
    run_in_child(__name__, {"LLAISYS_CPU_SIMD": level}, "t.check_all(wide=False); t.check_rows_independent()",
                 expect_level=level)


def test_linear_gq_nan_in_x_poisons_its_row(device):
    case = Case(3, 20, 128, 4, 32, device=device)
    x = case.x_host.copy()
    x[1, 40] = np.nan
    got = case.run(x)
    assert np.isnan(got[1]).all() and np.isfinite(got[[0, 2]]).all()


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_linear_gq_empty_k_gives_bias(device, dtype):
    case = Case(3, 5, 0, 4, -1, dtype, bias=True, device=device)
    assert np.array_equal(case.run().astype(np.float64), np.broadcast_to(case.bias_host.astype(np.float64), (3, 5)))


@pytest.mark.parametrize("bad", [64, -1, 1 << 40])
def test_linear_gq_perm_out_of_range_is_refused(device, bad):
    case = Case(2, 5, 64, 4, 32, perm="int64", device=device)
    order = case.order.copy()
    order[9] = bad
    case.perm = llaisys.from_numpy(order, device)
    with pytest.raises(llaisys.LlaisysError, match=str(bad)) as info:
        case.run()
        llaisys.synchronize(device)
    assert isinstance(info.value, ValueError)


def test_linear_gq_rejects_bad_arguments(device):
    f32, u8, f16 = llaisys.float32, llaisys.uint8, llaisys.float16
    m, n, k = 3, 20, 128
    w, s, z = (llaisys.from_numpy(a, device) for a in llaisys.ops.pack_gq(
        *random_gq(np.random.default_rng(0), n, k, 4, 32, False), 4, 32))
    out, x = llaisys.empty((m, n), f32, device), llaisys.zeros((m, k), f32, device)
    cases = [
        ("bits must be 4 or 8, got 3", dict(bits=3)),
        ("bits must be 4 or 8", dict(bits="4")),
        ("group_size = 48 must be", dict(group_size=48)),         # not a multiple of 32
        ("group_size = 96 does not divide K = 128", dict(group_size=96)),
        ("group_size = 0", dict(group_size=0)),
        ("group_size must be an int", dict(group_size=32.0)),
        ("multiple of 32", dict(x=llaisys.zeros((m, 100), f32, device))),
        ("weight has shape", dict(weight=llaisys.zeros((2, 32, 64), u8, device))),  # 8-bit's shape
        ("weight has dtype", dict(weight=llaisys.zeros((2, 16, 64), llaisys.int8, device))),
        ("scales has shape", dict(scales=llaisys.zeros((2, 2, 16), f16, device))),
        ("scales has dtype", dict(scales=llaisys.zeros((2, 4, 16), llaisys.bfloat16, device))),
        ("zeros has shape", dict(zeros=llaisys.zeros((2, 4, 8), u8, device))),
        ("perm has shape", dict(perm=llaisys.zeros((k - 1,), llaisys.int32, device))),
        ("perm has dtype", dict(perm=llaisys.zeros((k,), llaisys.float32, device))),
        ("perm has dtype", dict(perm=llaisys.zeros((k,), llaisys.uint8, device))),
        ("bias", dict(bias=llaisys.zeros((n,), f16, device))),
        ("bias has shape", dict(bias=llaisys.zeros((n + 1,), f32, device))),
        ("out has shape", dict(out=llaisys.empty((m + 1, n), f32, device))),
        ("x must be contiguous", dict(x=llaisys.zeros((k, m), f32, device).permute(1, 0))),
        ("x has dtype", dict(x=llaisys.zeros((m, k), llaisys.int32, device))),
        ("overlap", dict(bias=out.slice(0, 0, 1).view(n))),
    ]
    for what, override in cases:
        args = dict(out=out, x=x, weight=w, scales=s, zeros=z, bits=4, group_size=32, bias=None, perm=None)
        args.update(override)
        with pytest.raises(llaisys.LlaisysError, match=what) as info:
            llaisys.ops.linear_gq(**args)
        assert isinstance(info.value, ValueError), info.value


def test_linear_gq_is_refused_where_not_implemented(device):
    if llaisys.ops.implemented("linear_gq", device):
        pytest.skip(f"the '{device.type}' backend implements linear_gq (the tests above run it)")
    out, x = llaisys.empty((3, 5), llaisys.float32, device), llaisys.zeros((3, 32), llaisys.float32, device)
    w, s, z = (llaisys.from_numpy(a, device) for a in llaisys.ops.pack_gq(
        *random_gq(np.random.default_rng(0), 5, 32, 4, 32, True), 4, 32))
    with pytest.raises(llaisys.LlaisysError, match=r"op 'linear_gq' is not implemented"):
        llaisys.ops.linear_gq(out, x, w, s, z, 4, 32)


# -- the layout and the helpers (no kernel) ---------------------------------------------------------------------


@pytest.mark.parametrize("bits", [4, 8])
def test_pack_gq_round_trips_and_follows_the_contract(bits):
    """pack_gq puts each code where backend.h says (read back here from the description, byte by byte), and
    unpack_gq undoes it."""
    rng = np.random.default_rng(bits)
    n, k, gs = 37, 192, 64
    q, scales, zeros = random_gq(rng, n, k, bits, gs, False)
    weight, s_blocks, z_blocks = llaisys.ops.pack_gq(q, scales, zeros, bits, gs)
    assert (weight.shape, s_blocks.shape, z_blocks.shape) == llaisys.ops.gq_shapes(n, k, bits, gs)
    assert weight.shape == (3, k * bits // 32, 64) and s_blocks.dtype == np.float16
    per = 32 // bits
    for row in range(48):
        for col in range(k):
            word = int.from_bytes(weight[row // 16, col // per, 4 * (row % 16):4 * (row % 16) + 4].tobytes(), "little")
            code = (word >> (bits * (col % per))) & ((1 << bits) - 1)
            assert code == (q[row, col] if row < n else 0), (row, col)
        for g in range(k // gs):
            assert s_blocks[row // 16, g, row % 16] == (scales[row, g] if row < n else 0)
            assert z_blocks[row // 16, g, row % 16] == (zeros[row, g] if row < n else 0)
    back = llaisys.ops.unpack_gq(weight, s_blocks, z_blocks, n, k, bits, gs)
    for got, want in zip(back, (q, scales, zeros)):
        assert got.dtype == want.dtype and np.array_equal(got, want)
    w = llaisys.ops.dequantize_gq(q, scales, zeros, gs)
    g = np.arange(k) // gs
    assert np.array_equal(w, (q.astype(np.float64) - zeros[:, g]) * scales[:, g].astype(np.float64))


def test_pack_gq_rejects_bad_input():
    q = np.zeros((4, 64), np.uint8)
    s, z = np.ones((4, 2), np.float16), np.full((4, 2), 8, np.uint8)
    for what, args in (("bits must be 4 or 8", (q, s, z, 3, 32)), ("does not divide", (q, s, z, 4, 96)),
                       ("multiple of 32", (q[:, :48], s, z, 4, -1)), ("q must lie in", (q + 16, s, z, 4, 32)),
                       ("zeros must lie in", (q, s, z + 8, 4, 32)),
                       ("scales must be float16", (q, s.astype(np.float32), z, 4, 32)),
                       ("q must be uint8", (q.astype(np.int32), s, z, 4, 32)),
                       ("zeros must be uint8", (q, s, z[:, :1], 4, 32))):
        with pytest.raises(ValueError, match=what):
            llaisys.ops.pack_gq(*args)


def test_gq_perm_sorts_columns_by_group():
    rng = np.random.default_rng(3)
    g_idx = np.repeat(np.arange(4), 32)
    rng.shuffle(g_idx)
    perm = llaisys.ops.gq_perm(g_idx, 32)
    assert perm.dtype == np.int32 and np.array_equal(g_idx[perm], np.arange(128) // 32)
    with pytest.raises(ValueError, match="exactly 32"):
        llaisys.ops.gq_perm(np.r_[g_idx[:-1], 0], 32)


def test_desc_act_through_perm_equals_the_unsorted_matrix(device):
    """A desc_act checkpoint: columns assigned to groups at random (g_idx). Sorting them by group (gq_perm), packing
    q[:, perm] and passing perm gives x @ W.T with W the checkpoint's own (unsorted) dequantized matrix."""
    skip_without_kernels(device, ["linear_gq"], "this test")
    rng = np.random.default_rng(11)
    n, k, gs, bits = 24, 256, 64, 4
    g_idx = np.repeat(np.arange(k // gs), gs)
    rng.shuffle(g_idx)
    q, scales, zeros = random_gq(rng, n, k, bits, gs, False)
    w = (q.astype(np.float64) - zeros[:, g_idx]) * scales[:, g_idx].astype(np.float64)  # the checkpoint's matrix
    perm = llaisys.ops.gq_perm(g_idx, gs)
    blocks = [llaisys.from_numpy(a, device) for a in llaisys.ops.pack_gq(np.ascontiguousarray(q[:, perm]), scales,
                                                                         zeros, bits, gs)]
    x = rng.standard_normal((5, k)).astype(np.float32)
    out = nan_filled((5, n), llaisys.float32, device)
    llaisys.ops.linear_gq(out, llaisys.from_numpy(x, device), *blocks, bits, gs, perm=llaisys.from_numpy(perm, device))
    close(out.numpy(), x.astype(np.float64) @ w.T, llaisys.float32, TOLERANCE[llaisys.float32])
