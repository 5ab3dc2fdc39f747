"""Constrained replies: ``response_format`` (chat, completions), ``text.format`` (responses) and a forcing
``tool_choice`` (chat), each a ``grammar.Grammar`` on the request.

    response_format  {"type": "text"}                                   unconstrained (the default)
                     {"type": "json_object"}                            one JSON object
                     {"type": "json_schema", "json_schema": {"name": "...", "schema": {...}, "strict": true}}
    text.format      {"type": "text"} | {"type": "json_object"}
                     {"type": "json_schema", "name": "...", "schema": {...}, "strict": true}   (flat, as OpenAI's)
    tool_choice      "required" | {"type": "function", "function": {"name": "..."}}   (serve/forced_calls.py)

Every choice of a request with one is constrained (strict or not: what is asked for is what comes out), and
ends when its grammar is complete (finish_reason "stop", or "tool_calls" for calls) or at max_tokens ("length",
the JSON cut short). A schema the grammar library cannot compile is a 400 naming the parameter that holds it.

Whatever a request's grammar is, it cannot harm another request (engine/grammar.py): it is compiled here, in an
executor, once per request (its n choices copy the compiled matcher), never on the engine thread or the event
loop. Before it compiles, each JSON schema (a json_schema format's, or the parameters of each function a
forcing tool_choice names) is held to OpenAI's published size limits and must have finite values
(engine/schema_check.py); after, the grammar must allow a first token of the model's vocabulary. Each failure
is a 400 that names the parameter and the limit or the path at fault, in one line.

llguidance's view of the tokenizer (seconds at a vocabulary of 150k on a loaded machine) is built once, on a
thread started with the server (``warm_up``): a constrained request that comes before it is ready waits for it
(the view's lock), the others never do.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import re
import threading
from typing import TYPE_CHECKING

from ..engine.grammar import Grammar, GrammarError, check_schemas, grammar_tokenizer
from .engine import SamplingParams
from .errors import invalid
from .forced_calls import arguments_schema, grammar_source
from .tool_calls import ToolFormat, special_openers

if TYPE_CHECKING:
    from ..text.tokenizer import Tokenizer
    from .openai.chat.tools import ToolRequest

log = logging.getLogger("llaisys.serve")

PARAM = "response_format"
TEXT_FORMAT = "text.format"
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for json_schema.name

ForcedCalls = tuple[ToolFormat, list[dict], bool]  # a forcing tool_choice: the format, the tools to call, several or one
# ("json_schema", schema dict), ("json_object", None), or ("tool_choice", ForcedCalls)
Spec = tuple[str, dict | ForcedCalls | None]


def parse(body: dict) -> Spec | None:
    """(kind, schema) of a chat or completions request's ``response_format``: ("json_schema", dict),
    ("json_object", None), or None for text / absent."""
    value = body.get(PARAM)
    if value is None:
        return None
    kind = _kind(value, PARAM)
    if kind is None or kind == "json_object":
        return None if kind is None else ("json_object", None)
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise invalid(f"'{PARAM}.json_schema' must be an object with 'name' and 'schema'", PARAM,
                      "missing_required_parameter" if spec is None else "invalid_type")
    return _schema(spec, f"{PARAM}.json_schema", PARAM)


def parse_text_format(body: dict) -> Spec | None:
    """(kind, schema) of a responses request's ``text.format`` (its json_schema fields sit in the format itself),
    or None for text / absent."""
    text = body.get("text")
    if text is None:
        return None
    if not isinstance(text, dict):
        raise invalid("'text' must be an object", "text", "invalid_type")
    value = text.get("format")
    if value is None:
        return None
    kind = _kind(value, TEXT_FORMAT)
    if kind is None or kind == "json_object":
        return None if kind is None else ("json_object", None)
    return _schema(value, TEXT_FORMAT, TEXT_FORMAT)


def _kind(value: object, param: str) -> str | None:
    if not isinstance(value, dict):
        raise invalid(f"'{param}' must be an object with a 'type', got {type(value).__name__}", param, "invalid_type")
    kind = value.get("type")
    if kind not in ("text", "json_object", "json_schema"):
        raise invalid(f"'{param}.type' must be 'text', 'json_object' or 'json_schema', got {kind!r}", param)
    return None if kind == "text" else kind


def _schema(spec: dict, where: str, param: str) -> Spec:
    """A json_schema format's ``name``, ``strict`` and ``schema`` (in ``spec``, which is at ``where``)."""
    name = spec.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise invalid(f"'{where}.name' must be 1 to 64 letters, digits, '_' or '-', got {name!r}", param)
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        raise invalid(f"'{where}.strict' must be a boolean", param, "invalid_type")
    schema = spec.get("schema")
    if schema is None:  # OpenAI's schema is optional: any JSON object then
        return "json_object", None
    if not isinstance(schema, dict):
        raise invalid(f"'{where}.schema' must be a JSON Schema object", param, "invalid_type")
    return "json_schema", schema


