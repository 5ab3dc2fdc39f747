"""Continuous batching: a sequence's tokens are the same alone (``generate``) or batched with others,
chunked, preempted and recomputed; KV blocks shared between prompts are freed exactly once."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import llaisys
import llaisys_models
from llaisys_models.scheduler import Sampling, Scheduler
from tiny_models import SPECS, prompt

NAMES = ["f32_gqa2_hd32", "bf16_mha_hd64", "f16_gqa3_hd64_legacy"]
LENGTHS = (1, 5, 13, 16, 17, 40, 70)  # around and across blocks of 16 and chunks of 16
NEW = 24


_loaded: dict = {}


@pytest.fixture
def models(tiny_models, device):
    """The test models on ``device``, loaded once per session."""
    if device not in _loaded:
        _loaded[device] = {name: llaisys_models.load(tiny_models.path(name), device=device) for name in NAMES}
    return _loaded[device]


def prompts(name):
    vocab = SPECS[name].vocab
    return [prompt(name, n, vocab) for n in LENGTHS]


@pytest.mark.parametrize("name", NAMES)
def test_greedy_batch_equals_generate(models, name):
    model = models[name]
    alone = [model.generate(p, NEW, eos_token_ids=()) for p in prompts(name)]
    # 16 tokens a step: prompts are read in chunks while the others decode
    assert model.generate_batch(prompts(name), NEW, eos_token_ids=(), max_batch_tokens=16) == alone


@pytest.mark.parametrize("name", NAMES)
def test_seeded_sampling_batch_equals_generate(models, name):
    model = models[name]
    seeds = [1000 + i for i in range(len(LENGTHS))]
    sampling = dict(top_k=0, top_p=0.95, temperature=0.9)
    alone = [model.generate(p, NEW, seed=s, eos_token_ids=(), **sampling) for p, s in zip(prompts(name), seeds)]
    batched = model.generate_batch(prompts(name), NEW, seed=seeds, eos_token_ids=(), max_batch_tokens=16, **sampling)
    assert batched == alone
    other = model.generate_batch(prompts(name), NEW, seed=[s + 1 for s in seeds], eos_token_ids=(), **sampling)
    assert other != alone  # the seeds are really used


def test_each_sequence_stops_at_its_own_eos(models):
    model = models["f32_gqa2_hd32"]
    ps = prompts("f32_gqa2_hd32")
    full = [model.generate(p, NEW, eos_token_ids=()) for p in ps]
    eos = full[2][len(ps[2]) + 3]  # the 4th new token of prompt 2 plays EOS
    alone = [model.generate(p, NEW, eos_token_ids=(eos,)) for p in ps]
    assert model.generate_batch(ps, NEW, eos_token_ids=(eos,)) == alone
    assert len(alone[2]) == len(ps[2]) + 4


def run(scheduler, sequences, max_tokens):
    while scheduler.has_work:
        for seq, _ in scheduler.step():
            if seq.generated >= max_tokens:
                scheduler.finish(seq)
    return [seq.tokens for seq in sequences]


@pytest.mark.parametrize("name", ["f32_gqa2_hd32", "bf16_mha_hd64"])
def test_preemption_under_a_tiny_kv_budget_completes_every_request(models, name):
    model = models[name]
    ps = prompts(name)
    sampling = Sampling(greedy=False, top_k=0, top_p=1.0, temperature=1.0, seed=5)
    alone = [model.generate(p, NEW, top_k=0, seed=5, eos_token_ids=()) for p in ps]
    # room for the longest request and a little more: the others take turns, preempting the newest
    pool = model.new_kv_pool(num_blocks=(70 + NEW) // 16 + 3, block_size=16)
    scheduler = Scheduler(model, pool, max_running=len(ps), max_batch_tokens=32)
    sequences = [scheduler.add(p, sampling, NEW) for p in ps]
    assert run(scheduler, sequences, NEW) == alone
    assert scheduler.stats.preemptions > 0 and scheduler.stats.recomputed_tokens > 0
    assert pool.check()["used"] == 0


def test_a_request_that_can_never_fit_is_refused(models):
    model = models["f32_gqa2_hd32"]
    scheduler = Scheduler(model, model.new_kv_pool(num_blocks=2, block_size=16))
    with pytest.raises(llaisys.LlaisysValueError, match="exceed the KV cache's 32"):
        scheduler.add(list(range(30)), Sampling(), 3)
    with pytest.raises(llaisys.LlaisysValueError, match="exceed the KV cache's 32"):
        model.generate_batch([list(range(30))], 3, kv_memory=2 * 16 * model.kv_shape.bytes_per_token)


def test_shared_prefix_blocks_are_freed_exactly_once(models, device):
    model = models["bf16_mha_hd64"]
    vocab = SPECS["bf16_mha_hd64"].vocab
    rng = np.random.default_rng(3)
    system = rng.integers(0, vocab, 45).tolist()  # ~3 blocks every request starts with
    tails = [rng.integers(0, vocab, n).tolist() for n in (3, 9, 1, 17, 30)]
    ps = [system + t for t in tails]
    alone = [model.generate(p, 12, eos_token_ids=()) for p in ps]

    pool = model.new_kv_pool(num_blocks=64, block_size=16)
    scheduler = Scheduler(model, pool, max_running=8, max_batch_tokens=64)
    run(scheduler, [scheduler.add(rng.integers(0, vocab, 20).tolist(), Sampling(), 4)], 4)  # warm up
    model.clear_decode_graphs()  # captured decode steps keep their buffers: counted out on both sides
    gc.collect()
    baseline = llaisys.memory_stats(device)["allocated_bytes"]

    first = scheduler.add(ps[0], Sampling(), 12)
    run(scheduler, [first], 12)  # the system prompt is now cached
    rest = [scheduler.add(p, Sampling(), 12) for p in ps[1:]]
    shared_seen = []
    while scheduler.has_work:
        shared_seen.append(max(pool.refcount(b) for b in range(pool.num_blocks)))
        for seq, _ in scheduler.step():
            if seq.generated >= 12:
                scheduler.finish(seq)
    assert [first.tokens] + [s.tokens for s in rest] == alone
    assert max(shared_seen) == len(rest)  # the system prompt's blocks were held by every request at once
    assert all(s.reused >= 32 for s in rest)
    assert pool.check() == {"used": 0, "cached": pool.stats()["cached"], "free": pool.stats()["free"]}
    assert all(pool.refcount(b) == 0 for b in range(pool.num_blocks))
    model.clear_decode_graphs()
    gc.collect()
    assert llaisys.memory_stats(device)["allocated_bytes"] == baseline  # every step's tensors came back
    del scheduler, pool, first, rest
    gc.collect()
    # the pool's memory came back (and whatever step buffers the scheduler still held)
    assert llaisys.memory_stats(device)["allocated_bytes"] <= baseline - 64 * 16 * model.kv_shape.bytes_per_token


def test_a_backend_without_the_paged_kernels_is_refused_when_the_model_loads(tiny_models, monkeypatch):
    """A backend that lacks paged_attention / paged_kv_write (CUDA before it has them) is named at load,
    and device=None passes over it; never a failure in the middle of a forward."""
    registry = llaisys.plugins.registry()

    def drop_paged_kernels(device_type):
        backend = registry.backend(device_type)
        real = backend.kernel
        monkeypatch.setattr(backend, "kernel", lambda op: None if op.startswith("paged_") else real(op))
        monkeypatch.setattr(registry, "_kernels", {})  # resolve again, through the patched backend

    path = tiny_models.path("f32_gqa2_hd32")
    accelerators = sorted({d.type for d in llaisys.available_devices()} - {"cpu"})
    for device_type in accelerators:  # (a CPU-only machine has none: the CPU is the backend without them below)
        drop_paged_kernels(device_type)
        with pytest.raises(llaisys.BackendUnavailableError,
                           match=f"'{device_type}' backend does not implement paged_kv_write, paged_attention"):
            llaisys_models.load(path, device=device_type)
    if accelerators:
        assert llaisys_models.load(path).device.type == "cpu", "device=None should pass over the accelerators"
    drop_paged_kernels("cpu")
    with pytest.raises(llaisys.BackendUnavailableError,
                       match="'cpu' backend does not implement paged_kv_write, paged_attention, which the model"):
        llaisys_models.load(path, device="cpu")
    with pytest.raises(llaisys.BackendUnavailableError, match="does not implement paged_kv_write"):
        llaisys_models.load(path)  # no device can run it
