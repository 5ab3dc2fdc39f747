"""One rule per sampling parameter, whichever way it comes in: ``model.generate`` / ``chat`` / ``complete``
(``check_sampling`` in sampling.py, the penalties' checks in penalties.py), ``llaisys generate``'s flags, a
model's generation_config, and the server's request fields (serve/openai/sampling.py).

A rule is the parameter's type and range; its complaint ("must be >= 0 and <= 2, got 3") is the same words on
every side, each putting the name first as it spells it: ``temperature must be ...`` (a LlaisysValueError from
the Python API), ``--temperature must be ...`` (the CLI), ``'temperature' must be ...`` (the server's 400, its
``param`` the field). The server takes another range only where OpenAI's API (or vLLM's, which clients also
speak) sets one: that range is the row's ``served``, with its reason, which the server's message ends with.
Rows with no Python range are fields of the server's alone.

    parameter               type     Python API              server, where it differs: why
    max_new_tokens          integer  >= 0                    >= 1: a reply of one token at least
    temperature             number   >= 0                    >= 0 and <= 2: OpenAI's range
    top_p                   number   > 0 and <= 1
    top_k                   integer  >= 0                    >= -1: -1 is every token too, as in vLLM
    seed                    integer  >= 0 and <= 2**64 - 1   -2**63 .. 2**63 - 1: a signed 64-bit integer, as
                                                             OpenAI's API takes it (both modulo 2**64)
    repetition_penalty      number   > 0.0
    frequency_penalty       number   >= -2.0 and <= 2.0
    presence_penalty        number   >= -2.0 and <= 2.0
    logit_bias              number   >= -100.0 and <= 100.0  (each token's bias)
    num_speculative_tokens  integer  >= 1 and <= 32
    n                       integer  -                       >= 1 and <= 128: OpenAI's
    top_logprobs            integer  -                       >= 0 and <= 20: OpenAI's (chat)
    logprobs                integer  -                       >= 0 and <= 5: OpenAI's (completions)
    priority                integer  -                       >= 0 and <= 2147483647: a request may lower its
                                                             own priority, never raise it above the default 0
                                                             of others
    thinking_token_budget   integer  -                       >= 0: vLLM's (a reasoning model's thinking tokens)

(``describe()`` prints it from ``RULES``, the numbers written out.) The ``sample`` op checks its own arguments
again (llaisys-core): that is the op's contract with C (an int64 top_k, a uint64 seed), not a rule of this API.
"""

from __future__ import annotations

import dataclasses
import math
import typing

import numpy as np

import llaisys

MASK64 = (1 << 64) - 1


@dataclasses.dataclass(frozen=True)
class Range:
    """low <= value (low < value when ``low_open``), and value <= high where there is one."""
    low: float
    high: float | None = None
    low_open: bool = False

    def holds(self, value: float) -> bool:
        return not (value < self.low or (self.low_open and value == self.low)
                    or (self.high is not None and value > self.high))

    def __str__(self) -> str:
        return f"{'>' if self.low_open else '>='} {self.low}" + (f" and <= {self.high}" if self.high is not None
                                                                 else "")


