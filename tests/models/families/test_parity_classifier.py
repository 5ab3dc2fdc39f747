"""The divergence classifier of ``llaisys infer --test`` (``llaisys_models.cli.parity``).

A real bug planted into a loaded llaisys model (its config or weights perturbed in memory,
the library untouched) must come out as a *mismatch*; a bf16 divergence at a true tie of
the exact logits as a *near-tie*; the threshold itself is checked on hand-made logits. HF
transformers and its float64 run of the same weights are the references.
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest

import llaisys
import llaisys_models
from helpers.tiny_models import SPECS, prompt
from llaisys.cli import main
from llaisys_models.cli import parity

NEW_TOKENS = 24
F32, BF16 = "f32_gqa2_hd32", "bf16_mha_hd64"
TIED_PROMPT = "Once upon a time"  # the tiny models' tokenizer maps each byte to its id (no chat template: --raw)


# -- the verdict on hand-made logits -------------------------------------------------------

def reference(exact_rows, hf_error=0.1, dtype="bfloat16") -> parity.Reference:
    """HF's run over exact logits ``exact_rows``: HF's logits are off by +-hf_error, its tokens the exact argmax."""
    exact = np.asarray(exact_rows, dtype=np.float64)
    hf = exact + hf_error * np.where(np.arange(exact.shape[1]) % 2, 1.0, -1.0)
    return parity.Reference(prompt=[0], tokens=[int(r.argmax()) for r in exact], logits=hf.astype(np.float32),
                            exact_logits=exact, dtype=dtype, seconds=0.0)


def test_identical_choices_are_no_divergence():
    ref = reference([[1.0, 5.0, 2.0], [3.0, 0.0, -1.0]])
    report = parity.classify(ref, ref.exact_logits + 0.05)
    assert (report.identical, report.divergences, report.llaisys_choices) == (2, [], [1, 0])
    assert report.ok(strict=True)
    assert report.hf_error == pytest.approx(0.1, abs=1e-6) and report.llaisys_error == pytest.approx(0.05)
    assert report.bound == pytest.approx(0.2, abs=1e-6)


@pytest.mark.parametrize("gap, verdict", [(0.0, "near-tie"), (0.15, "near-tie"), (0.25, "mismatch"), (3.0, "mismatch")])
def test_a_choice_is_a_near_tie_within_twice_hfs_error(gap, verdict):
    """HF's logits are 0.1 off exact, so rounding of that size can swap logits up to 0.2 apart."""
    exact = [[10.0, 10.0 - gap, 0.0, -5.0]]
    ours = np.array([[10.0, 10.5, 0.0, -5.0]])  # llaisys prefers token 1
    report = parity.classify(reference(exact), ours)
    (d,) = report.divergences
    assert (d.step, d.hf_token, d.llaisys_token, d.verdict) == (0, 0, 1, verdict)
    assert d.exact_logits == (10.0, 10.0 - gap) and d.exact_gaps == (0.0, pytest.approx(gap))
    assert d.llaisys_logits == (10.0, 10.5) and d.hf_logits == (pytest.approx(9.9), pytest.approx(10.1 - gap))
    assert report.ok() == (verdict == "near-tie") and not report.ok(strict=True)


def test_report_counts_and_lines():
    exact = [[2.0, 1.0, 0.0], [0.0, 4.0, 3.95], [5.0, 0.0, 0.0]]
    ours = np.array([[2.0, 1.0, 0.0], [0.0, 3.9, 4.0], [0.0, 0.0, 9.0]])
    report = parity.classify(reference(exact), ours)
    assert (report.identical, report.near_ties, report.mismatches, report.first_divergence) == (1, 1, 1, 1)
    assert [d.verdict for d in report.divergences] == ["near-tie", "mismatch"]
    text = "\n".join(report.describe(lambda t: "abc"[t]))
    assert "step 1: HF chose 'b' (1), llaisys 'c' (2): near-tie" in text
    assert "step 2: HF chose 'a' (0), llaisys 'c' (2): mismatch" in text
    assert report.summary().startswith("1 identical step, 1 near-tie, 1 mismatch (bfloat16)")


