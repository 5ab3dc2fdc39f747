"""OpenAI's request parameters, checked field by field, and its response and stream-chunk bodies.

Requests are parsed by hand rather than by a schema library so that every rejection names its
parameter in OpenAI's words (``param`` = ``messages[2].role``) and says what was expected.
Unknown parameters are ignored (clients send vendor extras); known ones this server cannot
honour (n > 1, logprobs, tools, ...) are refused rather than silently dropped.
"""

from __future__ import annotations

import dataclasses
import math

from llaisys import LlaisysValueError

from ..penalties import BIAS_RANGE, FREQUENCY_RANGE, PRESENCE_RANGE
from ..speculative import DEFAULT_NUM_TOKENS, MAX_NUM_TOKENS, Speculation
from ..tokenizer import check_text
from .engine import SamplingParams, Usage
from .errors import invalid

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
MAX_STOP_STRINGS = 4  # OpenAI's limit
MAX_MESSAGES = 2048  # OpenAI's limit; it bounds the event loop's checks and the chat template's rendering
MAX_CACHE_SALT = 256  # characters of ``cache_salt``, as vLLM
SEED_RANGE = (-(1 << 63), 1 << 64)
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


def _in_range(value, name: str, low, high, low_open: bool = False):
    if value < low or (low_open and value == low) or value > high:
        raise invalid(f"'{name}' must be {'>' if low_open else '>='} {low} and <= {high}, got {value}", name)
    return value


def _unsupported(body: dict, name: str, neutral) -> None:
    """Refuse a parameter this server does not implement unless it has its neutral value."""
    value = body.get(name)
    if value is not None and value not in neutral:
        raise invalid(f"'{name}' = {value!r} is not supported by this server", name, "unsupported_parameter")


def model_name(body: dict) -> str:
    return field(body, "model", "string", required=True)


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
    """The ``messages`` as [{"role", "content"}] for the chat template (``developer`` -> ``system``)."""
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
    return out


def completion_prompt(body: dict, vocab_size: int, context: int) -> str | list[int]:
    """``prompt`` as a text, or as token ids (an array of integers). One prompt per request."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list) and len(prompt) >= context:  # refused before each item is looked at
        raise invalid(f"'prompt' holds {len(prompt)} items; this model's maximum context length is {context} tokens, "
                      f"which leaves no room for a completion", "prompt", "context_length_exceeded")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(_KINDS["integer"](t) for t in prompt):
        bad = next((i for i, t in enumerate(prompt) if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise invalid(f"'prompt[{bad}]' = {prompt[bad]} is not a token id in [0, {vocab_size})", "prompt")
        return prompt
    if prompt is None:
        raise invalid("missing required parameter 'prompt'", "prompt", "missing_required_parameter")
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        raise invalid("'prompt' holds several prompts; this server takes one per request", "prompt",
                      "unsupported_parameter")
    raise invalid(f"'prompt' must be a string or an array of token ids, got {json_type(prompt)}"
                  + (" (empty)" if prompt == [] else ""), "prompt", "invalid_type")


def check_unsupported(body: dict, chat: bool) -> None:
    n = field(body, "n", "integer", default=1)
    if n != 1:
        raise invalid(f"'n' = {n} is not supported: this server returns one choice per request", "n",
                      "unsupported_parameter")
    if chat:
        _unsupported(body, "logprobs", (False,))
        _unsupported(body, "tools", ([],))
        _unsupported(body, "response_format", ({"type": "text"},))
    else:
        _unsupported(body, "logprobs", (0,))
        _unsupported(body, "echo", (False,))
        _unsupported(body, "suffix", ("",))
        _unsupported(body, "best_of", (1,))


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


# -- sampling -----------------------------------------------------------------------------

def sampling_params(body: dict, prompt_tokens: int, context: int, prompt_param: str) -> SamplingParams:
    """The sampling parameters, checked against the model's context for this prompt length."""
    room = context - prompt_tokens
    if room <= 0:
        raise invalid(f"this model's maximum context length is {context} tokens; the prompt has {prompt_tokens} "
                      f"tokens, which leaves no room for a completion", prompt_param, "context_length_exceeded")
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = field(body, name, "integer", default=room)
    if max_tokens <= 0:
        raise invalid(f"'{name}' must be >= 1, got {max_tokens}", name)
    if max_tokens > room:
        raise invalid(f"this model's maximum context length is {context} tokens; the prompt has {prompt_tokens} "
                      f"tokens and '{name}' asks for {max_tokens} more (at most {room} fit)", name,
                      "context_length_exceeded")
    temperature = _in_range(field(body, "temperature", "number", default=1.0), "temperature", 0, 2)
    top_p = _in_range(field(body, "top_p", "number", default=1.0), "top_p", 0, 1, low_open=True)
    top_k = field(body, "top_k", "integer", default=0)
    if top_k < -1:
        raise invalid(f"'top_k' must be >= 0 (or -1 for all tokens), got {top_k}", "top_k")
    seed = field(body, "seed", "integer")
    if seed is not None:
        _in_range(seed, "seed", SEED_RANGE[0], SEED_RANGE[1] - 1)
    return SamplingParams(max_tokens=max_tokens, temperature=float(temperature), top_p=float(top_p),
                          top_k=max(top_k, 0), seed=seed, stop=stop_strings(body))


def penalties(body: dict, params: SamplingParams, vocab_size: int) -> SamplingParams:
    """``params`` with the request's repetition control: OpenAI's ``frequency_penalty`` and ``presence_penalty``
    (-2 .. 2), vLLM's ``repetition_penalty`` (HF transformers', > 0) and OpenAI's ``logit_bias`` (an object of
    token ids, as strings, to biases in -100 .. 100; at most MAX_LOGIT_BIAS of them)."""
    frequency = _in_range(field(body, "frequency_penalty", "number", default=0.0), "frequency_penalty",
                          *FREQUENCY_RANGE)
    presence = _in_range(field(body, "presence_penalty", "number", default=0.0), "presence_penalty", *PRESENCE_RANGE)
    repetition = field(body, "repetition_penalty", "number", default=1.0)
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
    """Bodies of one response: ``chat.completion`` / ``text_completion`` and their stream chunks."""

    def __init__(self, chat: bool, response_id: str, created: int, model: str):
        self.chat = chat
        self.head = {"id": response_id, "object": None, "created": created, "model": model,
                     "system_fingerprint": None}

    def _body(self, obj: str, choices: list, usage: dict | None) -> dict:
        return {**self.head, "object": obj, "choices": choices, "usage": usage}

    def complete(self, text: str, finish_reason: str, usage: Usage) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                      "logprobs": None, "finish_reason": finish_reason}
            return self._body("chat.completion", [choice], usage_body(usage))
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return self._body("text_completion", [choice], usage_body(usage))

    def chunk(self, text: str | None = None, finish_reason: str | None = None, first: bool = False) -> dict:
        """One stream chunk: the first chat chunk carries the role; the last, the finish reason."""
        if self.chat:
            delta = {"role": "assistant", "content": text or ""} if first else (
                {"content": text} if text is not None else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return self._body("chat.completion.chunk", [choice], None)
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        return self._body("text_completion", [choice], None)

    def usage_chunk(self, usage: Usage) -> dict:
        """The extra last chunk of ``stream_options.include_usage``: no choices, the usage."""
        return self._body("chat.completion.chunk" if self.chat else "text_completion", [], usage_body(usage))
