"""Tool calls in a model's output: each family's syntax, parsed into OpenAI's ``tool_calls`` as the text streams.

A family's chat template says how its models call tools, and the parser is picked from it (``tool_format``):

    hermes   (Qwen2/2.5, Hermes)  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one block a call
    llama3   (Llama 3.1/3.2)      ``{"name": ..., "parameters": {...}}`` (calls joined by ``;``), maybe after
                                  ``<|python_tag|>``
    mistral  (Mistral v3)         ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``

``<|python_tag|>`` and ``[TOOL_CALLS]`` are special tokens, which the engine's detokenizer keeps in the text of
requests with tools only (``special_openers``); and Llama 3 models often call without the tag. So for those two
families a call may also be the output itself: a JSON object (llama3) or array (mistral) that the output starts
with. Such a call counts only if every function it names is one of the
request's tools (a model answering in JSON is not calling a tool). Text that opens a call but does not parse
as one is content, unchanged: a model's malformed call is the client's to see, never a server error.

``ToolCallStream`` reads the text as it comes and gives back content and whole calls: text that may still
turn into a call opener (``<tool_c``) is held back, so no opener ever reaches the content.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..text.tokenizer import Tokenizer

PROBE_TOOL_NAME = "llaisys_probe_tool"
PROBE_TOOL = {"type": "function", "function": {"name": PROBE_TOOL_NAME, "description": "probe",
                                               "parameters": {"type": "object", "properties": {}}}}


@dataclasses.dataclass(frozen=True)
class ToolCall:
    index: int  # its place among the choice's calls
    id: str  # call_<24 hex>
    name: str
    arguments: str  # a JSON object, as text

    def body(self) -> dict:
        """As in a chat completion's ``message.tool_calls``."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


Parsed = list[tuple[str, dict]]  # (function name, arguments) of each call in a region


@dataclasses.dataclass(frozen=True)
class ToolFormat:
    name: str
    openers: tuple[str, ...]  # texts that open a call region anywhere in the output
    closer: str | None  # what ends one call (its region); None: the region runs to the end of the output
    bare_start: str | None  # a region's first character when the output starts with a call whose opener was dropped
    parse: Callable[[str], Parsed | None]  # a region's calls, or None when it is not calls


def _call(obj: object, arguments_key: str) -> tuple[str, dict] | None:
    """(name, arguments) of one call object, or None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    arguments = obj.get(arguments_key, obj.get("arguments", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    return (obj["name"], arguments) if isinstance(arguments, dict) else None


def _json_values(text: str, separator: str = "") -> list[Any] | None:
    """The JSON values ``text`` holds one after another (whitespace and ``separator`` between them), or None."""
    decoder, i = json.JSONDecoder(), 0
    values: list[Any] = []
    while True:
        while i < len(text) and (text[i].isspace() or (separator and text[i] == separator and values)):
            i += 1
        if i == len(text):
            return values or None
        try:
            value, i = decoder.raw_decode(text, i)
        except ValueError:
            return None
        values.append(value)


def _all_calls(objects: Iterable[object], arguments_key: str) -> Parsed | None:
    """Each object's call, or None when there are none or one is not a call."""
    calls: Parsed = []
    for obj in objects:
        call = _call(obj, arguments_key)
        if call is None:
            return None
        calls.append(call)
    return calls or None


def _parse_hermes(region: str) -> Parsed | None:
    values = _json_values(region)
    return _all_calls(values, "arguments") if values is not None and len(values) == 1 else None


def _parse_llama3(region: str) -> Parsed | None:
    values = _json_values(region, separator=";")
    return _all_calls(values, "parameters") if values is not None else None


def _parse_mistral(region: str) -> Parsed | None:
    values = _json_values(region)
    if values is None or len(values) != 1 or not isinstance(values[0], list):
        return None
    return _all_calls(values[0], "arguments")


HERMES = ToolFormat("hermes", ("<tool_call>",), "</tool_call>", None, _parse_hermes)
LLAMA3 = ToolFormat("llama3", ("<|python_tag|>",), None, "{", _parse_llama3)
MISTRAL = ToolFormat("mistral", ("[TOOL_CALLS]",), None, "[", _parse_mistral)


def tool_format(chat_template: str | dict[str, str] | None) -> ToolFormat | None:
    """The tool-call syntax a chat template teaches its model (the template renders the syntax into the prompt,
    or into earlier assistant turns): None when it names none of those this server parses."""
    if isinstance(chat_template, dict):  # named templates: apply_chat_template(tools=...) uses "tool_use"
        chat_template = chat_template.get("tool_use") or chat_template.get("default") or ""
    template = chat_template or ""
    if "<tool_call>" in template:
        return HERMES
    if "[TOOL_CALLS]" in template:
        return MISTRAL
    if "<|python_tag|>" in template or "ipython" in template:
        return LLAMA3
    return None


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _held_suffix(text: str, openers: tuple[str, ...]) -> int:
    """Length of the longest end of ``text`` that is the start of an opener (it may still become one)."""
    longest = 0
    for opener in openers:
        for k in range(min(len(text), len(opener) - 1), longest, -1):
            if opener.startswith(text[len(text) - k:]):
                longest = k
                break
    return longest


