#!/usr/bin/env python
"""How far quantize="int8" moves a model: the numbers behind tests/models/test_int8.py's bounds and the README.

    python benchmarks/int8_quality.py

On each tiny test model (tests/models/tiny_models.py), teacher-forced on HF's greedy sequence after a
13- and a 64-token prompt: per position err = ||logits - logits_HF_bf16|| / ||logits_HF_bf16|| for llaisys
int8 (bf16 activations) and, for scale, llaisys bf16; the share of positions whose argmax is HF bf16's.
On the demo model: addition accuracy in bf16 and int8 (the demo test's 200 problems, and 1000 more), and
the int8 logits' error against llaisys bf16 along 'a+b=sum' sequences.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "models"), str(ROOT / "tests" / "demo"), str(ROOT / "tests")]

from test_demo_model import addition_problems, answer  # noqa: E402
from tiny_models import SPECS, TinyModels  # noqa: E402


def relative_errors(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    return np.linalg.norm(got - want, axis=1) / np.linalg.norm(want, axis=1)


def test_models() -> None:
    import torch

    import llaisys_models

    models = TinyModels(Path(tempfile.mkdtemp(prefix="int8-quality-")))
    print(f"{'model':26} {'prompt':>6} | {'int8 err max':>12} {'mean':>6} {'argmax':>7} | "
          f"{'bf16 err max':>12} {'mean':>6} {'argmax':>7}")
    for name in SPECS:
        for length in (13, 64):
            sequence = models.reference(name, length).tokens[:-1]
            with torch.no_grad():
                want = models.hf(name, "bf16")(torch.tensor([sequence])).logits[0].float().numpy()
            row = []
            for quantize in ("int8", None):
                model = llaisys_models.load(models.path(name), device="cpu", dtype="bfloat16", quantize=quantize)
                got = model.logits(sequence)
                err = relative_errors(got, want)
                row.append(f"{err.max():12.4f} {err.mean():6.4f} {np.mean(got.argmax(1) == want.argmax(1)):7.3f}")
            print(f"{name:26} {length:6} | {row[0]} | {row[1]}")


def demo() -> None:
    from transformers import AutoTokenizer

    import llaisys_models

    tokenizer = AutoTokenizer.from_pretrained(llaisys_models.DEMO_MODEL_DIR)
    models = {q: llaisys_models.load(llaisys_models.DEMO_MODEL_DIR, device="cpu", quantize=q) for q in (None, "int8")}
    for n, seed in ((200, 2026), (1000, 1)):
        problems = addition_problems(n, seed)
        accuracy = {}
        for quantize, model in models.items():
            right = 0
            for a, b in problems:
                ids = tokenizer(f"{a}+{b}=")["input_ids"]
                right += answer(tokenizer, model.generate(ids, max_new_tokens=8), len(ids)) == str(a + b)
            accuracy[quantize] = right / n
        errors, agreement = [], []
        for a, b in problems[:200]:
            ids = tokenizer(f"{a}+{b}={a + b}")["input_ids"]
            bf16, int8 = models[None].logits(ids), models["int8"].logits(ids)
            errors.append(relative_errors(int8, bf16))
            agreement.append(np.mean(bf16.argmax(1) == int8.argmax(1)))
        e = np.concatenate(errors)
        print(f"demo, {n} problems (seed {seed}): accuracy bf16 {accuracy[None]:.3f}, int8 {accuracy['int8']:.3f}; "
              f"int8 logits vs bf16 on 200 'a+b=sum': err max {e.max():.4f} mean {e.mean():.4f}, "
              f"argmax agreement {np.mean(agreement):.4f}")


if __name__ == "__main__":
    import os

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    test_models()
    demo()
