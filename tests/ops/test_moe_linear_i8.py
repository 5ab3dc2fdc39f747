"""moe_linear_i8: the grouped expert linear with each expert's weight in linear_i8's int8 blocks.

Each (row, slot) output is checked three ways: against the float64 references of linear_i8 (the exact int8
arithmetic, tight; the unquantized product, within the proven quantization bound: test_linear_i8), bit for
bit against ``linear_i8`` of that input row and expert alone, and bit for bit against the same row decoded
alone or with the rest of the batch. Every SIMD path of the CPU backend runs the same checks in a child
process (test_linear_i8.test_int8_kernels_every_simd_path: LLAISYS_CPU_SIMD, LLAISYS_CPU_LINEAR_VNNI=0).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import llaisys
from helpers import FLOAT_DTYPES, TORCH_DTYPES, from_torch, nan_filled, skip_without_kernels, to_torch
from helpers.references.int8 import check_int8_outputs, quantize_weight
from helpers.references.moe import bits, random_experts

# tests that run on a device whose backend lacks the kernel (CUDA so far)
WITHOUT_THE_KERNEL = {"test_moe_linear_i8_is_refused_where_not_implemented", "test_moe_linear_i8_rejects_bad_arguments"}


@pytest.fixture(autouse=True)
def _device_has_the_kernel(request):
    if "device" in request.fixturenames and request.function.__name__ not in WITHOUT_THE_KERNEL:
        skip_without_kernels(request.getfixturevalue("device"), ["moe_linear_i8"], "this test")


# (M, k, E, N, K): K tails (1, 33, 100: a short last group), N tails (1, 17, 50: around 8 / 16 rows a vector,
# a short last block), 1..20 rows per expert (the groups of up to 8 rows of x a block), per-slot inputs, many
# experts few chosen.
SHAPES = [(1, 2, 8, 17, 33), (3, 1, 3, 1, 1), (5, 2, 4, 50, 100), (20, 2, 3, 33, 64), (2, 8, 64, 40, 300),
          (9, 4, 6, 20, 1101)]
# A decode step of the benchmark's Qwen3-MoE-like gate / up projection (hidden 2048, experts of width 768, top
# 8), of 9 experts rather than 64 (the reference quantizes every expert in numpy; the kernel reads only the
# chosen ones either way). The down projection's per-slot inputs are SHAPES' odd ones.
QWEN3_MOE_SHAPE = (1, 8, 9, 768, 2048)


class Case:
    """Random inputs of one shape: x, E experts' weights (their float values and int8 blocks), expert ids."""

    def __init__(self, shape, dtype, per_slot, device="cpu", seed=0):
        m, k, e, n, kk = shape
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((m, k, kk) if per_slot else (m, kk))
        x[rng.random(x.shape) < 0.02] *= 8  # a few large values, as activations have
        self.x_t = torch.from_numpy(x).to(TORCH_DTYPES[dtype])
        self.w = (rng.standard_normal((e, n, kk)) * kk ** -0.5).astype(np.float32)
        quantized = [quantize_weight(w) for w in self.w]
        self.q, self.scales = [q for q, _ in quantized], [s for _, s in quantized]
        blocks = [llaisys.ops.pack_int8(q, s) for q, s in quantized]
        self.weight = llaisys.from_numpy(np.stack([b for b, _ in blocks]), device)
        self.scale_t = llaisys.from_numpy(np.stack([s for _, s in blocks]), device)
        self.ids = random_experts(m, k, e, torch.Generator().manual_seed(seed))
        self.shape, self.dtype, self.per_slot, self.device = shape, dtype, per_slot, device

    def input(self, row: int, slot: int) -> torch.Tensor:
        return self.x_t[row, slot] if self.per_slot else self.x_t[row]

    def run(self, rows=slice(None)) -> torch.Tensor:
        x, ids = self.x_t[rows], self.ids[rows]
        out = nan_filled((ids.shape[0], ids.shape[1], self.shape[3]), self.dtype, self.device)
        llaisys.ops.moe_linear_i8(out, from_torch(x, self.device), self.weight, self.scale_t,
                                  from_torch(ids, self.device))
        return to_torch(out)

    def check_references(self, out: torch.Tensor) -> None:
        """Every expert's outputs against the float64 references, its (row, slot) inputs stacked."""
        got = out.to(torch.float64).numpy()
        m, k = self.ids.shape
        for e in sorted(set(self.ids.flatten().tolist())):
            pairs = [(r, j) for r in range(m) for j in range(k) if self.ids[r, j] == e]
            x32 = torch.stack([self.input(r, j) for r, j in pairs]).to(torch.float32).numpy()
            check_int8_outputs(np.stack([got[r, j] for r, j in pairs]), x32, self.q[e], self.scales[e],
                               self.w[e].astype(np.float64), 0.0, self.dtype, f"{self.shape} expert {e}")

    def check_is_linear_i8(self, out: torch.Tensor) -> None:
        """Each (row, slot) output, bit for bit, linear_i8 of its input row and its expert's blocks alone."""
        m, k = self.ids.shape
        n = self.shape[3]
        for r in range(m):
            for j in range(k):
                e = int(self.ids[r, j])
                alone = nan_filled((1, n), self.dtype, self.device)
                weight = self.weight.slice(0, e, e + 1).view(*self.weight.shape[1:])
                scales = self.scale_t.slice(0, e, e + 1).view(*self.scale_t.shape[1:])
                llaisys.ops.linear_i8(alone, from_torch(self.input(r, j)[None], self.device), weight, scales)
                assert torch.equal(bits(to_torch(alone)[0]), bits(out[r, j])), (
                    f"{self.dtype.name} {self.shape}: row {r} slot {j} (expert {e}) differs from linear_i8 alone")


