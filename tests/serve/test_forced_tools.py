"""``tool_choice`` "required" and a named function, forced by a grammar of the model's own call syntax.

Through the server, the real engine on the tiny model with Qwen2.5's template (random weights: it never writes a
call by itself, see test_tools_api.py): with many seeds, every reply is calls of the allowed functions whose
arguments match the function's random schema, streamed (the official client's accumulation) or not, finish_reason
"tool_calls". Each of the three syntaxes' grammars (Hermes, Llama 3, Mistral) drives ``model.generate`` and its
output parses back with that family's parser; Mistral's ``[TOOL_CALLS]``, where it is a special token, is that
token, and the detokenizer keeps it for requests with tools."""

from __future__ import annotations

import json
import random

import pytest

import llaisys_models
from helpers.random_schemas import matches, random_schema
from helpers.serve_helpers import CHAT_MODEL, http_request, require_serving, user
from llaisys_models import Grammar
from llaisys_models.serve.forced_calls import grammar_source
from llaisys_models.serve.tool_calls import HERMES, LLAMA3, MISTRAL, parse_tool_calls

require_serving()

SAMPLING = dict(temperature=1.0, top_p=0.95, max_tokens=400)


def function(name: str, parameters: dict | None) -> dict:
    spec = {"name": name, **({"parameters": parameters} if parameters is not None else {})}
    return {"type": "function", "function": spec}


def random_tools(rng: random.Random, count: int) -> list[dict]:
    return [function(f"fn_{i}", random_schema(rng)) for i in range(count)]


def schema_of(tools: list[dict], name: str) -> dict:
    return next(t["function"]["parameters"] for t in tools if t["function"]["name"] == name)


def streamed(client, **kwargs):
    with client.chat.completions.stream(**kwargs) as stream:
        return stream.get_final_completion().choices[0]


@pytest.fixture
def client(tool_server):
    tool_server.scripted.reply = None  # the model itself answers
    return tool_server.client()


def test_named_function_always_called_with_valid_arguments(client):
    rng = random.Random(30)
    for seed in range(16):
        tools = random_tools(rng, 3)
        name = rng.choice(tools)["function"]["name"]
        kwargs = dict(model=CHAT_MODEL, messages=user(f"Go {seed}"), tools=tools, seed=seed, **SAMPLING,
                      tool_choice={"type": "function", "function": {"name": name}})
        choice = streamed(client, **kwargs) if seed % 2 else client.chat.completions.create(**kwargs).choices[0]
        assert choice.finish_reason == "tool_calls", choice
        assert not choice.message.content
        (call,) = choice.message.tool_calls
        assert call.function.name == name and call.id.startswith("call_")
        arguments = json.loads(call.function.arguments)
        assert matches(arguments, schema_of(tools, name)), (schema_of(tools, name), arguments)


@pytest.mark.parametrize("parallel", [True, False])
def test_required_calls_tools_of_the_request(client, parallel):
    rng = random.Random(31 + parallel)
    counts = []
    for seed in range(8):
        tools = random_tools(rng, 2) + [function("no_arguments", None)]
        kwargs = dict(model=CHAT_MODEL, messages=user(f"Call {seed}"), tools=tools, tool_choice="required",
                      parallel_tool_calls=parallel, seed=seed, **SAMPLING)
        choice = client.chat.completions.create(**kwargs).choices[0]
        calls = choice.message.tool_calls
        if choice.finish_reason == "length":  # parallel calls go on until the model writes EOS (random weights may
            # not): the calls before max_tokens are whole, the one it cut is the content
            assert parallel and choice.message.content.startswith("<tool_call>"), choice
        else:
            assert choice.finish_reason == "tool_calls" and not choice.message.content, choice
        for call in calls:
            arguments = json.loads(call.function.arguments)
            assert matches(arguments, schema_of(tools, call.function.name) if call.function.name != "no_arguments"
                           else {"type": "object", "properties": {}}), (call, tools)
        counts.append(len(calls))
        if seed < 2:  # streamed: the same calls (ids aside)
            again = streamed(client, **kwargs)
            assert [(c.function.name, c.function.arguments) for c in again.message.tool_calls] == \
                [(c.function.name, c.function.arguments) for c in calls]
    assert min(counts) >= 1 and (max(counts) > 1 if parallel else max(counts) == 1), counts


def test_functions_named_like_choices_are_forced_by_name(client):
    tools = [function(name, {"type": "object", "properties": {"x": {"type": "boolean"}}, "required": ["x"]})
             for name in ("auto", "none", "required")]
    for name in ("none", "auto"):
        r = client.chat.completions.create(model=CHAT_MODEL, messages=user("x"), tools=tools, seed=1, max_tokens=100,
                                           tool_choice={"type": "function", "function": {"name": name}})
        assert [c.function.name for c in r.choices[0].message.tool_calls] == [name]


