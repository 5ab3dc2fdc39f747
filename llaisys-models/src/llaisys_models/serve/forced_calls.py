"""``tool_choice`` "required" and a named function: a grammar that admits exactly the model's own tool-call syntax.

The reply is constrained (llguidance, as structured outputs) to calls and nothing else, written as the model's
chat template teaches it (``tool_calls.ToolFormat``), so the text parses back into ``tool_calls`` with the same
parser as an unforced reply and reads to the model like its own calls. Each call names one of the allowed
functions and its arguments follow that function's ``parameters`` schema:

    hermes   <tool_call>\\n{"name": "f", "arguments": ARGS}\\n</tool_call>   calls joined by "\\n"
    llama3   {"name": "f", "parameters": ARGS}                               one call (Llama 3's templates render one)
    mistral  [TOOL_CALLS][{"name": "f", "arguments": ARGS}, ...]             ([TOOL_CALLS] as its special token)

"required": one call of any of the tools, or several where ``parallel_tool_calls`` allows (the model ends the
reply with EOS after any call); a named function: exactly one call of it (the reply ends there). JSON is written
with the separators of ``json.dumps`` (``", "``, ``": "``), as templates render arguments with ``tojson``, and
no other whitespace, so a model cannot pad its call with endless spaces.

vLLM forces the same choices with a JSON schema of ``[{"name", "parameters"}]`` (required) or of the function's
arguments (named), whatever syntax the model was trained on; llama.cpp's server builds a grammar of the model's
own syntax, as here.
"""

from __future__ import annotations

import dataclasses
import json

from .tool_calls import ToolFormat

# separators of json.dumps (and of Jinja's tojson): what the model saw in its prompt's tool calls
_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclasses.dataclass(frozen=True)
class CallSyntax:
    opener: str  # before the calls (the format's opener, where it is a special token, is written as that token)
    call_start: str
    arguments_key: str
    call_end: str
    separator: str | None  # between two calls; None: one call per reply
    closer: str


SYNTAX = {
    "hermes": CallSyntax("", "<tool_call>\n", "arguments", "\n</tool_call>", "\n", ""),
    "llama3": CallSyntax("", "", "parameters", "", None, ""),
    "mistral": CallSyntax("[TOOL_CALLS][", "", "arguments", "", ", ", "]"),
}


def arguments_schema(tool: dict) -> dict:
    """The JSON schema a call's arguments must match: the function's ``parameters`` (an object; none: an empty
    parameter list, ``{}``), in json.dumps' style. Where it does not say, the arguments are its properties only
    (``additionalProperties: false``, as llama.cpp's schema grammars default): a function takes no argument it
    does not declare, and an unbounded extra key is where a forced model rambles on."""
    parameters = dict(tool["function"].get("parameters") or {"properties": {}})
    parameters.setdefault("type", "object")
    parameters.setdefault("additionalProperties", False)
    return {**parameters, "x-guidance": _JSON_STYLE}


def _literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _text(text: str, special: dict[str, int]) -> str:
    """A Lark expression for ``text``: string literals, with each marker the tokenizer has as a special token
    (``special``: {text: id}) written as that token (``<[id]>``): the model writes the token, not its characters."""
    parts = []
    while text:
        at, marker = min(((text.find(m), m) for m in special if m in text), default=(-1, ""))
        if at < 0:
            parts.append(_literal(text))
            break
        if at:
            parts.append(_literal(text[:at]))
        parts.append(f"<[{special[marker]}]>")
        text = text[at + len(marker):]
    return " ".join(parts) if parts else '""'


def grammar_source(fmt: ToolFormat, tools: list[dict], several: bool, special: dict[str, int]) -> str:
    """The Lark grammar (llguidance's dialect: ``%json`` embeds a JSON schema) of a reply that is calls of
    ``tools`` (OpenAI function tools) in ``fmt``'s syntax: one or more when ``several`` (and the syntax has a
    separator), else exactly one."""
    syntax = SYNTAX[fmt.name]
    rules: list[str] = []
    for i, tool in enumerate(tools):
        head = f'{syntax.call_start}{{"name": {json.dumps(tool["function"]["name"])}, "{syntax.arguments_key}": '
        rules.append(f"call_{i}: {_text(head, special)} args_{i} {_text('}' + syntax.call_end, special)}")
        rules.append(f"args_{i}: %json {json.dumps(arguments_schema(tool), ensure_ascii=False)}")
    separator = syntax.separator if several else None  # (None: one call per reply in this syntax)
    calls = "call" + (f" ({_text(separator, special)} call)*" if separator is not None else "")
    opener = _text(syntax.opener, special) + " " if syntax.opener else ""
    closer = " " + _text(syntax.closer, special) if syntax.closer else ""
    return "\n".join([f"start: {opener}{calls}{closer}", "call: " + " | ".join(f"call_{i}" for i in range(len(tools))),
                      *rules]) + "\n"
