"""The engine's continuous batching: seeded replies equal ``model.generate`` however requests are batched,
a long prompt is read in chunks while other streams go on, a tiny KV cache preempts and recomputes
without any client noticing, and the KV blocks all come back."""

from __future__ import annotations

import queue

import pytest

import llaisys_models
from helpers.serve_helpers import (
    CHAT_MODEL,
    TIMEOUT,
    chat_ids,
    events_until_done,
    generate_text,
    require_serving,
    stream_chats_at_once,
    submit,
    user,
)
from llaisys_models.serve.engine import Delta, Engine, Finished
from llaisys_models.text.tokenizer import load_tokenizer

require_serving()


@pytest.fixture(scope="module")
def engine_model(chat_model_dir):
    return llaisys_models.load(chat_model_dir)  # the engines' own copy


def texts_of(events) -> dict:
    out = {}
    for name, e in events:
        if isinstance(e, Delta):
            out[name] = out.get(name, "") + e.text
    return out


def test_seeded_streams_equal_generate_whatever_runs_beside_them(chat_server, chat_reference, tokenizer):
    n = 6
    conversations = [user(f"Seeded {i}: " + "abc"[i % 3] * (5 * i + 1)) for i in range(n)]
    max_tokens = [10 + 3 * i for i in range(n)]
    seeds = [77 + i for i in range(n)]
    want = [generate_text(chat_reference, tokenizer, chat_ids(tokenizer, m), k, top_k=0, temperature=0.8, seed=s)
            for m, k, s in zip(conversations, max_tokens, seeds)]
    results = stream_chats_at_once(chat_server, [
        dict(model=CHAT_MODEL, messages=m, max_tokens=k, temperature=0.8, seed=s)
        for m, k, s in zip(conversations, max_tokens, seeds)])
    assert results == want


def test_a_long_prompt_is_read_in_chunks_while_other_streams_go_on(engine_model, chat_model_dir, tokenizer):
    engine = Engine(engine_model, load_tokenizer(chat_model_dir), max_batch_tokens=16, kv_memory=32 << 20).start()
    try:
        log = queue.Queue()
        submit(engine, chat_ids(tokenizer, user("short")), 60, log, "short", temperature=0)
        while log.get(timeout=TIMEOUT)[0] != "short":  # the short request streams
            pass
        long_prompt = chat_ids(tokenizer, user("long " * 60))
        assert len(long_prompt) > 200
        submit(engine, long_prompt, 2, log, "long", temperature=0)
        events = events_until_done(log, 2)
        first_long = next(i for i, (name, e) in enumerate(events) if name == "long")
        between = sum(1 for name, e in events[:first_long] if name == "short" and isinstance(e, Delta))
        chunks = -(-len(long_prompt) // 15)  # 16 tokens a step, one of them the short stream's
        assert between >= chunks - 1, f"the short stream got {between} tokens while a {len(long_prompt)}-token " \
                                      f"prompt was read: it was held up"
    finally:
        engine.stop()


def test_a_tiny_kv_cache_preempts_and_every_request_completes(engine_model, chat_model_dir, tokenizer,
                                                              chat_reference):
    prompts = {f"r{i}": chat_ids(tokenizer, user(f"Preempt {i} " + "q" * (7 * i))) for i in range(5)}
    new = 40
    longest = max(len(p) for p in prompts.values()) + new
    per_token = engine_model.kv_shape.bytes_per_token
    # room for the longest request and a few blocks more: the five cannot all fit at once
    engine = Engine(engine_model, load_tokenizer(chat_model_dir), max_running=5, block_size=8,
                    kv_memory=(-(-longest // 8) + 4) * 8 * per_token)
    try:
        log = queue.Queue()
        for name, ids in prompts.items():
            submit(engine, ids, new, log, name, temperature=0.7, seed=3)
        engine.start()
        events = events_until_done(log, len(prompts))
        assert all(isinstance(e, Finished) and e.reason == "length" for _, e in events if not isinstance(e, Delta))
        want = {name: generate_text(chat_reference, tokenizer, ids, new, top_k=0, temperature=0.7, seed=3)
                for name, ids in prompts.items()}
        assert texts_of(events) == want
        assert engine.scheduler.stats.preemptions > 0
        assert engine.pool.check()["used"] == 0
    finally:
        engine.stop()


def test_metrics_show_the_kv_cache(chat_server):
    m = chat_server.metrics()
    label = f'model="{CHAT_MODEL}"'
    blocks = {state: m[f'llaisys_kv_cache_blocks{{{label},state="{state}"}}'] for state in ("used", "cached", "free")}
    assert sum(blocks.values()) == chat_server.engine.pool.num_blocks
    assert m[f"llaisys_kv_cache_bytes{{{label}}}"] == chat_server.engine.pool.nbytes
    assert m[f'llaisys_kv_cache_capacity_tokens{{{label},cache_dtype="auto"}}'] == chat_server.engine.pool.capacity_tokens
    for name in ("llaisys_preemptions_total", "llaisys_fair_preemptions_total", "llaisys_recomputed_tokens_total",
                 "llaisys_engine_steps_total"):
        assert f"{name}{{{label}}}" in m
