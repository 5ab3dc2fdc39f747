"""``n`` choices and prompt lists: each choice equals ``model.generate`` with its own seed (``choice_seed``),
streamed chunks interleave by index, usage counts each prompt once, the choices of a prompt share its KV
blocks (computed once), and a batch mixing n > 1 and plain requests gives each what it gives alone."""

from __future__ import annotations

import json
import queue

import pytest

from helpers.serve_helpers import (
    CHAT_MODEL,
    TIMEOUT,
    chat_ids,
    generate_text,
    http_stream,
    require_serving,
    text_ids,
    user,
)
from llaisys_models.serve.engine import Delta, Finished, Request, SamplingParams, choice_seed

require_serving()

SAMPLING = dict(temperature=0.9, top_p=0.95)


@pytest.fixture(scope="module")
def client(chat_server):
    return chat_server.client()


def sampled(model, tokenizer, ids, max_tokens: int, seed: int, n: int) -> list[str]:
    """What ``model.generate`` gives for each of n choices (seeds ``choice_seed(seed, i)``)."""
    return [generate_text(model, tokenizer, ids, max_tokens, top_k=0, seed=choice_seed(seed, i), **SAMPLING)
            for i in range(n)]


def test_choice_seeds_are_the_request_seed_then_distinct():
    seeds = [choice_seed(-5, i) for i in range(64)]
    assert seeds[0] == -5 and len(set(seeds)) == 64 and all(0 <= s < 1 << 64 for s in seeds[1:])
    assert choice_seed(None, 3) is None


def test_chat_n_choices_each_its_own_seeded_stream(client, chat_reference, tokenizer, chat_server):
    messages = user("Give me three.")
    ids = chat_ids(tokenizer, messages)
    want = sampled(chat_reference, tokenizer, ids, 16, 99, 3)
    stats = chat_server.engine.scheduler.stats
    forked = stats.prompt_tokens_forked
    r = client.chat.completions.create(model=CHAT_MODEL, messages=messages, max_tokens=16, n=3, seed=99, **SAMPLING)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.message.content for c in r.choices] == want
    assert len(set(want)) == 3 and all(c.finish_reason == "length" for c in r.choices)
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ids), 48)  # the prompt counted once
    assert stats.prompt_tokens_forked - forked == 2 * len(ids)  # choices 1 and 2 took choice 0's prompt blocks
    assert chat_server.metrics()[f'llaisys_prompt_tokens_forked_total{{model="{CHAT_MODEL}"}}'] == \
        stats.prompt_tokens_forked
    one = client.chat.completions.create(model=CHAT_MODEL, messages=messages, max_tokens=16, seed=99, **SAMPLING)
    assert one.choices[0].message.content == want[0]  # choice 0 is the request without n


def test_unseeded_choices_differ(client):
    r = client.completions.create(model=CHAT_MODEL, prompt="Roll", max_tokens=24, n=2, temperature=1.0)
    assert len({c.text for c in r.choices}) == 2


def test_streamed_choices_interleave_by_index(client, chat_reference, tokenizer):
    ids = text_ids(tokenizer, "Stream three")
    want = sampled(chat_reference, tokenizer, ids, 12, 7, 3)
    stream = client.completions.create(model=CHAT_MODEL, prompt="Stream three", max_tokens=12, n=3, seed=7,
                                       stream=True, stream_options={"include_usage": True}, **SAMPLING)
    chunks = list(stream)
    texts, order = ["", "", ""], []
    for c in chunks[:-1]:
        (choice,) = c.choices
        texts[choice.index] += choice.text
        if choice.text:
            order.append(choice.index)
    assert texts == want
    assert order != sorted(order)  # decoded together: the choices' chunks alternate
    finishes = {c.choices[0].index: c.choices[0].finish_reason for c in chunks[:-1] if c.choices[0].finish_reason}
    assert finishes == {0: "length", 1: "length", 2: "length"}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 36
    assert chunks[-1].usage.prompt_tokens == len(ids)


