"""Random weight matrices for the quantization tests: dtypes and rows of very different magnitudes."""

from __future__ import annotations

import ml_dtypes
import numpy as np

BF16 = ml_dtypes.bfloat16

DTYPES = {"f32": np.float32, "f16": np.float16, "bf16": BF16}


def random_matrix(shape, dtype, seed) -> np.ndarray:
    """Normal values with rows and columns of very different magnitudes (as LLM weights have)."""
    rng = np.random.default_rng(seed)
    n, k = shape
    spread = np.exp(rng.normal(0, 2, (n, 1))) * np.exp(rng.normal(0, 1, (1, k)))
    return (rng.standard_normal(shape) * spread * 0.02).astype(dtype)
