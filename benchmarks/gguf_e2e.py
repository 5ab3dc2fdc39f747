#!/usr/bin/env python
"""llaisys against llama.cpp on the same quantized GGUF files, side by side in one run (paired, alternating).

    python benchmarks/make_model.py --out /tmp/qwen2-1.5b                      # random weights, the 1.5B shape
    python benchmarks/gguf_e2e.py --write-bf16 /tmp/qwen2-1.5b /tmp/qwen2-1.5b-bf16.gguf
    llama-quantize /tmp/qwen2-1.5b-bf16.gguf /tmp/q4_0.gguf Q4_0                # and Q4_K_M, ...
    python benchmarks/gguf_e2e.py --llama-bench llama-bench --gguf q4_0=/tmp/q4_0.gguf --gguf q4_k_m=... \\
        --threads 2 --rounds 3

For each file and round, llaisys (its own process: load, first token, prefill 16 and 512 tokens, decode) then
llama.cpp's llama-bench (prefill 16 / 512, decode), each decode bracketed by a streaming read (torch summing
1 GiB with the same threads, as benchmarks/e2e.py measures it): bound tok/s = the higher reading / the weight
bytes a decode step reads (every matrix but the token embedding, once: llaisys' blocks as it holds them,
llama.cpp's as the file stores them). Medians over the rounds; the ratio column is llaisys / llama.cpp of the
same round's medians. Peak RSS is llaisys' VmHWM after load, first token and the prefills (before the
bandwidth probe's 1 GiB), against the file's size.

--write-bf16 DIR FILE writes a safetensors checkpoint as a BF16 GGUF file (tokenizer "none": llama.cpp then
runs it with dummy tokens), the input llama-quantize turns into the quantized files.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from e2e import StreamRead, prefill_rates, prompt  # noqa: E402
from gguf_load import status_bytes, write_gguf  # noqa: E402


def decode_bytes_llaisys(model) -> int:
    """Bytes a llaisys decode step reads: every matrix once (blocks with their scales), not the embedding table
    (one row per token) unless it is also the lm_head."""
    from llaisys_models.loading.quantize import BlockWeight, Int8Weight

    def nbytes(m) -> int:
        return m.weight.nbytes + m.scales.nbytes if isinstance(m, (BlockWeight, Int8Weight)) else m.nbytes

    w = model.weights
    total = nbytes(w.lm_head)
    for layer in w.layers:
        total += sum(nbytes(getattr(layer, f)) for f in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                         "up_proj", "down_proj"))
    return total


def decode_bytes_file(path: Path) -> int:
    """Bytes llama.cpp reads per decode step: the file's matrices but the token embedding (unless tied)."""
    from llaisys_models.loading.gguf.reader import GGUFFile

    f = GGUFFile(path)
    tied = "output.weight" not in f.tensors
    return sum(t.nbytes for name, t in f.tensors.items()
               if len(t.shape) == 2 and (name != "token_embd.weight" or tied))


def bench_llaisys(path: Path, threads: int, decode_tokens: int) -> dict:
    import llaisys_models

    t0 = time.perf_counter()
    model = llaisys_models.load(path, device="cpu", progress=False)
    result = {"load_s": time.perf_counter() - t0}
    vocab = model.config.vocab_size
    model.generate(prompt(16, vocab), 1, eos_token_ids=())
    result["first_token_s"] = time.perf_counter() - t0
    result.update(prefill_rates(model, vocab))
    result["peak_rss"] = status_bytes("VmHWM")
    result["bytes_per_token"] = decode_bytes_llaisys(model)
    result["formats"] = "/".join(model.weight_formats)
    probe = StreamRead(threads)
    before = probe()
    model.generate(prompt(16, vocab), decode_tokens, eos_token_ids=())
    result["decode"] = model.last_stats.decode_tokens_per_second
    result["bandwidth"] = max(before, probe())
    return result


def bench_llama(path: Path, llama_bench: str, threads: int, decode_tokens: int) -> dict:
    probe = StreamRead(threads)
    before = probe()
    cmd = [llama_bench, "-m", str(path), "-p", "16,512", "-n", str(decode_tokens), "-t", str(threads), "-r", "2",
           "-o", "json"]
    runs = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    result = {"bandwidth": max(before, probe()), "bytes_per_token": decode_bytes_file(path)}
    for run in runs:
        result[f"prefill_{run['n_prompt']}" if run["n_prompt"] else "decode"] = run["avg_ts"]
    return result


