"""llaisys' linears on a GPU against torch's (cuBLAS), bf16, at the Qwen2-1.5B shapes: the batch-invariance check
of the default (tensor-core) linear, then the timings.

    python benchmarks/linear_gpu.py                      # check + timings (the default linear and linear_i8)
    LLAISYS_CUDA_LINEAR_SIMT=1 python benchmarks/linear_gpu.py --no-check   # the SIMT kernel, for comparison
    LLAISYS_CUDA_LINEAR_CUBLAS_ROWS=1 python benchmarks/linear_gpu.py       # llaisys through cuBLAS

The check (exit status 1 when it fails), per (N, K): out = linear(x) for 512 random rows, then rows
[s, s + M) of x alone for M = 1, 7, 64 at a few offsets s: every row must be the same bits as in the 512-row
call (host execution shows the kernels follow one reduction for every M, not that the GPU's tensor cores round
alike at every fragment position: this does); and the 512 rows against torch's f32 matmul of the same bf16
values within bf16's tolerance (|d| <= 1e-2 (1 + |ref|), DESIGN §6).

Timings per (N, K, M): llaisys µs and torch µs per call (the best of 5 rounds of 20 calls, each round ended by
a synchronize), ratio = torch / llaisys (> 1: llaisys is faster), llaisys' weight-read GB/s (what bounds M = 1)
and TFLOP/s; then linear_i8 (the same weights quantized per group of 32) µs and its weight-read GB/s
(1 + 2 / 32 bytes per weight).
"""

from __future__ import annotations

import argparse
import functools
import sys
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


def bf16_bits(t: llaisys.Tensor) -> np.ndarray:
    return t.numpy().view(np.uint16)


def check_shape(n: int, k: int, w_host: np.ndarray, device: str, rng) -> list[str]:
    """The failures of one (N, K): rows across M, and the 512 rows against torch's f32 product."""
    w = llaisys.from_numpy(w_host, device)
    x_host = rng.standard_normal((512, k), dtype=np.float32).astype(ml_dtypes.bfloat16)

    def rows(start: int, m: int) -> np.ndarray:
        out = llaisys.empty((m, n), llaisys.bfloat16, device)
        llaisys.ops.linear(out, llaisys.from_numpy(np.ascontiguousarray(x_host[start:start + m]), device), w)
        return bf16_bits(out)

    failures = []
    everything = rows(0, 512)
    for m in (1, 7, 64):
        for start in (0, 3, 512 - m):
            got = rows(start, m)
            if not np.array_equal(got, everything[start:start + m]):
                bad = int((got != everything[start:start + m]).sum())
                failures.append(f"{n}x{k}: rows [{start}, {start + m}) alone differ from the 512-row call in {bad} "
                                f"of {got.size} outputs")
    tw = torch.from_numpy(w_host.view(np.int16)).view(torch.bfloat16).to("cuda").float()
    tx = torch.from_numpy(x_host.view(np.int16)).view(torch.bfloat16).to("cuda").float()
    ref = (tx @ tw.T).double().cpu().numpy()
    ours = everything.view(ml_dtypes.bfloat16).astype(np.float64)
    err = np.abs(ours - ref) / (1 + np.abs(ref))
    if not err.max() <= 1e-2:
        failures.append(f"{n}x{k}: {int((err > 1e-2).sum())} outputs off torch's f32 product (max {err.max():.3g})")
    return failures


