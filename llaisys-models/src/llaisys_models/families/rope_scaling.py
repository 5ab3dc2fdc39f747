"""Rope scaling: the inverse-frequency table a config asks for, computed once at load time.

``llaisys.ops.rope`` turns pair j at position p by the f32 angle p * inv_freq[j] and scales cos/sin by a
factor; every variant here is such a table and factor, computed as HF transformers computes it
(``modeling_rope_utils``) in f32, step by step, so that f32 models stay token-exact with HF:

    default   inv_freq[j] = 1 / theta^(2j / d)
    linear    inv_freq / factor
    llama3    (Llama 3.1 / 3.2) long wavelengths divided by factor, short ones kept, a smooth ramp between
    yarn      (Qwen2.5 long context, ...) a ramp between inv_freq / factor and inv_freq over the dimensions,
              and cos/sin times the attention factor 0.1 ln(factor) + 1

A GGUF file of a Llama 3.1 / 3.2 model holds its llama3 table as per-frequency divisors instead
(``rope_freqs.weight``, llama.cpp's converter computes them from the same formula): "freq_factors".

longrope (Phi-3 128k) and dynamic switch frequencies with the sequence length, which one table cannot say:
they are refused by name (config.py).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

import llaisys

SUPPORTED = ("default", "linear", "llama3", "yarn")
f32 = np.float32


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """The rope of a config: its type and the parameters that type reads (None: not given)."""

    rope_type: str = "default"
    factor: float | None = None
    low_freq_factor: float | None = None  # llama3
    high_freq_factor: float | None = None  # llama3
    original_max_position_embeddings: int | None = None  # llama3, yarn
    beta_fast: float | None = None  # yarn
    beta_slow: float | None = None  # yarn
    attention_factor: float | None = None  # yarn
    mscale: float | None = None  # yarn
    mscale_all_dim: float | None = None  # yarn
    truncate: bool = True  # yarn
    freq_factors: tuple[float, ...] | None = None  # "freq_factors" (GGUF rope_freqs.weight): inv_freq / factor[j]


def table(head_dim: int, theta: float, rope: RopeScaling, max_position_embeddings: int) -> tuple[np.ndarray, float]:
    """(inv_freq f32 [head_dim / 2], cos/sin scale) of ``rope``."""
    inv = llaisys.ops.rope_inv_freq(head_dim, theta)
    if rope.rope_type == "default":
        return inv, 1.0
    if rope.rope_type == "linear":
        return inv / f32(rope.factor), 1.0
    if rope.rope_type == "llama3":
        return _llama3(inv, rope), 1.0
    if rope.rope_type == "freq_factors":  # llama.cpp: theta_j = p * inv_freq[j] / factor[j]
        return inv / np.asarray(rope.freq_factors, np.float32), 1.0
    return _yarn(head_dim, theta, rope, max_position_embeddings)


def _llama3(inv: np.ndarray, rope: RopeScaling) -> np.ndarray:
    """HF's _compute_llama3_parameters, in its f32 order of operations."""
    low_freq, high_freq, old = rope.low_freq_factor, rope.high_freq_factor, rope.original_max_position_embeddings
    # (config.py reads each of them for a llama3 rope, and refuses a config without one)
    assert rope.factor is not None and low_freq is not None and high_freq is not None and old is not None
    factor, low = f32(rope.factor), f32(low_freq)
    low_wavelen, high_wavelen = f32(old / low_freq), f32(old / high_freq)
    wavelen = f32(2 * math.pi) / inv
    scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (f32(old) / wavelen - low) / f32(high_freq - low_freq)
    smoothed = (f32(1) - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def _yarn(head_dim: int, theta: float, rope: RopeScaling, max_position_embeddings: int) -> tuple[np.ndarray, float]:
    """HF's _compute_yarn_parameters: the table in its f32 order of operations, the attention factor in double."""
    original = rope.original_max_position_embeddings
    assert original is not None  # (config.py refuses a yarn rope without it)
    factor = rope.factor if rope.factor is not None else max_position_embeddings / original

    def get_mscale(scale: float, mscale: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    attention = rope.attention_factor
    if attention is None:
        if rope.mscale and rope.mscale_all_dim:
            attention = get_mscale(factor, rope.mscale) / get_mscale(factor, rope.mscale_all_dim)
        else:
            attention = get_mscale(factor)
    beta_fast, beta_slow = rope.beta_fast or 32, rope.beta_slow or 1

    def correction_dim(rotations: float) -> float:
        return head_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # HF: prevents a division by zero
    # the powers theta^(2j / d) as rope_inv_freq rounds them (correctly rounded, then f32)
    exponent = np.arange(0, head_dim, 2, dtype=np.float32) / f32(head_dim)
    powers = np.power(np.float64(f32(theta)), exponent.astype(np.float64)).astype(np.float32)
    extrapolation = f32(1) / powers
    interpolation = f32(1) / (f32(factor) * powers)
    ramp = np.clip((np.arange(head_dim // 2, dtype=np.float32) - f32(low)) / f32(high - low), f32(0), f32(1))
    extrapolation_factor = f32(1) - ramp
    inv = interpolation * (f32(1) - extrapolation_factor) + extrapolation * extrapolation_factor
    return inv.astype(np.float32), float(attention)
