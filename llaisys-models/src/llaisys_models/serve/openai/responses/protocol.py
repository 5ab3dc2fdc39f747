"""OpenAI's Responses API (``POST /v1/responses``) for text: its request checked field by field, its response
object and its stream of semantic events.

The input is a string (one user message) or a list of message items (``{"role", "content"}``, content a string
or ``input_text`` / ``output_text`` parts; ``reasoning`` items, an earlier turn's thinking, are dropped),
``instructions`` a system message before them; the reply is one ``message`` output item with one ``output_text``
part, constrained where ``text.format`` asks for ``json_object`` or ``json_schema`` (serve/structured.py). A
reasoning model's thinking comes first, as a ``reasoning`` item (``content``: one ``reasoning_text`` part; no
summary). Nothing is stored (``store`` is answered false), so ``previous_response_id`` is refused, as are tools,
the ``reasoning`` options, images and files, each by its parameter's name.

A stream is ``event: <type>`` / ``data: {...}`` pairs, each with a ``sequence_number``: ``response.created``,
``response.in_progress``; a reasoning item's ``response.output_item.added``, ``response.content_part.added``,
``response.reasoning_text.delta`` per piece of thinking, ``response.reasoning_text.done``,
``response.content_part.done`` and ``response.output_item.done``; then the message's
``response.output_item.added``, ``response.content_part.added``, ``response.output_text.delta`` per piece of text,
``response.output_text.done``, ``response.content_part.done``, ``response.output_item.done``; and
``response.completed`` (``response.incomplete`` when ``max_output_tokens`` cut it short, ``response.failed`` on an
engine error). There is no ``[DONE]``. Where the server parses no thinking, the message's item opens at once.
"""

from __future__ import annotations

from typing import Any

from ....engine.sampling import SamplingParams
from ... import sse
from ...engine import Usage
from ...errors import invalid
from ...request_body import field, json_type
from ..protocol import MAX_MESSAGES, ROLES, unsupported

TEXT_PARTS = ("input_text", "output_text", "text")  # content parts whose text is read


# -- the request ---------------------------------------------------------------------------

def check_unsupported(body: dict) -> None:
    """Refuse, by name, what this server cannot honour (unless sent with its neutral value)."""
    unsupported(body, "tools", ([],))
    unsupported(body, "tool_choice", ("none", "auto"))
    unsupported(body, "include", ([],))
    unsupported(body, "background", (False,))
    unsupported(body, "truncation", ("disabled",))
    unsupported(body, "top_logprobs", (0,))
    unsupported(body, "reasoning", ({}, {"effort": None}))
    for name in ("previous_response_id", "conversation", "prompt"):
        if body.get(name) is not None:
            raise invalid(f"'{name}' is not supported by this server (it stores no responses or prompts); send "
                          f"the whole conversation as 'input'", name, "unsupported_parameter")
    field(body, "text", "object")  # its format: serve/structured.py
    field(body, "store", "boolean")
    field(body, "instructions", "string")
    metadata = field(body, "metadata", "object", default={})
    if len(metadata) > 16 or not all(isinstance(v, str) for v in metadata.values()):
        raise invalid("'metadata' holds at most 16 string values", "metadata")


def input_messages(body: dict) -> list[dict]:
    """``instructions`` and ``input`` as [{"role", "content"}] for the chat template."""
    instructions = field(body, "instructions", "string")
    value = body.get("input")
    if value is None:
        raise invalid("missing required parameter 'input'", "input", "missing_required_parameter")
    if isinstance(value, str):
        items = [{"role": "user", "content": value}]
    elif isinstance(value, list):
        if not value:
            raise invalid("'input' must contain at least one item", "input", "empty_array")
        if len(value) > MAX_MESSAGES:
            raise invalid(f"'input' holds {len(value)} items; at most {MAX_MESSAGES} are allowed", "input",
                          "array_too_long")
        items = [_message(item, f"input[{i}]") for i, item in enumerate(value)
                 if not (isinstance(item, dict) and item.get("type") == "reasoning")]  # earlier thinking: dropped
    else:
        raise invalid(f"'input' must be a string or an array of message items, got {json_type(value)}", "input",
                      "invalid_type")
    return ([{"role": "system", "content": instructions}] if instructions is not None else []) + items