def test_logits_of_the_wrong_shape_are_refused():
    with pytest.raises(ValueError, match="expected"):
        parity.classify(reference([[1.0, 2.0]]), np.zeros((2, 2)))


# -- real models: HF references made once per module ----------------------------------------

@pytest.fixture(scope="module")
def references(tiny_models):
    """(checkpoint path, prompt length, tokens) -> HF's greedy run with exact logits, EOS ignored."""
    cache = {}

    def get(path, ids, dtype, new_tokens=NEW_TOKENS):
        key = (str(path), tuple(ids), dtype, new_tokens)
        if key not in cache:
            cache[key] = parity.hf_reference(path, ids, new_tokens, dtype, eos_token_ids=())
        return cache[key]
    return get


def compare(model, name, references, length=13):
    ids = prompt(name, length, SPECS[name].vocab)
    return parity.compare(model, ids, NEW_TOKENS, reference=references(model.path, ids, model.dtype.name))


@pytest.mark.parametrize("name", [F32, BF16])
def test_the_correct_model_has_no_mismatch(name, tiny_models, references, device):
    report = compare(llaisys_models.load(tiny_models.path(name), device=device), name, references)
    assert report.steps == NEW_TOKENS and report.mismatches == 0, "\n".join(report.describe())


def test_hf_runs_plain_greedy_whatever_the_checkpoint_asks(tiny_models, device, tmp_path):
    """A chat checkpoint's generation_config.json (sampling, a repetition penalty) must not leak into
    the reference: generate() would merge it into explicit greedy arguments."""
    path = tmp_path / F32
    shutil.copytree(tiny_models.path(F32), path)
    (path / "generation_config.json").write_text(json.dumps(
        {"do_sample": True, "temperature": 0.7, "top_k": 20, "top_p": 0.8, "repetition_penalty": 1.5,
         "eos_token_id": 256, "pad_token_id": 256}))
    ids = list(b"Hello there, general")
    reference = parity.hf_reference(path, ids, NEW_TOKENS, "float32", eos_token_ids=())
    assert reference.tokens == reference.logits.argmax(-1).tolist()  # no processor between logits and choice
    report = parity.compare(llaisys_models.load(path, device=device), ids, NEW_TOKENS, reference=reference)
    assert report.ok(strict=True), report.summary()


def wrong_rope_theta(model):
    model.config = dataclasses.replace(model.config, rope_theta=model.config.rope_theta * 10)
    model.set_rope()  # the rope table is built from the config at load


def dropped_q_bias(model):
    model.weights.layers[0].q_bias = None


@pytest.mark.parametrize("name, bug", [(F32, wrong_rope_theta), (F32, dropped_q_bias), (BF16, wrong_rope_theta),
                                       (BF16, dropped_q_bias)], ids=lambda x: getattr(x, "__name__", x))
def test_a_planted_bug_is_a_mismatch(name, bug, tiny_models, references, device):
    model = llaisys_models.load(tiny_models.path(name), device=device)
    bug(model)
    report = compare(model, name, references)
    assert report.mismatches >= 1 and not report.ok(), report.summary()
    worst = max(max(d.exact_gaps) for d in report.divergences)
    assert worst > report.bound  # some choice is further below the exact maximum than rounding explains


def nudge_lm_head_row(model, token: int, factor: float) -> None:
    """Scale llaisys' (not the checkpoint's) lm_head row ``token`` by ``factor``."""
    weight = model.weights.lm_head.numpy().copy()
    weight[token] = (weight[token].astype(np.float32) * factor).astype(weight.dtype)
    model.weights.lm_head = llaisys.from_numpy(weight, model.device)


