#!/usr/bin/env python
"""Write a random-weight model of the exact DeepSeek-R1-Distill-Qwen-1.5B shape (bf16, ~3.5 GB).

    python benchmarks/make_model.py --out /tmp/qwen2-1.5b-random

28 layers, hidden 1536, 12 heads / 2 KV heads (head_dim 128), intermediate 8960, vocab
151936, rope_theta 10000, max_position_embeddings 131072, untied lm_head. The weights are
drawn with numpy in chunks and streamed into one model.safetensors (memory stays near one
chunk, no torch), next to a config.json and generation_config.json like the real model's.
No tokenizer: the benchmark feeds token ids (pass --tokenizer DIR to copy one in).
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np

SHAPE = dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
             num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=131072)
CHUNK = 1 << 24  # values drawn per numpy call


def config(shape: dict = SHAPE) -> dict:
    return {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", **shape,
        "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu",
        "initializer_range": 0.02, "max_window_layers": 21, "rms_norm_eps": 1e-06, "rope_theta": 10000,
        "sliding_window": 4096, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
        "use_sliding_window": False,
    }


def tensors(shape: dict = SHAPE) -> list[tuple[str, tuple[int, ...], float, float]]:
    """(name, shape, mean, std) in the order HF writes them, for the model of ``shape`` (SHAPE's keys)."""
    c = shape
    h, inter, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    d = h // c["num_attention_heads"]
    kv = c["num_key_value_heads"] * d
    out = [("model.embed_tokens.weight", (v, h), 0.0, 0.02)]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (h,), 1.0, 0.05),
                (p + "self_attn.q_proj.weight", (h, h), 0.0, 0.02), (p + "self_attn.q_proj.bias", (h,), 0.0, 0.02),
                (p + "self_attn.k_proj.weight", (kv, h), 0.0, 0.02), (p + "self_attn.k_proj.bias", (kv,), 0.0, 0.02),
                (p + "self_attn.v_proj.weight", (kv, h), 0.0, 0.02), (p + "self_attn.v_proj.bias", (kv,), 0.0, 0.02),
                (p + "self_attn.o_proj.weight", (h, h), 0.0, 0.02),
                (p + "post_attention_layernorm.weight", (h,), 1.0, 0.05),
                (p + "mlp.gate_proj.weight", (inter, h), 0.0, 0.02), (p + "mlp.up_proj.weight", (inter, h), 0.0, 0.02),
                (p + "mlp.down_proj.weight", (h, inter), 0.0, 0.02)]
    out += [("model.norm.weight", (h,), 1.0, 0.05), ("lm_head.weight", (v, h), 0.0, 0.02)]
    return out


def write_safetensors(path: Path, specs, seed: int) -> int:
    header, offset = {}, 0
    for name, shape, _, _ in specs:
        nbytes = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % 8)  # data starts 8-byte aligned, as the safetensors library does
    rng = np.random.default_rng(seed)
    done, t0, shown = 0, time.perf_counter(), 0.0
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for _, shape, mean, std in specs:
            n = int(np.prod(shape))
            for start in range(0, n, CHUNK):
                values = rng.standard_normal(min(CHUNK, n - start), dtype=np.float32)
                values *= std
                values += mean
                f.write(values.astype(ml_dtypes.bfloat16).tobytes())
            done += n * 2
            if time.perf_counter() - shown < 1.0 and done < offset:
                continue
            shown = time.perf_counter()
            print(f"\r{path.name}: {done / offset * 100:5.1f}% of {offset / 2**30:.2f} GiB "
                  f"({time.perf_counter() - t0:.0f}s)", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return offset


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="output directory (created)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer", type=Path, default=None, help="copy tokenizer files from this directory")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "config.json").write_text(json.dumps(config(), indent=2))
    (args.out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 151643, "eos_token_id": 151643, "do_sample": True, "temperature": 0.6, "top_p": 0.95},
        indent=2))
    nbytes = write_safetensors(args.out / "model.safetensors", tensors(), args.seed)
    if args.tokenizer:
        for f in args.tokenizer.glob("*"):
            if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges")):
                shutil.copy(f, args.out / f.name)
    print(f"wrote {args.out} ({nbytes / 2**30:.2f} GiB of bf16 weights)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
