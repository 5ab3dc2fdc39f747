#!/usr/bin/env python
"""Concurrent streamed clients against ``llaisys serve``: continuous batching next to the unbatched engine.

    python benchmarks/make_model.py --out /tmp/qwen2-1.5b      # once (3.5 GB)
    python benchmarks/serving.py --model /tmp/qwen2-1.5b

For each engine (``llaisys serve`` as it ships, then with ``--no-batching``: one forward per sequence
and per step, prompts in one piece — the engine before continuous batching) the server runs as a
subprocess, and for N = 1, 2, 4, 8, 16 clients, N threads of this process each stream one completion at the
same moment (``llaisys bench serve``'s client, a prompt of --prompt-tokens tokens, greedy, --max-tokens new tokens; every
client's prompt is different, so no KV block is shared). Per N: aggregate generated tokens/s (all tokens
/ first request sent -> last token received), time to first token and inter-token latency (the gaps
between a stream's text chunks, all streams pooled), p50 and p99. The table ends with the targets that
continuous batching is held to: at 8 streams, >= 4x the single-stream aggregate tokens/s with p50
inter-token latency <= 2x the single-stream one.

The model directory needs no tokenizer: without one, serve_ttft.py's character-level one is written to a
temporary directory (one token = one character, so one streamed chunk per token). With one (the demo
model: ``--model llaisys-models/src/llaisys_models/demo``), prompts are drawn from its one-character
tokens; such a model may end a stream early at its EOS, so compare the tok/s columns, not token counts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import socket
import string
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from llaisys_models.bench import client as bench_client
from llaisys_models.bench import serve as bench_serve
from llaisys_models.bench import stats as bench_stats

sys.path.insert(0, str(Path(__file__).parent))
from serve_ttft import write_tokenizer  # noqa: E402

ENGINES = {"continuous batching": [], "unbatched": ["--no-batching"]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(command: list[str], port: int, start_timeout: float, stop_timeout: float):
    """Runs ``command`` (an ``llaisys serve`` on ``port``) until the block ends; yields its base URL and its log
    (a file of its stdout and stderr). Its exit or a start slower than ``start_timeout`` ends the benchmark."""
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise SystemExit(f"llaisys serve exited with {proc.returncode}:\n{log.read()}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(base + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            if time.monotonic() > deadline:
                raise SystemExit(f"llaisys serve did not come up within {start_timeout:.0f} s")
            time.sleep(0.5)
        yield base, log
    finally:
        proc.terminate()
        try:
            proc.wait(stop_timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@contextlib.contextmanager
def serve(args, tokenizer_dir: Path, extra: list[str]):
    """``llaisys serve`` on a free port until the block ends; yields its base URL."""
    port = free_port()
    command = [str(Path(sys.executable).parent / "llaisys"), "serve", "--model", str(args.model), "--tokenizer",
               str(tokenizer_dir), "--device", args.device, "--port", str(port), "--served-model-name", "bench",
               "--max-running", str(max(args.clients)), "--kv-memory", args.kv_memory, *extra]
    with running_server(command, port, start_timeout=600, stop_timeout=60) as (base, log):
        log.seek(0)
        print("  " + "  ".join(line for line in log.read().splitlines() if "KV cache" in line), file=sys.stderr)
        yield base


def prompt_text(seed: int, length: int, alphabet: str) -> str:
    """A random prompt of `length` one-character tokens; for the demo model (which adds), a sum to complete:
    two numbers of about length / 2 digits, so the answer is about as long again before its EOS."""
    rng = random.Random(seed)
    if set(alphabet) == set("0123456789+="):
        a = max(1, (length - 2) // 2)
        return "".join(rng.choices("123456789")) + "".join(rng.choices("0123456789", k=a - 1)) + "+" + \
            "".join(rng.choices("123456789")) + "".join(rng.choices("0123456789", k=length - a - 3)) + "="
    return "".join(rng.choices(alphabet, k=length))


def one_character_tokens(tokenizer_dir: Path) -> str:
    """The characters that are tokens of their own in the model's tokenizer (no special tokens)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    special = set(tokenizer.all_special_tokens)
    return "".join(sorted(t for t in tokenizer.get_vocab() if len(t) == 1 and t not in special))