def test_a_forced_call_streams_as_tool_call_chunks(tool_server):
    tool_server.scripted.reply = None
    tools = [function("get_weather", {"type": "object", "properties": {"city": {"type": "string", "maxLength": 4}},
                                      "required": ["city"]})]
    body = {"model": CHAT_MODEL, "messages": user("Weather?"), "tools": tools, "tool_choice": "required",
            "parallel_tool_calls": False, "stream": True, "seed": 5, "max_tokens": 200}
    from helpers.serve_helpers import http_stream

    with http_stream(tool_server.base_url, "/v1/chat/completions", body) as r:
        events = [e for e in r.read().decode().split("\n\n") if e]
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("content") or "" for d in deltas) == ""  # not one character of the call's text
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0]["function"]["name"] == "get_weather" and len(calls) == 2
    assert len(json.loads(calls[1]["function"]["arguments"])["city"]) <= 4
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls" and events[-1] == "data: [DONE]"


@pytest.mark.parametrize("body, param", [
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
    ({"tool_choice": "required", "speculative": "ngram"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
])
def test_forcing_conflicts_are_400s_naming_their_param(tool_server, body, param):
    tools = [function("f", {"type": "object", "properties": {}})]
    r = http_request(tool_server.base_url, "POST", "/v1/chat/completions",
                     {"messages": user("x"), "tools": tools, "max_tokens": 8, **body})
    assert r.status == 400 and r.json()["error"]["param"] == param, r.text


# -- each syntax's grammar, through model.generate, parsed back by that family's parser -----------------------

@pytest.mark.parametrize("fmt", [HERMES, LLAMA3, MISTRAL], ids=lambda f: f.name)
def test_each_syntax_parses_back_into_valid_calls(fmt, tool_model_dir):
    from llaisys_models.text.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tool_model_dir)
    model = llaisys_models.load(tool_model_dir)
    rng = random.Random(fmt.name)
    ids = tokenizer("Call", add_special_tokens=False).input_ids
    several = 0
    for seed in range(6):
        tools = random_tools(rng, 2)
        grammar = Grammar.lark(tokenizer, grammar_source(fmt, tools, seed % 2 == 0, {}), what="tool_choice")
        out = model.generate(ids, 400, grammar=grammar, temperature=1.0, top_k=0, top_p=0.95, seed=seed)
        text = tokenizer.decode(out[len(ids):], skip_special_tokens=True)
        content, calls = parse_tool_calls(text, fmt, [t["function"]["name"] for t in tools])
        assert content is None and calls, (fmt.name, text)
        assert (seed % 2 == 0 and fmt is not LLAMA3) or len(calls) == 1, text  # Llama 3: one call a reply
        for call in calls:
            assert matches(json.loads(call.arguments), schema_of(tools, call.name)), (text, tools)
        several += len(calls) > 1
    assert several if fmt is not LLAMA3 else not several, "parallel calls: never (the separator untested) or Llama 3"


def test_a_special_token_marker_is_that_token_and_kept_in_the_text(tool_model_dir):
    """Mistral's [TOOL_CALLS] in a tokenizer that has it as a special token: the grammar admits the token, not the
    characters, and the detokenizer of a request with tools keeps its text (the parser's opener)."""
    from tokenizers import AddedToken

    from llaisys_models.serve.tool_calls import special_openers
    from llaisys_models.text.stream import TextStream
    from llaisys_models.text.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tool_model_dir)
    tokenizer.add_special_tokens({"additional_special_tokens": [AddedToken("[TOOL_CALLS]", special=True)]})
    marker = tokenizer.convert_tokens_to_ids("[TOOL_CALLS]")
    assert special_openers(tokenizer, MISTRAL) == {"[TOOL_CALLS]": marker}
    tools = [function("f", {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})]
    grammar = Grammar.lark(tokenizer, grammar_source(MISTRAL, tools, True, special_openers(tokenizer, MISTRAL)))
    body = tokenizer('[{"name": "f", "arguments": {"a": 1}}]', add_special_tokens=False).input_ids
    as_text = tokenizer("[TOOL_CALLS]", split_special_tokens=True, add_special_tokens=False).input_ids
    assert len(as_text) > 1
    matcher = grammar.matcher(len(tokenizer))
    for token in [marker, *body]:
        matcher.accept(token)
    assert matcher.done  # "]" ends the calls
    with pytest.raises(llaisys_models.GrammarError):
        grammar.matcher(len(tokenizer)).accept(as_text[0])

    def text_of(keep):
        stream = TextStream(tokenizer, (), keep)
        return "".join(stream.push(t)[0] for t in [marker, *body]) + stream.finish()[0]
    assert text_of(frozenset()) == '[{"name": "f", "arguments": {"a": 1}}]'  # skipped, as before
    kept = text_of(frozenset({marker}))
    assert kept == '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}]'
    content, calls = parse_tool_calls(kept, MISTRAL, ["f"])
    assert content is None and [(c.name, json.loads(c.arguments)) for c in calls] == [("f", {"a": 1})]
