"""Tools through the server, on a tiny model with Qwen2.5's chat template whose output the test scripts: the engine
is given the request's prompt ids and answers with a fixed text, token by token through the engine's own
detokenizer (the random weights could never write a tool call). Checked with the official client, non-streamed
and streamed (its stream accumulation gives the same calls), as raw server-sent events (no call text leaks into
the content), and on the prompt: tools and tool results rendered as Qwen2.5's template renders them (HF's
``apply_chat_template`` on the same tokenizer is the reference)."""

from __future__ import annotations

import json

import pytest

import llaisys_models
from helpers.serve_helpers import CHAT_MODEL, http_request, http_stream, require_serving

require_serving()

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
CALL_TEXT = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
             '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
ASK = [{"role": "user", "content": "Weather and time in Paris?"}]


@pytest.fixture(scope="module")
def hf_tokenizer(tool_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tool_model_dir))


def prompt_text(server, hf_tokenizer) -> str:
    return hf_tokenizer.decode(server.scripted.prompts[-1])


def reference_prompt(hf_tokenizer, messages, tools=None) -> str:
    return hf_tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)


def test_calls_non_streamed(tool_server, hf_tokenizer):
    tool_server.scripted.reply = CALL_TEXT
    r = tool_server.client().chat.completions.create(model=CHAT_MODEL, messages=ASK, tools=[WEATHER, TIME])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls
    assert [(c.type, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("function", "get_weather", {"city": "Paris"}), ("function", "get_time", {})]
    assert all(c.id.startswith("call_") for c in calls) and calls[0].id != calls[1].id
    # the tools reached the model as Qwen2.5's template shows them
    text = prompt_text(tool_server, hf_tokenizer)
    assert text == reference_prompt(hf_tokenizer, ASK, [WEATHER, TIME])
    assert "<tools>\n" + json.dumps(WEATHER) + "\n" + json.dumps(TIME) + "\n</tools>" in text


def test_calls_streamed_accumulate_to_the_same(tool_server):
    tool_server.scripted.reply = "Let me check.\n" + CALL_TEXT
    client = tool_server.client()
    with client.chat.completions.stream(model=CHAT_MODEL, messages=ASK, tools=[WEATHER, TIME]) as stream:
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check.\n"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {})]
    whole = client.chat.completions.create(model=CHAT_MODEL, messages=ASK, tools=[WEATHER, TIME])
    assert whole.choices[0].message.content == "Let me check.\n"
    def named(calls):
        return [(c.function.name, c.function.arguments) for c in calls]
    assert named(whole.choices[0].message.tool_calls) == named(choice.message.tool_calls)


def test_raw_stream_chunks(tool_server):
    tool_server.scripted.reply = "Sure.<tool_call>\n" + '{"name": "get_weather", "arguments": {"city": "Paris"}}' \
                                 "\n</tool_call>"
    body = {"model": CHAT_MODEL, "messages": ASK, "tools": [WEATHER], "stream": True}
    with http_stream(tool_server.base_url, "/v1/chat/completions", body) as r:
        events = r.read().decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    content = "".join(d.get("content") or "" for d in deltas)
    assert content == "Sure."  # no '<tool_call>' text, not even in part
    calls = [d["tool_calls"] for d in deltas if "tool_calls" in d]
    assert calls == [[{"index": 0, "id": calls[0][0]["id"], "type": "function",
                       "function": {"name": "get_weather", "arguments": ""}}],
                     [{"index": 0, "function": {"arguments": '{"city": "Paris"}'}}]]
    assert calls[0][0]["id"].startswith("call_")
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "tool_calls"


def test_tool_result_round_trip(tool_server, hf_tokenizer):
    tool_server.scripted.reply = "It is sunny in Paris."
    call = {"id": "call_abc", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_abc", "content": '{"sky": "sunny", "celsius": 21}'}]
    r = tool_server.client().chat.completions.create(model=CHAT_MODEL, messages=messages, tools=[WEATHER])
    assert r.choices[0].message.content == "It is sunny in Paris." and r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.tool_calls is None
    text = prompt_text(tool_server, hf_tokenizer)
    # the template's own rendering of the call (arguments as an object) and of the result
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            '</tool_call><|im_end|>\n') in text
    assert '<|im_start|>user\n<tool_response>\n{"sky": "sunny", "celsius": 21}\n</tool_response><|im_end|>\n' in text
    parsed = [*ASK, {"role": "assistant", "content": "", "tool_calls": [{**call, "function": {
        "name": "get_weather", "arguments": {"city": "Paris"}}}]}, messages[2]]
    assert text == reference_prompt(hf_tokenizer, parsed, [WEATHER])


def test_tool_choice_none_shows_no_tools_and_parses_nothing(tool_server, hf_tokenizer):
    tool_server.scripted.reply = CALL_TEXT
    r = tool_server.client().chat.completions.create(model=CHAT_MODEL, messages=ASK, tools=[WEATHER],
                                                     tool_choice="none")
    assert r.choices[0].message.content == CALL_TEXT and r.choices[0].message.tool_calls is None
    assert r.choices[0].finish_reason == "stop"
    assert prompt_text(tool_server, hf_tokenizer) == reference_prompt(hf_tokenizer, ASK)


def test_auto_parallel_off_and_n_choices(tool_server):
    tool_server.scripted.reply = CALL_TEXT
    r = tool_server.client().chat.completions.create(model=CHAT_MODEL, messages=ASK, tools=[WEATHER, TIME],
                                                     tool_choice="auto", parallel_tool_calls=False, n=2)
    for choice in r.choices:
        assert [c.function.name for c in choice.message.tool_calls] == ["get_weather"]
        assert choice.finish_reason == "tool_calls"
    assert r.choices[0].message.tool_calls[0].id != r.choices[1].message.tool_calls[0].id


def test_malformed_call_is_content(tool_server):
    bad = '<tool_call>\n{"name": "get_weather", "arguments": {"city": Paris}}\n</tool_call>'
    tool_server.scripted.reply = bad
    client = tool_server.client()
    r = client.chat.completions.create(model=CHAT_MODEL, messages=ASK, tools=[WEATHER])
    assert r.choices[0].message.content == bad and r.choices[0].message.tool_calls is None
    assert r.choices[0].finish_reason == "stop"
    stream = client.chat.completions.create(model=CHAT_MODEL, messages=ASK, tools=[WEATHER], stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == bad


def post(server, body):
    return http_request(server.base_url, "POST", "/v1/chat/completions", body)


@pytest.mark.parametrize("change,param", [
    ({"tools": {"type": "function"}}, "tools"),
    ({"tools": ["get_weather"]}, "tools[0]"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
    ({"tools": [{"type": "function"}]}, "tools[0].function"),
    ({"tools": [{"type": "function", "function": {"description": "x"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
     "tools[0].function.parameters"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function"}}, "tool_choice.function"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function": {
        "name": "f", "arguments": "{not json"}}]}]}, "messages[0].tool_calls[0].function.arguments"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function": {
        "name": "f", "arguments": "[1]"}}]}]}, "messages[0].tool_calls[0].function.arguments"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function": {"arguments": "{}"}}]}]},
     "messages[0].tool_calls[0].function.name"),
])
def test_bad_tool_fields_name_their_param(tool_server, change, param):
    response = post(tool_server, {"model": CHAT_MODEL, "messages": ASK, **change})
    assert response.status == 400, response.text
    assert response.json()["error"]["param"] == param, response.text


