"""The KV cache, sampling, streaming and stopping at EOS."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

import llaisys
import llaisys_models
from helpers.tiny_models import EOS_ID, NEW_TOKENS, SPECS, prompt

F32 = "f32_gqa2_hd32"
BF16 = "bf16_mha_hd64"


@pytest.fixture(scope="module")
def f32_path(tiny_models):
    return tiny_models.path(F32)


def assert_logits_close(actual: np.ndarray, expected: np.ndarray, rel: float):
    scale = float(np.abs(expected).max())
    err = float(np.abs(actual - expected).max())
    assert err <= rel * scale, f"logits differ by {err:.3g} (max |logit| {scale:.3g}, allowed {rel * scale:.3g})"


@pytest.mark.parametrize("name, rel", [(F32, 1e-5), (BF16, 2 ** -6)])
def test_decode_step_equals_full_recompute(name, rel, tiny_models, device):
    """Logits of one cached decode step == logits of the whole sequence recomputed from scratch."""
    model = llaisys_models.load(tiny_models.path(name), device=device)
    ids = prompt(name, 20, SPECS[name].vocab)
    full = model.logits(ids)
    session = model.session()
    session.forward(ids[:-3])
    steps = [session.forward([t]).numpy().astype(np.float32)[0] for t in ids[-3:]]
    assert len(session) == len(ids)
    assert_logits_close(np.stack(steps), full[-3:], rel)
    # a chunk of several tokens on top of a cache gives the same as well
    session.truncate(10)
    chunk = session.forward(ids[10:], all_logits=True).numpy().astype(np.float32)
    assert_logits_close(chunk, full[10:], rel)


def test_cache_grows_and_keeps_its_content(f32_path, device):
    """Growing a KV pool past its first allocation keeps the cached keys/values intact."""
    model = llaisys_models.load(f32_path, device=device)
    ids = np.random.default_rng(0).integers(0, 256, size=300).tolist()
    full = model.logits(ids)
    session = model.session()  # starts with one block of 16 positions
    session.forward(ids[:200])
    blocks = session.pool.num_blocks
    rest = session.forward(ids[200:], all_logits=True).numpy()
    assert session.pool.num_blocks > blocks >= 200 // session.pool.block_size
    assert_logits_close(rest, full[200:], 1e-5)


def test_cache_is_allocated_once_per_generation(f32_path, device):
    model = llaisys_models.load(f32_path, device=device)
    ids = prompt(F32, 5, SPECS[F32].vocab)
    model.generate(ids, 20, eos_token_ids=())
    pool = model.generator.pool
    keys = [k.data_ptr() for k in pool.keys]
    model.generate(ids, 30, eos_token_ids=())  # fits in the same pool: no reallocation
    assert [k.data_ptr() for k in pool.keys] == keys
    assert pool.check()["used"] == 0  # every generation's blocks came back (cached or free)
    longer = prompt(F32, 300, SPECS[F32].vocab)
    model.generate(longer, 4, eos_token_ids=())  # more than the first pool holds: it grows
    assert model.generator.pool is pool and pool.capacity_tokens >= 304 and pool.check()["used"] == 0


def test_a_prompt_that_starts_like_an_earlier_one_reuses_its_cache(f32_path, device):
    """A chat's next turn: the prompt is the last prompt + reply + a new message. Prefix caching computes
    only the tokens after the cached ones (the last token is always computed), with the same result."""
    model = llaisys_models.load(f32_path, device=device)
    ids = prompt(F32, 13, SPECS[F32].vocab)
    first = model.generate(ids, 8, eos_token_ids=())
    longer = first + [5, 6, 7]
    fresh = llaisys_models.load(f32_path, device=device).generate(longer, 10, eos_token_ids=())
    model.generate(ids, 8, eos_token_ids=())
    reused = model.generate(longer, 10, eos_token_ids=())
    # the cache holds ids + the first 7 new tokens (the 8th was never fed back)
    assert model.last_stats.prompt_tokens == len(longer) - (len(first) - 1)
    assert reused == fresh


def test_top_k_1_is_greedy_whatever_the_temperature(f32_path, device):
    model = llaisys_models.load(f32_path, device=device)
    ids = prompt(F32, 13, SPECS[F32].vocab)
    greedy = model.generate(ids, 16, eos_token_ids=())
    assert model.generate(ids, 16, top_k=1, temperature=0.7, seed=3, eos_token_ids=()) == greedy
    assert model.generate(ids, 16, top_k=0, temperature=0.0, seed=3, eos_token_ids=()) == greedy


def test_sampling_is_reproducible_with_a_seed(f32_path, device):
    model = llaisys_models.load(f32_path, device=device)
    ids = prompt(F32, 13, SPECS[F32].vocab)
    kwargs = dict(top_k=0, top_p=0.95, temperature=1.5, eos_token_ids=())
    a = model.generate(ids, 24, seed=1234, **kwargs)
    assert model.generate(ids, 24, seed=1234, **kwargs) == a
    others = [model.generate(ids, 24, seed=s, **kwargs) for s in (1, 2, 3)]
    assert any(o != a for o in others), "different seeds always draw the same tokens"
    assert all(0 <= t < SPECS[F32].vocab for t in a)


def test_stream_generate_yields_the_generated_tokens(f32_path, device):
    model = llaisys_models.load(f32_path, device=device)
    ids = prompt(F32, 7, SPECS[F32].vocab)
    stream = model.stream_generate(ids, 12, eos_token_ids=())
    first = next(stream)
    streamed = [first, *stream]
    stats = model.last_stats
    assert stats.prompt_tokens == len(ids) and stats.new_tokens == 12
    assert stats.prefill_tokens_per_second > 0 and stats.decode_tokens_per_second > 0
    assert streamed == model.generate(ids, 12, eos_token_ids=())[len(ids):]


def test_stream_generate_checks_arguments_before_iterating(f32_path, device):
    model = llaisys_models.load(f32_path, device=device)
    with pytest.raises(ValueError, match="top_p"):
        model.stream_generate([1, 2], 4, top_k=0, top_p=1.5)
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.stream_generate([1, 2], -1)


def test_generate_stops_right_after_eos(tiny_models, device):
    """With the model's own EOS (from config.json / generation_config.json), like HF generate."""
    name = F32
    ids = prompt(name, 13, SPECS[name].vocab)
    hf_tokens = tiny_models.reference(name, 13).tokens
    eos = hf_tokens[len(ids) + 5]  # pretend the 6th greedy token is the end of text
    stop = hf_tokens.index(eos, len(ids))
    directory = tiny_models.root / "eos_variant"
    if not directory.exists():
        shutil.copytree(tiny_models.path(name), directory)
        for file, value in (("config.json", [EOS_ID, eos]), ("generation_config.json", eos)):
            raw = json.loads((directory / file).read_text())
            raw["eos_token_id"] = value
            (directory / file).write_text(json.dumps(raw))
    model = llaisys_models.load(directory, device=device)
    assert set(model.eos_token_ids) == {EOS_ID, eos}
    out = model.generate(ids, NEW_TOKENS)
    new = out[len(ids):]
    assert len(out) <= stop + 1 and new[-1] in (EOS_ID, eos), f"did not stop at EOS: {new}"
    assert not {EOS_ID, eos} & set(new[:-1]), f"went on past an EOS: {new}"
    assert list(model.stream_generate(ids, NEW_TOKENS)) == new
    # HF stops at the same place
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    with torch.no_grad():
        x = torch.tensor([ids])
        ref = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NEW_TOKENS, do_sample=False)
    assert out == ref[0].tolist()
    # an explicit list overrides the model's; () never stops
    assert len(model.generate(ids, NEW_TOKENS, eos_token_ids=())) == len(ids) + NEW_TOKENS