@pytest.fixture(scope="module")
def tied_checkpoint(tiny_models, references, tmp_path_factory):
    """A copy of the bf16 checkpoint whose lm_head row b is a copy of row a, a = HF's first greedy token
    after the prompt (b > a, so HF, taking the first of equal maxima, keeps choosing a)."""
    import torch
    from safetensors.torch import load_file, save_file

    source = tiny_models.path(BF16)
    ids = list(TIED_PROMPT.encode())
    a = references(source, ids, "bfloat16", new_tokens=1).tokens[0]
    b = SPECS[BF16].vocab - 1 if a != SPECS[BF16].vocab - 1 else 0
    assert a < b
    path = tmp_path_factory.mktemp("tied") / BF16
    shutil.copytree(source, path)
    tensors = load_file(path / "model.safetensors")
    tensors["lm_head.weight"][b] = tensors["lm_head.weight"][a]
    assert tensors["lm_head.weight"].dtype == torch.bfloat16
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    return path, a, b


def test_a_bf16_near_tie_is_a_near_tie(tied_checkpoint, references, device):
    """Tokens a and b have identical exact logits; llaisys' copy of b's row is 1.6% larger (about a bf16
    ulp and a half of the logit), so it picks b where HF picks a: a divergence that is only a tie."""
    path, a, b = tied_checkpoint
    model = llaisys_models.load(path, device=device)
    nudge_lm_head_row(model, b, 1 + 2 ** -6)
    ids = list(TIED_PROMPT.encode())
    report = parity.compare(model, ids, NEW_TOKENS, reference=references(path, ids, "bfloat16"))
    assert report.hf_tokens[0] == a
    first = report.divergences[0]
    assert (first.step, first.hf_token, first.llaisys_token) == (0, a, b)
    assert first.exact_logits[0] == first.exact_logits[1] == first.exact_max
    assert report.mismatches == 0 and report.near_ties >= 1, "\n".join(report.describe())
    assert report.ok() and not report.ok(strict=True)


# -- llaisys infer --test ---------------------------------------------------------------------

def test_infer_test_on_the_demo_with_the_default_prompt(capsys):
    if not (llaisys_models.DEMO_MODEL_DIR / "config.json").is_file():
        pytest.skip("the demo model is not in this checkout")
    rc = main(["infer", "--test"])
    out, err = capsys.readouterr()
    assert rc == 0, out + err
    assert out.startswith("llaisys (") and "PASS: identical" in out
    assert "0 mismatches" in out and "max |logit - exact|" in out
    assert "Loading weights" not in out + err and "it/s" not in out + err  # no HF progress bars


@pytest.fixture
def load_with(monkeypatch):
    """Make the CLI's model load apply ``perturb`` to the llaisys model."""
    def install(perturb):
        real = llaisys_models.load
        monkeypatch.setattr(llaisys_models, "load", lambda *a, **k: _perturbed(real(*a, **k), perturb))
    return install


def _perturbed(model, perturb):
    perturb(model)
    return model


def test_infer_test_fails_on_a_bug(tiny_models, device, load_with, capsys):
    load_with(wrong_rope_theta)
    rc = main(["infer", "--model", str(tiny_models.path(F32)), "--device", str(device), "--test", "--raw",
               "--prompt", "Once upon a time", "--max-new-tokens", "24"])
    out, err = capsys.readouterr()
    assert rc == 1, out + err
    assert ": mismatch" in out and "FAIL:" in out and "below the exact maximum" in out


@pytest.mark.parametrize("strict", [False, True])
def test_infer_test_passes_a_near_tie_unless_strict(tied_checkpoint, device, load_with, capsys, strict):
    path, a, b = tied_checkpoint
    load_with(lambda model: nudge_lm_head_row(model, b, 1 + 2 ** -6))
    args = ["infer", "--model", str(path), "--device", str(device), "--raw", "--prompt", TIED_PROMPT,
            "--max-new-tokens", "8"] + (["--strict"] if strict else ["--test"])
    rc = main(args)
    out, err = capsys.readouterr()
    assert "step 0: HF chose " in out and f" ({a}), llaisys " in out and f" ({b}): near-tie" in out, out + err
    assert ": near-tie" in out and "0 mismatches" in out, out + err
    assert rc == (1 if strict else 0), out + err
    assert ("FAIL (--strict)" in out) == strict
