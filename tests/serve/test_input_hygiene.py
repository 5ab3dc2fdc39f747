"""What a hostile client may put in a body's text, and what the server makes of its log-probabilities:

- a lone surrogate (``"\\ud800"``, which Python's json accepts) or bytes that are not UTF-8, in any string of any
  endpoint's body, keys included, is a 400 ``invalid_text`` whose ``param`` is that field's path, sent before any
  stream starts (no 500, no 200 with a stream cut short); surrogate pairs (``"\\ud83d\\ude00"``) are text like any;
- every log-probability is a finite JSON number, streamed or not: a token a grammar rules out has -9999.0 (OpenAI's
  number for it), never -Infinity.
"""

from __future__ import annotations

import json
import math

import pytest

from helpers.serve_helpers import CHAT_MODEL, check_error_body, http_request, require_serving, user

require_serving()

from helpers.serve_helpers import CHAT, COMPLETIONS, chat  # noqa: E402

RESPONSES = "/v1/responses"
LONE = "a\ud800b"  # json.dumps writes it as the escape "a\\ud800b"
TOOL = {"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}


def completion(**fields) -> dict:
    return {"model": CHAT_MODEL, "prompt": "hi", "max_tokens": 2, **fields}


def response(**fields) -> dict:
    return {"model": CHAT_MODEL, "input": "hi", "max_output_tokens": 2, **fields}


# (id, path, body, the param named)
CASES = [
    ("chat-content", CHAT, chat(messages=[*user("ok"), *user(LONE)]), "messages[1].content"),
    ("chat-content-part", CHAT, chat(messages=[{"role": "user", "content": [{"type": "text", "text": LONE}]}]),
     "messages[0].content[0].text"),
    ("chat-name", CHAT, chat(messages=[{"role": "user", "content": "x", "name": LONE}]), "messages[0].name"),
    ("chat-role", CHAT, chat(messages=[{"role": LONE, "content": "x"}]), "messages[0].role"),
    ("tool-description", CHAT, chat(tools=[{**TOOL, "function": {**TOOL["function"], "description": LONE}}]),
     "tools[0].function.description"),
    ("tool-schema", CHAT, chat(tools=[{**TOOL, "function": {**TOOL["function"], "parameters": {
        "type": "object", "properties": {"x": {"type": "string", "enum": [LONE]}}}}}]),
     "tools[0].function.parameters.properties.x.enum[0]"),
    ("chat-stop", CHAT, chat(stop=["ok", LONE]), "stop[1]"),
    ("chat-schema", CHAT, chat(response_format={"type": "json_schema", "json_schema": {"name": LONE, "schema": {}}}),
     "response_format.json_schema.name"),
    ("chat-user", CHAT, chat(user=LONE), "user"),
    ("completions-prompt", COMPLETIONS, completion(prompt=LONE), "prompt"),
    ("completions-prompt-list", COMPLETIONS, completion(prompt=["ok", LONE]), "prompt[1]"),
    ("completions-stop", COMPLETIONS, completion(stop=LONE), "stop"),
    ("responses-input", RESPONSES, response(input=LONE), "input"),
    ("responses-input-item", RESPONSES, response(input=[{"role": "user", "content": [
        {"type": "input_text", "text": LONE}]}]), "input[0].content[0].text"),
    ("responses-instructions", RESPONSES, response(instructions=LONE), "instructions"),
    ("responses-metadata", RESPONSES, response(metadata={"k": LONE}), "metadata.k"),
    ("responses-metadata-key", RESPONSES, response(metadata={LONE: "v"}), f"metadata.{LONE}"),
    ("top-level-key", CHAT, {**chat(), LONE: 1}, LONE),
    ("message-key", CHAT, chat(messages=[{"role": "user", "content": "x", LONE: "y"}]), f"messages[0].{LONE}"),
    ("low-half-alone", CHAT, chat(messages=user("x\udc00")), "messages[0].content"),
    ("pair-reversed", CHAT, chat(messages=user("\ude00\ud83d")), "messages[0].content"),
]


def post(server, path: str, body: dict | bytes):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()  # ASCII, lone surrogates as escapes
    return http_request(server.base_url, "POST", path, raw=raw)


def check_refused(reply, param: str) -> None:
    """A 400 JSON error (not a stream: no event was sent) whose param names the field, printable as UTF-8."""
    error = check_error_body(reply, 400, param.encode("utf-8", "backslashreplace").decode(), "invalid_text")
    assert "not valid Unicode" in error["message"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("path, body, param", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_lone_surrogate_is_refused_naming_the_field(chat_server, path, body, param, stream):
    check_refused(post(chat_server, path, {**body, "stream": stream}), param)


NOT_UTF8 = [
    ("chat-content", CHAT, b'{"messages": [{"role": "user", "content": "a\xffb"}]}', "messages[0].content"),
    ("encoded-surrogate", CHAT, b'{"messages": [{"role": "user", "content": "a\xed\xa0\x80b"}]}',
     "messages[0].content"),
    ("cut-sequence", COMPLETIONS, b'{"prompt": "ok", "stop": ["x\xe2\x82"]}', "stop[0]"),
    ("metadata-key", RESPONSES, b'{"input": "hi", "metadata": {"k\xc0": "v"}}', "metadata.k\udcc0"),
]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("path, raw, param", [c[1:] for c in NOT_UTF8], ids=[c[0] for c in NOT_UTF8])
def test_bytes_that_are_not_utf8_are_refused_naming_the_field(chat_server, path, raw, param, stream):
    body = raw[:-1] + (b', "stream": true}' if stream else b"}")
    reply = post(chat_server, path, body)
    check_refused(reply, param)
    assert "byte 0x" in reply.json()["error"]["message"]


def test_surrogate_pairs_and_other_text_are_served(chat_server):
    """An escaped pair (as json.dumps writes an emoji) and text outside ASCII are plain text, in values and keys."""
    body = chat(messages=user("smile \U0001F600 é 中"), max_tokens=2, metadata_extra={"\U0001F600": "é"})
    for raw in (json.dumps(body).encode(), json.dumps(body, ensure_ascii=False).encode(),
                b"\xef\xbb\xbf" + json.dumps(body, ensure_ascii=False).encode()):  # with a UTF-8 byte order mark
        reply = post(chat_server, CHAT, raw)
        assert reply.status == 200, reply.text
    reply = post(chat_server, RESPONSES, response(metadata={"\U0001F600": "\U0001F600"}))
    assert reply.status == 200 and reply.json()["metadata"] == {"\U0001F600": "\U0001F600"}


def test_still_serving_afterwards(chat_server):
    for _, path, body, _ in CASES:
        assert post(chat_server, path, {**body, "stream": True}).status == 400
    r = chat_server.client().chat.completions.create(model=CHAT_MODEL, messages=user("fine?"), max_tokens=3)
    assert r.usage.completion_tokens == 3
    m = chat_server.metrics()
    assert not any(k.startswith("llaisys_http_errors_total") and 'status="5' in k for k in m)


# -- log-probabilities under a grammar ----------------------------------------------------------------------

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}}
IMPOSSIBLE = -9999.0


def strict_json(text: str):
    """``text`` parsed as JSON proper: NaN, Infinity and -Infinity are refused."""
    def refuse(name: str):
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


def numbers(value) -> list[float]:
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [value]
    if isinstance(value, dict):
        return [x for v in value.values() for x in numbers(v)]
    if isinstance(value, list):
        return [x for v in value for x in numbers(v)]
    return []


def bodies(reply, stream: bool) -> list[dict]:
    """The response body, or each event's data, each parsed strictly."""
    assert reply.status == 200, reply.text
    if not stream:
        return [strict_json(reply.text)]
    lines = [line.removeprefix("data: ") for line in reply.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [strict_json(line) for line in lines[:-1]]


def chat_logprobs(found: list[dict]) -> tuple[list[float], list[float]]:
    """(the chosen tokens' log-probabilities, their alternatives') of every choice in ``found``."""
    chosen, alternatives = [], []
    for body in found:
        for choice in body["choices"]:
            for entry in (choice.get("logprobs") or {}).get("content") or []:
                chosen.append(entry["logprob"])
                alternatives += [t["logprob"] for t in entry["top_logprobs"]]
    return chosen, alternatives


def completion_logprobs(found: list[dict]) -> tuple[list[float], list[float]]:
    chosen, alternatives = [], []
    for body in found:
        for choice in body["choices"]:
            if choice.get("logprobs"):
                chosen += choice["logprobs"]["token_logprobs"]
                alternatives += [lp for top in choice["logprobs"]["top_logprobs"] for lp in top.values()]
    return chosen, alternatives


def check_logprobs(found: list[dict], chosen: list[float], alternatives: list[float]) -> None:
    assert all(math.isfinite(x) for body in found for x in numbers(body))
    assert chosen and all(IMPOSSIBLE < lp <= 0 for lp in chosen)  # the grammar allows every token it chose
    assert IMPOSSIBLE in alternatives  # ... and rules out most of the 20 most likely at each step
    assert all(IMPOSSIBLE <= lp <= 0 for lp in alternatives)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_chat_logprobs_under_a_schema_are_finite(chat_server, stream):
    body = chat(messages=user("Say"), max_tokens=30, seed=1, n=2, logprobs=True, top_logprobs=20,
                response_format=JSON_SCHEMA, stream=stream)
    found = bodies(post(chat_server, CHAT, body), stream)
    check_logprobs(found, *chat_logprobs(found))


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_completions_logprobs_under_a_schema_are_finite(chat_server, stream):
    body = completion(prompt="Say", max_tokens=30, seed=1, logprobs=5, response_format=JSON_SCHEMA, stream=stream)
    found = bodies(post(chat_server, COMPLETIONS, body), stream)
    check_logprobs(found, *completion_logprobs(found))


def test_json_logprob_floors_what_json_cannot_write():
    from llaisys_models.serve.openai.protocol import IMPOSSIBLE_LOGPROB, json_logprob

    assert IMPOSSIBLE_LOGPROB == IMPOSSIBLE
    assert [json_logprob(x) for x in (-math.inf, math.nan, -1e6, -9999.0, -2.5, 0.0)] == [
        IMPOSSIBLE, IMPOSSIBLE, IMPOSSIBLE, IMPOSSIBLE, -2.5, 0.0]
