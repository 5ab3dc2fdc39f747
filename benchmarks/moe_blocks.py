#!/usr/bin/env python
"""A Q4_K_M mixture-of-experts GGUF file with its experts kept in their blocks (moe_linear_q): memory and decode.

    python benchmarks/moe_blocks.py --out /tmp/moe-blocks --layers 12 --llama-bench PATH [--llama-quantize PATH]
                                    [--threads 2] [--rounds 3] [--new 32]

Writes (once) a random bf16 file of benchmarks/moe.py's shape (Qwen3-MoE-like: hidden 2048, 64 experts of 768,
top 8, vocab 32000, Mixtral's GGUF layout; 12 layers: 3.9 B parameters) — its values drawn once per standard
deviation (a pool of 2^25) and reused at shifting offsets, so writing 8 GB takes the disk's time, not the random
generator's — then llama-quantize makes it Q4_K_M (its experts Q4_K, some down experts Q6_K). Per round,
alternating: llaisys in its own process (load as stored, a 16-token prompt, then --new greedy tokens, twice),
then llama-bench on the same file (``-p 0 -n NEW -t THREADS -r 1`` and --llama-args). Printed:

  * the experts' bytes in llaisys (BlockExperts: weight + scales) against the file's expert tensors;
  * llaisys' peak RSS (VmHWM) after the load and after decoding, against the file's size (target <= 1.2x);
  * decode tok/s of each engine (medians over the rounds) and llaisys / llama.cpp per round, then the median.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf_load import status_bytes  # noqa: E402
from moe import add_metadata, quantized_file, run_llama_bench, tensors  # noqa: E402

POOL = 1 << 25  # random values drawn per standard deviation (64 MiB of bf16)


def write_gguf(path: Path, layers: int) -> None:
    """benchmarks/moe.py's file (its metadata and tensors), the values of each tensor taken from a pool of random
    bf16 values of its standard deviation, from a new offset each time (writes at the disk's speed)."""
    import gguf

    specs = tensors(layers)
    writer = gguf.GGUFWriter(path, "llama")
    add_metadata(writer, layers)
    for name, shape, _ in specs:
        dtype = gguf.GGMLQuantizationType.BF16 if len(shape) > 1 else gguf.GGMLQuantizationType.F32
        nbytes = int(np.prod(shape)) * (2 if len(shape) > 1 else 4)
        writer.add_tensor_info(name, shape, np.dtype(np.float32), nbytes, raw_dtype=dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng, pools, offsets = np.random.default_rng(0), {}, itertools.count(0, 7919)
    for _, shape, std in specs:
        n = int(np.prod(shape))
        if len(shape) == 1:
            writer.write_tensor_data(np.ones(n, np.float32))
            continue
        if std not in pools:
            pools[std] = (rng.standard_normal(POOL, np.float32) * std).astype(ml_dtypes.bfloat16).view(np.uint16)
        pool, start = pools[std], next(offsets) % POOL
        reps = -(-(start + n) // POOL)
        writer.write_tensor_data(np.tile(pool, reps)[start:start + n] if reps > 1 else pool[start:start + n])
    writer.close()


def expert_bytes(model) -> tuple[int, tuple[str, ...]]:
    """The bytes of every layer's stacked experts as the model holds them, and their formats."""
    total, formats = 0, set()
    for layer in model.weights.layers:
        if layer.experts is None:
            continue
        for w in (layer.experts.gate, layer.experts.up, layer.experts.down):
            if hasattr(w, "scales"):  # BlockExperts, Int8Experts
                total += w.weight.nbytes + w.scales.nbytes
                formats.add(getattr(w, "fmt", "int8"))
            else:
                total += w.nbytes
                formats.add(w.dtype.name)
    return total, tuple(sorted(formats))


def file_expert_bytes(path: Path) -> int:
    from llaisys_models.loading.gguf.reader import GGUFFile

    return sum(t.nbytes for name, t in GGUFFile(path).tensors.items() if "_exps." in name)


def run_llaisys(path: Path, new: int) -> dict:
    """One llaisys run in this process: load as stored, two timed greedy decodes, the peak RSS after each step."""
    import llaisys_models

    t = time.perf_counter()
    model = llaisys_models.load(path, device="cpu", progress=False)
    load_s, peak_load = time.perf_counter() - t, status_bytes("VmHWM")
    prompt = list(range(16))
    rates = []
    for _ in range(2):
        model.generate(prompt, new, eos_token_ids=())
        rates.append(model.last_stats.decode_tokens_per_second)
    experts, formats = expert_bytes(model)
    return dict(load_s=load_s, peak_load=peak_load, peak=status_bytes("VmHWM"), tps=max(rates), experts=experts,
                expert_formats=formats, formats=model.weight_formats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/moe-blocks"))
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--llama-bench", default=None, help="a llama.cpp llama-bench binary")
    parser.add_argument("--llama-quantize", default=None, help="llama-quantize (default: beside llama-bench)")
    parser.add_argument("--llama-args", default="", help="more llama-bench arguments, e.g. '--poll 0' (its threads "
                        "then wait without spinning: on a loaded machine a spinning thread that loses its core stalls "
                        "every op)")
    parser.add_argument("--file", type=Path, help="a Q4_K_M (or other) MoE file to use instead of writing one")
    parser.add_argument("--one", type=Path, help=argparse.SUPPRESS)  # a worker process: one llaisys run
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    if args.one:
        print(json.dumps(run_llaisys(args.one, args.new)))
        return

    path = args.file
    if path is None:
        args.out.mkdir(parents=True, exist_ok=True)
        bf16 = args.out / f"moe-{args.layers}l-bf16.gguf"
        if not bf16.exists():
            write_gguf(bf16, args.layers)
        quantizer = args.llama_quantize or str(Path(args.llama_bench).with_name("llama-quantize"))
        path = quantized_file(bf16, quantizer, args.threads, "Q4_K_M")
    size = path.stat().st_size
    ours: list[dict] = []
    theirs: list[float] = []
    for round_ in range(args.rounds):
        worker = subprocess.run([sys.executable, __file__, "--new", str(args.new), "--threads", str(args.threads),
                                 "--one", str(path)], check=True, capture_output=True, text=True).stdout
        ours.append(json.loads(worker.strip().splitlines()[-1]))
        line = f"round {round_ + 1}: llaisys {ours[-1]['tps']:.2f}"
        if args.llama_bench:
            theirs.append(run_llama_bench(args.llama_bench, path, args.new, args.threads, "-r 1 " + args.llama_args))
            line += f", llama.cpp {theirs[-1]:.2f}"
        print(line + f" tok/s (load average {os.getloadavg()[0]:.1f})", flush=True)

    r = ours[0]
    stored = file_expert_bytes(path)
    print(f"{path.name}: {size / 2**30:.2f} GiB; experts in llaisys {r['experts'] / 2**30:.3f} GiB "
          f"({'/'.join(r['expert_formats'])}) vs the file's {stored / 2**30:.3f} GiB ({r['experts'] / stored:.3f}x); "
          f"formats {'/'.join(r['formats'])}")
    peak_load = max(o["peak_load"] for o in ours)
    peak = max(o["peak"] for o in ours)
    load_s = statistics.median(o["load_s"] for o in ours)
    print(f"llaisys peak RSS: after load {peak_load / 2**30:.2f} GiB ({peak_load / size:.2f}x the file), after "
          f"decoding {peak / 2**30:.2f} GiB ({peak / size:.2f}x); load {load_s:.1f} s")
    tps = statistics.median(o["tps"] for o in ours)
    print(f"decode, {args.threads} threads, {args.new} tokens, median of {args.rounds} rounds: llaisys {tps:.2f} tok/s",
          end="")
    if theirs:
        ratios = [o["tps"] / t for o, t in zip(ours, theirs)]
        print(f", llama.cpp {statistics.median(theirs):.2f} tok/s; llaisys / llama.cpp per round "
              f"{', '.join(f'{x:.2f}' for x in ratios)} (median {statistics.median(ratios):.2f}x)")
    else:
        print()


if __name__ == "__main__":
    main()
