"""A rank's part of a weight (layout.Part), read from the mapped checkpoint a chunk of rows at a time.

Both loaders (safetensors, GGUF) describe a weight by a row reader: ``read(start, stop)`` returns rows
[start, stop) of it as a host array of floats (a view of the mapping for safetensors; decoded rows for a
quantized GGUF tensor; elements for a vector). ``build`` cuts the part out of those rows and writes it
straight into the buffer that becomes the weight (or quantizes it, ``quantize="int8"`` / ``"int4"``: shard
first, then quantize, so a rank's blocks of 16 rows and groups of 32 inputs are those of its own matrix). Only the
part's rows are ever read, or, for a column part, the rows' bytes once, chunk by chunk.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

import llaisys

from ..loading.host_memory import bytes_of, host_buffer
from ..loading.quantize import CHUNK_VALUES, BlockWeight, Int8Experts, Int8Weight, int8_experts, quantized_weight
from .layout import Part

Reader = Callable[[int, int], np.ndarray]  # rows [start, stop) of a weight, as host floats


def part_reader(read: Reader, shape: tuple[int, ...], part: Part) -> tuple[Reader, tuple[int, ...]]:
    """The reader of ``part`` of a weight of ``shape`` read by ``read``, and the part's shape."""
    part_shape = part.shape(shape)
    if part.dim == 1:
        return (lambda start, stop: read(start, stop)[:, part.start:part.stop]), part_shape
    real = part.stop - part.start  # rows past it (up to part.rows) are zeros

    def rows(start: int, stop: int) -> np.ndarray:
        if stop <= real:
            return read(part.start + start, part.start + stop)
        have = read(part.start + start, part.start + real) if start < real else None
        pad = np.zeros((stop - max(start, real), *shape[1:]), np.float32 if have is None else have.dtype)
        return pad if have is None else np.concatenate([have, pad])

    return rows, part_shape


def tensor_from_rows(read: Reader, shape: tuple[int, ...], dtype: llaisys.DType,
                     device: llaisys.Device) -> llaisys.Tensor:
    """A tensor of ``shape`` in ``dtype`` on ``device`` holding the rows ``read`` returns (converted once)."""
    if device.type == "cpu":  # straight into the weight's own buffer
        tensor = llaisys.empty(shape, dtype, device)
        host = bytes_of(tensor)
    else:
        host = host_buffer(math.prod(shape) * dtype.itemsize)
    values = host.view(dtype.numpy).reshape(shape)
    step = max(1, CHUNK_VALUES // max(1, math.prod(shape[1:])))
    for start in range(0, shape[0], step):
        stop = min(start + step, shape[0])
        np.copyto(values[start:stop], read(start, stop), casting="unsafe")
    return tensor if device.type == "cpu" else llaisys.from_numpy(values, device)


def build(read: Reader, shape: tuple[int, ...], part: Part | None, dtype: llaisys.DType, device: llaisys.Device,
          quantize: str | None, name: str) -> llaisys.Tensor | Int8Weight | BlockWeight:
    """``part`` (None: all) of the weight of ``shape`` that ``read`` reads, on ``device``: quantized as
    ``quantize`` says ("int8", "int4", "q8_0": quantize.quantized_weight) when it is a matrix, else in
    ``dtype``."""
    if part is not None:
        read, shape = part_reader(read, shape, part)
    if quantize and len(shape) == 2:
        return quantized_weight(quantize, read, shape, device, name)
    return tensor_from_rows(read, shape, dtype, device)


def build_experts(reads: list[Reader], shape: tuple[int, int], part: Part, dtype: llaisys.DType,
                  device: llaisys.Device, quantize: str | None, names: list[str]) -> llaisys.Tensor | Int8Experts:
    """``part`` of each of the len(reads) expert matrices of ``shape`` (expert e's rows read by ``reads[e]``),
    stacked [E, N', K'] on ``device``: in int8 when ``quantize`` asks for any quantized format (a mixture's
    experts are int8 for int4 too: loading/quantize.py), else in ``dtype``."""
    cut = [part_reader(read, shape, part)[0] for read in reads]
    n, k = part.shape(shape)
    if quantize:
        return int8_experts(cut, (n, k), device, names)

    def stacked_rows(start: int, stop: int) -> np.ndarray:  # rows [start, stop) of the [E N', K'] stack
        pieces = []
        while start < stop:
            e, row = divmod(start, n)
            end = min(stop, (e + 1) * n)
            pieces.append(cut[e](row, row + end - start))
            start = end
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    return tensor_from_rows(stacked_rows, (len(reads) * n, k), dtype, device).view(len(reads), n, k)
