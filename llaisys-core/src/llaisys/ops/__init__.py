"""Operators: output first, validated here, executed by the tensor's backend."""

from ._dispatch import implemented
from .elementwise import add, rearrange, swiglu
from .nn import embedding, linear, rms_norm, rope, self_attention
from .paged import paged_attention, paged_kv_write
from .sampling import argmax, sample

__all__ = ["add", "argmax", "embedding", "implemented", "linear", "paged_attention", "paged_kv_write", "rearrange",
           "rms_norm", "rope", "sample", "self_attention", "swiglu"]
