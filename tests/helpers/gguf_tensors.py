"""Random ggml-quantized tensors with finite values, as stored bytes."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

HALF_FIELDS = {Q.Q8_0: (0,), Q.Q4_0: (0,), Q.Q5_0: (0,), Q.Q4_1: (0, 2), Q.Q5_1: (0, 2), Q.Q2_K: (80, 82),
               Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}

FLOAT_TYPES = (Q.F32, Q.F16, Q.BF16)


def random_tensor(qtype: Q, rows: int, blocks_per_row: int, rng) -> np.ndarray:
    """Stored bytes [rows, bytes per row] of a random ``qtype`` tensor with finite values."""
    block, type_size = GGML_QUANT_SIZES[qtype]
    if qtype in FLOAT_TYPES:
        values = rng.standard_normal((rows, blocks_per_row * block * (256 if block == 1 else 1))).astype(np.float32)
        stored = {Q.F32: values, Q.F16: values.astype(np.float16), Q.BF16: values.astype(ml_dtypes.bfloat16)}[qtype]
        return stored.view(np.uint8)
    blocks = rng.integers(0, 256, size=(rows * blocks_per_row, type_size), dtype=np.uint8)
    for at in HALF_FIELDS[qtype]:
        blocks[:, at:at + 2] = rng.uniform(-2.0, 2.0, (len(blocks), 1)).astype(np.float16).view(np.uint8)
    return blocks.reshape(rows, blocks_per_row * type_size)
