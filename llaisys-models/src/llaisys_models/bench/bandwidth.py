"""Decode's memory-bandwidth bound for ``llaisys bench``: the bytes a decode step reads, over the bandwidth a copy
measures on the device (a decode step of a dense model streams every weight once: its rate cannot beat
bandwidth / bytes)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (llaisys and the model's classes are imported when measuring)
    import llaisys

    from ..families.causal_lm import CausalLM
    from ..families.weights import Int8Experts, Linear

PROBE_SHAPE = (1 << 12, 1 << 14)  # float32: 256 MiB, past any cache

def copy_bandwidth(device: llaisys.Device) -> float:
    """Bytes per second that a device-side copy of 256 MiB moves (read + written), best of 5, with the backend's
    own threads. (benchmarks/e2e.py reads with torch, which llaisys does not depend on: this is the same
    streaming measurement through llaisys.)"""
    import llaisys

    src = llaisys.zeros(PROBE_SHAPE, llaisys.float32, device)
    dst = llaisys.empty(PROBE_SHAPE, llaisys.float32, device)
    best = float("inf")
    for _ in range(5):
        llaisys.synchronize(device)
        t0 = time.perf_counter()
        llaisys.ops.rearrange(dst, src)
        llaisys.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best

def decode_bytes(model: CausalLM, new_tokens: int) -> float:
    """Bytes one decode step of a tgN test reads: every weight matrix (the embedding table only for its one row,
    left out; a mixture of experts' chosen share of its experts) and the KV cache at its mean length."""
    w, c = model.weights, model.config
    total: float = _nbytes(w.lm_head) + _nbytes(w.norm)
    for layer in w.layers:
        for name, value in vars(layer).items():
            if value is None:
                continue
            if name == "experts":
                share = c.num_experts_per_tok / c.num_experts
                total += _nbytes(value.router) + share * sum(_nbytes(m) for m in (value.gate, value.up, value.down))
            else:
                total += _nbytes(value)
    mean_positions = 1 + (new_tokens + 1) / 2  # the 1-token prompt, then one more position per step
    return total + model.kv_shape.bytes_per_token * mean_positions

def _nbytes(weight: Linear | Int8Experts) -> int:
    """A tensor's bytes, or a quantized weight's (its blocks, scales, and zero points and permutation if any)."""
    import llaisys

    from ..families.weights import Adapted

    if isinstance(weight, Adapted):  # (the LoRA adapters beside it are read per adapted row only: not counted)
        return _nbytes(weight.base)
    if isinstance(weight, llaisys.Tensor):
        return weight.nbytes
    extra = [getattr(weight, name, None) for name in ("zeros", "perm")]  # (GPTQ / AWQ: GQWeight)
    return weight.weight.nbytes + weight.scales.nbytes + sum(t.nbytes for t in extra if t is not None)
