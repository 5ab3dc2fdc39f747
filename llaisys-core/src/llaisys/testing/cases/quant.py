"""The quantized ops: linear_i8 and moe_linear_i8 (int8 weights, bf16 scales per 32 k), linear_q, moe_linear_q and
embedding_q (the ggml block formats q8_0, q4_0, q4_1, q4_k, q6_k).

The linears quantize each row of x on the fly (backend.h: sx = max|x| / 127 per group of 32 k, round half to
even), so the reference is x quantized the same way (in the same f32 arithmetic) times the exact weights the
blocks hold, in float64: what is left is the kernel's f32 summation, within the dtype's tolerance.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from ... import ops
from ...dtype import bfloat16, float16, float32
from ...stream import synchronize
from ...tensor import Tensor
from ..case import ALIASING, BATCH, CONTIGUOUS, ODD, PROPERTY, Case, Ctx
from ..compare import TOLERANCE, close, exact, identical, refused
from ..references import int8_weights, quant_weights, quantized_linear
from .moe import random_experts

FLOATS = (float32, float16, bfloat16)
K_FORMATS = ("q4_k", "q6_k")  # K a multiple of 256


def activations(ctx: Ctx, shape) -> tuple:
    """x ~ N(0, 1) with a few large values (as activations have): (tensor, its values as float32 [.., K])."""
    x = ctx.rng.standard_normal(shape)
    x[ctx.rng.random(shape) < 0.02] *= 8
    host = x.astype(ctx.dtype.numpy)
    return ctx.upload(host), host.astype(np.float32)


def int8_matrix(ctx: Ctx, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(q int8 [n, k] in [-127, 127], scales bf16 [n, ceil(k / 32)]), weights ~ 1/sqrt(K) (outputs O(1))."""
    q = ctx.rng.integers(-127, 128, (n, k)).astype(np.int8)
    scales = (max(k, 1) ** -0.5 / 60 * (0.5 + ctx.rng.random((n, -(-k // 32))))).astype(bfloat16.numpy)
    return q, scales


def quant_matrix(ctx: Ctx, fmt: str, n: int, k: int) -> tuple:
    """Random codes and scale parameters of ``fmt`` (pack_quant's arguments), weights ~ 1/sqrt(K), every code
    value and both signs of a scale represented."""
    rng, groups, size = ctx.rng, -(-k // 32), k ** -0.5
    f16 = lambda a: np.asarray(a, np.float32).astype(np.float16)  # noqa: E731
    sign = lambda shape: rng.choice([-1.0, 1.0], shape)  # noqa: E731
    if fmt == "q8_0":
        return (rng.integers(-127, 128, (n, k)).astype(np.int8),
                f16(sign((n, groups)) * size / 60 * (0.5 + rng.random((n, groups)))))
    if fmt in ("q4_0", "q4_1"):
        codes = rng.integers(0, 16, (n, k)).astype(np.uint8)
        d = f16(sign((n, groups)) * size / 4 * (0.5 + rng.random((n, groups))))
        if fmt == "q4_0":
            return codes, d
        return codes, d, f16(-8 * d.astype(np.float32) + size * rng.standard_normal((n, groups)))
    supers = k // 256
    if fmt == "q4_k":
        return (rng.integers(0, 16, (n, k)).astype(np.uint8), f16(size / 128 * (0.5 + rng.random((n, supers)))),
                f16(size / 32 * rng.random((n, supers))), rng.integers(0, 64, (n, groups)).astype(np.uint8),
                rng.integers(0, 64, (n, groups)).astype(np.uint8))
    return (rng.integers(0, 64, (n, k)).astype(np.uint8),
            f16(sign((n, supers)) * size / 2048 * (0.5 + rng.random((n, supers)))),
            rng.integers(-128, 128, (n, k // 16)).astype(np.int8))


def _bias(ctx: Ctx, n: int, wanted: bool) -> tuple[Tensor | None, np.ndarray]:
    """(bias [n] on the device, its values) or (None, zeros)."""
    return ctx.normal((n,)) if wanted else (None, np.zeros(n))


# ---- linear_i8 ---------------------------------------------------------------------------------------------

class Int8Linear:
    """x, the int8 blocks of a random [N, K] matrix and an optional bias, on the device, with the float64 weights."""

    def __init__(self, ctx: Ctx, m: int, n: int, k: int, bias: bool):
        self.ctx, self.n = ctx, n
        self.x, self.x32 = activations(ctx, (m, k))
        q, scales = int8_matrix(ctx, n, k)
        self.w = int8_weights(q, scales)
        blocks, block_scales = ops.pack_int8(q, scales)
        self.weight, self.scales = ctx.upload(blocks), ctx.upload(block_scales)
        self.bias, self.rb = _bias(ctx, n, bias)

    def run(self, x=None):
        x = self.x if x is None else x
        out = self.ctx.nan((x.shape[0], self.n))
        ops.linear_i8(out, x, self.weight, self.scales, self.bias)
        return out.numpy()


def _linear_i8(m: int, n: int, k: int, bias: bool, ctx: Ctx) -> None:
    case = Int8Linear(ctx, m, n, k, bias)
    close(case.run(), quantized_linear(case.x32, case.w) + case.rb, ctx.dtype, TOLERANCE[ctx.dtype])


def _rows_alone(ctx: Ctx, run, x32: np.ndarray, batched: np.ndarray) -> None:
    """run(x) for a few row ranges of x alone equals, bit for bit, those rows of the batched result."""
    host = x32.astype(ctx.dtype.numpy)
    for start, rows in ((0, 1), (5, 1), (12, 1), (0, 2), (3, 5), (4, 8), (2, 9)):
        identical(run(ctx.upload(host[start:start + rows])), batched[start:start + rows],
                  f"rows [{start}, {start + rows}) computed alone vs in a batch of {len(host)}")


def _linear_i8_batch(ctx: Ctx) -> None:
    case = Int8Linear(ctx, 13, 50, 100, True)
    _rows_alone(ctx, case.run, case.x32, case.run())


def _linear_i8_overlap(ctx: Ctx) -> None:
    case = Int8Linear(ctx, 2, 4, 40, True)
    refused(lambda: ops.linear_i8(case.x.view(80).slice(0, 72, 80).view(2, 4), case.x, case.weight, case.scales),
            "overlap")


# ---- linear_q / embedding_q ----------------------------------------------------------------------------------

class QuantLinear:
    def __init__(self, ctx: Ctx, fmt: str, m: int, n: int, k: int, bias: bool):
        self.ctx, self.fmt, self.n = ctx, fmt, n
        self.x, self.x32 = activations(ctx, (m, k))
        codes, *params = quant_matrix(ctx, fmt, n, k)
        self.w = quant_weights(fmt, codes, *params)
        weight, scales = ops.pack_quant(fmt, codes, *params)
        self.weight, self.scales = ctx.upload(weight), ctx.upload(scales)
        self.bias, self.rb = _bias(ctx, n, bias)

    def run(self, x=None):
        x = self.x if x is None else x
        out = self.ctx.nan((x.shape[0], self.n))
        ops.linear_q(out, x, self.weight, self.scales, self.fmt, self.bias)
        return out.numpy()


def _linear_q(fmt: str, m: int, n: int, k: int, bias: bool, ctx: Ctx) -> None:
    case = QuantLinear(ctx, fmt, m, n, k, bias)
    close(case.run(), quantized_linear(case.x32, case.w) + case.rb, ctx.dtype, TOLERANCE[ctx.dtype])


def _linear_q_batch(fmt: str, ctx: Ctx) -> None:
    case = QuantLinear(ctx, fmt, 13, 33, 256, True)
    _rows_alone(ctx, case.run, case.x32, case.run())


def _embedding_q(fmt: str, vocab: int, dim: int, n: int, ctx: Ctx) -> None:
    """Rows of the weights computed in f32 as ggml's dequantizer computes them (dequantize_quant), rounded once."""
    codes, *params = quant_matrix(ctx, fmt, vocab, dim)
    weight, scales = ops.pack_quant(fmt, codes, *params)
    index = ctx.rng.integers(0, vocab, n)
    index[0], index[-1] = 0, vocab - 1
    out = ctx.nan((n, dim))
    ops.embedding_q(out, ctx.upload(index), ctx.upload(weight), ctx.upload(scales), fmt, vocab)
    rows = ops.dequantize_quant(fmt, codes, *params)[index]
    exact(out.numpy(), rows.astype(np.float64), ctx.dtype)


def _embedding_q_out_of_range(ctx: Ctx) -> None:
    codes, *params = quant_matrix(ctx, "q8_0", 8, 32)
    weight, scales = (ctx.upload(a) for a in ops.pack_quant("q8_0", codes, *params))
    out = ctx.nan((3, 32))

    def call():
        ops.embedding_q(out, ctx.upload(np.array([1, 8, 2])), weight, scales, "q8_0", 8)
        synchronize(ctx.device)
    refused(call, "8")  # (the valid rows may have been written: backend.h promises only the refusal)


def _linear_q_overlap(ctx: Ctx) -> None:
    case = QuantLinear(ctx, "q8_0", 2, 4, 40, False)
    refused(lambda: ops.linear_q(case.x.view(80).slice(0, 72, 80).view(2, 4), case.x, case.weight, case.scales,
                                 "q8_0"), "overlap")


# ---- moe_linear_i8: each (row, slot) output is linear_i8 of its input and its expert's blocks -----------------

class MoeInt8:
    def __init__(self, ctx: Ctx, shape, per_slot: bool):
        m, k, e, n, kk = shape
        self.ctx, self.shape, self.per_slot = ctx, shape, per_slot
        self.x, self.x32 = activations(ctx, (m, k, kk) if per_slot else (m, kk))
        matrices = [int8_matrix(ctx, n, kk) for _ in range(e)]
        self.w = [int8_weights(q, s) for q, s in matrices]
        blocks = [ops.pack_int8(q, s) for q, s in matrices]
        self.weight = ctx.upload(np.stack([b for b, _ in blocks]))
        self.scales = ctx.upload(np.stack([s for _, s in blocks]))
        self.ids = random_experts(ctx, m, k, e)

    def run(self, x=None, ids=None):
        x, ids = (self.x, self.ids) if x is None else (x, ids)
        out = self.ctx.nan((ids.shape[0], ids.shape[1], self.shape[3]))
        ops.moe_linear_i8(out, x, self.weight, self.scales, self.ctx.upload(ids))
        return out.numpy()

    def expected(self) -> np.ndarray:
        m, k, _, n, _ = self.shape
        want = np.zeros((m, k, n))
        for r in range(m):
            for j in range(k):
                row = self.x32[r, j] if self.per_slot else self.x32[r]
                want[r, j] = quantized_linear(row[None], self.w[self.ids[r, j]])[0]
        return want


def _moe_linear_i8(shape, per_slot: bool, ctx: Ctx) -> None:
    case = MoeInt8(ctx, shape, per_slot)
    close(case.run(), case.expected(), ctx.dtype, TOLERANCE[ctx.dtype])


def _moe_linear_i8_batch(ctx: Ctx) -> None:
    case = MoeInt8(ctx, (20, 2, 3, 33, 64), False)
    batched = case.run()
    host = case.x32.astype(ctx.dtype.numpy)
    for row in (0, 7, 19):
        identical(case.run(ctx.upload(host[row:row + 1]), case.ids[row:row + 1])[0], batched[row],
                  f"row {row} alone vs in a batch of 20")


def _moe_linear_i8_overlap(ctx: Ctx) -> None:
    case = MoeInt8(ctx, (2, 1, 2, 4, 40), False)
    out = case.x.view(80).slice(0, 72, 80).view(2, 1, 4)
    refused(lambda: ops.moe_linear_i8(out, case.x, case.weight, case.scales, ctx.upload(case.ids)), "overlap")


# ---- moe_linear_q: each (row, slot) output is linear_q of its input and its expert's blocks --------------------

class MoeQuant:
    """Stacked random experts [E, N, K] in format ``fmt`` (and each expert's blocks alone, for linear_q), x and ids."""

    def __init__(self, ctx: Ctx, fmt: str, shape, per_slot: bool):
        m, k, e, n, kk = shape
        self.ctx, self.fmt, self.shape, self.per_slot = ctx, fmt, shape, per_slot
        self.x, self.x32 = activations(ctx, (m, k, kk) if per_slot else (m, kk))
        matrices = [quant_matrix(ctx, fmt, n, kk) for _ in range(e)]
        self.w = [quant_weights(fmt, *params) for params in matrices]
        self.blocks = [ops.pack_quant(fmt, *params) for params in matrices]
        self.weight = ctx.upload(np.stack([b for b, _ in self.blocks]))
        self.scales = ctx.upload(np.stack([s for _, s in self.blocks]))
        self.ids = random_experts(ctx, m, k, e)

    def run(self, x=None, ids=None):
        x, ids = (self.x, self.ids) if x is None else (x, ids)
        out = self.ctx.nan((ids.shape[0], ids.shape[1], self.shape[3]))
        ops.moe_linear_q(out, x, self.weight, self.scales, self.ctx.upload(ids), self.fmt)
        return out.numpy()

    def input_of(self, r: int, j: int) -> np.ndarray:
        """x_rj as float32 [K]: the row's input to its slot j."""
        return self.x32[r, j] if self.per_slot else self.x32[r]

    def expected(self) -> np.ndarray:
        m, k, _, n, _ = self.shape
        want = np.zeros((m, k, n))
        for r in range(m):
            for j in range(k):
                want[r, j] = quantized_linear(self.input_of(r, j)[None], self.w[self.ids[r, j]])[0]
        return want


def _moe_linear_q(fmt: str, shape, per_slot: bool, ctx: Ctx) -> None:
    case = MoeQuant(ctx, fmt, shape, per_slot)
    close(case.run(), case.expected(), ctx.dtype, TOLERANCE[ctx.dtype])


def _moe_linear_q_batch(fmt: str, ctx: Ctx) -> None:
    """Every (row, slot) of a batch is, bit for bit, linear_q of that row alone with that expert's own blocks."""
    case = MoeQuant(ctx, fmt, (13, 3, 4, 33, 256), fmt == "q4_1")
    batched = case.run()
    n = case.shape[3]
    for r in range(case.shape[0]):
        for j in range(case.shape[1]):
            weight, scales = (ctx.upload(a) for a in case.blocks[case.ids[r, j]])
            out = ctx.nan((1, n))
            ops.linear_q(out, ctx.upload(case.input_of(r, j)[None].astype(ctx.dtype.numpy)), weight, scales, fmt)
            identical(out.numpy()[0], batched[r, j], f"row {r} slot {j} (expert {case.ids[r, j]}) vs linear_q alone")


def _moe_linear_q_bad_expert(ctx: Ctx) -> None:
    case = MoeQuant(ctx, "q4_0", (2, 1, 3, 4, 32), False)

    def call():
        case.run(case.x, np.array([[1], [3]]))
        synchronize(ctx.device)
    refused(call, "3")


def _moe_linear_q_overlap(ctx: Ctx) -> None:
    case = MoeQuant(ctx, "q8_0", (2, 1, 2, 4, 40), False)
    out = case.x.view(80).slice(0, 72, 80).view(2, 1, 4)
    refused(lambda: ops.moe_linear_q(out, case.x, case.weight, case.scales, ctx.upload(case.ids), "q8_0"), "overlap")


INT8_SHAPES = {ODD: [(1, 1, 1), (3, 17, 33), (1, 15, 31)], CONTIGUOUS: [(9, 17, 100), (17, 50, 33), (4, 40, 300)]}
GROUP_SHAPES = {ODD: [(1, 1, 1), (3, 17, 33)], CONTIGUOUS: [(9, 17, 100), (17, 50, 64)]}
K_SHAPES = {ODD: [(1, 1, 256), (3, 17, 512)], CONTIGUOUS: [(9, 20, 256)]}
MOE_I8_SHAPES = {ODD: [(1, 2, 8, 17, 33), (3, 1, 3, 1, 1)], CONTIGUOUS: [(5, 2, 4, 50, 100), (2, 8, 16, 40, 300)]}
MOE_Q_SHAPES = {ODD: [(1, 2, 8, 17, 33), (3, 1, 3, 1, 1)], CONTIGUOUS: [(5, 2, 4, 50, 100), (2, 8, 16, 40, 96)]}
MOE_QK_SHAPES = {ODD: [(1, 2, 8, 17, 256), (3, 1, 3, 1, 256)], CONTIGUOUS: [(5, 2, 4, 50, 512)]}  # K formats


def cases() -> list[Case]:
    out: list[Case] = []
    for dtype in FLOATS:
        for layout, shapes in INT8_SHAPES.items():
            out += [Case("linear_i8", dtype, layout, f"{m}x{n}x{k}{' bias' if i % 2 == 0 else ''}",
                         partial(_linear_i8, m, n, k, i % 2 == 0)) for i, (m, n, k) in enumerate(shapes)]
        out += [Case("linear_i8", dtype, PROPERTY, "K=0 gives bias", partial(_linear_i8, 3, 5, 0, True)),
                Case("linear_i8", dtype, BATCH, "13x50x100 rows alone", _linear_i8_batch)]
        for fmt in ops.QUANT_FORMATS:
            for layout, shapes in (K_SHAPES if fmt in K_FORMATS else GROUP_SHAPES).items():
                out += [Case("linear_q", dtype, layout, f"{fmt} {m}x{n}x{k}{' bias' if i % 2 == 0 else ''}",
                             partial(_linear_q, fmt, m, n, k, i % 2 == 0)) for i, (m, n, k) in enumerate(shapes)]
            out.append(Case("linear_q", dtype, BATCH, f"{fmt} 13x33x256 rows alone", partial(_linear_q_batch, fmt)))
            dim = 256 if fmt in K_FORMATS else 96
            out += [Case("embedding_q", dtype, ODD, f"{fmt} 3 of 17x{dim}", partial(_embedding_q, fmt, 17, dim, 3)),
                    Case("embedding_q", dtype, CONTIGUOUS, f"{fmt} 40 of 300x{dim * 2}",
                         partial(_embedding_q, fmt, 300, dim * 2, 40))]
        for layout, moe_shapes in MOE_I8_SHAPES.items():
            out += [Case("moe_linear_i8", dtype, layout, "M{} k{} E{} N{} K{}".format(*s) + (" per slot" if i % 2 else ""),
                         partial(_moe_linear_i8, s, i % 2 == 1)) for i, s in enumerate(moe_shapes)]
        out.append(Case("moe_linear_i8", dtype, BATCH, "M20 k2 E3 N33 K64 rows alone", _moe_linear_i8_batch))
        for fmt in ops.QUANT_FORMATS:
            for layout, moe_shapes in (MOE_QK_SHAPES if fmt in K_FORMATS else MOE_Q_SHAPES).items():
                out += [Case("moe_linear_q", dtype, layout,
                             f"{fmt} " + "M{} k{} E{} N{} K{}".format(*s) + (" per slot" if i % 2 else ""),
                             partial(_moe_linear_q, fmt, s, i % 2 == 1)) for i, s in enumerate(moe_shapes)]
            out.append(Case("moe_linear_q", dtype, BATCH, f"{fmt} M13 k3 E4 N33 K256 rows as linear_q",
                            partial(_moe_linear_q_batch, fmt)))
    out += [Case("embedding_q", float32, PROPERTY, "index out of range is refused", _embedding_q_out_of_range),
            Case("linear_i8", float32, ALIASING, "out overlaps x", _linear_i8_overlap),
            Case("linear_q", float32, ALIASING, "out overlaps x", _linear_q_overlap),
            Case("moe_linear_i8", float32, ALIASING, "out overlaps x", _moe_linear_i8_overlap),
            Case("moe_linear_q", float32, PROPERTY, "expert id out of range", _moe_linear_q_bad_expert),
            Case("moe_linear_q", float32, ALIASING, "out overlaps x", _moe_linear_q_overlap)]
    return out


def _perf_linear_i8(ctx: Ctx):
    case = Int8Linear(ctx, 1, 8960, 1536, False)
    out = ctx.nan((1, 8960))
    return lambda: ops.linear_i8(out, case.x, case.weight, case.scales)


def _perf_linear_q(ctx: Ctx):
    case = QuantLinear(ctx, "q4_k", 1, 8960, 1536, False)
    out = ctx.nan((1, 8960))
    return lambda: ops.linear_q(out, case.x, case.weight, case.scales, "q4_k")


def _perf_embedding_q(ctx: Ctx):
    codes, *params = quant_matrix(ctx, "q6_k", 4096, 1536)
    weight, scales = (ctx.upload(a) for a in ops.pack_quant("q6_k", codes, *params))
    index, out = ctx.upload(ctx.rng.integers(0, 4096, 64)), ctx.nan((64, 1536))
    return lambda: ops.embedding_q(out, index, weight, scales, "q6_k", 4096)


def _perf_moe_linear_i8(ctx: Ctx):
    case = MoeInt8(ctx, (1, 8, 16, 768, 2048), False)
    ids, out = ctx.upload(case.ids), ctx.nan((1, 8, 768))
    return lambda: ops.moe_linear_i8(out, case.x, case.weight, case.scales, ids)


def _perf_moe_linear_q(ctx: Ctx):
    case = MoeQuant(ctx, "q4_k", (1, 8, 16, 768, 2048), False)
    ids, out = ctx.upload(case.ids), ctx.nan((1, 8, 768))
    return lambda: ops.moe_linear_q(out, case.x, case.weight, case.scales, ids, "q4_k")


PERF = {"linear_i8": ("1x8960x1536", _perf_linear_i8), "linear_q": ("q4_k 1x8960x1536", _perf_linear_q),
        "embedding_q": ("q6_k 64 of 4096x1536", _perf_embedding_q),
        "moe_linear_i8": ("M1 k8 E16 N768 K2048", _perf_moe_linear_i8),
        "moe_linear_q": ("q4_k M1 k8 E16 N768 K2048", _perf_moe_linear_q)}
