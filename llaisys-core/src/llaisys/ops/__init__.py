"""Operators: output first, validated here, executed by the tensor's backend."""

from ._dispatch import implemented
from .elementwise import add, rearrange, swiglu
from .nn import INT8_GROUP, embedding, linear, linear_i8, rms_norm, rope, self_attention
from .paged import paged_attention, paged_kv_write
from .sampling import argmax, sample

__all__ = ["INT8_GROUP", "add", "argmax", "embedding", "implemented", "linear", "linear_i8", "paged_attention",
           "paged_kv_write", "rearrange", "rms_norm", "rope", "sample", "self_attention", "swiglu"]
