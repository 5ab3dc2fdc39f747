"""How a result is judged: the per-dtype tolerances (docs/design/numerics.md) and the comparisons that name what
differs.

The reference is computed exactly (float64) and rounded once to the output's dtype (r); the kernel's value a
passes when |r - a| <= tol + tol * |r| (atol = rtol = tol, as the repository's op tests compare). Non-finite
values must match exactly: NaN where, and only where, the reference is NaN (outputs start as NaN, so an element
a kernel forgot to write shows), an infinity only where the reference has the same one.
"""

from __future__ import annotations

import numpy as np

from ..dtype import DType, bfloat16, float16, float32

TOLERANCE = {float32: 1e-5, float16: 1e-3, bfloat16: 1e-2}
ROPE_TOLERANCE = {float32: 1e-4, float16: 1e-3, bfloat16: 1e-2}
ADD_TOLERANCE = {float32: 1e-5, float16: 1e-3, bfloat16: 1e-3}


class CaseFailed(AssertionError):
    """A case's result differs from its reference; ``max_error`` is the largest |r - a| where one was measured."""

    def __init__(self, message: str, max_error: float | None = None):
        super().__init__(message)
        self.message = message
        self.max_error = max_error


def as_f64(array: np.ndarray) -> np.ndarray:
    """Any numeric array (bf16 included) widened exactly to float64."""
    with np.errstate(invalid="ignore"):  # (NaN payloads)
        return np.asarray(array).astype(np.float64)


def rounded(reference: np.ndarray, dtype: DType) -> np.ndarray:
    """The float64 reference rounded once to ``dtype`` (ml_dtypes rounds float64 to bf16 directly), widened back."""
    with np.errstate(over="ignore"):
        return np.asarray(reference, np.float64).astype(dtype.numpy).astype(np.float64)


def _show(value) -> str:
    """One element for a message: an int as an int, a float in full (repr of a Python float)."""
    value = float(value)
    return str(int(value)) if value.is_integer() and abs(value) < 2 ** 63 else repr(value)


def _where(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(mask)[0])


def _max_error(got: np.ndarray, want: np.ndarray) -> float:
    finite = np.isfinite(want) & np.isfinite(got)
    with np.errstate(invalid="ignore", over="ignore"):
        return float(np.abs(got - want)[finite].max()) if finite.any() else float("nan")


def close(got: np.ndarray, reference: np.ndarray, dtype: DType, tol: float, what: str = "out") -> None:
    """``got`` (the kernel's output, any dtype) against the float64 ``reference`` rounded to ``dtype``."""
    got, want = as_f64(got), rounded(reference, dtype)
    if got.shape != want.shape:
        raise CaseFailed(f"{what} has shape {got.shape}, expected {want.shape}")
    nan_mismatch = np.isnan(got) != np.isnan(want)
    if nan_mismatch.any():
        i = _where(nan_mismatch)
        raise CaseFailed(f"{what}: {int(nan_mismatch.sum())} of {got.size} elements are NaN where the reference is "
                         f"not, or the other way round (unwritten elements?); first at {i}: got {_show(got[i])}, "
                         f"expected {_show(want[i])}", _max_error(got, want))
    finite = np.isfinite(want)
    with np.errstate(invalid="ignore"):
        within = np.abs(got - want) <= tol + tol * np.abs(want)
    bad = np.where(finite, ~within, got != want) & ~np.isnan(want)
    if bad.any():
        i = _where(bad)
        error = _max_error(got, want)
        raise CaseFailed(f"{what}: {int(bad.sum())} of {got.size} elements differ beyond tol {tol:g}; first at {i}: "
                         f"got {_show(got[i])}, expected {_show(want[i])}; max error {error:.3g}", error)


def _is_float(array: np.ndarray) -> bool:
    return array.dtype.kind == "f" or array.dtype == bfloat16.numpy


def identical(got: np.ndarray, expected: np.ndarray, what: str = "out") -> None:
    """Bit for bit (any NaN equal to any NaN): for copies, exact arithmetic and the batch-invariance property."""
    got = np.asarray(got)
    expected = np.asarray(expected).astype(got.dtype)
    if got.shape != expected.shape:
        raise CaseFailed(f"{what} has shape {got.shape}, expected {expected.shape}")
    if _is_float(got):
        bits = f"u{got.dtype.itemsize}"
        same = got.view(bits) == expected.view(bits)
        same |= np.isnan(as_f64(got)) & np.isnan(as_f64(expected))
    else:
        same = got == expected
    if not same.all():
        g, e = as_f64(got), as_f64(expected)
        i, error = _where(~same), _max_error(g, e)
        raise CaseFailed(f"{what}: {int((~same).sum())} of {got.size} elements are not bit-exact; first at {i}: got "
                         f"{_show(g[i])}, expected {_show(e[i])}; max error {error:.3g}", error)


def exact(got: np.ndarray, reference: np.ndarray, dtype: DType, what: str = "out") -> None:
    """``got`` equals the float64 ``reference`` correctly rounded to ``dtype``, bit for bit."""
    with np.errstate(over="ignore"):  # (a sum past the dtype's range is its infinity)
        expected = np.asarray(reference, np.float64).astype(dtype.numpy)
    identical(got, expected, what)


def refused(call, *words: str) -> None:
    """``call()`` must raise LlaisysValueError (a bad argument core refuses before any kernel runs, or a kernel's
    INVALID_ARGUMENT) whose message holds each of ``words``."""
    from ..errors import LlaisysValueError

    try:
        call()
    except LlaisysValueError as e:
        missing = [w for w in words if w not in str(e)]
        if missing:
            raise CaseFailed(f"refused, but the message does not say {', '.join(map(repr, missing))}: {e}") from None
        return
    raise CaseFailed(f"accepted; expected a LlaisysValueError saying {', '.join(map(repr, words))}")