def test_a_template_without_tools_refuses_them(chat_server):
    # the shared chat server's template renders messages only
    response = post(chat_server, {"model": CHAT_MODEL, "messages": ASK, "tools": [WEATHER]})
    error = response.json()["error"]
    assert response.status == 400 and error["param"] == "tools" and error["code"] == "tools_unsupported"
    assert "does not render tools" in error["message"]
    ok = post(chat_server, {"model": CHAT_MODEL, "messages": ASK, "tools": [WEATHER], "tool_choice": "none",
                            "max_tokens": 2})
    assert ok.status == 200, ok.text  # tool_choice none: no tools shown, nothing to render


def test_the_model_itself_with_tools(tool_server, tool_model_dir, hf_tokenizer):
    """Through the real engine: a reply that is no call (random weights) is the content, streamed or not, and
    is the text ``model.generate`` gives on the prompt with the tools rendered."""
    tool_server.scripted.reply = None
    ids = hf_tokenizer(reference_prompt(hf_tokenizer, ASK, [WEATHER]), add_special_tokens=False).input_ids
    reference = llaisys_models.load(tool_model_dir)
    want = hf_tokenizer.decode(reference.generate(ids, 12)[len(ids):], skip_special_tokens=True)
    assert want  # some text to compare
    client = tool_server.client()
    kwargs = {"model": CHAT_MODEL, "messages": ASK, "tools": [WEATHER], "max_tokens": 12, "temperature": 0}
    r = client.chat.completions.create(**kwargs)
    assert r.choices[0].message.content == want and r.choices[0].message.tool_calls is None
    assert tool_server.scripted.prompts[-1] == ids
    streamed = client.chat.completions.create(stream=True, **kwargs)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == want
