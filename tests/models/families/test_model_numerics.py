"""load(..., numerics="hf"): the model's f16 / bf16 ops round where HF transformers' forward rounds.

Against HF's greedy runs on the tiny bf16 / f16 checkpoints, teacher-forced (llaisys_models.cli.parity):
many short prompts with few new tokens, so that every attention call has fewer than 16 keys, where the hf
mode's attention equals torch's sdpa bit for bit (with 16 and more keys torch computes exp with a ~20-bit
approximation that llaisys does not copy; tests/ops/test_numerics_hf.py). What remains between llaisys
and HF there is the f32 summation order inside the linear layers (an output moves by an ulp now and then).
So: the hf mode's generations equal HF's for nearly every prompt, any exception is a near-tie against the
exact (float64) logits, HF's logits are reproduced bit for bit at many steps (the exact mode: at none),
and the hf mode's logits are closer to HF's than the exact mode's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import llaisys
import llaisys_models
from helpers.tiny_models import SPECS
from llaisys_models import ModelLoadError
from llaisys_models.cli import parity

HALF = [name for name, spec in SPECS.items() if spec.dtype in ("bf16", "f16")]
PROMPTS, NEW_TOKENS = 24, 10  # prompts of 1-4 tokens: at most 13 keys
# measured (AVX-512 machine; models in SPECS order): token-identical generations 23, 23, 24 of 24 (exact
# mode: 19, 21, 24); bit-identical logits at 74%, 45%, 5% of the steps (exact mode: 0%): f16's three extra
# mantissa bits show the linear layers' summation order more often. With the batch-invariant linear (one
# summation order for every row count) the f16 model's bit-identical steps fell to 1 of 240 (exact
# mode: 0): in f16 only the ordering checks below (more identical rows, closer logits) hold.
MIN_IDENTICAL = PROMPTS - 3
MIN_HF_ROWS = {"bf16": 0.3, "f16": 0.0}


def short_prompts(name: str) -> list[list[int]]:
    rng = np.random.default_rng(sum(map(ord, name)))
    return [rng.integers(0, 256, size=1 + i % 4).tolist() for i in range(PROMPTS)]


# a backend may decline numerics=hf for f16 / bf16 attention (CUDA: where HF's GPU attention kernels round is
# not measured yet), with this in its NotSupportedError; the CPU backend implements it
DECLINED = "not implemented by this backend"


def skip_if_hf_attention_is_declined(model, device, ids):
    try:
        model.logits(ids)
    except llaisys.NotSupportedError as e:
        if device.type == "cpu" or DECLINED not in str(e):
            raise
        pytest.skip(str(e))


@pytest.mark.parametrize("name", HALF)
def test_hf_numerics_follow_hf_greedy(name, tiny_models, device):
    dtype = SPECS[name].dtype
    hf, exact_model = tiny_models.hf(name), tiny_models.hf(name, "f64")
    models = {mode: llaisys_models.load(tiny_models.path(name), device=device, numerics=mode)
              for mode in ("exact", "hf")}
    assert models["hf"].numerics == "hf"
    skip_if_hf_attention_is_declined(models["hf"], device, short_prompts(name)[0])
    identical = dict.fromkeys(models, 0)
    hf_rows = dict.fromkeys(models, 0)
    distance = dict.fromkeys(models, 0.0)
    steps = 0
    for ids in short_prompts(name):
        tokens, logits, seconds = parity.hf_greedy(hf, ids, NEW_TOKENS)
        with torch.no_grad():
            exact = exact_model(torch.tensor([ids + tokens[:-1]])).logits[0, len(ids) - 1:].numpy()
        reference = parity.Reference(ids, tokens, logits, exact, models["hf"].dtype.name, seconds)
        steps += len(tokens)
        for mode, model in models.items():
            ours = parity.teacher_forced_logits(model, ids, tokens)
            report = parity.classify(reference, ours)
            assert report.mismatches == 0, f"[{mode}] prompt {ids}: {report.describe()}"
            identical[mode] += not report.divergences
            hf_rows[mode] += report.hf_identical_rows
            distance[mode] = max(distance[mode], report.hf_distance)
    print(f"{name}: token-identical {identical}, logits = HF's at {hf_rows} of {steps} steps, "
          f"max |llaisys - HF| {distance}")
    assert identical["hf"] >= MIN_IDENTICAL, f"hf mode: only {identical['hf']} of {PROMPTS} generations are HF's"
    assert hf_rows["hf"] >= MIN_HF_ROWS[dtype] * steps, f"hf mode: logits = HF's at {hf_rows['hf']} of {steps} steps"
    assert hf_rows["hf"] > hf_rows["exact"]
    assert distance["hf"] < distance["exact"], f"hf mode's logits are not closer to HF's: {distance}"


def test_f32_hf_numerics_is_exact(tiny_models, device):
    name = "f32_gqa2_hd32"
    ids = short_prompts(name)[3] * 5
    exact = llaisys_models.load(tiny_models.path(name), device=device).logits(ids)
    hf = llaisys_models.load(tiny_models.path(name), device=device, numerics="hf").logits(ids)
    assert np.array_equal(exact, hf)


def test_numerics_option_and_environment(tiny_models, device, monkeypatch):
    path = tiny_models.path("bf16_mha_hd64")
    monkeypatch.delenv("LLAISYS_NUMERICS", raising=False)
    assert llaisys_models.load(path, device=device).numerics == "exact"
    monkeypatch.setenv("LLAISYS_NUMERICS", "hf")
    model = llaisys_models.load(path, device=device)
    assert model.numerics == "hf" and "numerics=hf" in repr(model)
    assert llaisys_models.load(path, device=device, numerics="exact").numerics == "exact"  # the argument wins
    monkeypatch.setenv("LLAISYS_NUMERICS", "fast")
    with pytest.raises(ModelLoadError, match="LLAISYS_NUMERICS must be one of exact, hf, got 'fast'"):
        llaisys_models.load(path, device=device)
    with pytest.raises(ModelLoadError, match="numerics must be one of exact, hf, got 'eager'"):
        llaisys_models.load(path, device=device, numerics="eager")


def test_cli_numerics_flag(tiny_models, device, capsys, monkeypatch):
    from llaisys.cli import main

    monkeypatch.delenv("LLAISYS_NUMERICS", raising=False)
    path = str(tiny_models.path("bf16_mha_hd64"))
    with pytest.raises(SystemExit):
        main(["generate", "--model", path, "--prompt", "Hi", "--numerics", "fast"])
    assert "invalid choice: 'fast'" in capsys.readouterr().err
    status = main(["generate", "--model", path, "--device", str(device), "--prompt", "Hi", "--raw",
                   "--max-new-tokens", "4", "--numerics", "hf"])
    err = capsys.readouterr().err
    declined = [line for line in err.splitlines() if line.startswith("llaisys: error:") and DECLINED in line]
    if status == 2 and device.type != "cpu" and declined:  # the CLI reports a LlaisysError so, exit 2
        pytest.skip(declined[0])
    assert status == 0, err
    assert "(numerics hf)" in err