def test_chat_stream_each_choice_starts_with_its_role(chat_server):
    body = {"messages": user("Two streams"), "max_tokens": 6, "n": 2, "seed": 1, "stream": True}
    with http_stream(chat_server.base_url, "/v1/chat/completions", body) as r:
        lines = [line for line in r.read().decode().split("\n\n") if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    first = {}
    for c in chunks:
        (choice,) = c["choices"]
        first.setdefault(choice["index"], choice["delta"])
    assert first == {0: {"role": "assistant", "content": ""}, 1: {"role": "assistant", "content": ""}}


def test_a_list_of_prompts_gives_a_choice_per_prompt_times_n(client, chat_reference, tokenizer):
    token_prompt = text_ids(tokenizer, "As tokens")
    prompts = ["First prompt", token_prompt, "Third"]
    ids = [text_ids(tokenizer, "First prompt"), token_prompt, text_ids(tokenizer, "Third")]
    r = client.completions.create(model=CHAT_MODEL, prompt=prompts, max_tokens=8, n=2, seed=5, **SAMPLING)
    # OpenAI's numbering: prompt i's choice j is index i * n + j
    want = [text for p in ids for text in sampled(chat_reference, tokenizer, p, 8, 5, 2)]
    assert [c.index for c in r.choices] == list(range(6))
    assert [c.text for c in r.choices] == want
    assert r.usage.prompt_tokens == sum(map(len, ids)) and r.usage.completion_tokens == 6 * 8
    streamed = [""] * 6
    for chunk in client.completions.create(model=CHAT_MODEL, prompt=prompts, max_tokens=8, n=2, seed=5, stream=True,
                                           **SAMPLING):
        streamed[chunk.choices[0].index] += chunk.choices[0].text
    assert streamed == want
    greedy = client.completions.create(model=CHAT_MODEL, prompt=["a b", "c d"], max_tokens=5, temperature=0)
    assert [c.text for c in greedy.choices] == [generate_text(chat_reference, tokenizer, text_ids(tokenizer, p), 5)
                                                for p in ("a b", "c d")]


def test_n_and_plain_requests_batched_each_give_what_they_give_alone(chat_server, chat_reference, tokenizer):
    """Seeded: a 3-choice request beside plain ones, all submitted at once, gives exactly its choices alone."""
    log = queue.Queue()
    jobs = {"many": (chat_ids(tokenizer, user("Many choices")), 20, 3, 41),
            "plain": (chat_ids(tokenizer, user("A plain one, longer prompt")), 14, 1, 42),
            "pair": (chat_ids(tokenizer, user("Pair")), 9, 2, 43)}
    for name, (ids, k, n, seed) in jobs.items():
        params = SamplingParams(max_tokens=k, seed=seed, **SAMPLING)
        chat_server.engine.submit(Request(ids, params, lambda e, name=name: log.put((name, e)), n=n))
    texts, open_choices = {}, sum(n for _, _, n, _ in jobs.values())
    while open_choices:
        name, event = log.get(timeout=TIMEOUT)
        if isinstance(event, Delta):
            texts[name, event.index] = texts.get((name, event.index), "") + event.text
        else:
            assert isinstance(event, Finished) and event.reason == "length", event
            open_choices -= 1
    want = {(name, i): text for name, (ids, k, n, seed) in jobs.items()
            for i, text in enumerate(sampled(chat_reference, tokenizer, ids, k, seed, n))}
    assert texts == want
    assert chat_server.engine.pool.check()["used"] == 0


def test_speculative_choices_equal_plain_ones(client):
    body = dict(model=CHAT_MODEL, prompt="abcabcabcabc", max_tokens=16, n=2, seed=8, **SAMPLING)
    plain = client.completions.create(**body, extra_body={"speculative": "off"})
    drafted = client.completions.create(**body, extra_body={"speculative": "ngram", "num_speculative_tokens": 3})
    assert [c.text for c in drafted.choices] == [c.text for c in plain.choices]


def test_cancelling_ends_every_choice_and_frees_the_blocks(chat_server, tokenizer):
    log = queue.Queue()
    ids = chat_ids(tokenizer, user("Cancel all of us"))
    request = Request(ids, SamplingParams(max_tokens=2000, seed=1), log.put, n=3)
    chat_server.engine.submit(request)
    while not isinstance(log.get(timeout=TIMEOUT), Delta):
        pass
    request.cancel()
    ended = []
    while len(ended) < 3:
        event = log.get(timeout=TIMEOUT)
        if not isinstance(event, Delta):
            ended.append(event)
    assert sorted(e.index for e in ended) == [0, 1, 2] and {e.reason for e in ended} == {"cancelled"}
    assert chat_server.engine.pool.check()["used"] == 0


def test_choices_with_penalties_count_the_prompt_and_their_own_tokens(client, chat_reference, tokenizer):
    """A fork starts from the prompt's token counts, not its parent's replies: each choice is penalised as
    ``generate`` penalises it alone."""
    penalties = dict(repetition_penalty=1.5, frequency_penalty=1.0, presence_penalty=0.5)
    ids = text_ids(tokenizer, "Repeat repeat repeat")
    want = [generate_text(chat_reference, tokenizer, ids, 16, top_k=0, seed=choice_seed(5, i), **SAMPLING,
                          **penalties) for i in range(3)]
    r = client.completions.create(model=CHAT_MODEL, prompt="Repeat repeat repeat", max_tokens=16, n=3, seed=5,
                                  extra_body={"repetition_penalty": 1.5}, frequency_penalty=1.0,
                                  presence_penalty=0.5, **SAMPLING)
    assert [c.text for c in r.choices] == want
