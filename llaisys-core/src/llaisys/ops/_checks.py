"""Argument validation shared by every op frontend: each failure names the op and the argument.

These run when a frontend meets a new combination of argument layouts (see ``_dispatch``);
what must be checked on every call (pointer overlap, scalars) is a few comparisons inline in
the frontend, which calls in here only to raise.
"""

from __future__ import annotations

from typing import NoReturn

import numpy as np

from ..abi import INT64_MAX, Numerics
from ..dtype import DType, bfloat16, float16, float32, int64
from ..errors import LlaisysValueError
from ..tensor import Tensor

FLOATS = (float32, float16, bfloat16)


def fail(op: str, message: str) -> NoReturn:
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
        elif t.device is not device:
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
    """``value`` as a Python int (``integer``) or float, within [low, high] (or (low, high]); else raise."""
    kinds = (int, np.integer) if integer else (int, float, np.integer, np.floating)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, kinds):
        fail(op, f"{name} must be {'an int' if integer else 'a number'}, got {value!r}")
    value = int(value) if integer else float(value)
    if value != value:  # NaN
        fail(op, f"{name} must not be NaN")
    if low is not None and (value < low or (low_open and value == low)):
        fail(op, f"{name} must be {'>' if low_open else '>='} {low}, got {value!r}")
    if high is not None and value > high:
        fail(op, f"{name} must be <= {high}, got {value!r}")
    return value


def size(op: str, name: str, value) -> int:
    """A count that a kernel receives as int64."""
    return number(op, name, value, low=0, high=INT64_MAX, integer=True)


def overlap(op: str, out_name: str, in_name: str, exact_allowed: bool = False):
    """Raise for an output that shares memory with an input (called once the frontend's pointer test hit)."""
    if exact_allowed:
        fail(op, f"{out_name} and {in_name} overlap in memory; {out_name} may be {in_name} itself (the same "
                 f"elements) for an in-place update, or must share no memory with it")
    fail(op, f"{out_name} and {in_name} overlap in memory; {out_name} must share no memory with {in_name}")


# the ``numerics=`` values of rms_norm / rope / self_attention / swiglu -> the ABI code
NUMERICS = {"exact": int(Numerics.EXACT), "hf": int(Numerics.HF),
            Numerics.EXACT: int(Numerics.EXACT), Numerics.HF: int(Numerics.HF)}


def numerics(op: str, value) -> int:
    """The ABI code of a ``numerics=`` argument: "exact" (f32 inside, one rounding) or "hf" (round where
    HF transformers rounds, for f16 / bf16)."""
    try:
        return NUMERICS[value]
    except (KeyError, TypeError):
        fail(op, f"numerics must be 'exact' or 'hf', got {value!r}")
