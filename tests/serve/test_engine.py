"""The engine without HTTP: requests in, events out on the engine thread. Fair turns, a failing
request that leaves the engine serving, an engine that dies says so instead of hanging."""

from __future__ import annotations

import queue

import pytest

import llaisys_models
from helpers.serve_helpers import TIMEOUT, chat_ids, events_until_done, generate_text, submit, user
from llaisys_models.serve.engine import Delta, Engine, EngineUnavailable, Failed, Finished
from llaisys_models.text.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def engine_model(chat_model_dir):
    return llaisys_models.load(chat_model_dir)  # the engine's own copy


def run_engine(model, directory, **kwargs) -> Engine:
    return Engine(model, load_tokenizer(directory), **kwargs).start()


def test_running_requests_take_turns_token_by_token(engine_model, chat_model_dir, tokenizer, chat_reference):
    engine = Engine(engine_model, load_tokenizer(chat_model_dir), max_running=3)
    try:
        log = queue.Queue()
        prompts = {name: chat_ids(tokenizer, user(f"turns {name}")) for name in "abc"}
        for name, ids in prompts.items():  # queued before the engine starts: all three are admitted at once
            submit(engine, ids, 8, log, name, temperature=0)
        engine.start()
        events = events_until_done(log, 3)
        # one printable character (one Delta) per token; each engine step gives every running sequence a turn
        assert [name for name, e in events if isinstance(e, Delta)] == list("abc" * 8)
        for name, ids in prompts.items():
            text = "".join(e.text for n, e in events if n == name and isinstance(e, Delta))
            assert text == generate_text(chat_reference, tokenizer, ids, 8)
        assert {e.reason for _, e in events if isinstance(e, Finished)} == {"length"}
    finally:
        engine.stop()


def test_waiting_requests_start_in_arrival_order(engine_model, chat_model_dir, tokenizer):
    engine = run_engine(engine_model, chat_model_dir, max_running=1)
    try:
        log = queue.Queue()
        for name in "pqrs":
            submit(engine, chat_ids(tokenizer, user(name)), 4, log, name, temperature=0)
        events = events_until_done(log, 4)
        assert [name for name, e in events if isinstance(e, Finished)] == list("pqrs")
        order = [name for name, _ in events]
        assert order == sorted(order)  # one at a time: no request's events interleave with another's
    finally:
        engine.stop()


def test_a_failing_request_leaves_the_engine_serving(engine_model, chat_model_dir, tokenizer):
    engine = run_engine(engine_model, chat_model_dir)
    try:
        log = queue.Queue()
        vocab = engine_model.config.vocab_size
        submit(engine, [1, 2, vocab + 5], 4, log, "bad", temperature=0)  # past every check the HTTP side makes
        (_, event), = events_until_done(log, 1)
        assert isinstance(event, Failed) and str(vocab + 5) in event.message
        submit(engine, chat_ids(tokenizer, user("fine")), 4, log, "good", temperature=0)
        events = events_until_done(log, 1)
        assert isinstance(events[-1][1], Finished) and events[-1][1].usage.completion_tokens == 4
        assert engine.alive and engine.metrics.finished["error"] == 1
    finally:
        engine.stop()


def test_an_engine_that_dies_fails_its_requests_and_refuses_new_ones(engine_model, chat_model_dir, tokenizer):
    engine = Engine(engine_model, load_tokenizer(chat_model_dir))

    def broken_admit():
        raise RuntimeError("simulated engine bug")

    engine._admit = broken_admit  # a fault outside any one request's handling
    log = queue.Queue()
    engine.start()
    submit(engine, chat_ids(tokenizer, user("x")), 4, log, "x", temperature=0)
    (_, event), = events_until_done(log, 1)
    assert isinstance(event, Failed) and "simulated engine bug" in event.message
    engine._thread.join(TIMEOUT)
    assert not engine.alive
    with pytest.raises(EngineUnavailable, match="simulated engine bug"):
        submit(engine, [1, 2, 3], 4, log)


def test_an_int8_model_serves_the_tokens_of_its_own_generate(chat_model_dir, tokenizer):
    """quantize="int8" through the engine (continuous batching, decode graphs): each of three requests decoded
    together gets the tokens the int8 model generates for it alone."""
    from helpers import skip_without_kernels

    skip_without_kernels("cpu", ["linear_i8"], "quantize='int8'")
    served = llaisys_models.load(chat_model_dir, device="cpu", quantize="int8")
    reference = llaisys_models.load(chat_model_dir, device="cpu", quantize="int8")
    engine = run_engine(served, chat_model_dir, max_running=3)
    try:
        log = queue.Queue()
        prompts = {name: chat_ids(tokenizer, user(f"int8 {name}")) for name in "abc"}
        for name, ids in prompts.items():
            submit(engine, ids, 12, log, name, temperature=0)
        events = events_until_done(log, 3)
        for name, ids in prompts.items():
            text = "".join(e.text for n, e in events if n == name and isinstance(e, Delta))
            assert text == generate_text(reference, tokenizer, ids, 12), name
    finally:
        engine.stop()
