"""A request's sampling fields, the same for every endpoint, as ``SamplingParams``: each checked by its rule in
engine/sampling_rules.py, the one table the Python API checks by too (the server's range where OpenAI's differs).

    max_tokens, max_completion_tokens (chat, completions), max_output_tokens (responses)   the reply's cap
    temperature, top_p, top_k, seed                                                        the choice of tokens
    frequency_penalty, presence_penalty, repetition_penalty, logit_bias                   repetition control
    n                                                                                      choices per prompt
    stop                                                                                   stop strings
    speculative, num_speculative_tokens                                                    speculative decoding

One request's share of the server is bounded before it is admitted, by what it declares:

- ``n``: at most 128 per prompt (OpenAI's limit) and MAX_CHOICES = 256 choices in all of a request's prompts.
- The log-probabilities it asks for: at most MAX_LOGPROB_ENTRIES = 2^18 = 262,144 entries per request, counting
  each choice's every token once for itself and once per alternative (chat: ``n`` x ``max_tokens`` x (1 +
  ``top_logprobs``); completions: the same for each prompt of its list, ``logprobs`` alternatives). Each entry is
  a token the engine thread decodes (slowing every sequence in the batch while it does) and about 60 bytes of
  JSON that the server holds (a whole response) or streams. OpenAI and vLLM bound each factor alone (``n`` <= 128,
  ``top_logprobs`` <= 20, vLLM's ``--max-logprobs`` 20) but not their product: n=128 with top_logprobs=20 and
  its default max_tokens asks for ~5.5M entries, ~330 MiB of JSON, from one request. 2^18 still fits any one
  reply with all 20 alternatives up to 12,483 tokens (most requests for log-probabilities: evaluations, n=1,
  0 to 5 alternatives, fit any context up to 43,690 tokens), or 128 choices of 2,048 tokens with no alternatives;
  a response stays under ~16 MiB. A request over it that names ``max_tokens`` is refused (a 400 naming it and
  what it may be); one that names none gets, as its default, at most what fits (its ``finish_reason`` says
  "length" if it reaches it), as a default is capped by the room the prompt leaves.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ...engine.sampling import SamplingParams
from ...engine.sampling_rules import RULES, Rule
from ...engine.speculative import DEFAULT_NUM_TOKENS, Speculation
from ...text.generation_defaults import NONE as NO_DEFAULTS
from ...text.generation_defaults import GenerationDefaults
from ..errors import invalid
from ..request_body import field, json_type

MAX_STOP_STRINGS = 4  # OpenAI's limit
MAX_LOGIT_BIAS = 300  # OpenAI's limit on logit_bias entries
MAX_CHOICES = 256  # choices in one request, all of its prompts' (each prompt's n: RULES["n"])
MAX_LOGPROB_ENTRIES = 1 << 18  # log-probabilities in one response, alternatives included: see above
MAX_TOKENS_NAMES = ("max_completion_tokens", "max_tokens")  # chat's and completions' reply caps, in that order


# -- fields checked by their rules ---------------------------------------------------------------------------

def typed(rule: Rule, value: Any, param: str, at: str | None = None) -> Any:
    """``value`` if it has ``rule``'s type, else a 400 ``invalid_type`` naming ``param`` (its message ``at``)."""
    if not rule.typed(value):
        raise invalid(f"'{at or param}' {rule.type_complaint(json_type(value))}", param, "invalid_type")
    return value


def in_range(rule: Rule, value: Any, param: str, served: bool = True, at: str | None = None) -> Any:
    """``value`` if it is in ``rule``'s range (the server's, where ``served`` and the rule has one), else a 400."""
    complaint = rule.range_complaint(value, served)
    if complaint is not None:
        raise invalid(f"'{at or param}' {complaint}", param)
    return value


def ruled(body: dict, name: str, default: Any = None, *, rule: str | None = None, served: bool = True) -> Any:
    """``body[name]`` (``default`` when absent or null; None stays None) checked by its rule (``rule``: the row's
    name where the field's differs, as max_tokens' is max_new_tokens)."""
    value = body.get(name)
    value = default if value is None else value
    if value is None:
        return None
    checked = RULES[rule or name]
    return in_range(checked, typed(checked, value, name), name, served)


def priority(body: dict) -> int:
    """The request's scheduling priority (vLLM's ``priority``: lower first, default 0; engine/fairness.py)."""
    return int(ruled(body, "priority", 0))


def _or(value: Any, default: Any) -> Any:
    """``value``, or ``default`` where it is None."""
    return default if value is None else value


def choices_n(body: dict, prompts: int = 1) -> int:
    """``n``: choices per prompt (and at most MAX_CHOICES for all of a request's prompts)."""
    n = ruled(body, "n", 1)
    if n * prompts > MAX_CHOICES:
        raise invalid(f"'n' = {n} for {prompts} prompts asks for {n * prompts} choices; at most {MAX_CHOICES} "
                      f"are allowed per request", "n")
    return n


@dataclasses.dataclass(frozen=True)
class LogprobRequest:
    """The log-probabilities a request asks for: ``alternatives`` with each token, for at most ``max_tokens`` tokens
    per choice (MAX_LOGPROB_ENTRIES shared by all its choices)."""
    alternatives: int
    max_tokens: int


