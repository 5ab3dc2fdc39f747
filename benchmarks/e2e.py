#!/usr/bin/env python
"""End-to-end benchmark: llaisys vs HF transformers (torch, bf16, eager) on one model, one run.

    python benchmarks/make_model.py --out /tmp/qwen2-1.5b-random
    python benchmarks/e2e.py --model /tmp/qwen2-1.5b-random
    python benchmarks/e2e.py --model /tmp/qwen2-1.5b-random --device cuda   # both on the same GPU

Each engine runs in its own subprocess (same thread count, same token ids) so that its
peak RSS is its own; this script prints one table with the ratio llaisys / HF per row.
Rows: load time, load + first token (llaisys maps the weights lazily, so a cold first
token is where its page-ins show), prefill tok/s for 16- and 512-token prompts, decode
tok/s over 64 new tokens (greedy, EOS ignored), peak RSS; on a GPU also the peak device memory
(torch.cuda.max_memory_allocated for HF, llaisys' caching allocator's peak for llaisys). llaisys runs twice:
as shipped (decode steps replayed from captured graphs where the backend has them) and eager
(LLAISYS_GRAPHS=0), so the graph column's gain is measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

PROMPT_SEED = 1234


def prompt(length: int, vocab: int) -> list[int]:
    return np.random.default_rng(PROMPT_SEED + length).integers(0, vocab, size=length).tolist()


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


# -- engines (each in its own process) -------------------------------------------------

def bench_llaisys(args, vocab: int) -> dict:
    import llaisys_models

    t0 = time.perf_counter()
    model = llaisys_models.load(args.model, device=args.device, dtype="bfloat16", progress=False)
    load = time.perf_counter() - t0
    model.generate(prompt(16, vocab), 1, eos_token_ids=())
    first = time.perf_counter() - t0
    result = {"load_s": load, "first_token_s": first}
    model.generate(prompt(16, vocab), 2, eos_token_ids=())  # warm-up
    for length, repeats in ((16, 3), (512, 2)):
        best = 0.0
        for _ in range(repeats):
            model.generate(prompt(length, vocab), 1, eos_token_ids=())
            best = max(best, model.last_stats.prefill_tokens_per_second)
        result[f"prefill_{length}"] = best
    model.generate(prompt(16, vocab), args.decode_tokens, eos_token_ids=())
    result["decode"] = model.last_stats.decode_tokens_per_second
    if args.device != "cpu":
        import llaisys
        result["peak_device"] = llaisys.memory_stats(args.device)["peak_allocated_bytes"]
    return result


def bench_hf(args, vocab: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).eval().to(args.device)
    load = time.perf_counter() - t0

    def prefill(ids):
        x = torch.tensor([ids], device=args.device)
        with torch.no_grad():
            out = model(x, use_cache=True, logits_to_keep=1)
            return int(out.logits[0, -1].argmax())

    prefill(prompt(16, vocab))
    result = {"load_s": load, "first_token_s": time.perf_counter() - t0}
    prefill(prompt(16, vocab))  # warm-up
    for length, repeats in ((16, 3), (512, 2)):
        ids, best = prompt(length, vocab), 0.0
        for _ in range(repeats):
            t = time.perf_counter()
            prefill(ids)
            best = max(best, length / (time.perf_counter() - t))
        result[f"prefill_{length}"] = best

    class Clock:  # generate() calls put() with the prompt, then with each new token
        def __init__(self):
            self.times = []

        def put(self, value):
            self.times.append(time.perf_counter())

        def end(self):
            self.times.append(time.perf_counter())

    clock = Clock()
    x = torch.tensor([prompt(16, vocab)], device=args.device)
    with torch.no_grad():
        model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=args.decode_tokens,
                       min_new_tokens=args.decode_tokens, do_sample=False, top_k=None, top_p=None,
                       temperature=None, pad_token_id=0, streamer=clock)
    first_new, last = clock.times[1], clock.times[-1]  # [prompt, token 1, ..., token N, end]
    result["decode"] = (args.decode_tokens - 1) / (last - first_new)
    if args.device != "cpu":
        result["peak_device"] = torch.cuda.max_memory_allocated()
    return result


def worker(args) -> int:
    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    result = (bench_llaisys if args.engine == "llaisys" else bench_hf)(args, vocab)
    result["peak_rss"] = peak_rss()
    print("RESULT " + json.dumps(result))
    return 0


# -- driver ----------------------------------------------------------------------------

def run_engine(args, engine: str, **extra_env: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="false", **extra_env)
    cmd = [sys.executable, __file__, "--engine", engine, "--model", str(args.model), "--threads", str(args.threads),
           "--decode-tokens", str(args.decode_tokens), "--device", args.device]
    print(f"running {engine} {' '.join(f'{k}={v}' for k, v in extra_env.items())}...", file=sys.stderr, flush=True)
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"{engine} failed (exit {proc.returncode})")
    print(f"  {engine} done in {time.perf_counter() - t:.0f}s", file=sys.stderr, flush=True)
    return json.loads(lines[-1][len("RESULT "):])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="llaisys vs HF transformers, end to end")
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (HF on torch's cuda:0, llaisys on cuda:0)")
    ap.add_argument("--engine", choices=["hf", "llaisys"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.engine:
        return worker(args)

    weights = sum(f.stat().st_size for f in args.model.glob("*.safetensors"))
    hf = run_engine(args, "hf")
    ours = run_engine(args, "llaisys")
    eager = run_engine(args, "llaisys", LLAISYS_GRAPHS="0")
    gib = 1 << 30
    rows = [  # label, key, format, better-when, target
        ("load (s)", "load_s", "{:.2f}", "lower", ""),
        ("load + first token (s)", "first_token_s", "{:.2f}", "lower", ""),
        ("prefill 16 (tok/s)", "prefill_16", "{:.1f}", "higher", ""),
        ("prefill 512 (tok/s)", "prefill_512", "{:.1f}", "higher", ">= 3x"),
        (f"decode {args.decode_tokens} (tok/s)", "decode", "{:.2f}", "higher", ">= 2x"),
        ("peak RSS (GiB)", "peak_rss", "{:.2f}", "lower", f"<= 1.2x weights = {1.2 * weights / gib:.2f}"),
    ]
    if args.device != "cpu":
        targets = {"prefill_512": ">= 1x", "decode": ">= 10x"}  # the CUDA issue's targets (H200-class, 1.5B)
        rows[2:5] = [(label, key, fmt, better, targets.get(key, "")) for label, key, fmt, better, _ in rows[2:5]]
        rows[5] = ("peak device memory (GiB)", "peak_device", "{:.2f}", "lower", "")
    print(f"\nmodel {args.model} ({weights / gib:.2f} GiB of weights), bf16, {args.threads} threads, {args.device}")
    header = f"{'':26}{'HF transformers':>16}{'llaisys':>12}{'llaisys/HF':>12}{'eager':>12}{'eager/HF':>10}  target"
    print(header)
    print("-" * len(header) + "-" * 24)
    for label, key, fmt, _, target in rows:
        scale = gib if key.startswith("peak") else 1
        a, b, c = hf[key] / scale, ours[key] / scale, eager[key] / scale
        print(f"{label:26}{fmt.format(a):>16}{fmt.format(b):>12}{b / a:>11.2f}x{fmt.format(c):>12}{c / a:>9.2f}x  {target}")
    print("llaisys: decode steps replayed from captured graphs where the backend has them; eager: LLAISYS_GRAPHS=0")
    print(f"llaisys peak RSS / weights: {ours['peak_rss'] / weights:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