def load(base: str, n: int, args, seed: int) -> dict:
    """n streams sent at the same moment, through ``llaisys bench serve``'s client (every request at once, n in
    flight): its summary row (output_throughput, ttft_p50_ms, itl_p99_ms, ...)."""
    target = bench_client.Target.parse(base, None)
    client = bench_client.Client(target, "/v1/completions", timeout=3600)
    bodies = [{"model": "bench", "prompt": prompt_text(seed + i, args.prompt_tokens, args.alphabet),
               "max_tokens": args.max_tokens, "temperature": 0, "stream": True,
               "stream_options": {"include_usage": True}} for i in range(n)]
    records: list = []
    duration = bench_serve.run_load(client, bodies, math.inf, n, seed, records)
    failed = [r.error for r in records if not r.ok]
    if failed:
        raise SystemExit(f"{len(failed)} of {n} streams failed: {failed[0]}")
    return bench_stats.summarize(records, duration, {})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=Path("/tmp/qwen2-1.5b"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--clients", default="1,2,4,8,16", help="comma-separated numbers of concurrent streams")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=48, help="new tokens per stream")
    ap.add_argument("--kv-memory", default="1GiB")
    ap.add_argument("--engines", default=",".join(ENGINES), help="which engines to run (default: both)")
    args = ap.parse_args()
    args.clients = [int(n) for n in args.clients.split(",")]
    engines = [name.strip() for name in args.engines.split(",")]

    config = json.loads((args.model / "config.json").read_text())
    rows: dict[str, dict[int, dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        if (args.model / "tokenizer.json").exists() or (args.model / "tokenizer_config.json").exists():
            tokenizer_dir = args.model
            args.alphabet = one_character_tokens(tokenizer_dir)
        else:
            tokenizer_dir = Path(tmp)
            write_tokenizer(tokenizer_dir, config["vocab_size"])
            args.alphabet = string.ascii_letters + " "
        for name in engines:
            print(f"{name}: starting llaisys serve {' '.join(ENGINES[name])}", file=sys.stderr, flush=True)
            with serve(args, tokenizer_dir, ENGINES[name]) as base:
                load(base, 1, argparse.Namespace(prompt_tokens=8, max_tokens=4, alphabet=args.alphabet), seed=1)
                rows[name] = {}
                for n in args.clients:
                    r = rows[name][n] = load(base, n, args, seed=1000 * n)
                    print(f"  {n:>2} clients: {r['output_throughput']:6.2f} tok/s, TTFT p50 {r['ttft_p50_ms'] / 1e3:.2f}s, "
                          f"ITL p50 {r['itl_p50_ms']:.0f}ms ({r['output_tokens']} tokens)", file=sys.stderr, flush=True)

    print(f"\nllaisys serve, {args.model.name} on {args.device} (OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'default')}): N concurrent streams, prompt {args.prompt_tokens} "
          f"tokens, {args.max_tokens} new tokens each, greedy")
    head = f"{'streams':>7}"
    for name in engines:
        head += f" | {name + ' tok/s':>25} {'TTFT p50/p99 s':>15} {'ITL p50/p99 ms':>15}"
    print(head + (" | batched/unbatched tok/s" if len(engines) == 2 else ""))
    for n in args.clients:
        line = f"{n:>7}"
        for name in engines:
            r = rows[name][n]
            line += (f" | {r['output_throughput']:>25.2f} {r['ttft_p50_ms'] / 1e3:>7.2f}/{r['ttft_p99_ms'] / 1e3:<7.2f}"
                     f" {r['itl_p50_ms']:>7.0f}/{r['itl_p99_ms']:<7.0f}")
        if len(engines) == 2:
            line += f" | {rows[engines[0]][n]['output_throughput'] / rows[engines[1]][n]['output_throughput']:>8.2f}x"
        print(line)
    first = engines[0]
    if 1 in args.clients and 8 in args.clients:
        one, eight = rows[first][1], rows[first][8]
        speedup = eight["output_throughput"] / one["output_throughput"]
        itl = eight["itl_p50_ms"] / one["itl_p50_ms"]
        print(f"{first}, 8 streams vs 1: aggregate tok/s {speedup:.2f}x (target >= 4x), "
              f"p50 inter-token latency {itl:.2f}x (target <= 2x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