def test_max_new_tokens_zero_returns_the_prompt(f32_path, device):
    model = llaisys_models.load(f32_path, device=device)
    assert model.generate([1, 2, 3], 0) == [1, 2, 3]


def test_input_ids_forms(f32_path, device):
    model = llaisys_models.load(f32_path, device=device)
    ids = [3, 1, 4, 1, 5]
    want = model.generate(ids, 4, eos_token_ids=())
    assert model.generate(np.array(ids, dtype=np.int32), 4, eos_token_ids=()) == want
    assert model.generate(tuple(ids), 4, eos_token_ids=()) == want
    assert model.generate(llaisys.from_numpy(np.array(ids, dtype=np.int64)), 4, eos_token_ids=()) == want


def test_huge_top_k_means_every_token_and_never_wraps(f32_path, device):
    """top_k beyond the vocabulary is the whole vocabulary (as in HF), never a wrapped C integer:
    2**64 + 1 would become 1 (greedy) and 2**63 a negative count."""
    model = llaisys_models.load(f32_path, device=device)
    ids = prompt(F32, 13, SPECS[F32].vocab)
    kwargs = dict(temperature=1.5, seed=11, eos_token_ids=())
    every = model.generate(ids, 24, top_k=0, **kwargs)
    assert every != model.generate(ids, 24, top_k=1, **kwargs), "sampling drew the greedy tokens"
    for top_k in (2**64 + 1, 2**63, SPECS[F32].vocab, np.int64(2**62)):
        assert model.generate(ids, 24, top_k=top_k, **kwargs) == every, top_k


@pytest.mark.parametrize("kwargs, match", [
    (dict(seed=-1), "seed must be >= 0"),
    (dict(seed=2**64), "seed must be >= 0 and <= 18446744073709551615"),
    (dict(top_k=-1), "top_k must be >= 0"),
    (dict(top_k=1.5), "top_k must be an integer"),
    (dict(temperature=float("inf")), "temperature must be a finite number, got inf"),
    (dict(temperature=float("nan")), "temperature must be a finite number"),
    (dict(top_p=float("nan")), "top_p must be a finite number"),
    (dict(max_new_tokens=2**64), "max_position_embeddings"),
    (dict(max_new_tokens=2**64 + 3), "max_position_embeddings"),
])
def test_bad_generate_arguments_fail_before_the_prefill(f32_path, device, kwargs, match):
    model = llaisys_models.load(f32_path, device=device)
    kwargs = dict(dict(max_new_tokens=4), **kwargs)
    with pytest.raises(llaisys.LlaisysValueError, match=match):
        model.generate([1, 2, 3], **kwargs)
    assert model.last_stats is None and model._generator is None, "the prefill ran before the check"