def check_shapes(shapes=SHAPES, dtypes=FLOAT_DTYPES, device="cpu"):
    for dtype in dtypes:
        for i, shape in enumerate(shapes):
            case = Case(shape, dtype, per_slot=i % 2 == 1, device=device, seed=i)
            out = case.run()
            case.check_references(out)
            case.check_is_linear_i8(out)


def check_rows_independent(device="cpu"):
    """Rows of a batch, bit for bit, what they are alone or in a part of the batch (an expert's rows then come
    in other numbers: other groups of up to 8 rows against each block)."""
    for dtype in FLOAT_DTYPES:
        case = Case((24, 2, 3, 33, 100), dtype, per_slot=False, device=device, seed=5)
        everything = case.run()
        for start, stop in ((0, 1), (7, 8), (23, 24), (3, 9), (0, 13), (5, 24)):
            assert torch.equal(bits(case.run(slice(start, stop))), bits(everything[start:stop])), (
                f"{dtype.name}: rows [{start}, {stop}) differ from the same rows in a batch of 24")


def check_all():
    check_shapes()
    check_rows_independent()


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_moe_linear_i8_matches_the_references_and_linear_i8(device, dtype):
    check_shapes(dtypes=[dtype], device=device)


def test_moe_linear_i8_qwen3_moe_decode_shape(device):
    case = Case(QWEN3_MOE_SHAPE, llaisys.bfloat16, per_slot=False, device=device, seed=11)
    out = case.run()
    case.check_references(out)
    case.check_is_linear_i8(out)


def test_moe_linear_i8_rows_do_not_depend_on_the_batch(device):
    check_rows_independent(device)


# Every other SIMD path of the CPU kernel runs check_all in test_linear_i8's child processes (one per path: the
# kernels share their pieces, and a child costs seconds of imports).


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_moe_linear_i8_empty_k_gives_zeros(device, dtype):
    """K = 0: no groups (weight [E, 1, 0, 8, 16, 4]): every output is an empty sum, 0."""
    out = nan_filled((3, 2, 5), dtype, device)
    llaisys.ops.moe_linear_i8(out, llaisys.zeros((3, 0), dtype, device),
                              llaisys.zeros((4, 1, 0, 8, 16, 4), llaisys.int8, device),
                              llaisys.zeros((4, 1, 0, 16), llaisys.bfloat16, device),
                              from_torch(torch.tensor([[0, 3], [1, 2], [3, 0]]), device))
    assert torch.equal(to_torch(out), torch.zeros(3, 2, 5, dtype=TORCH_DTYPES[dtype]))


