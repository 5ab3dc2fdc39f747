"""Quantized weights: ``llaisys_models.load(..., quantize="int8" | "int4")``, and the block weights of GGUF files.

What the forward reads (``Int8Weight``, ``BlockWeight``, ``Int8Experts``, and the ops that run each) is
families/weights.py's; how they are made at load time is here.

int8: every linear of the decoder (q/k/v/o, gate/up/down) and the lm_head is stored as symmetric int8 in
groups of 32 consecutive inputs of a row, one bfloat16 scale per group; ``llaisys.ops.linear_i8``
quantizes the activations per row and group on the fly and runs integer dot products. So are the experts
of a mixture-of-experts layer (``Int8Experts``: each expert's matrix in the same format, stacked; run by
``llaisys.ops.moe_linear_i8``, which gives for each row what linear_i8 gives for that row and expert).
Embeddings, norms, biases and the routers stay in the model dtype (a router's few logits pick the experts:
llama.cpp's quantizer leaves ffn_gate_inp unquantized too); a tied lm_head gets its own int8 copy (the
embedding table stays as it is: a lookup reads one row per token, the lm_head reads all of them every step).

int4: the decoder's linears in the q4_0 block format of ``llaisys.ops.quant`` (4.5 bits per weight: per row
and group of 32, an f16 scale d and codes u in [0, 15], w = d (u - 8); ``llaisys.ops.linear_q``), the lm_head
in q8_0 (8.5 bits: int8 codes and an f16 scale per 32, as int8 above with an f16 scale rounded up; llama.cpp
keeps its output matrix at 6 bits or more for the same reason: the logits are where 4 bits hurt most), both
run by linear_q alone (a mixture-of-experts layer's experts stay in int8, Int8Experts: there is no 4-bit
expert kernel). Per group: m = the value of largest magnitude, d = m / -8 rounded to f16, u =
round-half-to-even(w / d) + 8 clipped to [0, 15]: m itself is exact (u = 0) up to d's f16 rounding, every
other value within half a step |d| / 2, but for values of the other sign beyond 7.5 |d| (they clip at 7 steps:
within |d|). Symmetric, as llama.cpp's
Q4_0: a min per group (q4_1, 5 bits per weight) measured 4-6% less RMS error per weight on the demo and
SmolLM2 weights (benchmarks/RESULTS.md) for 11% more bytes per token.

The format (docs/quantization.md, docs/design/operators.md#quantized-weights; ``llaisys.ops.int8`` holds the layout,
the ``linear_i8`` kernels read it):

    q       int8 [N, K], in [-127, 127]
    scales  bfloat16 [N, G], G = ceil(K / 32): one per row and group of 32 consecutive k
    w[n, k] ~ scales[n, k // 32] * q[n, k]

stored in blocks of 16 rows (``llaisys.ops.pack_int8``), each block one sequential stream for the kernel.

Per row n and group g, in float32 from the stored bf16/f16/f32 values: amax = max |w|; scale = amax / 127
rounded up to a bfloat16 (so the scale is stored exactly and |w / scale| <= 127); q = w / scale rounded
half to even, clipped to [-127, 127]; a group of zeros gets scale 0 and q 0. Every element then comes
back within half a step: |w - scale * q| <= scale / 2.

A weight is quantized chunk by chunk (whole blocks of rows) straight from the (mapped) checkpoint into the
buffers that become the int8 tensors, so a load peaks at the int8 weights, the leftovers in the model dtype
and one chunk; a layer's experts are quantized expert by expert into their stacked buffers the same way.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterator

import numpy as np

import llaisys

from ..errors import ModelLoadError, shown
from ..families.weights import BlockWeight, Int8Experts, Int8Weight
from .host_memory import bytes_of, host_buffer, populate

MODES = ("int8", "int4")
GROUP = llaisys.ops.INT8_GROUP  # 32 values per scale along K
BLOCK_ROWS = llaisys.ops.INT8_BLOCK_ROWS  # rows per block of the stored layout
INT4_FORMAT = "q4_0"  # quantize="int4"'s block format (its lm_head: "q8_0")
# the ops a quantized model needs beyond the float model's: its linears', and its experts' (a mixture of experts;
# int4 keeps them in int8: there is no 4-bit expert kernel)
KERNELS: dict[str, tuple[str, ...]] = {"int8": ("linear_i8",), "int4": ("linear_q",)}
EXPERT_KERNELS: dict[str, tuple[str, ...]] = {"int8": ("moe_linear_i8",), "int4": ("moe_linear_i8",)}
BLOCK_KERNELS = ("linear_q", "embedding_q")  # what weights kept in a GGUF file's blocks need
CHUNK_VALUES = 1 << 18  # values quantized per numpy pass: the f32 temporaries stay in L2


def resolve(quantize: str | None) -> str | None:
    """``quantize`` checked: None (weights in the model dtype) or "int8"; anything else raises."""
    if quantize is None:
        return None
    if isinstance(quantize, str) and quantize.lower() in MODES:
        return quantize.lower()
    raise ModelLoadError(f"quantize must be None, {' or '.join(map(repr, MODES))}, got {shown(quantize)}")


def missing_kernels(device: llaisys.Device, quantize: str | None, experts: bool = False) -> list[str]:
    """The ops ``quantize``'s linears (and experts, for a mixture-of-experts model) need that ``device``'s
    backend does not implement."""
    if quantize is None:
        return []
    ops = KERNELS.get(quantize, ()) + (EXPERT_KERNELS.get(quantize, ()) if experts else ())
    return [op for op in ops if not llaisys.ops.implemented(op, device)]


def check_device(device: llaisys.Device, quantize: str | None, experts: bool = False) -> None:
    """Raise, naming the device and the way out, when its backend cannot run ``quantize``'s linears (and
    experts)."""
    missing = missing_kernels(device, quantize, experts)
    if missing:
        kernels = "kernel" if len(missing) == 1 else "kernels"
        raise llaisys.BackendUnavailableError(
            f"quantize={quantize!r} needs the {', '.join(missing)} {kernels}, which the '{device.type}' backend "
            f"({device}) does not implement; load the model on a device that has it (device='cpu', --device cpu) "
            f"or without quantize")


# -- the quantizer ----------------------------------------------------------------------------------------


def bf16_round_up(x: np.ndarray) -> np.ndarray:
    """The smallest bfloat16 >= x for each finite float32 x >= 0 (a bfloat16 is a float32 whose low 16
    bits are 0: carry anything below them into the upper half)."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    return ((bits + np.uint32(0xFFFF)) & np.uint32(0xFFFF0000)).view(np.float32).astype(llaisys.bfloat16.numpy)


