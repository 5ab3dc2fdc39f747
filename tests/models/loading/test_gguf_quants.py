"""llaisys' GGUF block decoders against the ``gguf`` package's reference dequantizers (ggml's own).

In float32 every value must be bit-equal to the reference; into bf16/f16 it must be the reference
rounded once. Blocks are random bytes (every bit pattern a file can hold) with finite f16 scales,
and, for the types the gguf package can quantize, real quantized weights.
"""

from __future__ import annotations

import gguf
import ml_dtypes
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

from helpers.gguf_tensors import random_tensor
from llaisys_models.loading.gguf import quants

# byte offsets of each block's f16 fields (scales, mins): set to finite values in random blocks
REQUIRED = (Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K)
SHAPES = [(1, 1), (3, 2), (17, 3), (64, 8)]  # (rows, blocks per row)


def reference(raw: np.ndarray, qtype: Q) -> np.ndarray:
    if qtype == Q.F16:  # gguf's quants module reads F16 through numpy, like this
        return raw.view(np.float16).astype(np.float32)
    return gguf.quants.dequantize(raw, qtype)


def values_shape(raw: np.ndarray, qtype: Q) -> tuple[int, int]:
    block, type_size = GGML_QUANT_SIZES[qtype]
    return raw.shape[0], raw.shape[1] // type_size * block


def test_required_types_are_supported():
    assert set(REQUIRED) <= set(quants.SUPPORTED)


@pytest.mark.parametrize("qtype", quants.SUPPORTED, ids=lambda q: q.name)
@pytest.mark.parametrize("rows,blocks", SHAPES, ids=lambda v: str(v))
def test_float32_is_bit_equal_to_the_reference(qtype, rows, blocks):
    rng = np.random.default_rng([qtype.value, rows, blocks])
    raw = random_tensor(qtype, rows, blocks, rng)
    out = np.full(values_shape(raw, qtype), np.nan, np.float32)
    quants.dequantize(raw, qtype, out)
    want = reference(raw, qtype)
    assert np.isfinite(want).all()
    np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("qtype", quants.SUPPORTED, ids=lambda q: q.name)
@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16], ids=["bf16", "f16"])
def test_half_outputs_are_the_reference_rounded_once(qtype, dtype):
    rng = np.random.default_rng([qtype.value, 7])
    raw = random_tensor(qtype, 17, 3, rng)
    out = np.full(values_shape(raw, qtype), np.nan, dtype)
    quants.dequantize(raw, qtype, out)
    np.testing.assert_array_equal(out.view(np.uint16), reference(raw, qtype).astype(dtype).view(np.uint16))


@pytest.mark.parametrize("qtype", quants.SUPPORTED, ids=lambda q: q.name)
def test_many_chunks_and_a_row_order(qtype, monkeypatch):
    """Chunk boundaries that do not divide the rows, and rows read in a given order."""
    monkeypatch.setattr(quants, "CHUNK_VALUES", 3 * values_shape(random_tensor(qtype, 1, 2, np.random.default_rng()),
                                                                 qtype)[1])
    rng = np.random.default_rng([qtype.value, 11])
    raw = random_tensor(qtype, 29, 2, rng)
    order = rng.permutation(29)
    out = np.full(values_shape(raw, qtype), np.nan, np.float32)
    quants.dequantize(raw, qtype, out, rows=order)
    np.testing.assert_array_equal(out, reference(raw, qtype)[order])


# one quantization step relative to the block's largest |weight| (ggml's Q4_0/Q5_0 map the extreme
# to -8/-16, so the other sign can be off by a whole step), with 10% for the f16 rounding of the scales
STEP_ERROR = {Q.Q8_0: 1 / 127, Q.Q4_0: 1 / 8, Q.Q4_1: 1 / 15, Q.Q5_0: 1 / 16, Q.Q5_1: 1 / 31, Q.BF16: 2 ** -8}


@pytest.mark.parametrize("qtype", list(STEP_ERROR), ids=lambda q: q.name)
def test_quantized_weights_decode_like_the_reference(qtype):
    """Weights quantized by the gguf package (real blocks, not random bytes)."""
    w = np.random.default_rng(3).standard_normal((45, 4096)).astype(np.float32) * 0.05
    raw = gguf.quants.quantize(w, qtype).view(np.uint8).reshape(45, -1)
    out = quants.dequantize(raw, qtype, np.empty(w.shape, np.float32))
    want = reference(raw, qtype)
    np.testing.assert_array_equal(out, want)
    blocks, decoded = w.reshape(-1, 32), out.reshape(-1, 32)  # and it is the weights, within a step
    assert (np.abs(decoded - blocks).max(axis=1) <= 1.1 * STEP_ERROR[qtype] * np.abs(blocks).max(axis=1)).all()


def test_a_raw_shape_that_does_not_fit_is_refused():
    raw = np.zeros((2, 34 * 3), np.uint8)
    with pytest.raises(ValueError, match="cannot hold"):
        quants.dequantize(raw, Q.Q8_0, np.empty((2, 64), np.float32))
