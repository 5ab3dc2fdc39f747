"""int8 weights: ``llaisys_models.load(..., quantize="int8")``.

Every linear of the decoder (q/k/v/o, gate/up/down) and the lm_head is stored as symmetric int8 in
groups of 32 consecutive inputs of a row, one bfloat16 scale per group; ``llaisys.ops.linear_i8``
quantizes the activations per row and group on the fly and runs integer dot products. So are the experts
of a mixture-of-experts layer (``Int8Experts``: each expert's matrix in the same format, stacked; run by
``llaisys.ops.moe_linear_i8``, which gives for each row what linear_i8 gives for that row and expert).
Embeddings, norms, biases and the routers stay in the model dtype (a router's few logits pick the experts:
llama.cpp's quantizer leaves ffn_gate_inp unquantized too); a tied lm_head gets its own int8 copy (the
embedding table stays as it is: a lookup reads one row per token, the lm_head reads all of them every step).

The format (docs/architecture.md; ``llaisys.ops.int8`` holds the layout, the ``linear_i8`` kernels read it):

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

import dataclasses
import math
from collections.abc import Callable

import numpy as np

import llaisys

from .errors import ModelLoadError, shown
from .host_memory import bytes_of, host_buffer

MODES = ("int8",)
GROUP = llaisys.ops.INT8_GROUP  # 32 values per scale along K
BLOCK_ROWS = llaisys.ops.INT8_BLOCK_ROWS  # rows per block of the stored layout
# the ops a quantized model needs beyond the float model's: its linears', and its experts' (a mixture of experts)
KERNELS = {"int8": ("linear_i8",)}
EXPERT_KERNELS = {"int8": ("moe_linear_i8",)}
CHUNK_VALUES = 1 << 18  # values quantized per numpy pass: the f32 temporaries stay in L2


def resolve(quantize: str | None) -> str | None:
    """``quantize`` checked: None (weights in the model dtype) or "int8"; anything else raises."""
    if quantize is None:
        return None
    if isinstance(quantize, str) and quantize.lower() in MODES:
        return quantize.lower()
    raise ModelLoadError(f"quantize must be None or {' or '.join(map(repr, MODES))}, got {shown(quantize)}")


def missing_kernels(device: llaisys.Device, quantize: str | None, experts: bool = False) -> list[str]:
    """The ops ``quantize``'s linears (and experts, for a mixture-of-experts model) need that ``device``'s
    backend does not implement."""
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


@dataclasses.dataclass(frozen=True)
class Int8Weight:
    """A linear's [N, K] weight in the int8 format: the blocks ``weight`` and ``scales`` (llaisys.ops.int8)."""

    weight: llaisys.Tensor
    scales: llaisys.Tensor
    shape: tuple[int, int]  # [N, K]


@dataclasses.dataclass(frozen=True)
class Int8Experts:
    """A mixture-of-experts layer's stacked expert matrices [E, N, K] in the int8 format: expert e's blocks at
    ``weight[e]`` and ``scales[e]`` (``llaisys.ops.moe_linear_i8``)."""

    weight: llaisys.Tensor  # int8 [E, ceil(N / 16), ceil(K / 32), 8, 16, 4]
    scales: llaisys.Tensor  # bf16 [E, ceil(N / 16), ceil(K / 32), 16]
    shape: tuple[int, int, int]  # [E, N, K]


def linear(out: llaisys.Tensor, x: llaisys.Tensor, weight: llaisys.Tensor | Int8Weight,
           bias: llaisys.Tensor | None = None) -> None:
    """out = x @ weight.T + bias, whichever kind the weight is: a tensor in the model dtype, or int8."""
    if isinstance(weight, Int8Weight):
        llaisys.ops.linear_i8(out, x, weight.weight, weight.scales, bias)
    else:
        llaisys.ops.linear(out, x, weight, bias)


def moe_linear(out: llaisys.Tensor, x: llaisys.Tensor, weight: llaisys.Tensor | Int8Experts,
               experts: llaisys.Tensor) -> None:
    """out[m, j] = x[m] (or x[m, j]) @ weight[experts[m, j]].T, whichever kind the stacked experts are: a tensor
    [E, N, K] in the model dtype, or int8."""
    if isinstance(weight, Int8Experts):
        llaisys.ops.moe_linear_i8(out, x, weight.weight, weight.scales, experts)
    else:
        llaisys.ops.moe_linear(out, x, weight, experts)


# -- the quantizer ----------------------------------------------------------------------------------------


