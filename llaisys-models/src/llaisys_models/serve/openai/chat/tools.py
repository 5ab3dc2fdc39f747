"""A chat request's tools: ``tools``, ``tool_choice`` and ``parallel_tool_calls`` checked into a ``ToolRequest``:
what the chat template renders, what a grammar forces (serve/structured.py, serve/forced_calls.py) and what is
parsed from the reply (serve/tool_calls.py, through serving.ToolParsers)."""

from __future__ import annotations

import dataclasses
import json
import re

from llaisys import LlaisysValueError

from ....text.tokenizer import check_text
from ...errors import invalid
from ...request_body import field, json_type

TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names
MAX_TOOLS = 128  # OpenAI's limit


@dataclasses.dataclass(frozen=True)
class ToolRequest:
    """The tools a chat request offers: rendered through the chat template, their calls parsed from its output."""
    tools: list[dict]  # [{"type": "function", "function": {"name", "description"?, "parameters"?}}]
    names: tuple[str, ...]
    parallel: bool  # ``parallel_tool_calls``: more than one call per reply
    # the functions the reply must call, through a grammar ("required": any of the tools; a named function: that
    # one, once); empty: "auto", the model decides
    forced: tuple[str, ...] = ()

    @property
    def forced_tools(self) -> list[dict]:
        return [tool for tool in self.tools if tool["function"]["name"] in self.forced]


def chat_tools(body: dict) -> ToolRequest | None:
    """``tools``, ``tool_choice`` and ``parallel_tool_calls``: what to render, force and parse, or None when the
    request has no tools or ``tool_choice`` is "none" (then, as under vLLM's
    ``--exclude-tools-when-tool-choice-none``, the model is shown no tools and its whole output is content)."""
    tools = field(body, "tools", "array", default=[])
    if len(tools) > MAX_TOOLS:
        raise invalid(f"'tools' holds {len(tools)} tools; at most {MAX_TOOLS} are allowed", "tools", "array_too_long")
    checked = [_tool(tool, f"tools[{i}]") for i, tool in enumerate(tools)]
    names = tuple(tool["function"]["name"] for tool in checked)
    for i, name in enumerate(names):
        if name in names[:i]:
            raise invalid(f"'tools[{i}].function.name' = {name!r} names a function that an earlier tool already "
                          f"names", f"tools[{i}].function.name")
    parallel = field(body, "parallel_tool_calls", "boolean", default=True)
    choice, function = tool_choice(body, names)
    if choice == "none" or not checked:
        return None
    if choice == "auto":
        return ToolRequest(checked, names, parallel)
    if choice == "required":
        return ToolRequest(checked, names, parallel, forced=names)
    assert function is not None  # a named function: one call of it
    return ToolRequest(checked, names, False, forced=(function,))


def _tool(tool: object, param: str) -> dict:
    if not isinstance(tool, dict):
        raise invalid(f"'{param}' must be an object, got {json_type(tool)}", param, "invalid_type")
    kind = field(tool, "type", "string", required=True, param=f"{param}.type")
    if kind != "function":
        raise invalid(f"'{param}.type' = {kind!r} is not supported; only 'function' tools are", f"{param}.type")
    function = field(tool, "function", "object", required=True, param=f"{param}.function")
    name = field(function, "name", "string", required=True, param=f"{param}.function.name")
    if not TOOL_NAME.fullmatch(name):
        raise invalid(f"'{param}.function.name' = {name!r} must be 1 to 64 letters, digits, '_' or '-'",
                      f"{param}.function.name")
    out = {"name": name}
    description = field(function, "description", "string", param=f"{param}.function.description")
    if description is not None:
        out["description"] = description
    parameters = field(function, "parameters", "object", param=f"{param}.function.parameters")
    if parameters is not None:
        if parameters.get("type", "object") != "object":  # arguments are a JSON object (OpenAI refuses others too)
            raise invalid(f"'{param}.function.parameters' must be a JSON Schema of type 'object', got type "
                          f"{parameters['type']!r}", f"{param}.function.parameters")
        out["parameters"] = parameters
    field(function, "strict", "boolean", param=f"{param}.function.strict")
    try:
        check_text(json.dumps(out, ensure_ascii=False), f"'{param}'")
    except LlaisysValueError as e:  # a lone surrogate
        raise invalid(str(e), param, "invalid_text") from None
    return {"type": "function", "function": out}


def tool_choice(body: dict, names: tuple[str, ...]) -> tuple[str, str | None]:
    """``tool_choice`` as (choice, function): ("none" | "auto" (the default) | "required", None), or ("function",
    its name) for a named function (``{"type": "function", "function": {"name"}}``). Only with ``tools``, but for
    "none"."""
    choice = body.get("tool_choice")
    if choice is None:
        return "auto", None
    if isinstance(choice, dict):
        if field(choice, "type", "string", required=True, param="tool_choice.type") != "function":
            raise invalid(f"'tool_choice.type' = {choice['type']!r} is not supported; use 'function'",
                          "tool_choice.type")
        function = field(choice, "function", "object", required=True, param="tool_choice.function")
        name = field(function, "name", "string", required=True, param="tool_choice.function.name")
        if name not in names:
            raise invalid(f"'tool_choice.function.name' = {name!r} is not one of the request's tools",
                          "tool_choice.function.name")
        return "function", name
    if choice not in ("none", "auto", "required"):
        raise invalid(f"'tool_choice' must be 'none', 'auto', 'required' or a named function, got "
                      f"{choice if isinstance(choice, str) else json_type(choice)!r}", "tool_choice")
    if choice != "none" and not names:
        raise invalid("'tool_choice' is only allowed when 'tools' are specified", "tool_choice")
    return choice, None
