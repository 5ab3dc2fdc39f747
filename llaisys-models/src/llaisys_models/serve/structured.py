"""``response_format``: structured outputs for chat and completions, as a ``grammar.Grammar`` on the request.

    {"type": "text"}                                   unconstrained (the default)
    {"type": "json_object"}                            one JSON object
    {"type": "json_schema", "json_schema": {"name": "...", "schema": {...}, "strict": true}}

Every choice of a request with one is constrained (strict or not: what is asked for is what comes out), and
ends when its JSON is complete (finish_reason "stop") or at max_tokens ("length", the JSON cut short). A
schema the grammar library cannot compile is a 400 naming ``response_format``.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import re
import threading

from ..grammar import Grammar, GrammarError
from .engine import SamplingParams
from .errors import invalid

PARAM = "response_format"
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for json_schema.name


def parse(body: dict) -> tuple[str, object] | None:
    """(kind, schema) of the request's ``response_format``: ("json_schema", dict), ("json_object", None), or None
    for text / absent."""
    value = body.get(PARAM)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid(f"'{PARAM}' must be an object with a 'type', got {type(value).__name__}", PARAM, "invalid_type")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return "json_object", None
    if kind != "json_schema":
        raise invalid(f"'{PARAM}.type' must be 'text', 'json_object' or 'json_schema', got {kind!r}", PARAM)
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise invalid(f"'{PARAM}.json_schema' must be an object with 'name' and 'schema'", PARAM,
                      "missing_required_parameter" if spec is None else "invalid_type")
    name = spec.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise invalid(f"'{PARAM}.json_schema.name' must be 1 to 64 letters, digits, '_' or '-', got {name!r}", PARAM)
    if not isinstance(spec.get("strict", False), bool) and spec.get("strict") is not None:
        raise invalid(f"'{PARAM}.json_schema.strict' must be a boolean", PARAM, "invalid_type")
    schema = spec.get("schema")
    if schema is None:  # OpenAI's schema is optional: any JSON object then
        return "json_object", None
    if not isinstance(schema, dict):
        raise invalid(f"'{PARAM}.json_schema.schema' must be a JSON Schema object", PARAM, "invalid_type")
    return "json_schema", schema


class Grammars:
    """Compiles requests' ``response_format`` off the event loop, with a tokenizer of its own (a HF tokenizer is
    not for two threads at once; llguidance's view of it is built on the first request, about a second)."""

    def __init__(self, tokenizer):
        self._tokenizer = copy.deepcopy(tokenizer)
        self._lock = threading.Lock()

    def _compile(self, kind: str, schema) -> Grammar:
        with self._lock:
            try:
                if kind == "json_object":
                    return Grammar.json_object(self._tokenizer)
                return Grammar.json_schema(self._tokenizer, schema)
            except GrammarError as e:
                raise invalid(f"'{PARAM}' cannot be used: {e}", PARAM) from None

    async def of(self, body: dict) -> Grammar | None:
        """The grammar the request's ``response_format`` asks for (None: unconstrained)."""
        spec = parse(body)
        if spec is None:
            return None
        return await asyncio.get_running_loop().run_in_executor(None, self._compile, *spec)


def constrain(body: dict, params: SamplingParams, grammar: Grammar | None) -> SamplingParams:
    """``params`` with the request's grammar. A grammar is not verified against drafts: the server's default
    speculation is dropped for it, and a request that asks for both is refused."""
    if grammar is None:
        return params
    if params.speculation is not None:
        if body.get("speculative") not in (None, "off"):
            raise invalid(f"'{PARAM}' cannot be combined with 'speculative' decoding", PARAM)
        params = dataclasses.replace(params, speculation=None)
    return dataclasses.replace(params, grammar=grammar)
