#!/usr/bin/env python
"""End-to-end benchmark: llaisys vs HF transformers (torch, bf16, eager) on one model, one run.

    python benchmarks/make_model.py --out /tmp/qwen2-1.5b-random
    python benchmarks/e2e.py --model /tmp/qwen2-1.5b-random
    python benchmarks/e2e.py --model /tmp/qwen2-1.5b-random --profile     # + where a decode step's time goes
                                                          # (--profile-int8: with int8 weights too)
    python benchmarks/e2e.py --model /tmp/qwen2-1.5b-random --device cuda   # both on the same GPU
    python benchmarks/e2e.py --model M --llama-bench build/bin/llama-bench --gguf bf16=M-bf16.gguf --gguf q8_0=M-q8.gguf

Each engine runs in its own subprocess (same thread count, same token ids) so that its
peak RSS is its own; this script prints one table with the ratio to HF per row. On a GPU a second HF column
runs gpt-fast's recipe: a static KV cache and the decode step compiled (torch.compile, mode "reduce-overhead",
i.e. replayed from CUDA graphs), which transformers' generate() applies by itself to a static cache; its
prefill stays eager in that recipe, so it has decode numbers only.
Rows: load time, load + first token (llaisys maps the weights lazily, so a cold first
token is where its page-ins show), prefill tok/s for 16- and 512-token prompts, decode
tok/s over 64 new tokens (greedy, EOS ignored; llaisys on the CPU: median of 3 runs), peak RSS; on a
GPU also the peak device memory (torch.cuda.max_memory_allocated for HF, llaisys' caching allocator's
peak for llaisys). llaisys runs
as shipped (decode steps replayed from captured graphs where the backend has them), eager
(LLAISYS_GRAPHS=0), and with int8 weights (quantize="int8", where the backend has the int8 linear).

On the CPU the script also measures the machine's streaming read bandwidth (torch summing a 1 GiB tensor
with the same threads) just before and just after each decode run, and prints decode against its bound: a
decode step reads every weight once (the matrices of the layers and the lm_head; not the embedding table,
of which it reads one row), so bound tok/s = bandwidth / weight bytes per token. llaisys decodes in three
such rounds and reports the medians (a VM's bandwidth can change from one 10 s stretch to the next).
llama.cpp's llama-bench (built from the llama-cpp-python sdist's vendored tree with cmake) adds a column
per GGUF file given (convert the same checkpoint with its convert_hf_to_gguf.py --outtype bf16 / q8_0),
bracketed by streaming reads too.
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
GROUP = 32  # int8 weights: one bf16 scale per 32 values of a row


def prompt(length: int, vocab: int, variant: int = 0) -> list[int]:
    """Random token ids; each ``variant`` is another prompt (llaisys caches prompt prefixes: a prefill measured
    twice on the same prompt would compute only its last token the second time)."""
    return np.random.default_rng(PROMPT_SEED + length + 7919 * variant).integers(0, vocab, size=length).tolist()


def prefill_rates(model, vocab: int) -> dict:
    """The best prefill tok/s of a 16- and a 512-token prompt (3 and 2 tries, each a new prompt), after a warm-up."""
    model.generate(prompt(16, vocab), 2, eos_token_ids=())  # warm-up
    rates = {}
    for length, repeats in ((16, 3), (512, 2)):
        best = 0.0
        for r in range(repeats):
            model.generate(prompt(length, vocab, variant=1 + r), 1, eos_token_ids=())
            best = max(best, model.last_stats.prefill_tokens_per_second)
        rates[f"prefill_{length}"] = best
    return rates


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def decode_weight_bytes(model: Path) -> dict[str, int]:
    """Bytes a decode step reads per token, bf16 and int8: every 2-D weight but the embedding table (unless
    it is also the lm_head), once; int8 stores 1 byte per value + a 2-byte scale per group of 32."""
    from safetensors import safe_open

    config = json.loads((model / "config.json").read_text())
    bf16 = int8 = int4 = 0
    for file in sorted(model.glob("*.safetensors")):
        with safe_open(file, "np") as f:
            for name in f.keys():
                shape = f.get_slice(name).get_shape()
                if len(shape) != 2 or (name.endswith("embed_tokens.weight") and not config.get("tie_word_embeddings")):
                    continue
                n, k = shape
                groups = -(-k // GROUP)
                bf16 += 2 * n * k
                int8 += n * k + 2 * n * groups
                # int4: q4_0 blocks (16 bytes of codes + an f16 scale per 32), the lm_head in q8_0 (32 + 2)
                head = name.endswith(("lm_head.weight", "embed_tokens.weight"))
                int4 += n * groups * (34 if head else 18)
    return {"bf16": bf16, "int8": int8, "int4": int4}


class StreamRead:
    """Streaming read bandwidth: torch summing a 1 GiB float32 tensor, best of 5, with the given threads.

    This VM's memory bandwidth changes under a running program: the same read swings between ~36 and ~60
    GB/s from one 10-20 s stretch to the next. So a decode measurement is paired with readings taken just
    before and just after it, in the same process, and judged against the higher of the two."""

    def __init__(self, threads: int):
        import torch  # (imported after llaisys' backend started the OpenMP runtime they share)

        torch.set_num_threads(threads)
        self.data = torch.arange(1 << 28, dtype=torch.float32)  # 1 GiB, touched, no two pages alike

    def __call__(self) -> float:
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            self.data.sum()
            best = min(best, time.perf_counter() - t)
        return self.data.numel() * 4 / best


def bench_bandwidth(args) -> dict:
    return {"bandwidth": StreamRead(args.threads)()}


def paired_decode(args, model, vocab: int, rounds: int = 3) -> dict:
    """Decode tok/s and its fraction of the bandwidth bound, per round: a streaming read, args.decode_tokens
    decode steps, a streaming read; the bound is the higher reading / weight bytes per token. Medians of
    the rounds. (Call after peak_rss() was taken: the probe's 1 GiB is not the model's.)"""
    per_token = decode_weight_bytes(args.model)[args.quantize or "bf16"]
    probe = StreamRead(args.threads)
    speeds, readings, fractions = [], [], []
    for _ in range(rounds):
        before = probe()
        model.generate(prompt(16, vocab), args.decode_tokens, eos_token_ids=())
        speed = model.last_stats.decode_tokens_per_second
        bandwidth = max(before, probe())
        speeds.append(speed)
        readings.append(bandwidth)
        fractions.append(speed * per_token / bandwidth)
    del probe
    return {"decode": float(np.median(speeds)), "bound_fraction": float(np.median(fractions)),
            "bound_readings": readings, "bound_fractions": fractions}


# -- engines (each in its own process) -------------------------------------------------

def load_llaisys(args):
    import llaisys_models

    options = {"quantize": args.quantize} if args.quantize else {}
    return llaisys_models.load(args.model, device=args.device, dtype="bfloat16", progress=False, **options)


def bench_llaisys(args, vocab: int) -> dict:
    t0 = time.perf_counter()
    model = load_llaisys(args)
    load = time.perf_counter() - t0
    model.generate(prompt(16, vocab), 1, eos_token_ids=())
    first = time.perf_counter() - t0
    result = {"load_s": load, "first_token_s": first}
    result.update(prefill_rates(model, vocab))
    if args.device != "cpu":
        import llaisys
        model.generate(prompt(16, vocab), args.decode_tokens, eos_token_ids=())
        result["decode"] = model.last_stats.decode_tokens_per_second
        if args.streams:
            result.update(concurrent_decode(args, model, vocab))
        result["peak_device"] = llaisys.memory_stats(args.device)["peak_allocated_bytes"]
    else:
        result["peak_rss"] = peak_rss()
        result.update(paired_decode(args, model, vocab))
    return result


def concurrent_decode(args, model, vocab: int) -> dict:
    """Aggregate tok/s of args.streams sequences decoded together (generate_batch: continuous batching, one
    forward per step for all), and of one sequence through the same path: 16-token prompts, args.decode_tokens
    new tokens each, greedy; each timed after a warm-up of the same batch size (which captures its graphs)."""
    result = {}
    for n, key in ((1, "streams_1"), (args.streams, "streams_n")):
        prompts = [prompt(16, vocab, variant=100 + i) for i in range(n)]
        model.generate_batch(prompts, 4, eos_token_ids=())  # warm-up
        t = time.perf_counter()
        outs = model.generate_batch(prompts, args.decode_tokens, eos_token_ids=())
        result[key] = sum(len(o) - len(p) for o, p in zip(outs, prompts)) / (time.perf_counter() - t)
    return result


def profile_llaisys(args, vocab: int) -> dict:
    """The ops of args.decode_tokens eager decode steps (run with LLAISYS_GRAPHS=0), per step."""
    import llaisys

    model = load_llaisys(args)
    model.generate(prompt(16, vocab), 8, eos_token_ids=())  # warm-up: page the weights in, fill the caches
    steps = args.decode_tokens
    tokens = model.stream_generate(prompt(16, vocab), steps + 1, eos_token_ids=())
    next(tokens)  # the prompt's forward and the first token, not profiled
    with llaisys.profile(shapes=True) as prof:
        for _ in range(steps):
            next(tokens)
    tokens.close()
    return {"table": prof.table(per=steps, unit="step")}


class Clock:
    """A generate() streamer that notes the time of each put(): the prompt, then each new token, then end()."""

    def __init__(self):
        self.times = []

    def put(self, value):
        self.times.append(time.perf_counter())

    def end(self):
        self.times.append(time.perf_counter())


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


def bench_hf_compiled(args, vocab: int) -> dict:
    """Decode tok/s of HF transformers with a static KV cache and a compiled decode step (gpt-fast style): the
    first generate() compiles and captures, the next ones are timed. On the CPU (a dry run of this code) the
    compilation is left out."""
    import torch
    from transformers import AutoModelForCausalLM, CompileConfig

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).eval().to(args.device)
    x = torch.tensor([prompt(16, vocab)], device=args.device)
    options = dict(attention_mask=torch.ones_like(x), max_new_tokens=args.decode_tokens,
                   min_new_tokens=args.decode_tokens, do_sample=False, top_k=None, top_p=None, temperature=None,
                   pad_token_id=0, cache_implementation="static",
                   compile_config=CompileConfig(fullgraph=True, mode="reduce-overhead"),
                   disable_compile=args.device == "cpu")
    t = time.perf_counter()
    with torch.no_grad():
        model.generate(x, **options)  # compiles
        result = {"compile_s": time.perf_counter() - t}
        model.generate(x, **options)  # the CUDA graphs of "reduce-overhead" are recorded on later calls
        clock = Clock()
        model.generate(x, streamer=clock, **options)
    first_new, last = clock.times[1], clock.times[-1]
    result["decode"] = (args.decode_tokens - 1) / (last - first_new)
    if args.device != "cpu":
        result["peak_device"] = torch.cuda.max_memory_allocated()
    return result


def bench_llama_cpp(args) -> dict:
    """llama-bench on one GGUF file: prefill 16 / 512 and decode, tok/s (its mean over repetitions)."""
    cmd = [args.llama_bench, "-m", args.gguf_file, "-p", "16,512", "-n", str(args.decode_tokens),
           "-t", str(args.threads), "-r", "2", "-o", "json"]
    runs = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    result = {}
    for run in runs:
        key = f"prefill_{run['n_prompt']}" if run["n_prompt"] else "decode"
        result[key] = run["avg_ts"]
    return result


def worker(args) -> int:
    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    if args.engine == "bandwidth":
        result = bench_bandwidth(args)
    elif args.engine == "llama.cpp":
        result = bench_llama_cpp(args)
    elif args.engine == "llaisys-profile":
        result = profile_llaisys(args, vocab)
    elif args.engine == "hf-compile":
        result = bench_hf_compiled(args, vocab)
    else:
        result = (bench_llaisys if args.engine == "llaisys" else bench_hf)(args, vocab)
    result.setdefault("peak_rss", peak_rss())
    print("RESULT " + json.dumps(result))
    return 0


# -- driver ----------------------------------------------------------------------------

def run_engine(args, engine: str, *extra: str, **extra_env: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="false", **extra_env)
    cmd = [sys.executable, __file__, "--engine", engine, "--model", str(args.model), "--threads", str(args.threads),
           "--decode-tokens", str(args.decode_tokens), "--device", args.device, "--streams", str(args.streams), *extra]
    what = " ".join([engine, *extra, *(f"{k}={v}" for k, v in extra_env.items())])
    print(f"running {what}...", file=sys.stderr, flush=True)
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"{what} failed (exit {proc.returncode})")
    print(f"  done in {time.perf_counter() - t:.0f}s", file=sys.stderr, flush=True)
    print(f"engine {what}: {lines[-1][len('RESULT '):]}", flush=True)  # in the log even if the run is cut short
    return json.loads(lines[-1][len("RESULT "):])


def int8_available(device: str) -> bool:
    import llaisys

    return llaisys.ops.implemented("linear_i8", device)


def int4_available(device: str) -> bool:
    import llaisys

    return "linear_q" in llaisys.abi.OP_SLOTS and llaisys.ops.implemented("linear_q", device)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="llaisys vs HF transformers (and llama.cpp), end to end")
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (HF on torch's cuda:0, llaisys on cuda:0)")
    ap.add_argument("--profile", action="store_true", help="also print the ops of one eager decode step")
    ap.add_argument("--profile-int8", action="store_true", help="and those of one with int8 weights")
    ap.add_argument("--streams", type=int, default=16,
                    help="on a GPU, also decode this many sequences at once (generate_batch) against one (0: no)")
    ap.add_argument("--no-compile", action="store_true",
                    help="on a GPU, leave out the HF column with a static cache and a compiled decode step")
    ap.add_argument("--llama-bench", help="a llama-bench binary: adds a column per --gguf file")
    ap.add_argument("--gguf", action="append", default=[], metavar="LABEL=FILE",
                    help="a GGUF file of the same model for llama-bench, e.g. bf16=model-bf16.gguf (repeatable)")
    ap.add_argument("--engine", choices=["hf", "hf-compile", "llaisys", "llaisys-profile", "bandwidth", "llama.cpp"],
                    help=argparse.SUPPRESS)
    ap.add_argument("--quantize", help=argparse.SUPPRESS)
    ap.add_argument("--gguf-file", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.engine:
        return worker(args)

    weights = sum(f.stat().st_size for f in args.model.glob("*.safetensors"))
    def bandwidth_around(run):
        """run() with a streaming read just before and after it (on the CPU): the higher one as its bound."""
        before = run_engine(args, "bandwidth")["bandwidth"] if args.device == "cpu" else None
        result = run()
        if before is not None:
            result["bound_readings"] = [max(before, run_engine(args, "bandwidth")["bandwidth"])]
        return result

    columns = {"HF transformers": run_engine(args, "hf")}
    columns["llaisys"] = run_engine(args, "llaisys")
    columns["eager"] = run_engine(args, "llaisys", LLAISYS_GRAPHS="0")
    int8 = int8_available(args.device)
    if int8:
        columns["int8"] = run_engine(args, "llaisys", "--quantize", "int8")
    if int4_available(args.device):
        columns["int4"] = run_engine(args, "llaisys", "--quantize", "int4")
    if args.device != "cpu" and not args.no_compile:
        try:  # torch.compile is the part of a run most likely to break with a new torch: the table goes on
            columns["HF static+compile"] = run_engine(args, "hf-compile")
        except SystemExit as e:
            print(f"HF static+compile: {e}", file=sys.stderr)
    for spec in args.gguf if args.llama_bench else ():
        label, _, file = spec.partition("=")
        columns[f"llama.cpp {label}"] = bandwidth_around(
            lambda file=file: run_engine(args, "llama.cpp", "--llama-bench", args.llama_bench, "--gguf-file", file))
    profiles = {}
    if args.profile:
        profiles["bf16"] = run_engine(args, "llaisys-profile", LLAISYS_GRAPHS="0")["table"]
    if args.profile_int8 and int8:
        profiles["int8"] = run_engine(args, "llaisys-profile", "--quantize", "int8", LLAISYS_GRAPHS="0")["table"]

    gib = 1 << 30
    rows = [  # label, key, format
        ("load (s)", "load_s", "{:.2f}"),
        ("load + first token (s)", "first_token_s", "{:.2f}"),
        ("prefill 16 (tok/s)", "prefill_16", "{:.1f}"),
        ("prefill 512 (tok/s)", "prefill_512", "{:.1f}"),
        (f"decode {args.decode_tokens} (tok/s)", "decode", "{:.2f}"),
        ("1 stream, batch path (tok/s)", "streams_1", "{:.1f}"),
        (f"{args.streams} streams, aggregate (tok/s)", "streams_n", "{:.1f}"),
        ("peak RSS (GiB)", "peak_rss", "{:.2f}"),
        ("compile + capture (s)", "compile_s", "{:.1f}"),
    ]
    if args.device != "cpu":
        rows[5] = ("peak device memory (GiB)", "peak_device", "{:.2f}")
    print(f"\nmodel {args.model} ({weights / gib:.2f} GiB of weights), {args.threads} threads, {args.device}")
    hf = columns["HF transformers"]
    header = f"{'':26}" + "".join(f"{name:>18}" for name in columns)
    print(header + "\n" + "-" * len(header))
    for label, key, fmt in rows:
        cells = []
        for name, result in columns.items():
            scale = gib if key.startswith("peak") else 1
            if key not in result or (name.startswith("llama.cpp") and key == "peak_rss"):
                cells.append(f"{'-':>18}")
                continue
            value = fmt.format(result[key] / scale)
            ratio = "" if name == "HF transformers" or key not in hf else f" ({result[key] / hf[key]:.2f}x)"
            cells.append(f"{value + ratio:>18}")
        print(f"{label:26}" + "".join(cells))
    print("(x): ratio to HF transformers. llaisys: decode steps replayed from captured graphs where the backend has "
          "them; eager: LLAISYS_GRAPHS=0; int8 / int4: quantize='int8' / 'int4'")
    print(f"llaisys peak RSS / checkpoint bytes: {columns['llaisys']['peak_rss'] / weights:.2f}")
    for name, result in columns.items():
        if "streams_n" in result:
            print(f"{name}: {args.streams} streams decode {result['streams_n'] / result['streams_1']:.2f}x the "
                  f"aggregate tok/s of one stream (the same batch path)")
    if args.device == "cpu":
        per_token = decode_weight_bytes(args.model)
        print(f"\ndecode against the bandwidth bound: bound tok/s = streaming read (torch summing 1 GiB, "
              f"{args.threads} threads, the higher of the readings just before and just after the decode "
              f"run) / weight bytes per token; llaisys: per round of {args.decode_tokens} tokens, median of 3")
        for name, result in columns.items():
            dtype = name if name in ("int8", "int4") else "int8" if name.endswith("q8_0") else "bf16"
            if "bound_readings" not in result:
                continue
            got = result["decode"]
            fractions = result.get("bound_fractions") or [got * per_token[dtype] / result["bound_readings"][0]]
            rounds = ", ".join(f"{100 * f:.0f}% of {r / 1e9:.1f} GB/s"
                               for f, r in zip(fractions, result["bound_readings"]))
            print(f"  {name:15} {dtype} ({per_token[dtype] / 1e9:.2f} GB/token): {got:.2f} tok/s = "
                  f"{100 * float(np.median(fractions)):.0f}% of the bound  [{rounds}]")
    for dtype, table in profiles.items():
        print(f"\none eager decode step, {dtype}, by op and size (M x N x K for linear), mean of "
              f"{args.decode_tokens} steps:\n{table}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