def _finite_amax(x: np.ndarray, magnitude: np.ndarray, name: str, what: str) -> np.ndarray:
    """max |x| per group of 32 of x (float32 [R, G * 32]) -> [R, G], using ``magnitude`` (x's shape) as scratch;
    raises naming the tensor for inf / NaN."""
    n = x.shape[0]
    # |x| is x's bits without the sign, and non-negative floats order as their bits do (an integer max reduces
    # ~3x faster than a float one); inf and NaN come out above every finite value
    np.bitwise_and(x.view(np.uint32), np.uint32(0x7FFFFFFF), out=magnitude.view(np.uint32))
    amax = magnitude.view(np.uint32).reshape(n, -1, GROUP).max(axis=2).view(np.float32)
    if not np.isfinite(amax).all():
        row = int(np.nonzero(~np.isfinite(amax))[0][0])
        raise ModelLoadError(f"tensor {name!r} holds inf or NaN (row {row}), which {what} cannot hold; load it "
                             f"without quantize")
    return amax


def quantize_rows(rows: np.ndarray, work: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` (float [R, K], any float dtype) quantized: (q int8 [R, G * 32], zeros from column K on;
    scales bfloat16 [R, G]).

    ``work``: float32 [2, R, G * 32] whose first half has zeros from column K on (the short last group reads as
    padded with zeros, which change neither its amax nor anything else)."""
    n, k = rows.shape
    x = work[0]
    np.copyto(x[:, :k], rows, casting="unsafe")  # exact: f16 and bf16 values are f32 values
    groups = x.reshape(n, -1, GROUP)
    amax = _finite_amax(x, work[1], name, "int8")  # [R, G]
    scale = bf16_round_up(amax / np.float32(127))
    divisor = scale.astype(np.float32)
    divisor[divisor == 0] = 1  # a group of zeros: 0 / 1 = 0
    np.divide(groups, divisor[:, :, None], out=groups)
    np.rint(x, out=x)  # half to even
    np.clip(x, -127, 127, out=x)
    return x.astype(np.int8), scale


def quantize_rows_int4(rows: np.ndarray, work: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` (float [R, K]) in q4_0: (codes uint8 [R, K] in [0, 15], d float16 [R, G]); ``work`` as for
    ``quantize_rows``. Per group: d = (the value of largest magnitude) / -8 rounded to f16, u = round-half-to-
    even(w / d) + 8 clipped to [0, 15]; a group of zeros (or one whose d underflows f16) gets d = 0, u = 8."""
    n, k = rows.shape
    x = work[0]
    np.copyto(x[:, :k], rows, casting="unsafe")
    groups = x.reshape(n, -1, GROUP)
    amax = _finite_amax(x, work[1], name, "int4")
    if amax.max(initial=0) / 8 > np.finfo(np.float16).max:
        raise ModelLoadError(f"tensor {name!r} holds values beyond 8 x the largest float16 ({amax.max():g}), "
                             f"which int4's f16 scales cannot hold; load it without quantize or with int8")
    at = np.argmax(np.abs(groups), axis=2)[:, :, None]
    d = (np.take_along_axis(groups, at, axis=2)[:, :, 0] / np.float32(-8)).astype(np.float16)
    divisor = d.astype(np.float32)
    divisor[divisor == 0] = 1  # a group of zeros: 0 / 1 + 8 = 8, the code of 0
    np.divide(groups, divisor[:, :, None], out=groups)  # the zeros past K stay zeros (work's contract)
    np.rint(x, out=x)
    return np.clip(x[:, :k] + 8, 0, 15).astype(np.uint8), d


def f16_round_up(x: np.ndarray) -> np.ndarray:
    """The smallest float16 >= x for each float32 x >= 0 (inf beyond the largest float16)."""
    x = np.asarray(x, np.float32)
    h = x.astype(np.float16)
    low = h.astype(np.float32) < x
    h[low] = np.nextafter(h[low], np.float16(np.inf))
    return h


def quantize_rows_q8_0(rows: np.ndarray, work: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` (float [R, K]) in q8_0: (q int8 [R, K], d float16 [R, G]) as quantize_rows does int8, the scale
    amax / 127 rounded up to a float16 instead of a bfloat16 (3 more bits: the q8_0 lm_head of quantize="int4")."""
    n, k = rows.shape
    x = work[0]
    np.copyto(x[:, :k], rows, casting="unsafe")
    groups = x.reshape(n, -1, GROUP)
    amax = _finite_amax(x, work[1], name, "q8_0")
    d = f16_round_up(amax / np.float32(127))
    if np.isinf(d).any():
        raise ModelLoadError(f"tensor {name!r} holds values beyond 127 x the largest float16, which q8_0's f16 "
                             f"scales cannot hold; load it without quantize or with int8")
    divisor = d.astype(np.float32)
    divisor[divisor == 0] = 1
    np.divide(groups, divisor[:, :, None], out=groups)
    np.rint(x, out=x)
    np.clip(x, -127, 127, out=x)
    return x[:, :k].astype(np.int8), d


RowQuantizer = Callable[[np.ndarray, np.ndarray, str], tuple[np.ndarray, np.ndarray]]  # quantize_rows' signature


def quantized_chunks(read: Callable[[int, int], np.ndarray], shape: tuple[int, int], name: str = "weight",
                     quantize_rows: RowQuantizer = quantize_rows) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
    """Quantize the [N, K] matrix whose rows ``read(start, end)`` returns a chunk of rows at a time (whole
    blocks of INT8_BLOCK_ROWS, the last one aside): yields (start, end, *quantize_rows' results for those rows:
    int8 q [end - start, G * 32] (zeros past K) and bfloat16 scales [end - start, G] by default)."""
    n, k = shape
    step = max(1, min(n, CHUNK_VALUES // max(k, 1)) // BLOCK_ROWS) * BLOCK_ROWS
    work = np.zeros((2, min(step, n), groups_of(k) * GROUP), np.float32)
    for start in range(0, n, step):
        end = min(start + step, n)
        yield (start, end, *quantize_rows(read(start, end), work[:, :end - start], name))


def groups_of(k: int) -> int:
    """G: the groups of 32 along a row of ``k`` values (the last may be short)."""
    return -(-k // GROUP)


def quantize(w: np.ndarray, name: str = "weight") -> tuple[np.ndarray, np.ndarray]:
    """(q int8 [N, K], scales bfloat16 [N, G]) of the float matrix ``w`` [N, K] (not in blocks)."""
    n, k = w.shape
    q, scales = np.empty((n, k), np.int8), np.empty((n, groups_of(k)), llaisys.bfloat16.numpy)
    for start, end, q_rows, s_rows in quantized_chunks(lambda start, end: w[start:end], (n, k), name):
        q[start:end], scales[start:end] = q_rows[:, :k], s_rows
    return q, scales


class Arena:
    """One CPU buffer that the uint8 blocks of many weights are carved from, in order: one allocation, faulted in
    by one call, so that the 2 MiB rounding of large buffers (the backend puts them on huge pages) happens once
    instead of per tensor (about 1 MiB per large tensor: 100 MB of a 1.5B model's 1.1 GB)."""

    ALIGN = 64

    def __init__(self, nbytes: int, device: llaisys.Device):
        self.tensor = llaisys.empty((max(nbytes, 1),), llaisys.uint8, device)
        populate(bytes_of(self.tensor))
        self.used = 0

    @staticmethod
    def size_of(shape: tuple[int, ...]) -> int:
        return -(-math.prod(shape) // Arena.ALIGN) * Arena.ALIGN

    def take(self, shape: tuple[int, ...]) -> llaisys.Tensor:
        """The next uint8 tensor of ``shape`` in the arena (a view)."""
        n = math.prod(shape)
        if self.used + n > self.tensor.shape[0]:
            raise ModelLoadError(f"internal: the weights' arena holds {self.tensor.shape[0]} bytes, {self.used} used, "
                                 f"{n} more asked")
        view = self.tensor.slice(0, self.used, self.used + n).view(*shape)
        self.used += self.size_of(shape)
        return view


class BlockBuffers:
    """The buffers of a weight's blocks, filled on the host then placed on ``device``: on the CPU the weight's
    own buffers (large ones on huge pages; uint8 ones from ``arena`` when given), written in place; elsewhere
    host buffers, copied over at the end. ``arrays`` are writable numpy views of them ([shape] of each buffer's
    numpy dtype)."""

    def __init__(self, specs: list[tuple[tuple[int, ...], llaisys.DType]], device: llaisys.Device,
                 arena: Arena | None = None):
        self.specs, self.device = specs, device
        self.tensors: list[llaisys.Tensor] | None  # None: host buffers (raw), copied to the device by placed()
        if device.type == "cpu":
            if arena is not None:
                self.tensors = [arena.take(shape) for shape, _ in specs]
            else:
                self.tensors = [llaisys.empty(shape, dtype, device) for shape, dtype in specs]
            raw = [bytes_of(t) for t in self.tensors]
            if arena is None:
                for r in raw:
                    populate(r)
        else:
            self.tensors = None
            raw = [host_buffer(math.prod(shape) * dtype.itemsize) for shape, dtype in specs]
        self.raw = raw
        self.arrays = [r.view(dtype.numpy).reshape(shape) for r, (shape, dtype) in zip(raw, specs)]

    def placed(self) -> list[llaisys.Tensor]:
        """The filled buffers as tensors on the device."""
        if self.tensors is not None:
            return self.tensors
        return [llaisys.from_buffer(r, dtype, shape).to(self.device) for r, (shape, dtype) in zip(self.raw, self.specs)]


def int8_weight(read: Callable[[int, int], np.ndarray], shape: tuple[int, int], device: llaisys.Device,
                name: str = "weight") -> Int8Weight:
    """The int8 weight on ``device`` of the [N, K] matrix whose rows ``read(start, end)`` returns, quantized a
    chunk of rows at a time straight into its blocks."""
    n, k = shape
    weight_shape, scales_shape = llaisys.ops.int8_shapes(n, k)
    buffers = BlockBuffers([(weight_shape, llaisys.int8), (scales_shape, llaisys.bfloat16)], device)
    blocks, block_scales = buffers.arrays
    _quantize_into(read, shape, blocks, block_scales, name)
    weight, scales = buffers.placed()
    return Int8Weight(weight, scales, (n, k))


def int8_experts(reads: list[Callable[[int, int], np.ndarray]], shape: tuple[int, int], device: llaisys.Device,
                 names: list[str]) -> Int8Experts:
    """The int8 stacked experts on ``device`` of len(reads) [N, K] matrices, expert e's rows returned by
    ``reads[e](start, end)`` (``names[e]``: its name in errors): each quantized in turn, a chunk of rows at a
    time, into its slot [e] of the stacked buffers (so a load holds one chunk beside the int8 result)."""
    weight_shape, scales_shape = llaisys.ops.int8_shapes(*shape)
    experts = len(reads)
    buffers = BlockBuffers([((experts, *weight_shape), llaisys.int8), ((experts, *scales_shape), llaisys.bfloat16)],
                           device)
    blocks, block_scales = buffers.arrays
    for e, read in enumerate(reads):
        _quantize_into(read, shape, blocks[e], block_scales[e], names[e])
    weight, scales = buffers.placed()
    return Int8Experts(weight, scales, (experts, *shape))


def _quantize_into(read: Callable[[int, int], np.ndarray], shape: tuple[int, int], blocks: np.ndarray,
                   block_scales: np.ndarray, name: str) -> None:
    """The [N, K] matrix whose rows ``read(start, end)`` returns, quantized into its int8 blocks (``int8_shapes``)."""
    for start, end, q_rows, s_rows in quantized_chunks(read, shape, name):
        first, last = start // BLOCK_ROWS, -(-end // BLOCK_ROWS)
        llaisys.ops.pack_int8(q_rows, s_rows, blocks[first:last], block_scales[first:last])


def block_buffers(fmt: str, shape: tuple[int, int], device: llaisys.Device, arena: Arena | None = None) -> BlockBuffers:
    """The (weight, scales) buffers of the ``fmt`` blocks of an [N, K] matrix on ``device`` (from ``arena``)."""
    weight_shape, scales_shape = llaisys.ops.quant_shapes(fmt, *shape)
    return BlockBuffers([(weight_shape, llaisys.uint8), (scales_shape, llaisys.uint8)], device, arena)


def block_bytes(fmt: str, shape: tuple[int, int]) -> int:
    """The arena bytes the ``fmt`` blocks of an [N, K] matrix take."""
    return sum(Arena.size_of(s) for s in llaisys.ops.quant_shapes(fmt, *shape))


def experts_block_buffers(fmt: str, shape: tuple[int, int, int], device: llaisys.Device,
                          arena: Arena | None = None) -> BlockBuffers:
    """The (weight, scales) buffers of E stacked [N, K] matrices' ``fmt`` blocks ([E, *quant_shapes]: expert e's at
    [e], as moe_linear_q reads them) on ``device`` (from ``arena``)."""
    experts, n, k = shape
    weight_shape, scales_shape = llaisys.ops.quant_shapes(fmt, n, k)
    return BlockBuffers([((experts, *weight_shape), llaisys.uint8), ((experts, *scales_shape), llaisys.uint8)], device,
                        arena)


def experts_block_bytes(fmt: str, shape: tuple[int, int, int]) -> int:
    """The arena bytes the ``fmt`` blocks of E stacked [N, K] matrices take."""
    experts, n, k = shape
    return sum(Arena.size_of((experts, *s)) for s in llaisys.ops.quant_shapes(fmt, n, k))


# the formats quantized from floats
QUANTIZERS: dict[str, RowQuantizer] = {"q4_0": quantize_rows_int4, "q8_0": quantize_rows_q8_0}


def quantized_blocks(fmt: str, read: Callable[[int, int], np.ndarray], shape: tuple[int, int],
                     device: llaisys.Device, name: str = "weight") -> BlockWeight:
    """The ``fmt`` (q4_0 or q8_0) weight on ``device`` of the [N, K] matrix whose rows ``read(start, end)``
    returns, quantized a chunk of rows at a time straight into its blocks."""
    buffers = block_buffers(fmt, shape, device)
    blocks, block_scales = buffers.arrays
    for start, end, codes, d in quantized_chunks(read, shape, name, QUANTIZERS[fmt]):
        first, last = start // BLOCK_ROWS, -(-end // BLOCK_ROWS)
        llaisys.ops.pack_quant(fmt, codes, d, out_weight=blocks[first:last], out_scales=block_scales[first:last])
    weight, scales = buffers.placed()
    return BlockWeight(weight, scales, fmt, shape)


def quantized_weight(quantize: str, read: Callable[[int, int], np.ndarray], shape: tuple[int, int],
                     device: llaisys.Device, name: str = "weight") -> Int8Weight | BlockWeight:
    """The [N, K] matrix whose rows ``read(start, end)`` returns as ``quantize`` says: "int8" (Int8Weight), "int4"
    (q4_0 blocks) or "q8_0" (the lm_head of int4)."""
    if quantize == "int8":
        return int8_weight(read, shape, device, name)
    return quantized_blocks(INT4_FORMAT if quantize == "int4" else quantize, read, shape, device, name)


def linear_mode(quantize: str | None, field: str) -> str | None:
    """How the linear ``field`` (weights.LINEARS) is quantized under ``quantize``: as it says, but for int4's
    lm_head, in q8_0 (see the top)."""
    return "q8_0" if quantize == "int4" and field == "lm_head" else quantize


def add_argument(parser: argparse.ArgumentParser) -> None:
    """``--quantize int8|int4`` and ``--dequantize`` on a CLI command that loads a model."""
    parser.add_argument("--dequantize", action="store_true",
                        help="GGUF files: decode the quantized tensors into the compute dtype at load (exactly the "
                             "stored values, as HF transformers reads the file; ~4-8x the memory) instead of "
                             "running them in their blocks")
    parser.add_argument("--quantize", default=None, choices=MODES,
                        help="store the linears' weights as int8 (per group of 32 inputs, bfloat16 scales: about "
                             "half the bytes per token of bf16) or int4 (q4_0 blocks, f16 scales, the lm_head in "
                             "q8_0: about a third), quantized at load time from the checkpoint, at a small loss "
                             "of accuracy (default: the weights as stored; a GGUF file's quantized tensors stay in "
                             "their blocks)")