def _message(item: Any, param: str) -> dict:
    if not isinstance(item, dict):
        raise invalid(f"'{param}' must be an object, got {json_type(item)}", param, "invalid_type")
    kind = field(item, "type", "string", default="message", param=f"{param}.type")
    if kind != "message":
        raise invalid(f"'{param}.type' = {kind!r} is not supported; only message items are", f"{param}.type",
                      "unsupported_parameter")
    role = field(item, "role", "string", required=True, param=f"{param}.role")
    if role not in ROLES:
        raise invalid(f"'{param}.role' = {role!r} is not a supported role; use one of {', '.join(ROLES)}",
                      f"{param}.role", "invalid_role")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": ROLES[role], "content": content}
    if not isinstance(content, list):
        what = "missing" if content is None else f"got {json_type(content)}"
        raise invalid(f"'{param}.content' must be a string or an array of text parts, {what}", f"{param}.content",
                      "invalid_type" if content is not None else "missing_required_parameter")
    texts = []
    for j, part in enumerate(content):
        p = f"{param}.content[{j}]"
        if not isinstance(part, dict):
            raise invalid(f"'{p}' must be an object, got {json_type(part)}", p, "invalid_type")
        if part.get("type") not in TEXT_PARTS:
            raise invalid(f"'{p}.type' = {part.get('type')!r} is not supported; only text parts "
                          f"({', '.join(TEXT_PARTS)}) are", f"{p}.type", "unsupported_content")
        texts.append(field(part, "text", "string", required=True, param=f"{p}.text"))
    return {"role": ROLES[role], "content": "".join(texts)}


# -- the response ---------------------------------------------------------------------------