def int8_weight(w_host: np.ndarray, device: str) -> tuple[llaisys.Tensor, llaisys.Tensor]:
    """w quantized as the models do (a bf16 scale per row and group of 32, rounded up), in the block layout."""
    n, k = w_host.shape
    groups = -(-k // 32)
    wp = np.zeros((n, groups * 32), np.float32)
    wp[:, :k] = w_host.astype(np.float32)
    scale = (np.abs(wp.reshape(n, groups, 32)).max(-1) / 127).astype(np.float32)
    bits = scale.view(np.uint32)
    scale = np.where(bits & 0xFFFF, (bits & 0xFFFF0000) + 0x10000, bits).astype(np.uint32).view(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(scale[:, :, None] > 0, np.rint(wp.reshape(n, groups, 32) / scale[:, :, None]), 0)
    blocks, scales = llaisys.ops.pack_int8(q.reshape(n, -1)[:, :k].astype(np.int8), scale.astype(ml_dtypes.bfloat16))
    return llaisys.from_numpy(blocks, device), llaisys.from_numpy(scales, device)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rows", default="1,4,16,128,512", help="comma-separated M")
    ap.add_argument("--no-check", action="store_true", help="timings only")
    ap.add_argument("--no-int8", action="store_true", help="no linear_i8 timings")
    ap.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES), help="comma-separated NxK")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    torch_device = "cpu" if args.device == "cpu" else "cuda"  # cpu: a dry run of the script itself
    torch_sync = torch.cuda.synchronize if torch_device == "cuda" else (lambda: None)
    sync = functools.partial(llaisys.synchronize, args.device)
    shapes = [tuple(map(int, shape.split("x"))) for shape in args.shapes.split(",")]
    check = not args.no_check and torch_device == "cuda"
    int8 = not args.no_int8 and llaisys.ops.implemented("linear_i8", args.device)
    failures = []
    print(f"{'N':>7} {'K':>5} {'M':>4} {'llaisys us':>11} {'torch us':>9} {'ratio':>6} {'GB/s':>7} {'TFLOP/s':>8}"
          + (f" {'int8 us':>8} {'int8 GB/s':>9}" if int8 else ""), flush=True)
    for n, k in shapes:  # one weight at a time (the lm_head's is 0.47 GB)
        w_host = (rng.standard_normal((n, k), dtype=np.float32) * k ** -0.5).astype(ml_dtypes.bfloat16)
        if check:
            failures += check_shape(n, k, w_host, args.device, rng)
        w = llaisys.from_numpy(w_host, args.device)
        tw = torch.from_numpy(w_host.view(np.int16)).view(torch.bfloat16).to(torch_device)
        w8 = int8_weight(w_host, args.device) if int8 else None
        for m in map(int, args.rows.split(",")):
            x_host = rng.standard_normal((m, k), dtype=np.float32).astype(ml_dtypes.bfloat16)
            x, out = llaisys.from_numpy(x_host, args.device), llaisys.empty((m, n), llaisys.bfloat16, args.device)
            tx = torch.from_numpy(x_host.view(np.int16)).view(torch.bfloat16).to(torch_device)
            tout = torch.empty((m, n), dtype=torch.bfloat16, device=torch_device)
            ours = best_us(functools.partial(llaisys.ops.linear, out, x, w), sync)
            theirs = best_us(functools.partial(torch.matmul, tx, tw.T, out=tout), torch_sync)
            gbs, tflops = n * k * 2 / ours / 1e3, 2 * m * n * k / ours / 1e6
            line = f"{n:>7} {k:>5} {m:>4} {ours:>11.1f} {theirs:>9.1f} {theirs / ours:>6.2f} {gbs:>7.0f} {tflops:>8.1f}"
            if w8 is not None:
                us8 = best_us(functools.partial(llaisys.ops.linear_i8, out, x, *w8), sync)
                line += f" {us8:>8.1f} {n * k * (1 + 2 / 32) / us8 / 1e3:>9.0f}"
            print(line, flush=True)
        del w, tw, w8
    status = 0
    if check:
        print("batch invariance (rows at M = 1, 7, 64 against M = 512, bit for bit) and torch f32 tolerance: " +
              ("PASS" if not failures else "FAIL\n  " + "\n  ".join(failures)), flush=True)
        status = 1 if failures else 0
    return status


if __name__ == "__main__":
    sys.exit(main())
