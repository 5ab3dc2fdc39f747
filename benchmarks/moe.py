#!/usr/bin/env python
"""Mixture-of-experts decode: bytes read per token against the active-parameter bound, and llama.cpp.

    python benchmarks/moe.py --out /tmp/moe-bench [--layers 12] [--new 32] [--threads 2] [--rounds 2]
                             [--modes bf16,int8] [--llama-bench PATH [--llama-quantize PATH]]

Writes (once) a random bf16 GGUF file of a Qwen3-MoE-like shape in Mixtral's layout (llama.cpp arch
``llama`` with ``llama.expert_count``): hidden 2048, 64 experts of width 768, top 8 renormalised, 16 heads /
4 KV heads of 128, vocab 32000, untied lm_head; --layers sets the depth (12: 3.9 B parameters, 0.65 B
active a token). Modes:

  * bf16: llaisys loads the file without a copy (bf16 on the CPU reads the mapping in place);
  * int8: llaisys loads it with quantize="int8" (every linear and every expert in linear_i8's int8 blocks,
    quantized expert by expert from the mapping; the routers and the embedding stay bf16); llama.cpp runs
    the same file requantized to Q8_0 by llama-quantize (--llama-quantize, default: beside llama-bench),
    the same 8.5 bits a weight (an int8 per weight and a 16-bit scale per 32).

Each llaisys mode runs in its own process (so its peak RSS is its own): it loads the file, then 3 times
decodes --new tokens greedily after a 16-token prompt and measures what its kernels stream from memory: a
dense ``linear`` (bf16) or ``linear_i8`` (int8) over a 1 GiB weight (M = 1), the machine's read rate for
that kernel at that moment (medians of the 3). Printed per mode:

  * active bytes per token: every layer's attention, router and 8 chosen experts, and the lm_head, in that
    mode's format (the bound: a decode step must read them, and need read nothing else);
  * llaisys' and llama.cpp's decode tokens/s (llama-bench ``-p 0 -n NEW -t THREADS -r 3``, plus each
    --llama-args), so the effective read rate = active bytes x tokens/s, and its fraction of the dense stream
    rate (target >= 75%);
  * the ratio llaisys / llama.cpp on the same file (target > 1): per round (llaisys, then llama.cpp, right
    after), the median over --rounds rounds;
  * int8: the load's peak RSS against the int8 weights' bytes (quantizing expert by expert from the mapping
    keeps it about the int8 size).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np
from gguf_load import status_bytes

SHAPE = dict(hidden=2048, inter=768, experts=64, top_k=8, heads=16, kv_heads=4, head_dim=128, vocab=32000)
CHUNK = 1 << 24  # values drawn per numpy call
INT8_BYTES = 1 + 2 / 32  # an int8 per weight and a bf16 scale per 32 (llaisys int8, and llama.cpp's Q8_0)


def tensors(layers: int) -> list[tuple[str, tuple[int, ...], float]]:
    """(GGUF name, shape in row-major order, standard deviation) of every tensor."""
    s = SHAPE
    h, q, kv = s["hidden"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
    out = [("token_embd.weight", (s["vocab"], h), 1.0), ("output_norm.weight", (h,), 0.0),
           ("output.weight", (s["vocab"], h), h ** -0.5)]
    for i in range(layers):
        p = f"blk.{i}."
        out += [(p + "attn_norm.weight", (h,), 0.0), (p + "ffn_norm.weight", (h,), 0.0),
                (p + "attn_q.weight", (q, h), h ** -0.5), (p + "attn_k.weight", (kv, h), h ** -0.5),
                (p + "attn_v.weight", (kv, h), h ** -0.5), (p + "attn_output.weight", (h, q), q ** -0.5),
                (p + "ffn_gate_inp.weight", (s["experts"], h), h ** -0.5),
                (p + "ffn_gate_exps.weight", (s["experts"], s["inter"], h), h ** -0.5),
                (p + "ffn_up_exps.weight", (s["experts"], s["inter"], h), h ** -0.5),
                (p + "ffn_down_exps.weight", (s["experts"], h, s["inter"]), s["inter"] ** -0.5)]
    return out


def add_metadata(writer, layers: int) -> None:
    """The file's metadata: the model's shape, a byte-level vocabulary of SHAPE["vocab"] tokens (llama.cpp runs
    it with dummy tokens)."""
    import gguf
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    s = SHAPE
    writer.add_name("random moe benchmark")
    writer.add_context_length(4096)
    writer.add_embedding_length(s["hidden"])
    writer.add_block_count(layers)
    writer.add_feed_forward_length(s["inter"])
    writer.add_head_count(s["heads"])
    writer.add_head_count_kv(s["kv_heads"])
    writer.add_key_length(s["head_dim"])
    writer.add_value_length(s["head_dim"])
    writer.add_rope_dimension_count(s["head_dim"])
    writer.add_rope_freq_base(1e6)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(s["vocab"])
    writer.add_expert_count(s["experts"])
    writer.add_expert_used_count(s["top_k"])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    alphabet = bytes_to_unicode()  # GPT-2's byte alphabet
    byte_tokens = [alphabet[b] for b in range(256)]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(byte_tokens + ["ĀĀ"] + [f"[PAD{i}]" for i in range(257, s["vocab"])])
    writer.add_token_types([gguf.TokenType.NORMAL] * 257 + [gguf.TokenType.UNUSED] * (s["vocab"] - 257))
    writer.add_token_merges(["Ā Ā"])
    writer.add_eos_token_id(s["vocab"] - 1)


def write_gguf(path: Path, layers: int) -> None:
    import gguf

    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(path, "llama")
    add_metadata(writer, layers)
    specs = tensors(layers)
    for name, shape, _ in specs:
        dtype = gguf.GGMLQuantizationType.BF16 if len(shape) > 1 else gguf.GGMLQuantizationType.F32
        nbytes = int(np.prod(shape)) * (2 if len(shape) > 1 else 4)
        writer.add_tensor_info(name, shape, np.dtype(np.float32), nbytes, raw_dtype=dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, shape, std in specs:
        n = int(np.prod(shape))
        if len(shape) == 1:
            data = np.ones(n, np.float32)
        else:
            data = np.empty(n, ml_dtypes.bfloat16)
            for i in range(0, n, CHUNK):
                data[i:i + CHUNK] = (rng.standard_normal(min(CHUNK, n - i), np.float32) * std).astype(ml_dtypes.bfloat16)
            data = data.view(np.uint16)
        writer.write_tensor_data(data)
    writer.close()


def active_bytes(layers: int, mode: str) -> int:
    """Bytes one decode step must read in ``mode``: every layer's attention, router (bf16 in both modes) and
    top-k experts, and the lm_head (the embedding: one row, not counted)."""
    s = SHAPE
    h, q, kv = s["hidden"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
    per_weight = 2 if mode == "bf16" else INT8_BYTES
    quantized = layers * (h * q + 2 * h * kv + q * h + s["top_k"] * 3 * h * s["inter"]) + s["vocab"] * h
    return int(per_weight * quantized + 2 * layers * s["experts"] * h)


def stream_rate(mode: str, device: str):
    """A function returning the bytes per second the mode's dense kernel (M = 1) streams over a 1 GiB weight
    (best of 3 calls)."""
    import llaisys

    k = 2048
    x = llaisys.from_numpy(np.ones((1, k), ml_dtypes.bfloat16), device)
    rng = np.random.default_rng(1)
    if mode == "bf16":
        n = 1 << 18
        w = llaisys.from_numpy(rng.standard_normal((n, k), np.float32).astype(ml_dtypes.bfloat16), device)
        args, nbytes = (w,), n * k * 2
        run = llaisys.ops.linear
    else:
        n = 1 << 19
        weight_shape, scales_shape = llaisys.ops.int8_shapes(n, k)
        w = llaisys.from_numpy(rng.integers(-127, 128, weight_shape, dtype=np.int8), device)
        scales = llaisys.from_numpy(np.full(scales_shape, 1e-3, ml_dtypes.bfloat16), device)
        args, nbytes = (w, scales), int(n * k * INT8_BYTES)
        run = llaisys.ops.linear_i8
    out = llaisys.empty((1, n), llaisys.bfloat16, device)

    def measure() -> float:
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            run(out, x, *args)
            out.numpy()  # (waits for the device)
            best = min(best, time.perf_counter() - t)
        return nbytes / best

    return measure


def weight_bytes(model) -> int:
    """The bytes of every weight the model holds (int8 ones with their scales)."""
    import dataclasses

    def size(w) -> int:
        if w is None:
            return 0
        if hasattr(w, "scales"):  # Int8Weight, Int8Experts
            return w.weight.nbytes + w.scales.nbytes
        if dataclasses.is_dataclass(w):  # ExpertWeights
            return sum(size(v) for v in vars(w).values())
        return w.nbytes

    ws = model.weights
    top = [ws.embed_tokens, ws.norm] + ([ws.lm_head] if ws.lm_head is not ws.embed_tokens else [])
    return sum(map(size, top)) + sum(size(v) for layer in ws.layers for v in vars(layer).values())


def run_llaisys(path: Path, mode: str, new: int, device: str) -> dict:
    """One mode in this process: load, three timed greedy decodes, the stream rate, the peak RSS."""
    import llaisys_models

    t = time.perf_counter()
    model = llaisys_models.load(path, device=device, quantize=None if mode == "bf16" else mode)
    load_s, peak = time.perf_counter() - t, status_bytes("VmHWM")
    prompt = list(range(16))
    model.generate(prompt, 4, eos_token_ids=())  # warm-up (page faults of the mapping, decode graphs)
    stream = stream_rate(mode, device)
    rates, streams = [], []
    for _ in range(3):  # decode and the dense stream in turn: each rate beside the other in time
        model.generate(prompt, new, eos_token_ids=())
        rates.append(model.last_stats.decode_tokens_per_second)
        streams.append(stream())
    return dict(mode=mode, tps=statistics.median(rates), load_s=load_s, peak=peak, weights=weight_bytes(model),
                stream=statistics.median(streams))


def run_llama_bench(binary: str, path: Path, new: int, threads: int, extra: str = "") -> float:
    result = subprocess.run([binary, "-m", str(path), "-p", "0", "-n", str(new), "-t", str(threads), "-r", "3",
                             *extra.split(), "-o", "json"], capture_output=True, text=True, timeout=3600)
    if result.returncode:
        raise RuntimeError(f"llama-bench failed:\n{result.stderr[-2000:]}")
    rows = json.loads(result.stdout[result.stdout.index("["):])
    return float(rows[0]["avg_ts"])


def quantized_file(path: Path, quantizer: str, threads: int, qtype: str = "Q8_0") -> Path:
    """``path`` (a bf16 GGUF) requantized by llama-quantize into ``qtype``, beside it (made once)."""
    out = path.with_name(path.stem.replace("bf16", qtype.lower()) + ".gguf")
    if not out.exists():
        subprocess.run([quantizer, str(path), str(out), qtype, str(threads)], check=True, capture_output=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/moe-bench"))
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2, help="rounds alternating llaisys and llama.cpp")
    parser.add_argument("--modes", default="bf16,int8")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--llama-bench", default=None, help="a llama.cpp llama-bench binary")
    parser.add_argument("--llama-quantize", default=None, help="llama-quantize (default: beside llama-bench)")
    parser.add_argument("--llama-args", action="append", default=None,
                        help="more llama-bench arguments, e.g. '--poll 0' (its threads then wait without spinning: "
                             "on a loaded machine a spinning thread that loses its core stalls every op); "
                             "repeat for several llama.cpp runs (default: its defaults)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a worker process: one llaisys mode
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    path = args.out / f"moe-{args.layers}l-bf16.gguf"
    if args.one:
        print(json.dumps(run_llaisys(path, args.one, args.new, args.device)))
        return

    args.out.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        t = time.perf_counter()
        write_gguf(path, args.layers)
        print(f"wrote {path} ({path.stat().st_size / 2**30:.2f} GiB) in {time.perf_counter() - t:.0f} s")
    modes = args.modes.split(",")
    files = {"bf16": path}
    if args.llama_bench and "int8" in modes:
        quantizer = args.llama_quantize or str(Path(args.llama_bench).with_name("llama-quantize"))
        files["int8"] = quantized_file(path, quantizer, args.threads)
    variants = (args.llama_args or [""]) if args.llama_bench else []
    ours: dict[str, list[dict]] = {m: [] for m in modes}
    theirs: dict[tuple[str, str], list[float]] = {(m, v): [] for m in modes for v in variants}
    for round_ in range(args.rounds):
        for mode in modes:
            worker = subprocess.run([sys.executable, __file__, "--out", str(args.out), "--layers", str(args.layers),
                                     "--new", str(args.new), "--threads", str(args.threads), "--device", args.device,
                                     "--one", mode], check=True, capture_output=True, text=True).stdout
            ours[mode].append(json.loads(worker.strip().splitlines()[-1]))
            progress = [f"llaisys {ours[mode][-1]['tps']:.2f}"]
            for variant in variants:
                theirs[mode, variant].append(run_llama_bench(args.llama_bench, files[mode], args.new, args.threads,
                                                             variant))
                progress.append(f"llama.cpp {variant or '(defaults)'} {theirs[mode, variant][-1]:.2f}")
            print(f"round {round_ + 1} {mode}: " + ", ".join(progress) + f" tok/s (load {os.getloadavg()[0]:.1f})",
                  flush=True)

    print(f"{path.name}: {args.layers} layers, {SHAPE['experts']} experts top {SHAPE['top_k']}, "
          f"{path.stat().st_size / 2**30:.2f} GiB; {args.device}, {args.threads} threads, {args.rounds} rounds "
          f"(medians); load average {os.getloadavg()[0]:.1f}")
    print(f"{'mode':5} {'engine':10} {'active GiB/tok':>14} {'tok/s':>7} {'ms/tok':>7} {'GB/s active':>12} "
          f"{'stream GB/s':>12} {'of bound':>9} {'llaisys/this':>13}")
    for mode in modes:
        active = active_bytes(args.layers, mode)
        stream = statistics.median(r["stream"] for r in ours[mode])
        ours_tps = statistics.median(r["tps"] for r in ours[mode])
        rows = [("llaisys", ours_tps, "")]
        for variant in variants:  # llaisys / llama.cpp per round (alternating runs), then the median
            ratios = [r["tps"] / t for r, t in zip(ours[mode], theirs[mode, variant])]
            rows.append((f"llama.cpp {variant}".strip(), statistics.median(theirs[mode, variant]),
                         f"{statistics.median(ratios):.2f}x"))
        for engine, tps, ratio in rows:
            print(f"{mode:5} {engine:10} {active / 2**30:14.3f} {tps:7.2f} {1e3 / tps:7.1f} {active * tps / 1e9:12.2f} "
                  f"{stream / 1e9:12.2f} {active * tps / stream:9.0%} {ratio:>13}")
        r = ours[mode][0]
        print(f"      llaisys load {r['load_s']:.1f} s, weights {r['weights'] / 2**30:.2f} GiB, peak RSS "
              f"{r['peak'] / 2**30:.2f} GiB ({r['peak'] / r['weights']:.2f}x the weights)")


if __name__ == "__main__":
    main()
