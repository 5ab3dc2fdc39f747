"""Argument validation shared by every op frontend: each failure names the op and the argument."""

from __future__ import annotations

from ..dtype import DType, bfloat16, float16, float32, int64
from ..errors import LlaisysValueError
from ..native import NUMERICS_CODES
from ..tensor import Tensor

FLOATS = (float32, float16, bfloat16)


def fail(op: str, message: str):
    raise LlaisysValueError(f"{op}: {message}")


def tensors(op: str, **named: Tensor | None):
    """All are Tensors (None allowed for optional ones) on one device; returns that device."""
    device = None
    for name, t in named.items():
        if t is None:
            continue
        if not isinstance(t, Tensor):
            fail(op, f"{name} must be a llaisys.Tensor, got {type(t).__name__}")
        if device is None:
            device, first = t.device, name
        elif t.device != device:
            fail(op, f"{name} is on {t.device} but {first} is on {device}; all tensors must share a device")
    return device


def dtype(op: str, name: str, t: Tensor, allowed: tuple[DType, ...]):
    if t.dtype not in allowed:
        fail(op, f"{name} has dtype {t.dtype.name}; expected {' or '.join(d.name for d in allowed)}")


def same_dtype(op: str, ref_name: str, ref: Tensor, **others: Tensor | None):
    for name, t in others.items():
        if t is not None and t.dtype != ref.dtype:
            fail(op, f"{name} has dtype {t.dtype.name} but {ref_name} has {ref.dtype.name}")


def shape(op: str, name: str, t: Tensor, expected: tuple):
    if t.shape != tuple(expected):
        fail(op, f"{name} has shape {t.shape}; expected {tuple(expected)}")


def ndim(op: str, name: str, t: Tensor, n: int):
    if t.ndim != n:
        fail(op, f"{name} must be {n}-d, got shape {t.shape}")


def contiguous(op: str, **named: Tensor | None):
    for name, t in named.items():
        if t is not None and not t.is_contiguous():
            fail(op, f"{name} must be contiguous (shape {t.shape}, strides {t.strides}); call .contiguous()")


def writable(op: str, name: str, t: Tensor):
    if t.storage.readonly:
        fail(op, f"{name} is read-only memory and cannot be written")


def index_tensor(op: str, name: str, t: Tensor, expected_shape: tuple | None = None):
    dtype(op, name, t, (int64,))
    if expected_shape is not None:
        shape(op, name, t, expected_shape)


def number(op: str, name: str, value, low=None, high=None, integer=False, low_open=False):
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        fail(op, f"{name} must be {'an int' if integer else 'a number'}, got {value!r}")
    if value != value:  # NaN
        fail(op, f"{name} must not be NaN")
    if low is not None and (value < low or (low_open and value == low)):
        fail(op, f"{name} must be {'>' if low_open else '>='} {low}, got {value!r}")
    if high is not None and value > high:
        fail(op, f"{name} must be <= {high}, got {value!r}")


def numerics(op: str, value) -> int:
    """The ABI code of a ``numerics=`` argument: "exact" (f32 inside, one rounding) or "hf" (round where
    HF transformers rounds, for f16 / bf16)."""
    try:
        return NUMERICS_CODES[value]
    except (KeyError, TypeError):
        fail(op, f"numerics must be 'exact' or 'hf', got {value!r}")
