"""Decode steps replayed from captured graphs (decode_graph.py) give the eager steps' logits bit for bit, in
generate, in batches and across a KV pool that grows; LLAISYS_GRAPHS=0 turns them off."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import llaisys
import llaisys_models
from helpers.tiny_models import SPECS, prompt

NAMES = ["f32_gqa2_hd32", "bf16_mha_hd64"]


@pytest.fixture
def pair(tiny_models, monkeypatch):
    """The same checkpoint loaded twice on the CPU: with decode graphs, and eager (LLAISYS_GRAPHS=0)."""
    def load(name):
        graphed = llaisys_models.load(tiny_models.path(name), device="cpu")
        monkeypatch.setenv("LLAISYS_GRAPHS", "0")
        eager = llaisys_models.load(tiny_models.path(name), device="cpu")
        monkeypatch.delenv("LLAISYS_GRAPHS")
        assert graphed._decode_graphs.enabled and not eager._decode_graphs.enabled
        return graphed, eager
    return load


@pytest.mark.parametrize("name", NAMES)
def test_replayed_decode_logits_equal_the_eager_ones_bit_for_bit(pair, name):
    graphed, eager = pair(name)
    ids = prompt(name, 7, SPECS[name].vocab)
    logits = {}
    for model in (graphed, eager):
        session = model.session()
        rows = [session.forward(ids).numpy()]
        token = int(np.argmax(rows[0][-1].astype(np.float32)))
        for _ in range(6):
            rows.append(session.forward([token]).numpy())
            token = int(np.argmax(rows[-1][-1].astype(np.float32)))
        logits[model] = rows
    assert graphed._decode_graphs.replays == 6 - 1  # one warm-up step, then every step replayed
    assert eager._decode_graphs.replays == 0
    for got, want in zip(logits[graphed], logits[eager]):
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("name", NAMES)
def test_generate_and_batches_equal_eager_runs(pair, name):
    graphed, eager = pair(name)
    vocab = SPECS[name].vocab
    prompts = [prompt(name, n, vocab) for n in (3, 17, 30)]
    for p in prompts:
        assert graphed.generate(p, 20, eos_token_ids=()) == eager.generate(p, 20, eos_token_ids=())
    sampling = dict(top_k=0, top_p=0.9, temperature=0.8, seed=[7, 8, 9])
    assert (graphed.generate_batch(prompts, 20, eos_token_ids=(), **sampling)
            == eager.generate_batch(prompts, 20, eos_token_ids=(), **sampling))
    assert graphed._decode_graphs.replays > 3 * 18  # batches of 3, 2 and 1 were replayed


@pytest.mark.parametrize("name", NAMES)
def test_verify_steps_of_speculative_decoding_are_replayed_too(pair, name):
    """A verify step (the last token and K drafts, the logits of every row) is captured by its rows per
    sequence: speculative output stays the eager plain output, and most steps are replays."""
    graphed, eager = pair(name)
    repeating = prompt(name, 6, SPECS[name].vocab) * 4  # prompt lookup finds drafts
    plain = eager.generate(repeating, 24, eos_token_ids=())
    for model in (graphed, eager):
        assert model.generate(repeating, 24, eos_token_ids=(), speculative="ngram", num_speculative_tokens=3) == plain
    stats = graphed.last_stats
    assert stats.draft_tokens > 0
    shapes = list(graphed._decode_graphs._steps)
    assert any(rows[0] > 1 for rows, _ in shapes), shapes  # a verify shape was captured (keys: rows, LoRA)
    steps = stats.new_tokens - stats.accepted_tokens  # forwards of the reply (one token each, plus kept drafts)
    assert graphed._decode_graphs.replays >= steps - 2 * len(shapes) - 1  # each shape: one eager warm-up


def test_a_growing_kv_pool_is_captured_again(pair):
    graphed, eager = pair("f32_gqa2_hd32")
    p = prompt("f32_gqa2_hd32", 5, SPECS["f32_gqa2_hd32"].vocab)
    short = graphed.generate(p, 8, eos_token_ids=())
    blocks = graphed.generator.pool.num_blocks
    longer = graphed.generate(p, 16 * blocks, eos_token_ids=())  # more positions than the pool holds
    assert graphed.generator.pool.num_blocks > blocks
    assert longer == eager.generate(p, 16 * blocks, eos_token_ids=())
    assert longer[:len(short)] == short


def test_graphs_keep_their_memory_from_others(pair):
    graphed, _ = pair("f32_gqa2_hd32")
    p = prompt("f32_gqa2_hd32", 4, SPECS["f32_gqa2_hd32"].vocab)
    first = graphed.generate(p, 12, eos_token_ids=())
    hoard = [llaisys.empty((4096,), llaisys.float32) for _ in range(64)]  # whatever the cache can give
    for t in hoard:
        t.load(np.full(4096, 7.0, np.float32))
    assert graphed.generate(p, 12, eos_token_ids=()) == first
    assert all((t.numpy() == 7.0).all() for t in hoard), "a replay wrote memory the allocator gave to others"


def test_graphs_do_not_keep_pools_that_are_gone(pair):
    """Each generate_batch makes a KV pool of its own; the decode steps captured on it must not keep its memory
    alive once the call returns (16 calls used to leave 16 pools allocated)."""
    graphed, _ = pair("f32_gqa2_hd32")
    prompts = [prompt("f32_gqa2_hd32", n, SPECS["f32_gqa2_hd32"].vocab) for n in (3, 9)]
    kv_memory = 64 * 16 * graphed.kv_shape.bytes_per_token  # 64 blocks per call
    graphed.generate_batch(prompts, 12, eos_token_ids=(), kv_memory=kv_memory)  # warm the allocator's cache
    gc.collect()
    before = llaisys.memory_stats("cpu")["allocated_bytes"]
    replays = graphed._decode_graphs.replays
    for _ in range(16):
        graphed.generate_batch(prompts, 12, eos_token_ids=(), kv_memory=kv_memory)
    gc.collect()
    assert graphed._decode_graphs.replays > replays, "the batches were not replayed from graphs"
    assert llaisys.memory_stats("cpu")["allocated_bytes"] - before < kv_memory, "a pool outlived its call"


@pytest.fixture
def partial_cpu():
    """A device type 'halfcpu': the CPU backend's library without its swiglu kernel (which then falls back to
    the CPU backend), graphs and all; the process registry restored afterwards."""
    from helpers.cpu_library_backend import install
    from llaisys import plugins
    from llaisys.ops._dispatch import clear_plans

    saved = plugins._registry
    yield install("halfcpu", missing=("swiglu",))
    plugins._registry = saved
    clear_plans()


def test_a_step_with_an_op_that_falls_back_runs_eagerly_and_says_why(tiny_models, partial_cpu):
    """A graph cannot record a fallback (it synchronizes and runs on another backend): the first capture turns
    decode graphs off for the model, naming the op, and the tokens stay the CPU's."""
    name = "f32_gqa2_hd32"
    ids = prompt(name, 7, SPECS[name].vocab)
    model = llaisys_models.load(tiny_models.path(name), device=partial_cpu)
    assert llaisys.capabilities(partial_cpu)["swiglu"] == "fallback"
    assert model._decode_graphs.enabled  # the backend captures graphs: only a step's ops can tell
    tokens = model.generate(ids, max_new_tokens=12)
    assert not model._decode_graphs.enabled and "swiglu" in model._decode_graphs.why_off
    assert model._decode_graphs.replays == 0
    assert tokens == llaisys_models.load(tiny_models.path(name), device="cpu").generate(ids, max_new_tokens=12)
