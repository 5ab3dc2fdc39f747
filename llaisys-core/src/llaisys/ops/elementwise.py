"""Element-wise ops and the strided copy."""

from __future__ import annotations

from . import _checks as check
from ._dispatch import run

MAX_RANK = 16


def add(c, a, b) -> None:
    """c = a + b (same shape and dtype, contiguous)."""
    device = check.tensors("add", c=c, a=a, b=b)
    check.dtype("add", "c", c, check.FLOATS)
    check.same_dtype("add", "c", c, a=a, b=b)
    check.shape("add", "a", a, c.shape)
    check.shape("add", "b", b, c.shape)
    check.contiguous("add", c=c, a=a, b=b)
    check.writable("add", "c", c)
    if c.numel():
        run("add", device, c, a, b)


def swiglu(out, gate, up, numerics: str = "exact") -> None:
    """out = up * gate / (1 + exp(-gate))."""
    device = check.tensors("swiglu", out=out, gate=gate, up=up)
    code = check.numerics("swiglu", numerics)
    check.dtype("swiglu", "out", out, check.FLOATS)
    check.same_dtype("swiglu", "out", out, gate=gate, up=up)
    check.shape("swiglu", "gate", gate, out.shape)
    check.shape("swiglu", "up", up, out.shape)
    check.contiguous("swiglu", out=out, gate=gate, up=up)
    check.writable("swiglu", "out", out)
    if out.numel():
        run("swiglu", device, out, gate, up, code)


def rearrange(out, x) -> None:
    """Strided copy: out[i...] = x[i...] for any strides of either (same shape and dtype)."""
    device = check.tensors("rearrange", out=out, x=x)
    check.same_dtype("rearrange", "out", out, x=x)
    check.shape("rearrange", "x", x, out.shape)
    check.writable("rearrange", "out", out)
    if out.ndim > MAX_RANK:
        check.fail("rearrange", f"rank {out.ndim} exceeds the supported {MAX_RANK}")
    if out.numel():
        run("rearrange", device, out, x)