def run(args, engine: str, path: Path) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    cmd = [sys.executable, __file__, "--engine", engine, "--file", str(path), "--threads", str(args.threads),
           "--decode-tokens", str(args.decode_tokens)]
    if args.llama_bench:
        cmd += ["--llama-bench", args.llama_bench]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"{engine} on {path} failed (exit {proc.returncode})")
    return json.loads(lines[-1][len("RESULT "):])


ROWS = [("load (s)", "load_s", "{:.2f}"), ("load + first token (s)", "first_token_s", "{:.2f}"),
        ("prefill 16 (tok/s)", "prefill_16", "{:.1f}"), ("prefill 512 (tok/s)", "prefill_512", "{:.1f}"),
        ("decode (tok/s)", "decode", "{:.2f}"), ("GB read / token", "bytes_per_token", "{:.3f}"),
        ("streaming read (GB/s)", "bandwidth", "{:.1f}"), ("decode / bound", "bound", "{:.0%}"),
        ("peak RSS (GiB)", "peak_rss", "{:.2f}"), ("peak RSS / file", "rss_per_file", "{:.2f}")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", action="append", default=[], metavar="LABEL=FILE")
    ap.add_argument("--llama-bench", help="llama.cpp's llama-bench binary")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--write-bf16", nargs=2, type=Path, metavar=("HF_DIR", "FILE"))
    ap.add_argument("--engine", choices=["llaisys", "llama.cpp"], help=argparse.SUPPRESS)
    ap.add_argument("--file", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.write_bf16:
        write_gguf(*args.write_bf16, "BF16")
        return 0
    if args.engine == "llaisys":
        print("RESULT " + json.dumps(bench_llaisys(args.file, args.threads, args.decode_tokens)))
        return 0
    if args.engine == "llama.cpp":
        print("RESULT " + json.dumps(bench_llama(args.file, args.llama_bench, args.threads, args.decode_tokens)))
        return 0

    print(f"{args.threads} threads, {args.rounds} rounds (llaisys then llama.cpp per round), load average "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    for spec in args.gguf:
        label, _, file = spec.partition("=")
        path = Path(file)
        engines = ["llaisys"] + (["llama.cpp"] if args.llama_bench else [])
        results = {engine: [] for engine in engines}
        for r in range(args.rounds):
            for engine in engines:
                print(f"  {label} round {r + 1}: {engine}...", file=sys.stderr, flush=True)
                result = run(args, engine, path)
                result["bound"] = result["decode"] * result["bytes_per_token"] / result["bandwidth"]
                results[engine].append(result)
        size = path.stat().st_size
        print(f"\n{label}: {path} ({size / 2**30:.2f} GiB), llaisys weights "
              f"{results['llaisys'][0]['formats']}, load average {os.getloadavg()[0]:.1f}")
        medians = {}
        for engine, rounds in results.items():
            medians[engine] = {key: float(np.median([r[key] for r in rounds if key in r]))
                               for key in rounds[0] if not isinstance(rounds[0][key], str)}
            if "peak_rss" in medians[engine]:
                medians[engine]["rss_per_file"] = medians[engine]["peak_rss"] / size
        header = f"{'':24}" + "".join(f"{e:>14}" for e in engines) + ("     ratio" if len(engines) == 2 else "")
        print(header + "\n" + "-" * len(header))
        for name, key, fmt in ROWS:
            cells, values = [], []
            for engine in engines:
                value = medians[engine].get(key)
                scale = 2**30 if key == "peak_rss" else 1e9 if key in ("bytes_per_token", "bandwidth") else 1
                values.append(value)
                cells.append(f"{'-' if value is None else fmt.format(value / scale):>14}")
            ratio = (f"{values[0] / values[1]:9.2f}x" if len(values) == 2 and None not in values and values[1]
                     and key not in ("bandwidth", "bound") else "")
            print(f"{name:24}" + "".join(cells) + ratio)
        decodes = {e: ", ".join(f"{r['decode']:.1f} ({r['bound']:.0%})" for r in rs) for e, rs in results.items()}
        print("per round decode tok/s (of bound): " + "; ".join(f"{e} {d}" for e, d in decodes.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
