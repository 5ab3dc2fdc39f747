"""OpenAI's request parameters, checked field by field, and its response and stream-chunk bodies.

Requests are parsed by hand rather than by a schema library so that every rejection names its
parameter in OpenAI's words (``param`` = ``messages[2].role``) and says what was expected.
Unknown parameters are ignored (clients send vendor extras); known ones this server cannot
honour (echo, suffix, ...) are refused rather than silently dropped.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re

from llaisys import LlaisysValueError

from ..engine.penalties import BIAS_RANGE, FREQUENCY_RANGE, PRESENCE_RANGE
from ..engine.speculative import DEFAULT_NUM_TOKENS, MAX_NUM_TOKENS, Speculation
from ..text.generation_defaults import NONE as NO_DEFAULTS
from ..text.generation_defaults import GenerationDefaults
from ..text.tokenizer import check_text
from .engine import SamplingParams, Usage
from .errors import invalid

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
MAX_STOP_STRINGS = 4  # OpenAI's limit
MAX_MESSAGES = 2048  # OpenAI's limit; it bounds the event loop's checks and the chat template's rendering
MAX_CACHE_SALT = 256  # characters of ``cache_salt``, as vLLM
SEED_RANGE = (-(1 << 63), 1 << 63)  # signed 64-bit, as OpenAI's peers (the sampler takes a seed modulo 2**64)
MAX_N = 128  # choices per prompt: OpenAI's limit
MAX_PROMPTS = 64  # prompts in one completions request (each with n choices, at most MAX_CHOICES in all)
MAX_CHOICES = 256
MAX_LOGIT_BIAS = 300  # OpenAI's limit on logit_bias entries


# -- field checks ---------------------------------------------------------------------

def json_type(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return {str: "a string", list: "an array", dict: "an object"}.get(type(value), type(value).__name__)


_KINDS = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


def field(body: dict, name: str, kind: str, *, required: bool = False, default=None, param: str | None = None):
    """``body[name]`` if it has the JSON ``kind``; ``default`` when absent or null (unless required)."""
    value = body.get(name)
    param = param or name
    if value is None:
        if required:
            raise invalid(f"missing required parameter '{param}'", param, "missing_required_parameter")
        return default
    if not _KINDS[kind](value):
        article = "an" if kind[0] in "aeiou" else "a"
        raise invalid(f"'{param}' must be {article} {kind}, got {json_type(value)}", param, "invalid_type")
    return value


def _or(value, default):
    """``value``, or ``default`` where it is None."""
    return default if value is None else value


def _in_range(value, name: str, low, high, low_open: bool = False):
    if value < low or (low_open and value == low) or value > high:
        raise invalid(f"'{name}' must be {'>' if low_open else '>='} {low} and <= {high}, got {value}", name)
    return value


def unsupported(body: dict, name: str, neutral) -> None:
    """Refuse a parameter this server does not implement unless it has its neutral value."""
    value = body.get(name)
    if value is not None and value not in neutral:
        raise invalid(f"'{name}' = {value!r} is not supported by this server", name, "unsupported_parameter")


def model_name(body: dict) -> str | None:
    """``model``: optional, as one model is served (None: that one)."""
    return field(body, "model", "string")


def choices_n(body: dict, prompts: int = 1) -> int:
    """``n``: choices per prompt, 1 .. MAX_N (and at most MAX_CHOICES for all of a request's prompts)."""
    n = _in_range(field(body, "n", "integer", default=1), "n", 1, MAX_N)
    if n * prompts > MAX_CHOICES:
        raise invalid(f"'n' = {n} for {prompts} prompts asks for {n * prompts} choices; at most {MAX_CHOICES} "
                      f"are allowed per request", "n")
    return n


def stream_flags(body: dict) -> tuple[bool, bool]:
    """(stream, include_usage) from ``stream`` and ``stream_options``."""
    stream = field(body, "stream", "boolean", default=False)
    options = field(body, "stream_options", "object", default={})
    include_usage = field(options, "include_usage", "boolean", default=False, param="stream_options.include_usage")
    if options and not stream:
        raise invalid("'stream_options' is only allowed when 'stream' is true", "stream_options")
    return stream, include_usage


# -- prompts ----------------------------------------------------------------------------

def _content_text(content, param: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: text only
        texts = []
        for i, part in enumerate(content):
            p = f"{param}[{i}]"
            if not isinstance(part, dict):
                raise invalid(f"'{p}' must be an object, got {json_type(part)}", p, "invalid_type")
            if part.get("type") != "text":
                raise invalid(f"'{p}.type' = {part.get('type')!r} is not supported; only text parts are",
                              f"{p}.type", "unsupported_content")
            texts.append(field(part, "text", "string", required=True, param=f"{p}.text"))
        return "".join(texts)
    raise invalid(f"'{param}' must be a string or an array of text parts, got {json_type(content)}", param,
                  "invalid_type")


def chat_messages(body: dict) -> list[dict]:
    """The ``messages`` as [{"role", "content"}] for the chat template (``developer`` -> ``system``); an assistant
    message's ``tool_calls`` and a tool message's ``tool_call_id`` (and ``name``) go along, each call's
    ``arguments`` parsed into an object, as chat templates expect it."""
    messages = field(body, "messages", "array", required=True)
    if not messages:
        raise invalid("'messages' must contain at least one message", "messages", "empty_array")
    if len(messages) > MAX_MESSAGES:
        raise invalid(f"'messages' holds {len(messages)} messages; at most {MAX_MESSAGES} are allowed", "messages",
                      "array_too_long")
    out = []
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(message, dict):
            raise invalid(f"'{param}' must be an object, got {json_type(message)}", param, "invalid_type")
        role = field(message, "role", "string", required=True, param=f"{param}.role")
        if role not in ROLES:
            raise invalid(f"'{param}.role' = {role!r} is not a supported role; use one of "
                          f"{', '.join(ROLES)}", f"{param}.role", "invalid_role")
        content = message.get("content")
        if content is None and role != "assistant":
            raise invalid(f"missing required parameter '{param}.content'", f"{param}.content",
                          "missing_required_parameter")
        out.append({"role": ROLES[role], "content": "" if content is None else _content_text(content,
                                                                                              f"{param}.content")})
        if role == "assistant" and message.get("tool_calls"):
            out[-1]["tool_calls"] = _message_tool_calls(message, param)
        if role == "tool":
            out[-1]["tool_call_id"] = field(message, "tool_call_id", "string", required=True,
                                            param=f"{param}.tool_call_id")
            if message.get("name") is not None:
                out[-1]["name"] = field(message, "name", "string", param=f"{param}.name")
    return out


def _message_tool_calls(message: dict, param: str) -> list[dict]:
    """An assistant message's ``tool_calls``, each ``{"id", "type": "function", "function": {"name", "arguments"}}``
    with ``arguments`` as an object (OpenAI sends its JSON text; templates render the object)."""
    calls = field(message, "tool_calls", "array", param=f"{param}.tool_calls")
    out = []
    for j, call in enumerate(calls):
        p = f"{param}.tool_calls[{j}]"
        if not isinstance(call, dict):
            raise invalid(f"'{p}' must be an object, got {json_type(call)}", p, "invalid_type")
        if field(call, "type", "string", default="function", param=f"{p}.type") != "function":
            raise invalid(f"'{p}.type' = {call['type']!r} is not supported; only 'function' is", f"{p}.type")
        function = field(call, "function", "object", required=True, param=f"{p}.function")
        name = field(function, "name", "string", required=True, param=f"{p}.function.name")
        text = field(function, "arguments", "string", required=True, param=f"{p}.function.arguments")
        try:
            arguments = json.loads(text)
        except ValueError as e:
            raise invalid(f"'{p}.function.arguments' is not valid JSON: {e}", f"{p}.function.arguments") from None
        if not isinstance(arguments, dict):
            raise invalid(f"'{p}.function.arguments' must be a JSON object, got {json_type(arguments)}",
                          f"{p}.function.arguments")
        out.append({"id": field(call, "id", "string", default=f"call_{j}", param=f"{p}.id"), "type": "function",
                    "function": {"name": name, "arguments": arguments}})
    return out


def completion_prompts(body: dict, vocab_size: int, context: int) -> list[str | list[int]]:
    """``prompt`` as a list of prompts, each a text or token ids: a string, an array of token ids, or an array of
    those (one choice per prompt, times ``n``)."""
    prompt = body.get("prompt")
    if prompt is None:
        raise invalid("missing required parameter 'prompt'", "prompt", "missing_required_parameter")
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        if len(prompt) > MAX_PROMPTS:
            raise invalid(f"'prompt' holds {len(prompt)} prompts; at most {MAX_PROMPTS} are allowed per request",
                          "prompt", "array_too_long")
        return [_one_prompt(p, f"prompt[{i}]", vocab_size, context) for i, p in enumerate(prompt)]
    return [_one_prompt(prompt, "prompt", vocab_size, context)]


def _one_prompt(prompt, param: str, vocab_size: int, context: int) -> str | list[int]:
    if isinstance(prompt, list) and len(prompt) >= context:  # refused before each item is looked at
        raise invalid(f"'{param}' holds {len(prompt)} items; this model's maximum context length is {context} "
                      f"tokens, which leaves no room for a completion", param, "context_length_exceeded")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(_KINDS["integer"](t) for t in prompt):
        bad = next((i for i, t in enumerate(prompt) if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise invalid(f"'{param}[{bad}]' = {prompt[bad]} is not a token id in [0, {vocab_size})", param)
        return prompt
    raise invalid(f"'{param}' must be a string or an array of token ids (or, for 'prompt', an array of those), got "
                  f"{json_type(prompt)}" + (" (empty)" if prompt == [] else ""), param, "invalid_type")


def check_unsupported(body: dict, chat: bool) -> None:
    if not chat:
        unsupported(body, "echo", (False,))
        unsupported(body, "suffix", ("",))
        n = body.get("n") if _KINDS["integer"](body.get("n")) else 1
        unsupported(body, "best_of", (1, n))  # best_of = n: every choice returned, as without it


MAX_TOP_LOGPROBS = {True: 20, False: 5}  # OpenAI's bounds: chat's top_logprobs, completions' logprobs


def logprobs_count(body: dict, chat: bool) -> int | None:
    """How many top alternatives each token's log-probability comes with, or None (not asked): chat's
    ``logprobs: true`` with ``top_logprobs`` 0 .. 20, completions' ``logprobs`` 0 .. 5."""
    if not chat:
        k = field(body, "logprobs", "integer")
        return None if k is None else _in_range(k, "logprobs", 0, MAX_TOP_LOGPROBS[False])
    wanted = field(body, "logprobs", "boolean", default=False)
    top = field(body, "top_logprobs", "integer")
    if top is not None and not wanted:
        raise invalid("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    if top is not None:
        _in_range(top, "top_logprobs", 0, MAX_TOP_LOGPROBS[True])
    return (top or 0) if wanted else None


def logprobs_body(chat: bool, entries, offset: int = 0) -> dict:
    """A choice's ``logprobs`` for the engine's TokenLogprobText ``entries``: chat's ``content`` list, or
    completions' parallel lists (``text_offset`` counted from ``offset``, the characters already sent)."""
    if chat:
        def item(token, logprob):
            return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8", "surrogatepass"))}
        return {"content": [{**item(e.token, e.logprob), "top_logprobs": [item(t, lp) for t, lp in e.top]}
                            for e in entries], "refusal": None}
    offsets = []
    for e in entries:
        offsets.append(offset)
        offset += len(e.token)
    return {"tokens": [e.token for e in entries], "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [dict(e.top) for e in entries], "text_offset": offsets}


def cache_salt(body: dict) -> str | None:
    """``cache_salt``: a text that keeps this request's cached prompt prefix apart from requests without it."""
    salt = field(body, "cache_salt", "string")
    if salt is None:
        return None
    if not 0 < len(salt) <= MAX_CACHE_SALT:
        raise invalid(f"'cache_salt' must be a non-empty string of at most {MAX_CACHE_SALT} characters, got "
                      f"{len(salt)} characters", "cache_salt")
    try:
        check_text(salt, "'cache_salt'")
    except LlaisysValueError as e:  # a lone surrogate
        raise invalid(str(e), "cache_salt", "invalid_text") from None
    return salt


# -- tools ---------------------------------------------------------------------------------

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
    return ToolRequest(checked, names, False, forced=(function,))  # a named function: one call of it


def _tool(tool, param: str) -> dict:
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


# -- sampling -----------------------------------------------------------------------------

def sampling_params(body: dict, prompt_tokens: int, context: int, prompt_param: str,
                    max_names=("max_completion_tokens", "max_tokens"),
                    default_max_tokens: int | None = None, defaults: GenerationDefaults = NO_DEFAULTS
                    ) -> SamplingParams:
    """The sampling parameters, checked against the model's context for this prompt length (the first of
    ``max_names`` present bounds the reply; none: ``default_max_tokens``, the server's cap, or the room the prompt
    leaves in the context if that is less or the cap is None). ``temperature``, ``top_p`` and ``top_k`` not in the
    request are ``defaults``' (the model's generation_config, as vLLM applies it), else OpenAI's."""
    room = context - prompt_tokens
    if room <= 0:
        raise invalid(f"this model's maximum context length is {context} tokens; the prompt has {prompt_tokens} "
                      f"tokens, which leaves no room for a completion", prompt_param, "context_length_exceeded")
    name = next((n for n in max_names if body.get(n) is not None), max_names[-1])
    default = room if default_max_tokens is None else min(default_max_tokens, room)
    max_tokens = field(body, name, "integer", default=default)
    if max_tokens <= 0:
        raise invalid(f"'{name}' must be >= 1, got {max_tokens}", name)
    if max_tokens > room:
        raise invalid(f"this model's maximum context length is {context} tokens; the prompt has {prompt_tokens} "
                      f"tokens and '{name}' asks for {max_tokens} more (at most {room} fit)", name,
                      "context_length_exceeded")
    temperature = field(body, "temperature", "number", default=_or(defaults.temperature, 1.0))
    _in_range(temperature, "temperature", 0, 2 if "temperature" in body else math.inf)  # (OpenAI's range: requests')
    top_p = _in_range(field(body, "top_p", "number", default=_or(defaults.top_p, 1.0)), "top_p", 0, 1, low_open=True)
    top_k = field(body, "top_k", "integer", default=_or(defaults.top_k, 0))
    if top_k < -1:
        raise invalid(f"'top_k' must be >= 0 (or -1 for all tokens), got {top_k}", "top_k")
    seed = field(body, "seed", "integer")
    if seed is not None:
        _in_range(seed, "seed", SEED_RANGE[0], SEED_RANGE[1] - 1)
    return SamplingParams(max_tokens=max_tokens, temperature=float(temperature), top_p=float(top_p),
                          top_k=max(top_k, 0), seed=seed, stop=stop_strings(body))


def penalties(body: dict, params: SamplingParams, vocab_size: int,
              defaults: GenerationDefaults = NO_DEFAULTS) -> SamplingParams:
    """``params`` with the request's repetition control: OpenAI's ``frequency_penalty`` and ``presence_penalty``
    (-2 .. 2), vLLM's ``repetition_penalty`` (HF transformers', > 0; not in the request: ``defaults``', the
    model's, else 1) and OpenAI's ``logit_bias`` (an object of token ids, as strings, to biases in -100 .. 100; at
    most MAX_LOGIT_BIAS of them)."""
    frequency = _in_range(field(body, "frequency_penalty", "number", default=0.0), "frequency_penalty",
                          *FREQUENCY_RANGE)
    presence = _in_range(field(body, "presence_penalty", "number", default=0.0), "presence_penalty", *PRESENCE_RANGE)
    repetition = field(body, "repetition_penalty", "number", default=_or(defaults.repetition_penalty, 1.0))
    if repetition <= 0:
        raise invalid(f"'repetition_penalty' must be > 0 (1 is off), got {repetition}", "repetition_penalty")
    bias = field(body, "logit_bias", "object", default={})
    if len(bias) > MAX_LOGIT_BIAS:
        raise invalid(f"'logit_bias' holds {len(bias)} tokens; at most {MAX_LOGIT_BIAS} are allowed", "logit_bias")
    pairs = {}
    for key, value in bias.items():
        token = int(key) if key.isascii() and key.isdigit() else -1
        if not 0 <= token < vocab_size:
            raise invalid(f"'logit_bias' key {key!r} is not a token id in [0, {vocab_size})", "logit_bias")
        if not _KINDS["number"](value):
            raise invalid(f"'logit_bias[{key}]' must be a number, got {json_type(value)}", "logit_bias",
                          "invalid_type")
        if not BIAS_RANGE[0] <= value <= BIAS_RANGE[1]:
            raise invalid(f"'logit_bias[{key}]' must be >= -100 and <= 100, got {value}", "logit_bias")
        pairs[token] = float(value)
    return dataclasses.replace(params, frequency_penalty=float(frequency), presence_penalty=float(presence),
                               repetition_penalty=float(repetition), logit_bias=tuple(sorted(pairs.items())))


def speculation(body: dict, params: SamplingParams, engine) -> SamplingParams:
    """``params`` decoded as the request's extension fields ``speculative`` ("ngram", "draft" where the server
    has a draft model, "off") and ``num_speculative_tokens`` (1 .. 32) say, else as the server's default."""
    method = field(body, "speculative", "string")
    k = field(body, "num_speculative_tokens", "integer")
    default = engine.speculation
    if method == "off":
        return dataclasses.replace(params, speculation=None)
    if method is None and (k is None or default is None):
        if k is not None:
            raise invalid("'num_speculative_tokens' needs 'speculative' (this server does not speculate by "
                          "default)", "num_speculative_tokens")
        return dataclasses.replace(params, speculation=default)
    if method is None:
        drafter = default.drafter
    elif method in engine.drafters:
        drafter = engine.drafters[method]
    else:
        offered = ", ".join(repr(m) for m in (*engine.drafters, "off"))
        why = "" if engine.drafters else " (this server's numerics cannot verify drafts exactly)"
        raise invalid(f"'speculative' = {method!r} is not offered by this server{why}; use one of {offered}",
                      "speculative")
    if k is None:
        k = default.num_tokens if default is not None else DEFAULT_NUM_TOKENS
    _in_range(k, "num_speculative_tokens", 1, MAX_NUM_TOKENS)
    return dataclasses.replace(params, speculation=Speculation(drafter, k))


def stop_strings(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise invalid(f"'stop' must be a string or an array of strings, got {json_type(stop)}", "stop",
                      "invalid_type")
    if len(stops) > MAX_STOP_STRINGS:
        raise invalid(f"'stop' takes at most {MAX_STOP_STRINGS} strings, got {len(stops)}", "stop")
    if any(s == "" for s in stops):
        raise invalid("'stop' strings must not be empty", "stop")
    return tuple(stops)


# -- responses --------------------------------------------------------------------------------

def usage_body(usage: Usage) -> dict:
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_tokens}}


class ResponseShape:
    """Bodies of one response: ``chat.completion`` / ``text_completion`` and their stream chunks (each chunk
    carries one choice, named by its ``index``)."""

    def __init__(self, chat: bool, response_id: str, created: int, model: str):
        self.chat = chat
        self.head = {"id": response_id, "object": None, "created": created, "model": model,
                     "system_fingerprint": None}

    def _body(self, obj: str, choices: list, usage: dict | None) -> dict:
        return {**self.head, "object": obj, "choices": choices, "usage": usage}

    def complete(self, choices: list[tuple], usage: Usage) -> dict:
        """The whole response: (text, finish reason) of each choice, in index order; a chat choice may add its
        tool calls, (content or None, finish reason, [ToolCall])."""
        if self.chat:
            body = [{"index": i, "message": _message(*choice), "logprobs": None, "finish_reason": choice[1]}
                    for i, choice in enumerate(choices)]
            return self._body("chat.completion", body, usage_body(usage))
        body = [{"index": i, "text": text, "logprobs": None, "finish_reason": reason}
                for i, (text, reason) in enumerate(choices)]
        return self._body("text_completion", body, usage_body(usage))

    def chunk(self, text: str | None = None, finish_reason: str | None = None, first: bool = False,
              index: int = 0) -> dict:
        """One stream chunk of choice ``index``: the first chat chunk carries the role; the last, the finish reason."""
        if self.chat:
            delta = {"role": "assistant", "content": text or ""} if first else (
                {"content": text} if text is not None else {})
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return self._body("chat.completion.chunk", [choice], None)
        choice = {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        return self._body("text_completion", [choice], None)

    def tool_call_chunks(self, call, index: int = 0) -> list[dict]:
        """A tool call of choice ``index`` as OpenAI streams it: its id, type and name (arguments ''), then its
        arguments (a client joins the ``arguments`` fragments of each call ``index``)."""
        head = {"index": call.index, "id": call.id, "type": "function",
                "function": {"name": call.name, "arguments": ""}}
        tail = {"index": call.index, "function": {"arguments": call.arguments}}
        return [self._body("chat.completion.chunk", [{"index": index, "delta": {"tool_calls": [delta]},
                                                      "logprobs": None, "finish_reason": None}], None)
                for delta in (head, tail)]

    def usage_chunk(self, usage: Usage) -> dict:
        """The extra last chunk of ``stream_options.include_usage``: no choices, the usage."""
        return self._body("chat.completion.chunk" if self.chat else "text_completion", [], usage_body(usage))


def _message(content: str | None, reason: str, calls=()) -> dict:
    message = {"role": "assistant", "content": content, "refusal": None}
    if calls:
        message["tool_calls"] = [call.body() for call in calls]
    return message
