"""How far an int8-quantized model may stray from its unquantized self: the bounds and their measure."""

from __future__ import annotations

import numpy as np

MAX_RELATIVE_ERROR = 0.15

MEAN_RELATIVE_ERROR = 0.08

MIN_ARGMAX_AGREEMENT = 0.85


def relative_errors(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    return np.linalg.norm(got - want, axis=1) / np.linalg.norm(want, axis=1)