class ResponseObject:
    """The ``response`` object of one request as it goes: created, in progress, completed / incomplete / failed,
    and the stream events that say so. ``reasoning``: the server parses a reasoning model's thinking, which comes
    first as an output item of its own (so the message's item opens only when its text starts)."""

    def __init__(self, response_id: str, created: int, model: str, body: dict, params: SamplingParams,
                 reasoning: bool = False):
        self.id = response_id
        self.item_id = "msg_" + response_id.removeprefix("resp_")
        self.reasoning_id = "rs_" + response_id.removeprefix("resp_")
        self.reasoning = reasoning
        self.head: dict[str, Any] = {
            "id": response_id, "object": "response", "created_at": created, "model": model,
            "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
            "metadata": body.get("metadata") or {}, "parallel_tool_calls": True, "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None}, "store": False, "temperature": params.temperature,
            "text": {"format": text_format(body)}, "tool_choice": "auto", "tools": [], "top_p": params.top_p,
            "truncation": "disabled", "user": body.get("user")}
        self.sequence = 0
        # a stream's progress: the text of each item so far, and which items are open or done
        self.thought: str | None = None  # the thinking (None: no reasoning item)
        self.text = ""
        self._thinking_open = self._message_open = False

    def body(self, status: str, text: str | None = None, usage: Usage | None = None, error: dict | None = None,
             thought: str | None = None) -> dict:
        """The response object; ``text``: the message's (None: no output yet), ``thought``: the thinking's (None:
        no reasoning item)."""
        done = "completed" if status == "completed" else "incomplete"
        output = [] if thought is None else [self.reasoning_item(thought, "completed" if text else done)]
        output += [] if text is None else [self.item(text, done)]
        return {**self.head, "status": status, "error": error,
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                "output": output, "usage": None if usage is None else usage_body(usage)}

    def item(self, text: str | None, status: str) -> dict:
        content = [] if text is None else [output_text(text)]
        return {"type": "message", "id": self.item_id, "status": status, "role": "assistant", "content": content}

    def reasoning_item(self, thought: str | None, status: str) -> dict:
        content = [] if thought is None else [reasoning_text(thought)]
        return {"type": "reasoning", "id": self.reasoning_id, "status": status, "summary": [], "content": content}

    def finished(self, reason: str, text: str, usage: Usage, thought: str | None = None) -> dict:
        return self.body("incomplete" if reason == "length" else "completed", text, usage, thought=thought)

    # -- stream events ----------------------------------------------------------------------

    def event(self, kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return sse.event(kind, data)

    @property
    def message_index(self) -> int:
        return 0 if self.thought is None else 1

    def opening(self) -> list[str]:
        events = [self.event("response.created", response=self.body("in_progress")),
                  self.event("response.in_progress", response=self.body("in_progress"))]
        return events if self.reasoning else events + self._open_message()

    def delta(self, text: str, thought: str = "") -> list[str]:
        """The events of more ``thought`` (thinking), then more ``text`` (the message's)."""
        events = []
        if thought:
            if self.thought is None:
                events += self._open_thinking()
            self.thought = (self.thought or "") + thought
            events.append(self.event("response.reasoning_text.delta", item_id=self.reasoning_id, output_index=0,
                                     content_index=0, delta=thought))
        if text:
            events += self._close_thinking("completed") + ([] if self._message_open else self._open_message())
            self.text += text
            events.append(self.event("response.output_text.delta", item_id=self.item_id,
                                     output_index=self.message_index, content_index=0, delta=text, logprobs=[]))
        return events

    def closing(self, reason: str, usage: Usage) -> list[str]:
        final = self.finished(reason, self.text, usage, self.thought)
        events = self._close_thinking(final["output"][0]["status"]) if self.thought is not None else []
        events += [] if self._message_open else self._open_message()
        where = {"item_id": self.item_id, "output_index": self.message_index, "content_index": 0}
        return events + [self.event("response.output_text.done", **where, text=self.text, logprobs=[]),
                         self.event("response.content_part.done", **where, part=output_text(self.text)),
                         self.event("response.output_item.done", output_index=self.message_index,
                                    item=final["output"][-1]),
                         self.event(f"response.{final['status']}", response=final)]

    def failed(self, message: str) -> str:
        return self.event("response.failed", response=self.body("failed", error={"code": "server_error",
                                                                                 "message": message}))

    def _open_message(self) -> list[str]:
        self._message_open = True
        where = {"item_id": self.item_id, "output_index": self.message_index, "content_index": 0}
        return [self.event("response.output_item.added", output_index=self.message_index,
                           item=self.item(None, "in_progress")),
                self.event("response.content_part.added", **where, part=output_text(""))]

    def _open_thinking(self) -> list[str]:
        self._thinking_open = True
        where = {"item_id": self.reasoning_id, "output_index": 0, "content_index": 0}
        return [self.event("response.output_item.added", output_index=0,
                           item=self.reasoning_item(None, "in_progress")),
                self.event("response.content_part.added", **where, part=reasoning_text(""))]

    def _close_thinking(self, status: str) -> list[str]:
        if not self._thinking_open:
            return []
        self._thinking_open = False
        thought = self.thought or ""
        where = {"item_id": self.reasoning_id, "output_index": 0, "content_index": 0}
        return [self.event("response.reasoning_text.done", **where, text=thought),
                self.event("response.content_part.done", **where, part=reasoning_text(thought)),
                self.event("response.output_item.done", output_index=0, item=self.reasoning_item(thought, status))]


def text_format(body: dict) -> dict:
    """The request's ``text.format`` as the response echoes it (checked by then)."""
    fmt = (body.get("text") or {}).get("format") or {"type": "text"}
    if fmt["type"] != "json_schema":
        return {"type": fmt["type"]}
    return {"type": "json_schema", "name": fmt["name"], "schema": fmt.get("schema"), "strict": fmt.get("strict"),
            "description": fmt.get("description")}


def output_text(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def reasoning_text(text: str) -> dict:
    return {"type": "reasoning_text", "text": text}


def usage_body(usage: Usage) -> dict:
    return {"input_tokens": usage.prompt_tokens, "input_tokens_details": {"cached_tokens": usage.cached_tokens},
            "output_tokens": usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
            "total_tokens": usage.prompt_tokens + usage.completion_tokens}
