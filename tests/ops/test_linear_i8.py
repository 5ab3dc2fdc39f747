"""linear_i8: linear with int8 weights per group of 32 k (bf16 scales), x quantized per row on the fly.

Two references, both float64 numpy/torch built here from the contract (docs/architecture.md, backend.h):
- the exact arithmetic: x quantized as the contract says, every group's integer dot product, scaled by
  scales[g, n] * sx[m, g] and summed: the kernel must match it up to f32 rounding (tight);
- the unquantized x @ w.T of the float weights the int8 ones were made from: within the worst-case error
  that quantizing x and w can cause (loose, but a proven bound, not a guess).
Every SIMD path of the CPU backend runs the same checks in a child process (LLAISYS_CPU_SIMD, and
LLAISYS_CPU_LINEAR_VNNI=0 for AVX-512 CPUs without VNNI): test_linear_q.py starts one per path for both
block linears.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

import llaisys
from helpers import FLOAT_DTYPES, TORCH_DTYPES, from_torch, nan_filled, skip_without_kernels, to_torch
from helpers.references.int8 import GROUP, check_int8_outputs, quantize_weight

assert llaisys.ops.INT8_GROUP == GROUP

# tests that run on a device whose backend lacks the kernel: an empty output needs no kernel, and the error
# for a non-empty one is checked there
WITHOUT_THE_KERNEL = {"test_linear_i8_empty_m_and_n", "test_linear_i8_is_refused_where_not_implemented"}


@pytest.fixture(autouse=True)
def _device_has_the_kernel(request):
    """A test on a device whose backend does not implement linear_i8 (CUDA so far) is skipped, naming it."""
    if "device" in request.fixturenames and request.function.__name__ not in WITHOUT_THE_KERNEL:
        skip_without_kernels(request.getfixturevalue("device"), ["linear_i8"], "this test")

# (M, N, K): K tails 1, 31, 33, 100 (a short last group, odd chunks of 64), N tails 1, 15, 17, 50 (around the
# kernels' 8 / 16 rows per vector), M = 1..9 (the decode sizes, the groups of up to 8 rows of x), 17 and 70.
TAIL_SHAPES = ([(m, n, k) for i, (n, k) in enumerate((n, k) for n in (1, 15, 17, 50) for k in (1, 31, 33, 100))
                for m in ((1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 70)[i % 11], (9, 17, 70, 1)[i % 4])]
               + [(m, 17, 100) for m in range(1, 10)] + [(17, 50, 33), (70, 15, 31)])
# Larger K (many groups, chunks of 64 and 32), the Qwen2-1.5B projections' K at decode sizes, and M past one
# tile of rows of x (the kernel takes ~256 KiB of quantized x per pass: 24 rows at K = 8960).
WIDE_SHAPES = [(1, 64, 1536), (3, 33, 1536), (2, 40, 8960), (1, 256, 1536), (9, 20, 4097), (1, 1536, 1536),
               (70, 20, 8960)]


class Case:
    """Random inputs of one shape: llaisys tensors and their float64 references."""

    def __init__(self, shape, dtype, with_bias, device="cpu", seed=0):
        m, n, k = shape
        rng = np.random.default_rng(seed)
        tdt = TORCH_DTYPES[dtype]
        # x ~ N(0, 1) with a few large values (as activations have); w ~ N(0, 1/K): outputs are O(1)
        x = rng.standard_normal((m, k))
        x[rng.random((m, k)) < 0.02] *= 8
        self.x_t = torch.from_numpy(x).to(tdt)  # x as the kernel sees it (rounded to dtype)
        w = (rng.standard_normal((n, k)) * k ** -0.5).astype(np.float32)
        self.q, self.scales = quantize_weight(w)
        self.w_exact = w.astype(np.float64)
        self.bias_t = torch.from_numpy(rng.standard_normal(n)).to(tdt) if with_bias else None
        self.dtype, self.device, self.shape = dtype, device, shape
        self.x = from_torch(self.x_t, device)
        blocks, block_scales = llaisys.ops.pack_int8(self.q, self.scales)
        self.weight = llaisys.from_numpy(blocks, device)
        self.scale_t = llaisys.from_numpy(block_scales, device)
        self.bias = None if self.bias_t is None else from_torch(self.bias_t, device)

    def run(self, x=None) -> torch.Tensor:
        x = self.x if x is None else x
        out = nan_filled((x.shape[0], self.shape[1]), self.dtype, self.device)
        llaisys.ops.linear_i8(out, x, self.weight, self.scale_t, self.bias)
        return to_torch(out)

    def bias64(self) -> np.ndarray:
        return 0.0 if self.bias_t is None else self.bias_t.to(torch.float64).numpy()

    def check(self):
        got = self.run().to(torch.float64).numpy()
        x32 = self.x_t.to(torch.float32).numpy()  # exact: f16 / bf16 widen exactly
        check_int8_outputs(got, x32, self.q, self.scales, self.w_exact, self.bias64(), self.dtype, str(self.shape))


def check_shapes(shapes=TAIL_SHAPES + WIDE_SHAPES, dtypes=FLOAT_DTYPES, device="cpu"):
    for dtype in dtypes:
        for i, shape in enumerate(shapes):
            Case(shape, dtype, with_bias=i % 2 == 0, device=device, seed=i).check()


def check_rows_independent(device="cpu"):
    """Each row of out, bit for bit, alone or among 2..20 rows (groups of up to 8 rows of x per weight block)."""
    for dtype in FLOAT_DTYPES:
        for n, k in ((17, 100), (50, 1536), (33, 31)):
            case = Case((20, n, k), dtype, with_bias=True, device=device, seed=n + k)
            everything = case.run()
            for start, m in ((0, 1), (5, 1), (19, 1), (0, 2), (3, 5), (0, 8), (11, 8), (2, 9), (0, 13), (7, 13),
                             (0, 20)):
                rows = case.run(from_torch(case.x_t[start:start + m], device))
                assert torch.equal(rows.view(torch.int16 if rows.element_size() == 2 else torch.int32),
                                   everything[start:start + m].view(torch.int16 if rows.element_size() == 2
                                                                    else torch.int32)), (
                    f"{dtype.name} N={n} K={k}: rows [{start}, {start + m}) differ from the same rows in a batch of 20")


def check_all():
    check_shapes()
    check_rows_independent()


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_linear_i8_matches_the_references(device, dtype):
    check_shapes(dtypes=[dtype], device=device)


def test_linear_i8_rows_do_not_depend_on_the_batch(device):
    check_rows_independent(device)


# Every SIMD path of the CPU kernel runs check_all in a child process: test_linear_q.py's
# test_block_linears_every_simd_path, one child per path for the block linears and moe_linear_i8 (they share the
# kernel).


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_linear_i8_empty_k_gives_bias(device, dtype):
    """K = 0: no groups (weight [1, 0, 8, 16, 4], scales [1, 0, 16]), the sum is empty: out = bias, or 0."""
    bias_t = torch.arange(5, dtype=TORCH_DTYPES[dtype])
    out = nan_filled((3, 5), dtype, device)
    x, w = llaisys.zeros((3, 0), dtype, device), llaisys.zeros((1, 0, 8, 16, 4), llaisys.int8, device)
    scales = llaisys.zeros((1, 0, 16), llaisys.bfloat16, device)
    llaisys.ops.linear_i8(out, x, w, scales, from_torch(bias_t, device))
    assert torch.equal(to_torch(out), bias_t.expand(3, 5))
    llaisys.ops.linear_i8(out, x, w, scales)
    assert torch.equal(to_torch(out), torch.zeros(3, 5, dtype=TORCH_DTYPES[dtype]))


def test_linear_i8_empty_m_and_n(device):
    """M = 0 or N = 0: the call succeeds and writes nothing; the empty outputs are views into NaN-filled
    tensors, whose every element must still be NaN afterwards."""
    f32 = llaisys.float32
    case = Case((1, 4, 40), f32, with_bias=False, device=device)
    rows = nan_filled((3, 4), f32, device)
    out = rows.slice(0, 1, 1)  # [0, 4], between rows 0 and 1
    llaisys.ops.linear_i8(out, llaisys.zeros((0, 40), f32, device), case.weight, case.scale_t)
    assert out.shape == (0, 4) and np.isnan(rows.numpy()).all()
    columns = nan_filled((2, 4), f32, device)
    out = columns.slice(1, 2, 2)  # [2, 0], in the middle of each row
    llaisys.ops.linear_i8(out, llaisys.zeros((2, 40), f32, device), llaisys.zeros((0, 2, 8, 16, 4), llaisys.int8, device),
                          llaisys.zeros((0, 2, 16), llaisys.bfloat16, device), llaisys.zeros((0,), f32, device))
    assert out.shape == (2, 0) and np.isnan(columns.numpy()).all()


def test_linear_i8_is_refused_where_not_implemented(device):
    """Where the backend has no linear_i8, a call that has work to do says so (a LlaisysError naming the op and
    the backend), after the frontend's own checks, which are the same on every device."""
    if llaisys.ops.implemented("linear_i8", device):
        pytest.skip(f"the '{device.type}' backend implements linear_i8 (the tests above run it)")
    f32, bf16, i8 = llaisys.float32, llaisys.bfloat16, llaisys.int8
    out, x = llaisys.empty((3, 5), f32, device), llaisys.zeros((3, 40), f32, device)
    w, s = llaisys.zeros((1, 2, 8, 16, 4), i8, device), llaisys.zeros((1, 2, 16), bf16, device)
    with pytest.raises(ValueError, match="scales"):
        llaisys.ops.linear_i8(out, x, w, llaisys.zeros((1, 1, 16), bf16, device))
    with pytest.raises(llaisys.LlaisysError, match=rf"op 'linear_i8' is not implemented by the '{device.type}' backend"):
        llaisys.ops.linear_i8(out, x, w, s)


