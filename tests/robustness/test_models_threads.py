"""One model used from several threads: calls take turns, never mix their sequences.

``generate`` and ``stream_generate`` share the model's own KV pool and scheduler, and every forward the
model's work buffers. Unguarded, two threads generating on one model at once wrote into each other's cache
(38 of 40 outputs differed from serial runs).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

import llaisys_models
from llaisys_models import ModelBusyError

DEMO = llaisys_models.DEMO_MODEL_DIR
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def demo_model():
    if not (DEMO / "config.json").is_file():
        pytest.skip("the demo model is not in this checkout yet")
    return llaisys_models.load(DEMO, device="cpu")


def prompts(n: int) -> list[list[int]]:
    """'a+b=' as ids (digits 0-9, '+' 10, '=' 11: the demo's character vocabulary)."""
    return [[int(c) for c in str(17 * i + 3)] + [10] + [int(c) for c in str(31 * i + 5)] + [11] for i in range(n)]


def test_threads_sharing_a_model_get_the_serial_results(demo_model):
    jobs = prompts(40)
    serial = [demo_model.generate(ids, NEW_TOKENS, eos_token_ids=()) for ids in jobs]
    with ThreadPoolExecutor(max_workers=4) as pool:
        shared = list(pool.map(lambda ids: demo_model.generate(ids, NEW_TOKENS, eos_token_ids=()), jobs))
    differ = sum(a != b for a, b in zip(shared, serial))
    assert differ == 0, f"{differ} of {len(jobs)} outputs differ from serial runs"


def test_streams_in_threads_take_turns(demo_model):
    jobs = prompts(8)
    serial = [demo_model.generate(ids, NEW_TOKENS, eos_token_ids=())[len(ids):] for ids in jobs]
    results = [None] * len(jobs)

    def stream(i):
        results[i] = list(demo_model.stream_generate(jobs[i], NEW_TOKENS, eos_token_ids=()))

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert results == serial


def test_the_same_thread_cannot_start_a_second_sequence_while_its_stream_is_open(demo_model):
    ids = prompts(2)
    stream = demo_model.stream_generate(ids[0], NEW_TOKENS, eos_token_ids=())
    first = next(stream)
    with pytest.raises(ModelBusyError, match="already running the model"):
        demo_model.generate(ids[1], 4)
    with pytest.raises(ModelBusyError):
        list(demo_model.stream_generate(ids[1], 4))
    # a sequence of its own (a session, a batch) is not the model's stream: it runs, between two steps
    assert demo_model.session().forward(ids[1]).shape[0] == 1
    batched = demo_model.generate_batch([ids[1]], 4, eos_token_ids=())[0]
    rest = list(stream)  # the open stream was not disturbed
    assert [first, *rest] == demo_model.generate(ids[0], NEW_TOKENS, eos_token_ids=())[len(ids[0]):]
    stream = demo_model.stream_generate(ids[0], NEW_TOKENS, eos_token_ids=())
    next(stream)
    stream.close()  # a closed (or dropped) stream gives the model back
    assert demo_model.generate(ids[1], 4, eos_token_ids=()) == batched