class ToolCallStream:
    """One choice's text in (``push``, then ``finish``), content and tool calls out, in output order: each call
    of ``format`` whole, once its region is read (at its closer, or at the end for formats without one).
    ``names``: the request's tools; ``parallel``: whether more than one call is kept (False: the first only).

    After a call, whitespace alone is not content (the newlines between a model's calls)."""

    def __init__(self, fmt: ToolFormat, names: Iterable[str], parallel: bool = True) -> None:
        self.format = fmt
        self.names = frozenset(names)
        self.parallel = parallel
        self.calls: list[ToolCall] = []
        self._buffer = ""  # text not given back yet
        self._opener: str | None = None  # the opener of the region being read ('' for a bare start), else None
        self._scanned = 0  # how much of the region's buffer holds no closer (each character is searched once)
        self._content_started = False  # some non-whitespace content was given back (no bare start any more)

    def push(self, text: str) -> list[str | ToolCall]:
        self._buffer += text
        return self._drain(final=False)

    def finish(self) -> list[str | ToolCall]:
        """What is left once the output has ended: an open region parsed (or given back as content)."""
        return self._drain(final=True)

    def _drain(self, final: bool) -> list[str | ToolCall]:
        fmt, closer = self.format, self.format.closer or ""
        out: list[str | ToolCall] = []
        while True:
            if self._opener is not None:  # in a call region
                end = self._buffer.find(closer, self._scanned) if closer else -1
                if end < 0 and not final:
                    self._scanned = max(0, len(self._buffer) - len(closer) + 1)
                    break
                region = self._buffer if end < 0 else self._buffer[:end]
                raw = self._opener + region + (closer if end >= 0 else "")
                self._buffer = "" if end < 0 else self._buffer[end + len(closer):]
                out += self._calls_or_text(region, raw)
                self._opener, self._scanned = None, 0
                continue
            found = [(i, o) for o in fmt.openers if (i := self._buffer.find(o)) >= 0]
            if found:
                at, opener = min(found)
                before, self._buffer = self._buffer[:at], self._buffer[at + len(opener):]
                out += self._content(before)
                self._opener = opener
                continue
            if fmt.bare_start and not self._content_started and not self.calls:
                rest = self._buffer.lstrip()
                if rest and not final and any(o.startswith(rest) for o in fmt.openers):
                    break  # '[' may be the start of '[TOOL_CALLS]'
                if rest.startswith(fmt.bare_start):
                    self._buffer, self._opener = rest, ""
                    continue
                if not rest and not final:  # only whitespace yet: it may come before a call
                    break
            keep = 0 if final else _held_suffix(self._buffer, fmt.openers)
            text = self._buffer[:len(self._buffer) - keep]
            if self.calls and not text.strip() and not final:
                break  # whitespace after a call: held until something else comes (dropped at the end)
            self._buffer = self._buffer[len(text):]
            out += self._content(text)
            break
        return _merged(out)

    def _content(self, text: str) -> list[str]:
        """``text`` as content, but for whitespace after a call (the newlines between a model's calls)."""
        if self.calls and not text.strip():
            return []
        if text.strip():
            self._content_started = True
        return [text] if text else []

    def _calls_or_text(self, region: str, raw: str) -> list[str | ToolCall]:
        parsed = self.format.parse(region)
        if parsed is not None and self._opener == "" and not all(name in self.names for name, _ in parsed):
            parsed = None  # a bare JSON answer naming no tool of the request: not a call
        if parsed is None:
            self._content_started = True
            return [raw]
        calls: list[str | ToolCall] = []
        for name, arguments in parsed:
            if self.calls and not self.parallel:
                break
            call = ToolCall(len(self.calls), new_call_id(), name, json.dumps(arguments, ensure_ascii=False))
            self.calls.append(call)
            calls.append(call)
        return calls


def _merged(events: list[str | ToolCall]) -> list[str | ToolCall]:
    out: list[str | ToolCall] = []
    for event in events:
        if isinstance(event, str) and out and isinstance(out[-1], str):
            out[-1] += event
        else:
            out.append(event)
    return out


def parse_tool_calls(text: str, fmt: ToolFormat, names: Iterable[str],
                     parallel: bool = True) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) of a whole output: the content is None when the output is calls and nothing else."""
    stream = ToolCallStream(fmt, names, parallel)
    events = stream.push(text) + stream.finish()
    content = "".join(e for e in events if isinstance(e, str))
    return (None if stream.calls and not content.strip() else content), stream.calls


def special_openers(tokenizer: Tokenizer, fmt: ToolFormat) -> dict[str, int]:
    """The openers of ``fmt`` that ``tokenizer`` has as special tokens (Llama 3's ``<|python_tag|>``, Mistral's
    ``[TOOL_CALLS]``), which a detokenizer that skips special tokens would drop: {text: token id}."""
    return {added.content: token_id for token_id, added in getattr(tokenizer, "added_tokens_decoder", {}).items()
            if added.special and added.content in fmt.openers}


def tool_support(tokenizer: Tokenizer) -> tuple[ToolFormat | None, str]:
    """(the format of the model's tool calls, '') where its chat template renders tools (a probe tool's name shows
    in the prompt) and teaches a format parsed here; else (None, why not)."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return None, "this model's tokenizer has no chat template, so it cannot be shown tools"
    try:
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": "?"}], tools=[PROBE_TOOL],
                                                 tokenize=False, add_generation_prompt=True)
    except Exception as e:  # a template that fails on tools
        return None, f"this model's chat template cannot render tools ({type(e).__name__}: {e})"
    if PROBE_TOOL_NAME not in rendered:
        return None, "this model's chat template does not render tools (the model was not made for tool calls)"
    fmt = tool_format(template)
    if fmt is None:
        return None, ("this model's chat template renders tools, but in none of the tool-call formats this server "
                      "parses (Qwen/Hermes <tool_call>, Llama 3 JSON, Mistral [TOOL_CALLS])")
    return fmt, ""
