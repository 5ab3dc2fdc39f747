"""A quantized KV cache (``kv_cache_dtype="int8"`` / ``"fp8"``): the pool holds about twice the tokens in the same
memory (measured from the allocator, not from the pool's own arithmetic); the tokens are batch invariant (batched ==
alone, chunked prompts == whole, a cached prefix == computed) as with the model-dtype cache; the logits stay close to
the model-dtype cache's; bad choices are one-line errors."""

from __future__ import annotations

import numpy as np
import pytest

import llaisys
import llaisys_models
from helpers.tiny_models import Spec, make_checkpoint, prompt
from llaisys_models.engine.sampling import SamplingParams
from llaisys_models.engine.scheduler import Scheduler

# head_dim 64 (SmolLM2's): one byte per value and a 2-byte scale per 64 values
SPEC = Spec(arch="qwen2", dtype="bf16", vocab=320, hidden=128, inter=256, layers=2, heads=2, kv_heads=1, head_dim=64,
            max_pos=1024, seed=31)
FORMATS = ("int8", "fp8")
NEW = 16


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("kvq") / "qwen2_hd64", SPEC)


@pytest.fixture(scope="module")
def models(checkpoint):
    """One model per cache dtype, on the CPU (in f32: its logits compare the caches, not bf16's rounding)."""
    return {cache: llaisys_models.load(checkpoint, device="cpu", dtype="f32", kv_cache_dtype=cache)
            for cache in ("auto", *FORMATS)}


def greedy(n: int = NEW) -> SamplingParams:
    return SamplingParams(n, top_k=1, eos_token_ids=frozenset())


def run(model, prompts, *, max_batch_tokens=64, pool=None, num_blocks=64):
    pool = pool or model.new_kv_pool(num_blocks=num_blocks, block_size=16)
    sched = Scheduler(model, pool, max_running=len(prompts), max_batch_tokens=max_batch_tokens)
    seqs = [sched.add(p, greedy()) for p in prompts]
    while sched.has_work:
        sched.step()
    return [s.tokens for s in seqs], sched


def test_the_same_memory_holds_about_twice_the_tokens(checkpoint):
    """bf16 keeps 2 * 64 bytes per (token, kv head) and layer, int8 / fp8 64 + 2: 1.94x the tokens; the pool's
    tensors hold that many bytes, and the allocator did hand them out."""
    memory = 1 << 20
    held, allocated, pools = {}, {}, []
    for cache in ("auto", *FORMATS):
        model = llaisys_models.load(checkpoint, device="cpu", dtype="bf16", kv_cache_dtype=cache)
        before = llaisys.memory_stats("cpu")["allocated_bytes"]
        pools.append(model.new_kv_pool(memory=memory, block_size=16))  # (kept: freeing one would hide the next)
        allocated[cache] = llaisys.memory_stats("cpu")["allocated_bytes"] - before
        held[cache] = pools[-1].capacity_tokens
        tensors = [*pools[-1].keys, *pools[-1].values, *pools[-1].key_scales, *pools[-1].value_scales]
        assert sum(t.numel() * t.dtype.itemsize for t in tensors) == pools[-1].nbytes <= memory
    for cache in FORMATS:
        assert held[cache] >= 1.9 * held["auto"], (cache, held)
        assert allocated[cache] >= 0.97 * memory  # the pool's memory really is its tensors'


@pytest.mark.parametrize("cache", FORMATS)
def test_batched_chunked_and_alone_give_the_same_tokens(models, cache):
    model = models[cache]
    prompts = [prompt("kvq", n, 256) for n in (1, 13, 64, 40)]
    batched, _ = run(model, prompts, max_batch_tokens=32)  # prompts cut into chunks beside other decodes
    for p, tokens in zip(prompts, batched):
        alone, _ = run(model, [p], max_batch_tokens=1 << 20)  # one forward for the prompt
        assert tokens == alone[0]
    assert model.generate(prompts[2], max_new_tokens=NEW, top_k=1) == prompts[2] + batched[2][len(prompts[2]):]


@pytest.mark.parametrize("cache", FORMATS)
def test_a_cached_prefix_gives_the_tokens_computed_ones_give(models, cache):
    model = models[cache]
    shared = prompt("prefix", 48, 256)
    first, second = shared + [5, 6, 7], shared + [9, 10]
    pool = model.new_kv_pool(num_blocks=64, block_size=16)
    run(model, [first], pool=pool)
    reused, sched = run(model, [second], pool=pool)
    fresh, _ = run(model, [second])
    assert sched.stats.prompt_tokens_reused == 48  # its 3 whole blocks came from the cache
    assert reused == fresh


@pytest.mark.parametrize("cache", FORMATS)
def test_logits_stay_close_to_the_model_dtype_cache(checkpoint, models, cache):
    """Per position, the logits with the quantized cache against the f32 cache's, measured beside what rounding the
    whole model to bf16 moves them: int8 (8 bits a value, a scale per row) about as much, fp8 (e4m3: 4 significant
    bits) a few times more; the same argmax nearly everywhere (a random model's near-ties may flip)."""
    ids = prompt("quality", 200, 256)
    ref = models["auto"].logits(ids)

    def error(logits):
        return float(np.median(np.linalg.norm(logits - ref, axis=-1) / np.linalg.norm(ref, axis=-1)))
    bf16 = error(llaisys_models.load(checkpoint, device="cpu", dtype="bf16").logits(ids))
    got = models[cache].logits(ids)
    assert 0 < error(got) < (2 if cache == "int8" else 8) * bf16, (error(got), bf16)
    assert (got.argmax(-1) == ref.argmax(-1)).mean() >= 0.9


def test_kv_cache_dtype_choices_are_checked(checkpoint, models, monkeypatch):
    with pytest.raises(llaisys.LlaisysValueError, match=r"kv_cache_dtype must be one of 'auto', 'int8', 'fp8', "
                                                        r"got 'fp4'"):
        llaisys_models.load(checkpoint, device="cpu", kv_cache_dtype="fp4")
    model = models["auto"]
    real = llaisys.capabilities
    monkeypatch.setattr(llaisys, "capabilities", lambda device: {**real(device), "paged_attention_q": "fallback"})
    with pytest.raises(llaisys.LlaisysValueError, match="the cpu backend has no paged_attention_q kernel"):
        model.kv_cache_dtype = "int8"
    assert model.kv_cache_dtype == "auto" and model.kv_shape.kv_format is None


def test_a_pool_keeps_its_dtype_and_the_next_follows_the_model(checkpoint):
    model = llaisys_models.load(checkpoint, device="cpu", dtype="f32")
    before = model.new_kv_pool(num_blocks=4)
    ids = prompt("switch", 20, 256)
    plain = model.generate(ids, max_new_tokens=4, top_k=1)
    model.kv_cache_dtype = "int8"
    after = model.new_kv_pool(num_blocks=4)
    assert before.keys[0].dtype == llaisys.float32 and after.keys[0].dtype == llaisys.uint8
    assert after.key_scales[0].dtype == llaisys.float16 and after.key_scales[0].shape == (4, 16, 1)
    assert len(model.generate(ids, max_new_tokens=4, top_k=1)) == len(plain)  # its own pool, made anew
    assert model._generator.pool.shape.cache_dtype == "int8"
