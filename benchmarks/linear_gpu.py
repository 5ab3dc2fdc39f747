"""llaisys' linear on a GPU against torch's (cuBLAS), bf16, at the Qwen2-1.5B shapes.

    python benchmarks/linear_gpu.py                      # the batch-invariant kernel (the default)
    LLAISYS_CUDA_LINEAR_CUBLAS_ROWS=1 python benchmarks/linear_gpu.py   # llaisys through cuBLAS

Per (N, K, M): llaisys µs and torch µs per call (the best of 5 rounds of 20 calls, each round ended by a
synchronize), ratio = torch / llaisys (> 1: llaisys is faster), and llaisys' weight-read GB/s (what
bounds M = 1) and TFLOP/s. Both sides read copies of the same random weights.
"""

from __future__ import annotations

import argparse
import functools
import time

import ml_dtypes
import numpy as np
import torch

import llaisys

SHAPES = [(2048, 1536), (1536, 1536), (17920, 1536), (1536, 8960), (151936, 1536)]  # (N, K): qkv, o, gate+up, down, lm_head


def best_us(run, sync, calls: int = 20, rounds: int = 5) -> float:
    run(), sync()
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls):
            run()
        sync()
        best = min(best, (time.perf_counter() - t) / calls)
    return best * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rows", default="1,4,16,128,512", help="comma-separated M")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    torch_device = "cpu" if args.device == "cpu" else "cuda"  # cpu: a dry run of the script itself
    torch_sync = torch.cuda.synchronize if torch_device == "cuda" else (lambda: None)
    sync = functools.partial(llaisys.synchronize, args.device)
    print(f"{'N':>7} {'K':>5} {'M':>4} {'llaisys us':>11} {'torch us':>9} {'ratio':>6} {'GB/s':>7} {'TFLOP/s':>8}")
    for n, k in SHAPES:
        w_host = (rng.standard_normal((n, k), dtype=np.float32) * k ** -0.5).astype(ml_dtypes.bfloat16)
        w = llaisys.from_numpy(w_host, args.device)
        tw = torch.from_numpy(w_host.view(np.int16)).view(torch.bfloat16).to(torch_device)
        for m in map(int, args.rows.split(",")):
            x_host = rng.standard_normal((m, k), dtype=np.float32).astype(ml_dtypes.bfloat16)
            x, out = llaisys.from_numpy(x_host, args.device), llaisys.empty((m, n), llaisys.bfloat16, args.device)
            tx = torch.from_numpy(x_host.view(np.int16)).view(torch.bfloat16).to(torch_device)
            tout = torch.empty((m, n), dtype=torch.bfloat16, device=torch_device)
            ours = best_us(functools.partial(llaisys.ops.linear, out, x, w), sync)
            theirs = best_us(functools.partial(torch.matmul, tx, tw.T, out=tout), torch_sync)
            gbs, tflops = n * k * 2 / ours / 1e3, 2 * m * n * k / ours / 1e6
            print(f"{n:>7} {k:>5} {m:>4} {ours:>11.1f} {theirs:>9.1f} {theirs / ours:>6.2f} {gbs:>7.0f} {tflops:>8.1f}",
                  flush=True)


if __name__ == "__main__":
    main()