def test_linear_i8_nan_in_a_group_poisons_its_row(device):
    case = Case((3, 20, 70), llaisys.float32, with_bias=False, device=device)
    x = case.x_t.clone()
    x[1, 40] = float("nan")
    got = case.run(from_torch(x, device))
    assert torch.isnan(got[1]).all() and torch.isfinite(got[[0, 2]]).all()


def test_linear_i8_rejects_bad_arguments(device):
    f32, bf16, i8 = llaisys.float32, llaisys.bfloat16, llaisys.int8
    m, n, k = 3, 5, 40  # 1 block of rows, 2 groups
    out, x = llaisys.empty((m, n), f32, device), llaisys.zeros((m, k), f32, device)
    w, s = llaisys.zeros((1, 2, 8, 16, 4), i8, device), llaisys.zeros((1, 2, 16), bf16, device)
    cases = [
        ("weight", dict(weight=llaisys.zeros((1, 2, 8, 16, 4), f32, device))),  # not int8
        ("weight", dict(weight=llaisys.zeros((n, k), i8, device))),              # [N, K], not in blocks
        ("weight", dict(weight=llaisys.zeros((1, 3, 8, 16, 4), i8, device))),    # K mismatch (3 groups)
        ("weight", dict(weight=llaisys.zeros((2, 2, 8, 16, 4), i8, device))),    # N mismatch (2 blocks)
        ("scales", dict(scales=llaisys.zeros((1, 2, 16), f32, device))),         # not bf16
        ("scales", dict(scales=llaisys.zeros((2, n), bf16, device))),            # [G, N], not in blocks
        ("scales", dict(scales=llaisys.zeros((1, 1, 16), bf16, device))),        # too few groups
        ("bias", dict(bias=llaisys.zeros((n,), llaisys.float16, device))),      # dtype mismatch
        ("bias", dict(bias=llaisys.zeros((n + 1,), f32, device))),              # N mismatch
        ("out", dict(out=llaisys.empty((m + 1, n), f32, device))),              # M mismatch
        ("weight", dict(out=llaisys.empty((m, 17), f32, device))),              # N of out: 2 blocks of rows
        ("out", dict(out=llaisys.empty((m, n), bf16, device))),                 # dtype mismatch
        ("out", dict(out=llaisys.empty((m * n,), f32, device))),                # not 2-D
        ("x", dict(x=llaisys.zeros((k, m), f32, device).permute(1, 0))),        # non-contiguous
        ("scales", dict(scales=llaisys.zeros((1, 16, 2), bf16, device).permute(0, 2, 1))),  # non-contiguous
        ("x", dict(x=llaisys.zeros((m * k,), f32, device))),                    # not 2-D
        ("x", dict(x=llaisys.zeros((m, k), llaisys.int32, device), out=llaisys.empty((m, n), llaisys.int32, device))),
        ("bias", dict(bias=out.slice(0, 0, 1).view(n))),                       # out overlaps bias
    ]
    shared = llaisys.zeros((m * k + m * n,), f32, device)  # x and out sharing one element of a buffer
    cases.append(("x", dict(x=shared.slice(0, 0, m * k).view(m, k),
                            out=shared.slice(0, m * k - 1, m * k - 1 + m * n).view(m, n))))
    for name, override in cases:
        args = dict(out=out, x=x, weight=w, scales=s, bias=None)
        args.update(override)
        with pytest.raises(llaisys.LlaisysError, match=name) as info:
            llaisys.ops.linear_i8(args["out"], args["x"], args["weight"], args["scales"], args["bias"])
        assert isinstance(info.value, ValueError), info.value