def bf16_round_up(x: np.ndarray) -> np.ndarray:
    """The smallest bfloat16 >= x for each finite float32 x >= 0 (a bfloat16 is a float32 whose low 16
    bits are 0: carry anything below them into the upper half)."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    return ((bits + np.uint32(0xFFFF)) & np.uint32(0xFFFF0000)).view(np.float32).astype(llaisys.bfloat16.numpy)


def quantize_rows(rows: np.ndarray, work: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` (float [R, K], any float dtype) quantized: (q int8 [R, G * 32], zeros from column K on;
    scales bfloat16 [R, G]).

    ``work``: float32 [2, R, G * 32] whose first half has zeros from column K on (the short last group
    reads as padded with zeros, which change neither its amax nor anything else)."""
    n, k = rows.shape
    x, magnitude = work[0], work[1].view(np.uint32)
    np.copyto(x[:, :k], rows, casting="unsafe")  # exact: f16 and bf16 values are f32 values
    groups = x.reshape(n, -1, GROUP)
    # amax: |x| is x's bits without the sign, and non-negative floats order as their bits do (an integer max
    # reduces ~3x faster than a float one); inf and NaN come out above every finite value
    np.bitwise_and(x.view(np.uint32), np.uint32(0x7FFFFFFF), out=magnitude)
    amax = magnitude.reshape(n, -1, GROUP).max(axis=2).view(np.float32)  # [R, G]
    if not np.isfinite(amax).all():
        row = int(np.nonzero(~np.isfinite(amax))[0][0])
        raise ModelLoadError(f"tensor {name!r} holds inf or NaN (row {row}), which int8 cannot hold; load it "
                             f"without quantize")
    scale = bf16_round_up(amax / np.float32(127))
    divisor = scale.astype(np.float32)
    divisor[divisor == 0] = 1  # a group of zeros: 0 / 1 = 0
    np.divide(groups, divisor[:, :, None], out=groups)
    np.rint(x, out=x)  # half to even
    np.clip(x, -127, 127, out=x)
    return x.astype(np.int8), scale


def quantized_chunks(read: Callable[[int, int], np.ndarray], shape: tuple[int, int], name: str = "weight"):
    """Quantize the [N, K] matrix whose rows ``read(start, end)`` returns a chunk of rows at a time (whole
    blocks of INT8_BLOCK_ROWS, the last one aside): yields (start, end, q int8 [end - start, G * 32] (zeros
    past K), scales bfloat16 [end - start, G])."""
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


def int8_weight(read: Callable[[int, int], np.ndarray], shape: tuple[int, int], device: llaisys.Device,
                name: str = "weight") -> Int8Weight:
    """The int8 weight on ``device`` of the [N, K] matrix whose rows ``read(start, end)`` returns.

    On the CPU the rows are quantized straight into the weight's own buffers (in blocks); another device
    gets a copy of host buffers."""
    def fill(blocks: np.ndarray, block_scales: np.ndarray) -> None:
        _quantize_into(read, shape, blocks, block_scales, name)

    weight, scales = _int8_buffers(llaisys.ops.int8_shapes(*shape), device, fill)
    return Int8Weight(weight, scales, shape)


def int8_experts(reads: list[Callable[[int, int], np.ndarray]], shape: tuple[int, int], device: llaisys.Device,
                 names: list[str]) -> Int8Experts:
    """The int8 stacked experts on ``device`` of len(reads) [N, K] matrices, expert e's rows returned by
    ``reads[e](start, end)`` (``names[e]``: its name in errors): each quantized in turn, a chunk of rows at a
    time, into its slot [e] of the stacked buffers (so a load holds one chunk beside the int8 result)."""
    weight_shape, scales_shape = llaisys.ops.int8_shapes(*shape)
    experts = len(reads)

    def fill(blocks: np.ndarray, block_scales: np.ndarray) -> None:
        for e, read in enumerate(reads):
            _quantize_into(read, shape, blocks[e], block_scales[e], names[e])

    weight, scales = _int8_buffers(((experts, *weight_shape), (experts, *scales_shape)), device, fill)
    return Int8Experts(weight, scales, (experts, *shape))


def _int8_buffers(shapes: tuple[tuple[int, ...], tuple[int, ...]], device: llaisys.Device,
                  fill: Callable[[np.ndarray, np.ndarray], None]) -> tuple[llaisys.Tensor, llaisys.Tensor]:
    """(int8 weight, bf16 scales) tensors on ``device`` of ``shapes``, their contents written by
    ``fill(weight array, scales array)``: on the CPU into the tensors' own buffers (large ones on huge pages),
    elsewhere into host buffers then copied."""
    weight_shape, scales_shape = shapes
    if device.type == "cpu":
        weight = llaisys.empty(weight_shape, llaisys.int8, device)
        scales = llaisys.empty(scales_shape, llaisys.bfloat16, device)
        w_bytes, s_bytes = bytes_of(weight), bytes_of(scales)
    else:
        w_bytes = host_buffer(math.prod(weight_shape))
        s_bytes = host_buffer(math.prod(scales_shape) * llaisys.bfloat16.itemsize)
    fill(w_bytes.view(np.int8).reshape(weight_shape), s_bytes.view(llaisys.bfloat16.numpy).reshape(scales_shape))
    if device.type != "cpu":
        weight = llaisys.from_buffer(w_bytes, llaisys.int8, weight_shape).to(device)
        scales = llaisys.from_buffer(s_bytes, llaisys.bfloat16, scales_shape).to(device)
    return weight, scales


def _quantize_into(read: Callable[[int, int], np.ndarray], shape: tuple[int, int], blocks: np.ndarray,
                   block_scales: np.ndarray, name: str) -> None:
    """The [N, K] matrix whose rows ``read(start, end)`` returns, quantized into its blocks (``int8_shapes``)."""
    for start, end, q_rows, s_rows in quantized_chunks(read, shape, name):
        first, last = start // BLOCK_ROWS, -(-end // BLOCK_ROWS)
        llaisys.ops.pack_int8(q_rows, s_rows, blocks[first:last], block_scales[first:last])


def add_argument(parser) -> None:
    """``--quantize int8`` on a CLI command that loads a model."""
    parser.add_argument("--quantize", default=None, choices=MODES,
                        help="store the linears' weights as int8 (per group of 32 inputs, bfloat16 scales), "
                             "quantized at load time from the checkpoint: about half the memory and bytes per "
                             "token of bf16, at a small loss of accuracy (default: the weights as stored)")
