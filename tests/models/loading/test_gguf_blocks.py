"""A GGUF file's quantized tensors kept in llaisys' block formats (llaisys_models.loading.gguf.blocks): every value of
every block the stored one, bit for bit.

Blocks are random bytes (every bit pattern a file can hold, test_gguf_quants.random_tensor) with finite f16
scales. Converted to llaisys' blocks and read back by the backend's embedding_q (each weight computed in f32
as the format's formula says), every value must equal the ``gguf`` package's reference dequantizer (ggml's
own) to the last bit: the formats hold the values exactly.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

import llaisys
from helpers import skip_without_kernels
from helpers.gguf_tensors import random_tensor
from llaisys_models.loading.gguf import blocks
from llaisys_models.loading.gguf import weights as gguf_weights
from llaisys_models.loading.gguf.reader import GGUFFile

SHAPES = [(1, 1), (17, 3), (40, 2)]  # (rows, blocks per row): one block of rows, a partial second, three


def converted(raw: np.ndarray, qtype: Q, rows: int, k: int):
    weight_shape, scales_shape = llaisys.ops.quant_shapes(blocks.FORMATS[qtype], rows, k)
    weight, scales = np.full(weight_shape, 0xA5, np.uint8), np.full(scales_shape, 0xA5, np.uint8)
    blocks.convert_rows(raw, qtype, weight, scales)
    return weight, scales


def decoded(weight, scales, qtype: Q, rows: int, k: int, device="cpu") -> np.ndarray:
    out = llaisys.empty((rows, k), llaisys.float32, device)
    index = llaisys.from_numpy(np.arange(rows, dtype=np.int64), device)
    llaisys.ops.embedding_q(out, index, llaisys.from_numpy(weight, device), llaisys.from_numpy(scales, device),
                            blocks.FORMATS[qtype], rows)
    return out.numpy()


@pytest.mark.parametrize("qtype", list(blocks.FORMATS), ids=lambda q: q.name)
def test_blocks_hold_the_stored_values_bit_for_bit(qtype, device):
    skip_without_kernels(device, ["embedding_q"], "reading blocks")
    block = GGML_QUANT_SIZES[qtype][0]
    for rows, per_row in SHAPES:
        raw = random_tensor(qtype, rows, per_row, np.random.default_rng([qtype.value, rows]))
        weight, scales = converted(raw, qtype, rows, per_row * block)
        want = gguf.quants.dequantize(raw, qtype)
        got = decoded(weight, scales, qtype, rows, per_row * block, device)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
        # the same through llaisys.ops.unpack_quant / dequantize_quant (numpy), and rows past N are zero
        codes, *params = llaisys.ops.unpack_quant(blocks.FORMATS[qtype], weight, scales, rows, per_row * block)
        np.testing.assert_array_equal(llaisys.ops.dequantize_quant(blocks.FORMATS[qtype], codes, *params), want)
        if rows % 16:
            words = llaisys.ops.quant.weight_words(blocks.FORMATS[qtype], weight)
            assert not words[-1, ..., rows % 16:].any()


def test_chunks_permuted_rows_and_parts_of_a_tensor(tmp_path, monkeypatch):
    """block_weight converts in chunks of rows (each chunk's pages dropped after), takes a row order (llama's Q/K
    un-permutation) and a slice of rows (a part of a fused tensor): the same blocks as converting those rows at
    once."""
    qtype, rows, per_row = Q.Q4_K, 50, 2
    raw = random_tensor(qtype, rows, per_row, np.random.default_rng(9))
    path = tmp_path / "t.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("w", raw, raw_shape=raw.shape, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    f = GGUFFile(path)
    monkeypatch.setattr(gguf_weights, "CHUNK_BYTES", 3 * raw.shape[1])  # 16 rows per chunk: 4 chunks
    k = per_row * 256
    order = np.random.default_rng(1).permutation(rows)
    for rows_arg, want_raw in ((None, raw), (order, raw[order]), (slice(7, 40), raw[7:40])):
        weight = gguf_weights.block_weight(f, "w", (len(want_raw), k), llaisys.Device("cpu"), rows_arg)
        want = converted(want_raw, qtype, len(want_raw), k)
        np.testing.assert_array_equal(weight.weight.numpy(), want[0])
        np.testing.assert_array_equal(weight.scales.numpy(), want[1])
