"""linear_gq (GPTQ / AWQ 4-bit groups, activations as they are) on the CPU at the Qwen2-1.5B linears, against torch on
the dequantized weights in bf16 and against linear_q's q4_0 (llama.cpp's 4-bit blocks, activations rounded to int8
per 32), decode (M = 1) and prefill (M = 512), in one run.

    python benchmarks/linear_gq.py                    # bf16 activations, group size 128
    python benchmarks/linear_gq.py --dtype f32 --group-size 32 --quick
    python benchmarks/linear_gq.py --threads 1

Each row: llaisys linear_gq ms, torch bf16 ms (F.linear on the exactly dequantized weights, the same values), llaisys
linear_q q4_0 ms, the ratios torch / gq and q4_0 / gq (> 1: linear_gq is faster), and for decode the 4-bit
bandwidth bound: the bytes linear_gq must read (codes, f16 scales, zero points) over this machine's read bandwidth
(a large multi-threaded sum, measured at start-up), with gq's fraction of it (bound / gq); for prefill GFLOP/s.
Times are medians of calls taken in alternating rounds (benchmarks/ops_cpu.py's Timer), so that noise from other
processes hits every side. Decode weights rotate over enough copies to exceed the last-level cache, as in a decode
step where every layer's weights come from DRAM; prefill reuses one copy.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ops_cpu import Timer, last_level_cache_bytes, lt, machine_read_bandwidth  # noqa: E402

import llaisys  # noqa: E402

HIDDEN, INTER = 1536, 8960
SHAPES = [("q/o_proj", HIDDEN, HIDDEN), ("gate/up_proj", INTER, HIDDEN), ("down_proj", HIDDEN, INTER)]  # name, N, K
PREFILL = 512
TORCH = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def gq_weights(rng, n, k, gs):
    """Random 4-bit codes, f16 scales and zero points (an asymmetric GPTQ / AWQ layer) -> (blocks, dequantized f32)."""
    q = rng.integers(0, 16, (n, k)).astype(np.uint8)
    groups = k // gs
    scales = (rng.random((n, groups)) * 0.02 + 0.005).astype(np.float16)
    zeros = rng.integers(0, 16, (n, groups)).astype(np.uint8)
    return llaisys.ops.pack_gq(q, scales, zeros, 4, gs), llaisys.ops.dequantize_gq(q, scales, zeros, gs)


def q4_0_weights(w: np.ndarray):
    """w in q4_0 blocks (d = max|w| / -8 per 32, as ggml quantizes)."""
    n, k = w.shape
    g = w.reshape(n, k // 32, 32)
    idx = np.abs(g).argmax(axis=2)
    mx = np.take_along_axis(g, idx[..., None], axis=2)[..., 0]
    d = mx / -8
    inv = np.where(d != 0, 1 / np.where(d != 0, d, 1), 0)
    codes = np.clip(np.floor(g * inv[..., None] + 8.5), 0, 15).astype(np.uint8).reshape(n, k)
    return llaisys.ops.pack_quant("q4_0", codes, d.astype(np.float16))


def case(name, n, k, m, gs, dtype, copies, rng):
    """{side: fn(i)}, bytes linear_gq reads per call."""
    tdt = TORCH[dtype]
    (w, s, z), w32 = gq_weights(rng, n, k, gs)
    qw, qs = q4_0_weights(w32)
    gq_sets = [[lt(torch.from_numpy(a.copy())) for a in (w, s, z)] for _ in range(copies)]
    q_sets = [[lt(torch.from_numpy(a.copy())) for a in (qw, qs)] for _ in range(copies)]
    torch_w = [torch.from_numpy(w32).to(tdt) for _ in range(copies)]
    x = torch.randn(m, k).to(tdt)
    out_gq, out_q, out_t = torch.empty(m, n, dtype=tdt), torch.empty(m, n, dtype=tdt), torch.empty(m, n, dtype=tdt)
    lx, lgq, lq = lt(x), lt(out_gq), lt(out_q)

    def gq(i):
        llaisys.ops.linear_gq(lgq, lx, *gq_sets[i % copies], 4, gs)

    def q4_0(i):
        llaisys.ops.linear_q(lq, lx, *q_sets[i % copies], "q4_0")

    def torch_bf16(i):
        torch.matmul(x, torch_w[i % copies].T, out=out_t)

    gq(0)
    q4_0(0)
    torch_bf16(0)
    ref = x.double() @ torch.from_numpy(w32).double().T
    err = (out_gq.double() - ref).abs().max().item() / ref.abs().max().item()
    err_q = (out_q.double() - ref).abs().max().item() / ref.abs().max().item()
    return {"gq": gq, "torch": torch_bf16, "q4_0": q4_0}, w.nbytes + s.nbytes + z.nbytes, (err, err_q)


def simd_level() -> str:
    """The SIMD path of the CPU backend's kernels in this process."""
    import ctypes

    import llaisys_backend_cpu
    fn = ctypes.CDLL(str(llaisys_backend_cpu.LIBRARY)).llaisys_cpu_simd_level
    fn.restype = ctypes.c_char_p
    return fn().decode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", choices=list(TORCH), default="bf16", help="activations (and torch's weights)")
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    timer = Timer(args.quick)
    bw = machine_read_bandwidth()
    llc = last_level_cache_bytes()
    rng = np.random.default_rng(0)
    torch_name = f"torch {args.dtype}"
    print(f"linear_gq 4-bit, group size {args.group_size}, {args.dtype} activations; {args.threads} threads; "
          f"read bandwidth {bw:.1f} GB/s; last-level cache {llc >> 20} MiB; simd {simd_level()}")
    print("ratio columns: other / gq (> 1: linear_gq is faster); bound = 4-bit bytes / read bandwidth")
    header = (f"{'shape':<24} {'M':>4} {'gq ms':>8} {torch_name + ' ms':>14} {'q4_0 ms':>8} {'torch/gq':>8} "
              f"{'q4_0/gq':>8} {'bound ms':>8} {'bound/gq':>8} {'GB/s|GFLOP/s':>12}  max rel err gq, q4_0")
    print(header)
    print("-" * len(header))
    for m in (1, PREFILL):
        for name, n, k in SHAPES:
            gq_bytes = n * k // 2 + 3 * (n * k // args.group_size)
            copies = max(1, math.ceil(2 * llc / gq_bytes)) if m == 1 else 1  # every side's copies exceed the LLC
            sides, nbytes, (err, err_q) = case(name, n, k, m, args.group_size, args.dtype, copies, rng)
            times, why = timer.sides(sides)
            t_gq, t_torch, t_q = (times[s] for s in ("gq", "torch", "q4_0"))
            bound = nbytes / (bw * 1e9)
            rate = f"{nbytes / t_gq / 1e9:.1f}" if m == 1 else f"{2 * m * n * k / t_gq / 1e9:.0f}"
            print(f"{name + f' {n}x{k}':<24} {m:>4} {t_gq * 1e3:>8.3f} {t_torch * 1e3:>14.3f} {t_q * 1e3:>8.3f} "
                  f"{t_torch / t_gq:>8.2f} {t_q / t_gq:>8.2f} "
                  f"{(bound * 1e3 if m == 1 else float('nan')):>8.3f} {(bound / t_gq if m == 1 else float('nan')):>8.2f} "
                  f"{rate:>12}  {err:.1e}, {err_q:.1e}")
            assert gq_bytes == nbytes, (gq_bytes, nbytes)


if __name__ == "__main__":
    main()
