"""Deliberately wrong kernels (the CPU's, then one change) that the conformance suite must catch."""

from __future__ import annotations

import ctypes

import llaisys
import llaisys.testing


def add_one_ulp_off_in_f32(cpu_add):
    """The correct sum, then the last bit of every fifth element (from the fourth) flipped, in f32 only: 1 ulp,
    ~1e-7 relative, far inside the f32 tolerance (1e-5), so only the exactness of the sum catches it."""
    def kernel(device, stream, code, n, c, a, b):
        status = cpu_add(device, stream, code, n, c, a, b)
        if status == 0 and code == llaisys.float32.code:
            bits = (ctypes.c_uint32 * n).from_address(c)
            for i in range(3, n, 5):
                bits[i] ^= 1
        return status
    return kernel
