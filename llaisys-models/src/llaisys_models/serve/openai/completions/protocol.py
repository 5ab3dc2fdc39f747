"""``POST /v1/completions``: its request's prompts and the fields it refuses or reads its own way, and its
response bodies (``text_completion``, as a whole and as stream chunks). The fields every endpoint shares:
../protocol.py and ../sampling.py.

A list of prompts is one request's work many times over (each prompt a job of its own for the engine, each with
``n`` choices), so it is bounded before admission:

- at most MAX_PROMPTS = 64 prompts. OpenAI documents no number; vLLM caps the list at 1,024
  (``VLLM_MAX_COMPLETION_PROMPTS``, added as a security fix against one request fanning out into as many engine
  requests as it likes). 64 is below that since the prompts' choices share sampling.MAX_CHOICES = 256 anyway
  (64 prompts leave n = 4 each), and a client with more prompts loses nothing by sending more requests, which
  admission then interleaves fairly with everyone else's.
- at most the model's context length in tokens, all its prompts together (``check_list_tokens``). One prompt may
  fill the context; a list may not make one request cost more prefill than that, which is what the engine's fair
  admission assumes of a request (4 prompts of 4,000 tokens on a 4,096-token model were one request with four
  requests' prefill). Neither OpenAI nor vLLM bounds this total: each checks each prompt against the context
  only. A list that cannot fit is refused before any tokenizer reads it where its size shows that already (token
  ids, and a text's characters: a token stands for at most ``longest_token`` of them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...engine import TokenLogprobText, Usage
from ...errors import invalid
from ...request_body import KINDS, json_type
from ..protocol import ChoicesShape, json_logprob, unsupported, usage_body
from ..sampling import ruled

MAX_PROMPTS = 64  # prompts in one request (each with n choices, at most sampling.MAX_CHOICES in all)


def completion_prompts(body: dict, vocab_size: int, context: int, longest_token: int) -> list[str | list[int]]:
    """``prompt`` as a list of prompts, each a text or token ids: a string, an array of token ids, or an array of
    those (one choice per prompt, times ``n``); a list of at most MAX_PROMPTS whose tokens, as far as they show
    before tokenizing (``longest_token``: the most characters a token stands for), fit ``context`` together."""
    prompt = body.get("prompt")
    if prompt is None:
        raise invalid("missing required parameter 'prompt'", "prompt", "missing_required_parameter")
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        if len(prompt) > MAX_PROMPTS:
            raise invalid(f"'prompt' holds {len(prompt)} prompts; at most {MAX_PROMPTS} are allowed per request",
                          "prompt", "array_too_long")
        prompts = [_one_prompt(p, f"prompt[{i}]", vocab_size, context) for i, p in enumerate(prompt)]
        if len(prompts) > 1:
            check_list_tokens(sum(_fewest_tokens(p, longest_token) for p in prompts), len(prompts), context,
                              " at least")
        return prompts
    return [_one_prompt(prompt, "prompt", vocab_size, context)]


def _fewest_tokens(prompt: str | list[int], longest_token: int) -> int:
    """The fewest tokens ``prompt`` can be: its ids, or its characters over the longest token's."""
    return len(prompt) if isinstance(prompt, list) else -(-len(prompt) // longest_token)


def check_list_tokens(tokens: int, prompts: int, context: int, at_least: str = "") -> None:
    """A 400 naming ``prompt`` where a list of ``prompts`` holds more than ``context`` tokens in all."""
    if tokens > context:
        raise invalid(f"'prompt' holds {prompts} prompts of{at_least} {tokens} tokens in all; a list of prompts may "
                      f"hold at most {context} tokens in all (this model's context length), so that one request "
                      f"costs no more than one full prompt: send fewer or shorter prompts, or some in requests of "
                      f"their own", "prompt", "prompt_list_too_long")


def _one_prompt(prompt: Any, param: str, vocab_size: int, context: int) -> str | list[int]:
    if isinstance(prompt, list) and len(prompt) >= context:  # refused before each item is looked at
        raise invalid(f"'{param}' holds {len(prompt)} items; this model's maximum context length is {context} "
                      f"tokens, which leaves no room for a completion", param, "context_length_exceeded")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(KINDS["integer"](t) for t in prompt):
        bad = next((i for i, t in enumerate(prompt) if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise invalid(f"'{param}[{bad}]' = {prompt[bad]} is not a token id in [0, {vocab_size})", param)
        return prompt
    raise invalid(f"'{param}' must be a string or an array of token ids (or, for 'prompt', an array of those), got "
                  f"{json_type(prompt)}" + (" (empty)" if prompt == [] else ""), param, "invalid_type")


def check_unsupported(body: dict) -> None:
    """Refuse, by name, what this server cannot honour (unless sent with its neutral value)."""
    unsupported(body, "echo", (False,))
    unsupported(body, "suffix", ("",))
    n = body.get("n") if KINDS["integer"](body.get("n")) else 1
    unsupported(body, "best_of", (1, n))  # best_of = n: every choice returned, as without it


def logprobs_count(body: dict) -> int | None:
    """How many top alternatives each token's log-probability comes with (``logprobs``), or None (not asked)."""
    return ruled(body, "logprobs")


# -- the response -------------------------------------------------------------------------------------------

class CompletionShape(ChoicesShape):
    """A ``text_completion`` and its chunks."""

    whole = chunked = "text_completion"

    def complete(self, choices: list[tuple], usage: Usage) -> dict:
        body = [{"index": i, "text": text, "logprobs": None, "finish_reason": reason}
                for i, (text, reason) in enumerate(choices)]
        return self.body(self.whole, body, usage_body(usage))

    def chunk(self, text: str | None = None, finish_reason: str | None = None, first: bool = False,
              index: int = 0) -> dict:
        choice = {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        return self.body(self.chunked, [choice], None)

    def logprobs(self, entries: Sequence[TokenLogprobText], offset: int = 0) -> dict:
        """Completions' ``logprobs``: parallel lists, ``text_offset`` counted from ``offset``."""
        offsets = []
        for e in entries:
            offsets.append(offset)
            offset += len(e.token)
        return {"tokens": [e.token for e in entries], "token_logprobs": [json_logprob(e.logprob) for e in entries],
                "top_logprobs": [{token: json_logprob(lp) for token, lp in e.top} for e in entries],
                "text_offset": offsets}