@dataclasses.dataclass(frozen=True)
class Constraint:
    grammar: Grammar
    param: str  # the request parameter that asked for it (errors name it)


class Grammars:
    """Compiles requests' grammars off the event loop, with a tokenizer of its own (a HF tokenizer is not for two
    threads at once)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = copy.deepcopy(tokenizer)
        self._lock = threading.Lock()

    def warm_up(self) -> threading.Thread:
        """Build llguidance's view of the tokenizer on a thread of its own (returned, started)."""
        def build() -> None:
            try:
                grammar_tokenizer(self._tokenizer)
            except GrammarError as e:  # no llguidance, a slow tokenizer: constrained requests will say so
                log.warning("structured outputs unavailable: %s", e)
        thread = threading.Thread(target=build, name="llaisys-grammar-warm-up", daemon=True)
        thread.start()
        return thread

    def _compile(self, param: str, kind: str, source: dict | ForcedCalls | None) -> Constraint:
        with self._lock:
            try:
                if kind == "json_object":
                    grammar = Grammar.json_object(self._tokenizer)
                elif kind == "json_schema":
                    assert isinstance(source, dict)  # (the schema: parse / parse_text_format)
                    grammar = Grammar.json_schema(self._tokenizer, source)
                else:  # tool_choice: source = (the format, the tools to call, several calls or one)
                    assert isinstance(source, tuple)
                    fmt, tools, several = source
                    check_schemas([(arguments_schema(tool), f"'parameters' of function {tool['function']['name']!r}")
                                   for tool in tools])
                    lark = grammar_source(fmt, tools, several, special_openers(self._tokenizer, fmt))
                    grammar = Grammar.lark(self._tokenizer, lark, what=kind)
            except GrammarError as e:
                raise invalid(f"'{param}' cannot be used: {e}", param) from None
        return Constraint(grammar, param)

    async def of(self, body: dict, tools: ToolRequest | None = None, tool_format: ToolFormat | None = None,
                 responses: bool = False) -> Constraint | None:
        """The grammar a request asks for (None: unconstrained): its format (``response_format``, or ``text.format``
        when ``responses``), or, for a ``tool_choice`` that forces calls (``tools``: a chat ToolRequest), calls of
        ``tool_format``'s syntax."""
        spec = parse_text_format(body) if responses else parse(body)
        param = TEXT_FORMAT if responses else PARAM
        if tools is not None and tools.forced:
            if spec is not None:
                raise invalid(f"'{PARAM}' cannot be combined with a 'tool_choice' that forces tool calls (the reply is "
                              f"the calls)", PARAM)
            assert tool_format is not None  # (a request with tools is refused first where the model has no format)
            # "required": one call, or several where parallel_tool_calls allows; a named function: one (not parallel)
            spec, param = ("tool_choice", (tool_format, tools.forced_tools, tools.parallel)), "tool_choice"
        if spec is None:
            return None
        return await asyncio.get_running_loop().run_in_executor(None, self._compile, param, *spec)


def constrain(body: dict, params: SamplingParams, constraint: Constraint | None) -> SamplingParams:
    """``params`` with the request's grammar. A grammar is not verified against drafts: the server's default
    speculation is dropped for it, and a request that asks for both is refused."""
    if constraint is None:
        return params
    if params.speculation is not None:
        if body.get("speculative") not in (None, "off"):
            raise invalid(f"'{constraint.param}' cannot be combined with 'speculative' decoding", constraint.param)
        params = dataclasses.replace(params, speculation=None)
    return dataclasses.replace(params, grammar=constraint.grammar)
