"""``/v1/responses`` through the official client and as raw server-sent events: the text equals
``model.generate`` on the chat template of ``instructions`` + ``input``; the events come in OpenAI's order with
increasing sequence numbers; what the server cannot honour is refused by name."""

from __future__ import annotations

import json
import random

import pytest

from helpers.random_schemas import matches, random_schema
from helpers.serve_helpers import CHAT_MODEL, chat_ids, generate_text, http_request, http_stream, require_serving, user

require_serving()

EVENTS = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
CLOSING = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]


@pytest.fixture(scope="module")
def client(chat_server):
    return chat_server.client()


def test_text_in_text_out_with_usage(client, chat_reference, tokenizer):
    ids = chat_ids(tokenizer, [{"role": "system", "content": "Be brief."}, *user("Hello there")])
    want = generate_text(chat_reference, tokenizer, ids, 12)
    r = client.responses.create(model=CHAT_MODEL, input="Hello there", instructions="Be brief.", max_output_tokens=12,
                                temperature=0)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == CHAT_MODEL
    assert r.output_text == want and len(r.output) == 1 and r.output[0].role == "assistant"
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"  # no EOS: ran to the limit
    assert (r.usage.input_tokens, r.usage.output_tokens, r.usage.total_tokens) == (len(ids), 12, len(ids) + 12)
    assert r.instructions == "Be brief." and r.max_output_tokens == 12 and r.store is False


def test_message_items_and_seeded_sampling(client, chat_reference, tokenizer):
    conversation = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
                    {"role": "user", "content": "More"}]
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
             {"role": "assistant", "content": [{"type": "output_text", "text": "Hello"}]},
             {"role": "developer", "content": "More"}]
    conversation[2]["role"] = "system"  # developer is the template's system
    ids = chat_ids(tokenizer, conversation)
    want = generate_text(chat_reference, tokenizer, ids, 10, top_k=0, temperature=0.8, seed=3)
    r = client.responses.create(input=items, max_output_tokens=10, temperature=0.8, extra_body={"seed": 3},
                                model=CHAT_MODEL)
    assert r.output_text == want


