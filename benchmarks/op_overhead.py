"""Fixed cost of one op call from Python to a kernel and back (tiny tensors, so the kernel is ~free).

    python benchmarks/op_overhead.py

Prints per-call microseconds for: the raw ctypes call of the C export, the same through
the backend's bound kernel, and the public llaisys.ops frontend (validation + dispatch),
next to torch's own per-op overhead for the same tiny op.
"""

import ctypes
import timeit

import numpy as np
import torch

import llaisys
from llaisys.plugins import registry


def per_call_us(fn, number=20000):
    fn()
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def main():
    x = llaisys.from_numpy(np.ones((1,), np.float32))
    out = llaisys.empty((1,))
    backend = registry().backend("cpu")
    lib_fn = backend.lib._lib.llaisys_cpu_rearrange
    shape = (ctypes.c_int64 * 1)(1)
    strides = (ctypes.c_int64 * 1)(1)
    kernel = registry().kernel("rearrange", "cpu")
    a, b, c = (llaisys.from_numpy(np.ones((1,), np.float32)) for _ in range(3))
    tx, tout = torch.ones(1), torch.empty(1)
    rows = [
        ("raw ctypes call (rearrange, 1 element)",
         per_call_us(lambda: lib_fn(0, None, 4, 1, shape, out.data_ptr(), strides, x.data_ptr(), strides))),
        ("bound kernel (packs tensors, checks status)", per_call_us(lambda: kernel(0, None, out, x))),
        ("llaisys.ops.rearrange (validate + dispatch)", per_call_us(lambda: llaisys.ops.rearrange(out, x))),
        ("torch: tout.copy_(tx)", per_call_us(lambda: tout.copy_(tx))),
    ]
    try:
        rows.append(("llaisys.ops.add (1 element)", per_call_us(lambda: llaisys.ops.add(c, a, b))))
        rows.append(("torch.add(out=) (1 element)", per_call_us(lambda: torch.add(tx, tx, out=tout))))
    except llaisys.LlaisysError as e:
        rows.append((f"llaisys.ops.add: {e}", float("nan")))
    rows.append(("llaisys.empty((1,)) (cached allocation)", per_call_us(lambda: llaisys.empty((1,)))))
    rows.append(("torch.empty(1)", per_call_us(lambda: torch.empty(1))))
    width = max(len(r[0]) for r in rows)
    print(f"{'call':<{width}}  us/call")
    for name, us in rows:
        print(f"{name:<{width}}  {us:7.2f}")


if __name__ == "__main__":
    main()