def logprob_request(body: dict, alternatives: int | None, alternatives_name: str, n: int,
                    prompts: int = 1) -> LogprobRequest | None:
    """The request's log-probabilities (``alternatives``: the endpoint's count, ``alternatives_name`` its field;
    None: not asked for) within MAX_LOGPROB_ENTRIES for its ``n`` choices of each of its ``prompts``, else a 400
    naming the reply cap (max_completion_tokens or max_tokens, whichever it sets, as sampling_params reads it) and
    what it may be at most."""
    if alternatives is None:
        return None
    choices = n * prompts
    ceiling = MAX_LOGPROB_ENTRIES // (choices * (1 + alternatives))
    name = next((name for name in MAX_TOKENS_NAMES if body.get(name) is not None), None)
    if name is not None:
        max_tokens = ruled(body, name, rule="max_new_tokens")
        if max_tokens > ceiling:
            of_n = f"'n' = {n}" + (f" for {prompts} prompts" if prompts > 1 else "")
            raise invalid(f"'{name}' = {max_tokens} with {of_n} and '{alternatives_name}' = {alternatives} asks for "
                          f"{choices * max_tokens * (1 + alternatives)} log-probabilities ({choices} choices x "
                          f"{max_tokens} tokens x {1 + alternatives}: each token's and its alternatives'); at most "
                          f"{MAX_LOGPROB_ENTRIES} are allowed per request: lower '{name}' to {ceiling} or less, or "
                          f"lower 'n' or '{alternatives_name}'", name, "too_many_logprobs")
    return LogprobRequest(alternatives, ceiling)


# -- the sampling parameters ----------------------------------------------------------------------------------

def sampling_params(body: dict, prompt_tokens: int, context: int, prompt_param: str,
                    max_names: tuple[str, ...] = MAX_TOKENS_NAMES,
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
    max_tokens = ruled(body, name, default, rule="max_new_tokens")
    if max_tokens > room:
        raise invalid(f"this model's maximum context length is {context} tokens; the prompt has {prompt_tokens} "
                      f"tokens and '{name}' asks for {max_tokens} more (at most {room} fit)", name,
                      "context_length_exceeded")
    # OpenAI's range bounds what a request asks for, not the model's own default
    temperature = ruled(body, "temperature", _or(defaults.temperature, 1.0), served="temperature" in body)
    top_p = ruled(body, "top_p", _or(defaults.top_p, 1.0))
    top_k = ruled(body, "top_k", _or(defaults.top_k, 0))
    seed = ruled(body, "seed")
    return SamplingParams(max_tokens=max_tokens, temperature=float(temperature), top_p=float(top_p),
                          top_k=max(top_k, 0), seed=seed, stop=stop_strings(body))


def penalties(body: dict, params: SamplingParams, vocab_size: int,
              defaults: GenerationDefaults = NO_DEFAULTS) -> SamplingParams:
    """``params`` with the request's repetition control: OpenAI's ``frequency_penalty`` and ``presence_penalty``,
    vLLM's ``repetition_penalty`` (HF transformers'; not in the request: ``defaults``', the model's, else 1) and
    OpenAI's ``logit_bias`` (an object of token ids, as strings, to biases; at most MAX_LOGIT_BIAS of them)."""
    frequency = ruled(body, "frequency_penalty", 0.0)
    presence = ruled(body, "presence_penalty", 0.0)
    repetition = ruled(body, "repetition_penalty", _or(defaults.repetition_penalty, 1.0))
    bias = field(body, "logit_bias", "object", default={})
    if len(bias) > MAX_LOGIT_BIAS:
        raise invalid(f"'logit_bias' holds {len(bias)} tokens; at most {MAX_LOGIT_BIAS} are allowed", "logit_bias")
    pairs = {}
    for key, value in bias.items():
        token = int(key) if key.isascii() and key.isdigit() else -1
        if not 0 <= token < vocab_size:
            raise invalid(f"'logit_bias' key {key!r} is not a token id in [0, {vocab_size})", "logit_bias")
        rule = RULES["logit_bias"]
        pairs[token] = float(in_range(rule, typed(rule, value, "logit_bias", f"logit_bias[{key}]"), "logit_bias",
                                      at=f"logit_bias[{key}]"))
    return dataclasses.replace(params, frequency_penalty=float(frequency), presence_penalty=float(presence),
                               repetition_penalty=float(repetition), logit_bias=tuple(sorted(pairs.items())))


def speculation(body: dict, params: SamplingParams, engine: Any) -> SamplingParams:
    """``params`` decoded as the request's extension fields ``speculative`` ("ngram", "draft" where the server
    has a draft model, "off") and ``num_speculative_tokens`` say, else as the server's default (``engine``: its
    ``speculation`` and ``drafters``)."""
    method = field(body, "speculative", "string")
    rule = RULES["num_speculative_tokens"]
    k = body.get("num_speculative_tokens")
    if k is not None:
        typed(rule, k, "num_speculative_tokens")
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
    in_range(rule, k, "num_speculative_tokens")
    return dataclasses.replace(params, speculation=Speculation(drafter, k))


def stop_strings(body: dict) -> tuple[str, ...]:
    """``stop``: a string or up to MAX_STOP_STRINGS of them, none empty."""
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