def test_stream_events_through_the_client(client, chat_reference, tokenizer):
    ids = chat_ids(tokenizer, user("Stream it"))
    want = generate_text(chat_reference, tokenizer, ids, 9)
    events = list(client.responses.create(model=CHAT_MODEL, input="Stream it", max_output_tokens=9, temperature=0,
                                          stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == EVENTS and kinds[-4:] == CLOSING + ["response.incomplete"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == want
    assert events[-4].text == want and events[-1].response.output_text == want
    assert events[-1].response.usage.output_tokens == 9
    assert [e.sequence_number for e in events] == list(range(len(events)))
    # the client's stream helper builds its snapshot from the same events; its final response needs a
    # response.completed (OpenAI ends a reply cut by max_output_tokens with response.incomplete): a stop string
    stop = want[4:7]
    with client.responses.stream(model=CHAT_MODEL, input="Stream it", max_output_tokens=9, temperature=0,
                                 extra_body={"stop": stop}) as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert "".join(deltas) == final.output_text == want[:want.find(stop)] and final.status == "completed"


def test_raw_events_name_their_type_and_end_completed(chat_server):
    body = {"input": "Raw events", "max_output_tokens": 5, "temperature": 0, "stream": True}  # no model: the one
    with http_stream(chat_server.base_url, "/v1/responses", body) as r:
        assert r.status == 200 and r.getheader("content-type").startswith("text/event-stream")
        blocks = [b for b in r.read().decode().split("\n\n") if b]
    pairs = [b.split("\n") for b in blocks]
    assert all(len(p) == 2 and p[0].startswith("event: ") and p[1].startswith("data: ") for p in pairs)
    for name, data in pairs:
        assert json.loads(data.removeprefix("data: "))["type"] == name.removeprefix("event: ")
    last = json.loads(pairs[-1][1].removeprefix("data: "))
    assert last["type"] == "response.incomplete" and last["response"]["status"] == "incomplete"
    created = json.loads(pairs[0][1].removeprefix("data: "))["response"]
    assert created["status"] == "in_progress" and created["output"] == []


def test_a_reply_that_ends_by_itself_is_completed(chat_server, tokenizer):
    body = {"input": "Stop me", "max_output_tokens": 30, "temperature": 0}
    full = http_request(chat_server.base_url, "POST", "/v1/responses", body).json()
    text = full["output"][0]["content"][0]["text"]
    r = http_request(chat_server.base_url, "POST", "/v1/responses", {**body, "stop": text[3:6]}).json()
    assert r["status"] == "completed" and r["incomplete_details"] is None
    assert r["output"][0]["content"][0]["text"] == text[:text.find(text[3:6])]


@pytest.mark.parametrize("body, param, code", [
    ({}, "input", "missing_required_parameter"),
    ({"input": []}, "input", "empty_array"),
    ({"input": 5}, "input", "invalid_type"),
    ({"input": [{"type": "function_call_output", "call_id": "x", "output": "y"}]}, "input[0].type",
     "unsupported_parameter"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].type", "unsupported_content"),
    ({"input": [{"role": "wizard", "content": "x"}]}, "input[0].role", "invalid_role"),
    ({"input": [{"role": "user"}]}, "input[0].content", "missing_required_parameter"),
    ({"input": "x", "instructions": 3}, "instructions", "invalid_type"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens", "invalid_value"),
    ({"input": "x", "max_output_tokens": 1 << 20}, "max_output_tokens", "context_length_exceeded"),
    ({"input": "x", "temperature": 3}, "temperature", "invalid_value"),
    ({"input": "x", "top_p": 0}, "top_p", "invalid_value"),
    ({"input": "x", "stream": "yes"}, "stream", "invalid_type"),
    ({"input": "x", "tools": [{"type": "function", "name": "f"}]}, "tools", "unsupported_parameter"),
    ({"input": "x", "tool_choice": "required"}, "tool_choice", "unsupported_parameter"),
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id", "unsupported_parameter"),
    ({"input": "x", "background": True}, "background", "unsupported_parameter"),
    ({"input": "x", "reasoning": {"effort": "high"}}, "reasoning", "unsupported_parameter"),
    ({"input": "x", "include": ["message.output_text.logprobs"]}, "include", "unsupported_parameter"),
    ({"input": "x", "metadata": {"a": 1}}, "metadata", "invalid_value"),
    ({"input": "x", "model": "gpt-9"}, "model", "model_not_found"),
], ids=lambda v: json.dumps(v)[:40] if isinstance(v, dict) else None)
def test_bad_requests_name_their_param(chat_server, body, param, code):
    r = http_request(chat_server.base_url, "POST", "/v1/responses", body)
    assert r.status == (404 if code == "model_not_found" else 400), r.text
    error = r.json()["error"]
    assert (error["param"], error["code"]) == (param, code), error


# -- structured outputs: text.format ---------------------------------------------------------------------------

def test_text_format_json_schema_replies_parse_and_match(client):
    """Random schemas, seeded sampling on the random model (which never writes JSON by itself, see
    test_structured.py): every reply is completed and its text matches its schema; the format is echoed."""
    rng = random.Random(2027)
    for seed in range(10):
        schema = random_schema(rng)
        fmt = {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}
        kwargs = dict(model=CHAT_MODEL, input=f"Answer {seed}", max_output_tokens=400, temperature=1.0, top_p=0.95,
                      text={"format": fmt}, extra_body={"seed": seed})
        if seed % 2:
            events = list(client.responses.create(stream=True, **kwargs))
            r = events[-1].response
            assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text
        else:
            r = client.responses.create(**kwargs)
        assert r.status == "completed", r.output_text
        assert matches(json.loads(r.output_text), schema), (schema, r.output_text)
        assert r.text.format.type == "json_schema" and r.text.format.name == "answer"
        assert r.text.format.schema_ == schema


def test_the_client_parses_a_pydantic_format(client):
    from pydantic import BaseModel, Field

    class City(BaseModel):
        name: str = Field(max_length=8)
        population: int = Field(ge=0, le=99)
        capital: bool

    r = client.responses.parse(model=CHAT_MODEL, input="A city", max_output_tokens=300, temperature=1.0,
                               text_format=City, extra_body={"seed": 4})
    assert isinstance(r.output_parsed, City) and len(r.output_parsed.name) <= 8 and 0 <= r.output_parsed.population <= 99
    with client.responses.stream(model=CHAT_MODEL, input="A city", max_output_tokens=300, temperature=1.0,
                                 text_format=City, extra_body={"seed": 4}) as stream:
        assert stream.get_final_response().output_parsed == r.output_parsed  # same seed, same reply


def test_text_format_json_object(client):
    ended = 0
    for seed in range(4):
        r = client.responses.create(model=CHAT_MODEL, input="JSON", max_output_tokens=60, temperature=1.0,
                                    text={"format": {"type": "json_object"}}, extra_body={"seed": seed})
        assert r.output_text.startswith("{") and r.text.format.type == "json_object"
        if r.status == "completed":
            ended += 1
            assert isinstance(json.loads(r.output_text), dict)
    assert ended


@pytest.mark.parametrize("text, words", [
    ({"format": {"type": "xml"}}, "type"),
    ({"format": "json"}, "object"),
    ({"format": {"type": "json_schema", "schema": {"type": "object"}}}, "name"),
    ({"format": {"type": "json_schema", "name": "a", "schema": {"type": "strng"}}}, "strng"),
    ({"format": {"type": "json_schema", "name": "a", "schema": [1]}}, "schema"),
    ({"format": {"type": "json_schema", "name": "a", "schema": {"type": "object"}, "strict": "yes"}}, "strict"),
])
def test_bad_text_format_is_a_400_naming_it(chat_server, text, words):
    r = http_request(chat_server.base_url, "POST", "/v1/responses", {"input": "x", "max_output_tokens": 4,
                                                                      "text": text})
    assert r.status == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "text.format" and words in error["message"], error
    r = http_request(chat_server.base_url, "POST", "/v1/responses", {"input": "x", "text": "json"})
    assert r.status == 400 and r.json()["error"]["param"] == "text"
    r = http_request(chat_server.base_url, "POST", "/v1/responses", {"input": "x", "speculative": "ngram",
                                                                      "text": {"format": {"type": "json_object"}}})
    assert r.status == 400 and r.json()["error"]["param"] == "text.format"
