#!/usr/bin/env python
"""Mixture-of-experts decode: bytes read per token against the active-parameter bound, and llama.cpp.

    python benchmarks/moe.py --out /tmp/moe-bench [--layers 12] [--new 32] [--threads 2] [--llama-bench PATH]

Writes (once) a random bf16 GGUF file of a Qwen3-MoE-like shape in Mixtral's layout (llama.cpp arch
``llama`` with ``llama.expert_count``): hidden 2048, 64 experts of width 768, top 8 renormalised, 16 heads /
4 KV heads of 128, vocab 32000, untied lm_head; --layers sets the depth (12: 3.9 B parameters, 0.65 B
active a token). llaisys loads it without a copy (bf16 on the CPU reads the mapping in place) and
decodes --new tokens greedily after a 16-token prompt; in the same run a dense ``linear`` over a 1 GiB bf16
matrix (M = 1) measures what the kernels stream from memory. Printed:

  * active bytes per token: attention, router, the 8 chosen experts of every layer, lm_head (the bound);
  * llaisys' decode time per token, so its effective read rate = active bytes / time, against the dense
    stream rate: the fraction of the bound reached (target >= 75%);
  * with --llama-bench (a llama.cpp ``llama-bench`` binary), llama.cpp's tg tokens/s on the same file
    (``-p 0 -n NEW -t THREADS``), and the ratio.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

import ml_dtypes
import numpy as np
from transformers.convert_slow_tokenizer import bytes_to_unicode

SHAPE = dict(hidden=2048, inter=768, experts=64, top_k=8, heads=16, kv_heads=4, head_dim=128, vocab=32000)
CHUNK = 1 << 24  # values drawn per numpy call


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


def write_gguf(path: Path, layers: int) -> None:
    import gguf

    s, rng = SHAPE, np.random.default_rng(0)
    writer = gguf.GGUFWriter(path, "llama")
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


def active_bytes(layers: int) -> int:
    """Bytes one decode step must read: every layer's attention, router and top-k experts, lm_head."""
    s = SHAPE
    h, q, kv = s["hidden"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
    attention = h * q + 2 * h * kv + q * h
    experts = s["top_k"] * 3 * h * s["inter"]
    return 2 * (layers * (attention + s["experts"] * h + experts) + s["vocab"] * h)


def stream_rate(device: str) -> float:
    """Bytes per second a dense linear (M = 1) streams over a 1 GiB bf16 matrix (best of 5)."""
    import llaisys

    n, k = 1 << 18, 2048
    w = llaisys.from_numpy(np.random.default_rng(1).standard_normal((n, k), np.float32).astype(ml_dtypes.bfloat16),
                           device)
    x = llaisys.from_numpy(np.ones((1, k), ml_dtypes.bfloat16), device)
    out = llaisys.empty((1, n), llaisys.bfloat16, device)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        llaisys.ops.linear(out, x, w)
        out.numpy()  # (waits for the device)
        best = min(best, time.perf_counter() - t)
    return n * k * 2 / best


def llama_cpp_rate(binary: str, path: Path, new: int, threads: int) -> float:
    result = subprocess.run([binary, "-m", str(path), "-p", "0", "-n", str(new), "-t", str(threads), "-o", "json"],
                            capture_output=True, text=True, timeout=3600)
    if result.returncode:
        raise RuntimeError(f"llama-bench failed:\n{result.stderr[-2000:]}")
    rows = json.loads(result.stdout[result.stdout.index("["):])
    return float(rows[0]["avg_ts"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/moe-bench"))
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--llama-bench", default=None, help="a llama.cpp llama-bench binary")
    args = parser.parse_args()

    import os
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"moe-{args.layers}l-bf16.gguf"
    if not path.exists():
        t = time.perf_counter()
        write_gguf(path, args.layers)
        print(f"wrote {path} ({path.stat().st_size / 2**30:.2f} GiB) in {time.perf_counter() - t:.0f} s")

    import llaisys_models

    rate = stream_rate(args.device)
    model = llaisys_models.load(path, device=args.device)
    prompt = list(range(16))
    model.generate(prompt, 4, eos_token_ids=())  # warm-up (page faults of the mapping, decode graphs)
    model.generate(prompt, args.new, eos_token_ids=())
    ours = model.last_stats.decode_tokens_per_second
    active = active_bytes(args.layers)
    total = path.stat().st_size
    print(f"{path.name}: {args.layers} layers, {SHAPE['experts']} experts top {SHAPE['top_k']}, "
          f"{total / 2**30:.2f} GiB in all, {active / 2**30:.3f} GiB active per token; {args.device}, "
          f"{args.threads} threads")
    print(f"dense linear stream rate (same kernels, 1 GiB bf16, M = 1): {rate / 1e9:.1f} GB/s")
    print(f"{'':>10} {'decode tok/s':>13} {'ms/token':>9} {'GB/s of active':>15} {'of stream rate':>15}")
    print(f"{'llaisys':>10} {ours:>13.2f} {1e3 / ours:>9.1f} {active * ours / 1e9:>15.1f} "
          f"{active * ours / rate:>14.0%}")
    if args.llama_bench:
        theirs = llama_cpp_rate(args.llama_bench, path, args.new, args.threads)
        print(f"{'llama.cpp':>10} {theirs:>13.2f} {1e3 / theirs:>9.1f} {active * theirs / 1e9:>15.1f} "
              f"{active * theirs / rate:>14.0%}")
        print(f"{'ratio':>10} {ours / theirs:>13.2f}x (llaisys / llama.cpp, same file)")


if __name__ == "__main__":
    main()
