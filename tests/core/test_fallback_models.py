"""Fallback exactness: models on a partial backend (add and embedding native, every other op on the CPU
backend: partial_backend.py) generate exactly the CPU backend's tokens, host-addressable or not."""

from __future__ import annotations

import partial_backend
import pytest

import llaisys

NEW_TOKENS = 12


@pytest.fixture(params=[True, False], ids=["host-addressable", "device-memory"])
def partial(request, partial_libraries, monkeypatch):
    monkeypatch.delenv("LLAISYS_FALLBACK", raising=False)
    library = partial_libraries[request.param]
    saved = partial_backend.use(partial_backend.registry_with(library))
    yield library
    partial_backend.use(saved)


def tokens_on(path, device, prompts, max_new_tokens=NEW_TOKENS) -> list[list[int]]:
    import llaisys_models

    model = llaisys_models.load(path, device=device)
    assert model.device == llaisys.Device(device)
    return [model.generate(ids, max_new_tokens=max_new_tokens) for ids in prompts]


def test_the_demo_model_answers_as_on_the_cpu(partial):
    from transformers import AutoTokenizer

    import llaisys_models

    tokenizer = AutoTokenizer.from_pretrained(llaisys_models.DEMO_MODEL_DIR)
    prompts = [tokenizer(p)["input_ids"] for p in ("1234+5678=", "12+34=", "999+1=", "7+8=")]
    with llaisys.profile() as prof:
        partial_tokens = tokens_on(llaisys_models.DEMO_MODEL_DIR, "partial", prompts)
    cpu_tokens = tokens_on(llaisys_models.DEMO_MODEL_DIR, "cpu", prompts)
    assert partial_tokens == cpu_tokens
    assert tokenizer.decode(partial_tokens[0][len(prompts[0]):], skip_special_tokens=True) == "6912"
    ran = set(prof.calls)
    assert {"add", "embedding", "linear (cpu fallback)", "rms_norm (cpu fallback)"} <= ran  # both sides ran


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """checkpoint(name): a tiny random checkpoint of tests/helpers/tiny_models.py, made once per module."""
    from helpers.tiny_models import SPECS, make_checkpoint

    made: dict = {}

    def checkpoint(name: str):
        if name not in made:
            made[name] = make_checkpoint(tmp_path_factory.mktemp(name), SPECS[name])
        return made[name]
    return checkpoint


@pytest.mark.parametrize("name", ["f32_gqa2_hd32", "bf16_mha_hd64"])
def test_a_tiny_qwen2_generates_the_cpus_tokens(partial, checkpoints, name):
    from helpers.tiny_models import SPECS, prompt

    spec = SPECS[name]
    assert spec.arch == "qwen2"
    prompts = [prompt(name, length, spec.vocab) for length in (1, 13)]
    path = checkpoints(name)
    assert tokens_on(path, "partial", prompts) == tokens_on(path, "cpu", prompts)
