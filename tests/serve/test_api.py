"""The OpenAI API through the official ``openai`` client: chat and completions, streamed or not,
usage, stop strings, seeded sampling; greedy replies equal ``model.generate``."""

from __future__ import annotations

import json

import pytest

from helpers.serve_helpers import CHAT_MODEL, chat_ids, generate_text, http_stream, require_serving, text_ids, user

require_serving()


@pytest.fixture(scope="module")
def client(chat_server):
    return chat_server.client()


def collect_chat_stream(stream) -> tuple[list, str]:
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return chunks, text


def test_models_are_listed(client):
    assert [m.id for m in client.models.list().data] == [CHAT_MODEL]
    model = client.models.retrieve(CHAT_MODEL)
    assert model.id == CHAT_MODEL and model.object == "model" and model.owned_by == "llaisys"


def test_chat_greedy_equals_generate_with_usage(client, chat_reference, tokenizer):
    messages = user("Tell me about llamas.")
    ids = chat_ids(tokenizer, messages)
    want = generate_text(chat_reference, tokenizer, ids, 24)
    r = client.chat.completions.create(model=CHAT_MODEL, messages=messages, max_tokens=24, temperature=0)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-") and r.model == CHAT_MODEL
    choice = r.choices[0]
    assert choice.index == 0 and choice.message.role == "assistant"
    assert choice.message.content == want and len(want) == 24  # one printable byte per token
    assert choice.finish_reason == "length"  # the model has no EOS: it runs to max_tokens
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (len(ids), 24, len(ids) + 24)


def test_chat_stream_role_first_then_text_then_usage(client, chat_reference, tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, *user("Streaming, please.")]
    ids = chat_ids(tokenizer, messages)
    want = generate_text(chat_reference, tokenizer, ids, 20)
    stream = client.chat.completions.create(model=CHAT_MODEL, messages=messages, max_tokens=20, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks, text = collect_chat_stream(stream)
    assert text == want
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.choices[0].delta.role is None for c in chunks[1:] if c.choices)
    assert len({c.id for c in chunks}) == 1 and all(c.object == "chat.completion.chunk" for c in chunks)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and set(finishes[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20
    assert chunks[-1].usage.prompt_tokens == len(ids) and chunks[-1].usage.total_tokens == len(ids) + 20
    assert all(c.usage is None for c in chunks[:-1])


def test_stream_without_include_usage_has_no_usage_chunk(client):
    chunks, _ = collect_chat_stream(client.chat.completions.create(
        model=CHAT_MODEL, messages=user("no usage"), max_tokens=3, temperature=0, stream=True))
    assert all(c.choices for c in chunks) and all(c.usage is None for c in chunks)


def test_stream_wire_format(chat_server):
    """Raw SSE: one ``data: {json}`` per event, a blank line after each, ``data: [DONE]`` last."""
    body = {"model": CHAT_MODEL, "messages": user("wire"), "max_tokens": 4, "temperature": 0, "stream": True}
    with http_stream(chat_server.base_url, "/v1/chat/completions", body) as r:
        assert r.status == 200 and r.getheader("content-type").startswith("text/event-stream")
        raw = r.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    for event in events[:-2]:
        assert event.startswith("data: ")
        assert json.loads(event[len("data: "):])["object"] == "chat.completion.chunk"


def test_completions_text_and_token_ids(client, chat_reference, tokenizer):
    prompt = "Once upon a time"
    ids = text_ids(tokenizer, prompt)
    want = generate_text(chat_reference, tokenizer, ids, 16)
    r = client.completions.create(model=CHAT_MODEL, prompt=prompt, max_tokens=16, temperature=0)
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    assert r.choices[0].text == want and r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ids), 16)
    by_ids = client.completions.create(model=CHAT_MODEL, prompt=ids, max_tokens=16, temperature=0)
    assert by_ids.choices[0].text == want
    chunks = list(client.completions.create(model=CHAT_MODEL, prompt=prompt, max_tokens=16, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want
    assert chunks[-2].choices[0].finish_reason == "length" and chunks[-1].usage.completion_tokens == 16


def test_max_completion_tokens(client):
    r = client.chat.completions.create(model=CHAT_MODEL, messages=user("short"), max_completion_tokens=5,
                                       temperature=0)
    assert r.usage.completion_tokens == 5 and len(r.choices[0].message.content) == 5


def test_stop_strings(client, chat_reference, tokenizer):
    messages = user("Say something that we can stop.")
    full = generate_text(chat_reference, tokenizer, chat_ids(tokenizer, messages), 40)
    stop = next(full[i:i + 3] for i in range(8, 30) if full.find(full[i:i + 3]) >= 8)
    want = full[:full.find(stop)]
    r = client.chat.completions.create(model=CHAT_MODEL, messages=messages, max_tokens=40, temperature=0, stop=stop)
    assert r.choices[0].message.content == want and r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens < 40
    _, streamed = collect_chat_stream(client.chat.completions.create(
        model=CHAT_MODEL, messages=messages, max_tokens=40, temperature=0, stop=["\x00never", stop], stream=True))
    assert streamed == want


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_seeded_sampling_repeats_and_matches_generate(client, chat_reference, tokenizer, endpoint):
    sampling = dict(temperature=0.9, top_p=0.95, seed=1234)
    if endpoint == "chat":
        messages = user("Sample me.")
        ids = chat_ids(tokenizer, messages)

        def ask(seed):
            r = client.chat.completions.create(model=CHAT_MODEL, messages=messages, max_tokens=24, **{
                **sampling, "seed": seed}, extra_body={"top_k": 20})
            return r.choices[0].message.content
    else:
        ids = text_ids(tokenizer, "Sample me")

        def ask(seed):
            r = client.completions.create(model=CHAT_MODEL, prompt="Sample me", max_tokens=24,
                                          **{**sampling, "seed": seed}, extra_body={"top_k": 20})
            return r.choices[0].text
    first, again, other = ask(1234), ask(1234), ask(4321)
    assert first == again
    assert first == generate_text(chat_reference, tokenizer, ids, 24, top_k=20, **sampling)
    assert other != first


def test_model_may_be_left_out_and_seeds_span_signed_64_bits(chat_server, chat_reference, tokenizer):
    from helpers.serve_helpers import http_request

    ids = chat_ids(tokenizer, user("No model named"))
    want = generate_text(chat_reference, tokenizer, ids, 6)
    for path, body in (("/v1/chat/completions", {"messages": user("No model named")}),
                       ("/v1/completions", {"prompt": ids})):
        r = http_request(chat_server.base_url, "POST", path, {**body, "max_tokens": 6, "temperature": 0})
        assert r.status == 200 and r.json()["model"] == CHAT_MODEL, r.text
        choice = r.json()["choices"][0]
        assert choice.get("text", choice.get("message", {}).get("content")) == want
    for seed in (-(1 << 63), (1 << 63) - 1):  # the sampler takes them modulo 2**64, as generate does
        r = http_request(chat_server.base_url, "POST", "/v1/completions",
                         {"prompt": ids, "max_tokens": 6, "seed": seed, "top_k": 0})
        assert r.json()["choices"][0]["text"] == generate_text(chat_reference, tokenizer, ids, 6, top_k=0,
                                                               seed=seed % (1 << 64))
