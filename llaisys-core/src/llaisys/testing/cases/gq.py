"""linear_gq: group-quantized weights (GPTQ / AWQ: 4- or 8-bit codes, an f16 scale and a zero point per row and
group), the activations as they are.

The reference is x (gathered through perm) times the exactly dequantized weights (q - z) * s, in float64, plus the
bias: what is left is the kernel's f32 summation, within the dtype's tolerance.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from ... import ops
from ...dtype import bfloat16, float16, float32
from ...stream import synchronize
from ...tensor import Tensor
from ..case import ALIASING, BATCH, CONTIGUOUS, ODD, PROPERTY, Case, Ctx
from ..compare import TOLERANCE, close, identical, refused

FLOATS = (float32, float16, bfloat16)


def gq_matrix(rng: np.random.Generator, n: int, k: int, bits: int, gs: int, symmetric: bool):
    """Random (q uint8 [n, k], scales f16 [n, G], zeros uint8 [n, G]) of pack_gq, weights ~ 1/sqrt(K) (outputs
    O(1)), every code value and both signs of a scale represented."""
    top = (1 << bits) - 1
    groups = k // gs if gs else 0
    q = rng.integers(0, top + 1, (n, k)).astype(np.uint8)
    size = max(k, 1) ** -0.5 / (top / 2)
    scales = (rng.choice([-1.0, 1.0], (n, groups)) * size * (0.5 + rng.random((n, groups)))).astype(np.float16)
    zeros = (np.full((n, groups), 1 << (bits - 1)) if symmetric else rng.integers(0, top + 1, (n, groups)))
    return q, scales, zeros.astype(np.uint8)


class GqLinear:
    """x, the blocks of a random [N, K] matrix, an optional bias and perm, on the device, with the float64 weights."""

    def __init__(self, ctx: Ctx, m: int, n: int, k: int, bits: int, group_size: int, symmetric: bool = False,
                 bias: bool = False, perm: str | None = None):
        self.ctx, self.n, self.bits, self.group_size = ctx, n, bits, group_size
        gs = k if group_size == -1 else group_size
        x = ctx.rng.standard_normal((m, k))
        x[ctx.rng.random((m, k)) < 0.02] *= 8  # a few large activations
        host = x.astype(ctx.dtype.numpy)
        self.x, self.x64 = ctx.upload(host), host.astype(np.float64)
        q, scales, zeros = gq_matrix(ctx.rng, n, k, bits, gs, symmetric)
        self.w = ops.dequantize_gq(q, scales, zeros, group_size).astype(np.float64)
        weight, block_scales, block_zeros = (ctx.upload(a) for a in ops.pack_gq(q, scales, zeros, bits, group_size))
        self.blocks = (weight, block_scales, block_zeros)
        self.bias: Tensor | None = None
        self.rb: np.ndarray = np.zeros(n)
        if bias:
            self.bias, self.rb = ctx.normal((n,))
        self.perm: Tensor | None = None
        self.order = np.arange(k)
        if perm is not None:
            self.order = ctx.rng.permutation(k)
            self.perm = ctx.upload(self.order.astype(perm))

    def run(self, x=None):
        x = self.x if x is None else x
        out = self.ctx.nan((x.shape[0], self.n))
        weight, scales, zeros = self.blocks
        ops.linear_gq(out, x, weight, scales, zeros, self.bits, self.group_size, self.bias, self.perm)
        return out.numpy()

    def expected(self) -> np.ndarray:
        return self.x64[:, self.order] @ self.w.T + self.rb


def _linear_gq(m, n, k, bits, group_size, symmetric, bias, perm, ctx: Ctx) -> None:
    case = GqLinear(ctx, m, n, k, bits, group_size, symmetric, bias, perm)
    close(case.run(), case.expected(), ctx.dtype, TOLERANCE[ctx.dtype])


def _linear_gq_batch(bits: int, perm, ctx: Ctx) -> None:
    """Rows computed alone (the decode path) are the same bits as inside a batch of 13 (the tiled path)."""
    case = GqLinear(ctx, 13, 33, 256, bits, 64, False, True, perm)
    batched = case.run()
    host = case.x64.astype(ctx.dtype.numpy)
    for start, rows in ((0, 1), (5, 1), (12, 1), (0, 2), (3, 4), (4, 8), (2, 9)):
        identical(case.run(ctx.upload(host[start:start + rows])), batched[start:start + rows],
                  f"rows [{start}, {start + rows}) computed alone vs in a batch of 13")


def _linear_gq_k0(ctx: Ctx) -> None:
    case = GqLinear(ctx, 3, 5, 0, 4, -1, bias=True)
    close(case.run(), case.expected(), ctx.dtype, TOLERANCE[ctx.dtype])


def _linear_gq_perm_out_of_range(ctx: Ctx) -> None:
    case = GqLinear(ctx, 2, 5, 64, 4, 32, perm="int64")
    order = case.order.copy()
    order[7] = 64
    case.perm = ctx.upload(order)

    def call():
        case.run()
        synchronize(ctx.device)
    refused(call, "64")


def _linear_gq_overlap(ctx: Ctx) -> None:
    case = GqLinear(ctx, 2, 4, 64, 4, 32)
    out = case.x.view(128).slice(0, 120, 128).view(2, 4)
    weight, scales, zeros = case.blocks
    refused(lambda: ops.linear_gq(out, case.x, weight, scales, zeros, 4, 32), "overlap")


# (m, n, k, bits, group size, symmetric, bias, perm dtype)
GQ_SHAPES = {
    ODD: [(1, 1, 32, 4, 32, False, True, None), (3, 17, 96, 4, -1, True, False, "int32"),
          (1, 15, 160, 8, 32, False, True, None), (17, 33, 64, 8, 64, True, False, "int64")],
    CONTIGUOUS: [(1, 48, 256, 4, 128, True, True, None), (9, 40, 384, 4, 128, False, False, "int32"),
                 (5, 32, 128, 8, -1, False, True, None), (16, 50, 192, 4, 64, False, True, "int64")],
}


def cases() -> list[Case]:
    out: list[Case] = []
    for dtype in FLOATS:
        for layout, shapes in GQ_SHAPES.items():
            for m, n, k, bits, gs, sym, bias, perm in shapes:
                name = (f"{bits}-bit gs {gs if gs > 0 else 'K'} {m}x{n}x{k} {'sym' if sym else 'asym'}"
                        f"{' bias' if bias else ''}{' perm ' + perm if perm else ''}")
                out.append(Case("linear_gq", dtype, layout, name,
                                partial(_linear_gq, m, n, k, bits, gs, sym, bias, perm)))
        out += [Case("linear_gq", dtype, PROPERTY, "K=0 gives bias", _linear_gq_k0),
                Case("linear_gq", dtype, BATCH, "4-bit 13x33x256 rows alone", partial(_linear_gq_batch, 4, None)),
                Case("linear_gq", dtype, BATCH, "8-bit perm 13x33x256 rows alone",
                     partial(_linear_gq_batch, 8, "int32"))]
    out += [Case("linear_gq", float32, PROPERTY, "perm out of range is refused", _linear_gq_perm_out_of_range),
            Case("linear_gq", float32, ALIASING, "out overlaps x", _linear_gq_overlap)]
    return out


def _perf_linear_gq(ctx: Ctx):
    case = GqLinear(ctx, 1, 8960, 1536, 4, 128)
    out = ctx.nan((1, 8960))
    weight, scales, zeros = case.blocks
    return lambda: ops.linear_gq(out, case.x, weight, scales, zeros, 4, 128)


PERF = {"linear_gq": ("4-bit gs 128 1x8960x1536", _perf_linear_gq)}