def test_pack_int8_puts_each_weight_where_the_contract_says():
    """weight[b, g, s, r, i] = q[16 b + r, 32 g + 4 s + i] and scales[b, g, r] = scale(16 b + r, g), zeros past
    N and K; unpack_int8 gives q and the scales back."""
    rng = np.random.default_rng(3)
    for n, k in ((1, 1), (16, 32), (17, 33), (40, 100), (0, 5), (3, 0)):
        q = rng.integers(-127, 128, (n, k), dtype=np.int8)
        scales = rng.random((n, -(-k // 32))).astype(ml_dtypes.bfloat16)
        blocks, block_scales = llaisys.ops.pack_int8(q, scales)
        assert (blocks.shape, block_scales.shape) == llaisys.ops.int8_shapes(n, k)
        for b, g, s, r, i in np.ndindex(blocks.shape):
            row, col = 16 * b + r, 32 * g + 4 * s + i
            assert blocks[b, g, s, r, i] == (q[row, col] if row < n and col < k else 0)
        for b, g, r in np.ndindex(block_scales.shape):
            row = 16 * b + r
            assert block_scales[b, g, r] == (scales[row, g] if row < n else 0)
        back_q, back_scales = llaisys.ops.unpack_int8(blocks, block_scales, n, k)
        np.testing.assert_array_equal(back_q, q)
        np.testing.assert_array_equal(back_scales, scales)


def test_pack_int8_rejects_what_is_not_q_and_its_scales():
    q, scales = np.zeros((5, 40), np.int8), np.zeros((5, 2), ml_dtypes.bfloat16)
    for bad_q, bad_scales, what in ((q.astype(np.int16), scales, "q must be int8"), (q[0], scales, "q must be int8"),
                                    (q, scales.T, "scales must be bf16"), (q, scales.astype(np.float32), "scales")):
        with pytest.raises(ValueError, match=what):
            llaisys.ops.pack_int8(bad_q, bad_scales)
    with pytest.raises(ValueError, match="outputs must be"):
        llaisys.ops.pack_int8(q, scales, out_weight=np.zeros((1, 1, 8, 16, 4), np.int8))
    with pytest.raises(ValueError, match="blocks of an"):
        llaisys.ops.unpack_int8(*llaisys.ops.pack_int8(q, scales), 5, 100)


def test_linear_i8_replays_in_a_graph(device):
    """A captured linear_i8 re-reads x at each replay (the CPU backend records the call, quantizing x then)."""
    if not llaisys.graphs_supported(device):
        pytest.skip(f"{device} does not capture graphs")
    case = Case((2, 33, 100), llaisys.float32, with_bias=True, device=device)
    out = nan_filled((2, 33), llaisys.float32, device)
    llaisys.ops.linear_i8(out, case.x, case.weight, case.scale_t, case.bias)  # warm-up (scratch, plans)
    graph = llaisys.Graph(device)
    with graph.capture():
        llaisys.ops.linear_i8(out, case.x, case.weight, case.scale_t, case.bias)
    rng = np.random.default_rng(1)
    for _ in range(2):
        x_new = torch.from_numpy(rng.standard_normal((2, 100)).astype(np.float32))
        case.x.load(x_new.numpy())
        graph.replay()
        assert torch.equal(to_torch(out), case.run(from_torch(x_new, device)))
    graph.close()
