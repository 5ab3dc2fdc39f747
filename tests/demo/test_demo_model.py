"""The embedded demo model: it adds numbers through llaisys, like HF, from the installed package."""

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch

import llaisys_models
from helpers import skip_without_kernels

REPO = Path(__file__).resolve().parents[2]


def addition_problems(n: int, seed: int = 2026) -> list[tuple[int, int]]:
    """Operands of 1 to 4 digits, the digit counts uniform, as in tools/train_demo_model.py."""
    rng = np.random.default_rng(seed)
    problems = []
    for _ in range(n):
        a_digits, b_digits = rng.integers(1, 5, size=2)
        a, b = (int(rng.integers(0 if d == 1 else 10 ** (d - 1), 10 ** d)) for d in (a_digits, b_digits))
        problems.append((a, b))
    return problems


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(llaisys_models.DEMO_MODEL_DIR)


def answer(tokenizer, tokens, prompt_len) -> str:
    return tokenizer.decode(tokens[prompt_len:], skip_special_tokens=True)


@pytest.mark.parametrize("quantize", [None, "int8", "int4"])
def test_demo_adds_numbers_through_llaisys(device, tokenizer, quantize):
    if quantize:
        skip_without_kernels(device, {"int8": ["linear_i8"], "int4": ["linear_q"]}[quantize],
                             f"quantize={quantize!r}")
    model = llaisys_models.load(llaisys_models.DEMO_MODEL_DIR, device=device, quantize=quantize)
    problems = addition_problems(200)
    correct = 0
    for a, b in problems:
        ids = tokenizer(f"{a}+{b}=")["input_ids"]
        tokens = model.generate(ids, max_new_tokens=8)
        correct += answer(tokenizer, tokens, len(ids)) == str(a + b)
        assert tokens[-1] in model.eos_token_ids, f"{a}+{b}= did not end with EOS: {tokens}"
    assert correct / len(problems) >= 0.95, f"accuracy {correct}/{len(problems)}"


@pytest.mark.slow
def test_demo_matches_hf_transformers(device, tokenizer):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(llaisys_models.DEMO_MODEL_DIR, dtype=torch.bfloat16).eval()
    model = llaisys_models.load(llaisys_models.DEMO_MODEL_DIR, device=device)
    for a, b in addition_problems(60, seed=7):
        ids = tokenizer(f"{a}+{b}=")["input_ids"]
        with torch.no_grad():
            want = hf.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False,
                               pad_token_id=tokenizer.eos_token_id)[0].tolist()
        assert model.generate(ids, max_new_tokens=8) == want, f"{a}+{b}="


def _installed_from_site_packages() -> bool:
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    return site in Path(llaisys_models.__file__).resolve().parents


@pytest.mark.skipif(not _installed_from_site_packages(),
                    reason="llaisys-models is not installed as a regular package here (editable or source "
                           "checkout); the nox session installs it and runs this check")
def test_demo_is_shipped_in_the_installed_package(tmp_path):
    demo = Path(llaisys_models.DEMO_MODEL_DIR).resolve()
    assert REPO / "llaisys-models" not in demo.parents, f"the demo resolves into the source tree: {demo}"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "README.md"):
        assert (demo / name).is_file(), f"{name} is missing from the installed demo model"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-m", "llaisys.cli", "generate", "--prompt", "1234+5678="],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "6912" in result.stdout
    assert "tok/s" in result.stdout + result.stderr
