"""Tool-call parsing on model-like text of each family (Qwen/Hermes, Llama 3, Mistral), whole and streamed: the
streamed parser gives the same calls and content whatever the chunking, and never lets a call opener reach the
content; malformed calls stay content. The parser is picked from the chat template."""

from __future__ import annotations

import json
import random

import pytest

from helpers.qwen_template import QWEN25_TEMPLATE
from llaisys_models.serve.tool_calls import (
    HERMES,
    LLAMA3,
    MISTRAL,
    ToolCall,
    ToolCallStream,
    parse_tool_calls,
    tool_format,
    tool_support,
)

NAMES = ("get_weather", "get_time")


def calls_of(calls: list[ToolCall]) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in calls]


# (format, model output, content wanted, calls wanted)
CASES = [
    (HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     None, [("get_weather", {"city": "Paris"})]),
    (HERMES, 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
             '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>',
     "Let me look.\n", [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "CET"})]),
    (HERMES, '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}</tool_call>',  # as a string
     None, [("get_weather", {"city": "Oslo"})]),
    (HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}', None,  # EOS before the closer
     [("get_weather", {"city": "Rome"})]),
    (HERMES, "The weather is fine; no <tool_call> needed", "The weather is fine; no <tool_call> needed", []),
    (HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"city": </tool_call> sorry',
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": </tool_call> sorry', []),
    (HERMES, "a < b and <tool", "a < b and <tool", []),  # a held opener prefix that never completes
    (LLAMA3, '{"name": "get_weather", "parameters": {"city": "Paris"}}', None, [("get_weather", {"city": "Paris"})]),
    (LLAMA3, '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
             '{"name": "get_time", "parameters": {}}', None, [("get_weather", {"city": "Paris"}), ("get_time", {})]),
    (LLAMA3, '\n {"name": "get_time", "arguments": {"zone": "UTC"}}', None, [("get_time", {"zone": "UTC"})]),
    (LLAMA3, '{"name": "send_mail", "parameters": {}}', '{"name": "send_mail", "parameters": {}}', []),  # no such tool
    (LLAMA3, '{"answer": 42}', '{"answer": 42}', []),  # a JSON answer, not a call
    (LLAMA3, 'It is {"name": "get_time"} maybe', 'It is {"name": "get_time"} maybe', []),  # not at the start
    (MISTRAL, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
              '{"name": "get_time", "arguments": {"zone": "CET"}}]', None,
     [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "CET"})]),
    (MISTRAL, ' [{"name": "get_weather", "arguments": {"city": "Lima"}}]', None,  # [TOOL_CALLS] dropped as special
     [("get_weather", {"city": "Lima"})]),
    (MISTRAL, 'Sure. [TOOL_CALLS][{"name": "get_time", "arguments": {}}]', "Sure. ", [("get_time", {})]),
    (MISTRAL, '[TOOL_CALLS][{"name": "get_time", "arguments": {}', '[TOOL_CALLS][{"name": "get_time", "arguments": {}',
     []),
    (MISTRAL, "[1, 2, 3]", "[1, 2, 3]", []),
]


@pytest.mark.parametrize("fmt,text,content,calls", CASES, ids=lambda v: getattr(v, "name", None))
def test_whole_output(fmt, text, content, calls):
    got_content, got_calls = parse_tool_calls(text, fmt, NAMES)
    assert got_content == content
    assert calls_of(got_calls) == calls
    assert [c.index for c in got_calls] == list(range(len(calls)))
    assert all(c.id.startswith("call_") and len(c.id) == 29 for c in got_calls)
    assert len({c.id for c in got_calls}) == len(got_calls)


def chunked(text: str, rng: random.Random) -> list[str]:
    pieces, i = [], 0
    while i < len(text):
        n = rng.randint(1, 6)
        pieces.append(text[i:i + n])
        i += n
    return pieces


@pytest.mark.parametrize("fmt,text,content,calls", CASES, ids=lambda v: getattr(v, "name", None))
def test_streamed_output(fmt, text, content, calls):
    for seed in range(20):
        pieces = list(text) if seed == 0 else chunked(text, random.Random(seed))
        stream = ToolCallStream(fmt, NAMES)
        events = []
        for piece in pieces:
            out = stream.push(piece)
            events += out
            streamed = "".join(e for e in events if isinstance(e, str))
            if calls:  # the content so far never holds (the start of) a call
                assert all(opener not in streamed for opener in fmt.openers)
                assert not streamed.lstrip().startswith(("{", "[")) or fmt is HERMES
        events += stream.finish()
        got_content = "".join(e for e in events if isinstance(e, str))
        assert (got_content or None if calls else got_content) == (content if content is not None else None), pieces
        assert calls_of([e for e in events if isinstance(e, ToolCall)]) == calls


def test_content_streams_before_the_call_ends():
    stream = ToolCallStream(HERMES, NAMES)
    assert stream.push("Checking the weather") == ["Checking the weather"]  # released at once
    assert stream.push(" now <tool") == [" now "]  # '<tool' held: it may open a call
    assert stream.push('_call>{"name": "get_weather", "arguments": {}}') == []
    [call] = stream.push("</tool_call>")
    assert call.name == "get_weather" and call.arguments == "{}"
    assert stream.push("\n") == [] and stream.finish() == []  # whitespace after a call is not content


def test_one_call_without_parallel_tool_calls():
    text = '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call><tool_call>{"name": "get_time", ' \
           '"arguments": {}}</tool_call>'
    _, calls = parse_tool_calls(text, HERMES, NAMES, parallel=False)
    assert calls_of(calls) == [("get_weather", {})]


def test_non_ascii_arguments_stay_text():
    _, [call] = parse_tool_calls('<tool_call>{"name": "get_weather", "arguments": {"city": "Zürich"}}</tool_call>',
                                 HERMES, NAMES)
    assert call.arguments == '{"city": "Zürich"}'


def test_format_from_the_chat_template():
    assert tool_format(QWEN25_TEMPLATE) is HERMES
    # the lines of each family's template that teach its format
    assert tool_format("{{- '<|python_tag|>' + tool_call.name }}{{- 'Environment: ipython' }}") is LLAMA3
    assert tool_format("{{- '[TOOL_CALLS] [' }}{{- '[AVAILABLE_TOOLS] [' }}") is MISTRAL
    assert tool_format({"default": "{{ messages }}", "tool_use": QWEN25_TEMPLATE}) is HERMES
    assert tool_format("{% for m in messages %}{{ m.content }}{% endfor %}") is None
    assert tool_format(None) is None


class FakeTemplateTokenizer:
    def __init__(self, template, render):
        self.chat_template = template
        self.render = render

    def apply_chat_template(self, messages, tools=None, **kwargs):
        return self.render(tools)


def test_tool_support_needs_a_template_that_renders_tools():
    fmt, why = tool_support(FakeTemplateTokenizer(None, lambda tools: ""))
    assert fmt is None and "no chat template" in why
    fmt, why = tool_support(FakeTemplateTokenizer("{{ messages }}", lambda tools: "no tools here"))
    assert fmt is None and "does not render tools" in why
    fmt, why = tool_support(FakeTemplateTokenizer("<tool_call>", lambda tools: 1 / 0))
    assert fmt is None and "cannot render tools (ZeroDivisionError" in why
    fmt, why = tool_support(FakeTemplateTokenizer("{{ tools }}", lambda tools: json.dumps(tools)))
    assert fmt is None and "none of the tool-call formats" in why
    fmt, why = tool_support(FakeTemplateTokenizer(QWEN25_TEMPLATE, lambda tools: json.dumps(tools)))
    assert fmt is HERMES and why == ""