@dataclasses.dataclass(frozen=True)
class Rule:
    """A parameter's type ("integer", or "number": a finite one) and range: ``range`` for the Python API (None:
    the server's field alone), ``served`` where the server's differs (OpenAI's), ``why`` it does."""
    name: str
    kind: str
    range: Range | None
    served: Range | None = None
    why: str = ""

    @property
    def what(self) -> str:
        return "an integer" if self.kind == "integer" else "a finite number"

    def typed(self, value: object) -> bool:
        """Whether ``value`` has the rule's type (a bool is no number; NumPy's scalars are)."""
        if self.kind == "integer":
            return isinstance(value, (int, np.integer)) and not isinstance(value, bool)
        return (isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
                and math.isfinite(value))

    def bounds(self, served: bool = False) -> Range:
        """The range that applies: the server's (``served``) where the row has one, else the Python API's."""
        chosen = self.served if served and self.served is not None else self.range
        assert chosen is not None, f"{self.name} is a field of the server's alone"
        return chosen

    def type_complaint(self, got: str) -> str:
        """What a value of the wrong type is told (``got``: how the side names what it got)."""
        return f"must be {self.what}, got {got}"

    def range_complaint(self, value: float, served: bool = False) -> str | None:
        """What ``value`` (of the right type) is told, or None where it is in range; the server's message gives
        the reason for a range of its own."""
        bounds = self.bounds(served)
        if bounds.holds(value):
            return None
        reason = f" ({self.why})" if bounds is self.served and self.range is not None else ""
        return f"must be {bounds}, got {value!r}{reason}"

    def check(self, value: object, name: str | None = None) -> float:
        """The Python API's check: ``value``, else a LlaisysValueError ``<name> must be ...`` (``name``: the
        parameter's, or how the caller spells it, e.g. ``logit_bias[5]``)."""
        if not self.typed(value):
            raise llaisys.LlaisysValueError(f"{name or self.name} {self.type_complaint(repr(value))}")
        number = typing.cast(float, value)  # (an int where the rule's kind is "integer")
        complaint = self.range_complaint(number)
        if complaint is not None:
            raise llaisys.LlaisysValueError(f"{name or self.name} {complaint}")
        return number


OPENAI = "OpenAI's"

RULES: dict[str, Rule] = {rule.name: rule for rule in (
    # new tokens at most (the server's max_tokens, max_completion_tokens, max_output_tokens)
    Rule("max_new_tokens", "integer", Range(0), served=Range(1), why="a reply of one token at least"),
    Rule("temperature", "number", Range(0), served=Range(0, 2), why=f"{OPENAI} range"),  # 0: greedy
    Rule("top_p", "number", Range(0, 1, low_open=True)),  # the most probable tokens up to this mass
    # the k most probable tokens; 0: every token, 1: greedy
    Rule("top_k", "integer", Range(0), served=Range(-1), why="-1 is every token too, as in vLLM"),
    # taken modulo 2**64 either way
    Rule("seed", "integer", Range(0, MASK64), served=Range(-(1 << 63), (1 << 63) - 1),
         why=f"a signed 64-bit integer, as {OPENAI} API takes it"),
    Rule("repetition_penalty", "number", Range(0.0, low_open=True)),  # HF transformers': prompt and reply; 1: off
    Rule("frequency_penalty", "number", Range(-2.0, 2.0)),  # OpenAI's: times each reply token's count; 0: off
    Rule("presence_penalty", "number", Range(-2.0, 2.0)),  # OpenAI's: once a token is in the reply; 0: off
    Rule("logit_bias", "number", Range(-100.0, 100.0)),  # OpenAI's, each token's bias: -100 bans it, 100 forces it
    # tokens drafted per step at most (speculative decoding; engine/speculative/config.py MAX_NUM_TOKENS)
    Rule("num_speculative_tokens", "integer", Range(1, 32)),
    Rule("n", "integer", None, served=Range(1, 128), why=OPENAI),  # choices per prompt
    # alternatives shown with each token's log-probability: chat's top_logprobs, completions' logprobs
    Rule("top_logprobs", "integer", None, served=Range(0, 20), why=OPENAI),
    Rule("logprobs", "integer", None, served=Range(0, 5), why=OPENAI),
    # scheduling order, lower first (vLLM's field): a request may put itself after others (batch work), never before
    Rule("priority", "integer", None, served=Range(0, (1 << 31) - 1),
         why="a request may lower its own priority, never raise it above the default 0 of others"),
    # a reasoning model's thinking tokens at most, then its answer (vLLM's field; engine/thinking.py)
    Rule("thinking_token_budget", "integer", None, served=Range(0), why="vLLM's"),
)}


def describe() -> str:
    """The table of rules as text: parameter, type, the Python API's range, the server's where it differs."""
    lines = [f"{'parameter':<24}{'type':<9}{'Python API':<24}server (where it differs: why)"]
    for rule in RULES.values():
        python = "-" if rule.range is None else str(rule.range)
        served = "" if rule.served is None else f"{rule.served}: {rule.why}"
        lines.append(f"{rule.name:<24}{rule.kind:<9}{python:<24}{served}".rstrip())
    return "\n".join(lines)