@pytest.mark.parametrize("bad", [-1, 4, 1 << 40])
def test_moe_linear_i8_refuses_an_expert_id_out_of_range(device, bad):
    case = Case((2, 2, 4, 3, 40), llaisys.float32, per_slot=False, device=device)
    out = nan_filled((2, 2, 3), llaisys.float32, device)
    with pytest.raises(llaisys.LlaisysError, match=rf"experts\[1, 0\] = {bad} is not an expert id in \[0, 4\)"):
        llaisys.ops.moe_linear_i8(out, from_torch(case.x_t, device), case.weight, case.scale_t,
                                  from_torch(torch.tensor([[0, 1], [bad, 2]]), device))
    assert torch.isnan(to_torch(out)).all(), "a refused call must not write"


def test_moe_linear_i8_rejects_bad_arguments(device):
    """Each bad argument is a ValueError naming it, before any kernel (the same on every device)."""
    f32, bf16, i8, i64 = llaisys.float32, llaisys.bfloat16, llaisys.int8, llaisys.int64
    z = lambda *shape, dtype=f32: llaisys.zeros(shape, dtype, device)  # noqa: E731
    w, s, ids = z(4, 1, 2, 8, 16, 4, dtype=i8), z(4, 1, 2, 16, dtype=bf16), z(2, 2, dtype=i64)  # 4 experts [3, 40]
    op = llaisys.ops.moe_linear_i8
    cases = [
        ((z(2, 2, 3), z(2, 40), w, s, z(2, 2, dtype=llaisys.int32)), "experts"),   # int32 ids
        ((z(2, 2, 3), z(2, 40), z(4, 3, 40, dtype=i8), s, ids), "weight"),        # not the blocks
        ((z(2, 2, 3), z(2, 40), w.slice(2, 0, 1), s, ids), "weight"),             # the blocks of K = 32
        ((z(2, 2, 3), z(2, 40), w, z(4, 1, 1, 16, dtype=bf16), ids), "scales"),   # scales of K = 32
        ((z(2, 2, 3), z(2, 40), w, z(4, 1, 2, 16), ids), "scales"),               # scales not bf16
        ((z(2, 2, 3), z(2, 40), z(4, 1, 2, 8, 16, 4), s, ids), "weight"),         # weight not int8
        ((z(2, 2, 3), z(2, 40, dtype=bf16), w, s, ids), "x"),                     # x dtype != out dtype
        ((z(2, 2, 3), z(3, 40), w, s, ids), "x"),                                 # M mismatch
        ((z(2, 2, 3), z(2, 3, 40), w, s, ids), "x"),                              # per-slot x with 3 slots
        ((z(2, 2, 20), z(2, 40), w, s, ids), "weight"),                           # N = 20 needs 2 blocks
        ((z(2, 3), z(2, 40), w, s, ids), "out"),                                  # out not [M, k, N]
        ((z(2, 2, 3), z(40, 2).permute(1, 0), w, s, ids), "x"),                   # x not contiguous
    ]
    for args, name in cases:
        with pytest.raises(llaisys.LlaisysError, match=name) as info:
            op(*args)
        assert isinstance(info.value, ValueError)
    buffer = z(80)  # x [2, 40] and out [2, 2, 3] in one buffer
    with pytest.raises(llaisys.LlaisysError, match="overlap"):
        op(buffer.slice(0, 0, 12).view(2, 2, 3), buffer.view(2, 40), w, s, ids)


def test_moe_linear_i8_is_refused_where_not_implemented(device):
    """Where the backend has no moe_linear_i8 (CUDA so far), a call says so, naming the op and the backend."""
    if llaisys.ops.implemented("moe_linear_i8", device):
        pytest.skip(f"the '{device.type}' backend implements moe_linear_i8 (the tests above run it)")
    f32, bf16, i8 = llaisys.float32, llaisys.bfloat16, llaisys.int8
    with pytest.raises(llaisys.LlaisysError,
                       match=rf"op 'moe_linear_i8' is not implemented by the '{device.type}' backend"):
        llaisys.ops.moe_linear_i8(llaisys.empty((2, 2, 3), f32, device), llaisys.zeros((2, 40), f32, device),
                                  llaisys.zeros((4, 1, 2, 8, 16, 4), i8, device),
                                  llaisys.zeros((4, 1, 2, 16), bf16, device),
                                  from_torch(torch.tensor([[0, 1], [2, 3]]), device))
