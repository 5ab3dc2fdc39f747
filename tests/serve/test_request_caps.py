"""One request's share of the server is bounded before admission (serve/openai/sampling.py and
completions/protocol.py say why these numbers):

- its log-probabilities: at most MAX_LOGPROB_ENTRIES entries (each token's and its alternatives', over all its
  choices and prompts). A request that names its reply cap over that is a 400 naming the cap, with the most it
  may be; one that names none gets that most as its default;
- a completions prompt list: at most MAX_PROMPTS prompts, and at most the context's tokens in all.

At the limit a request passes; one over it is refused with the field named, streamed or not (before any event).
"""

from __future__ import annotations

import pytest

from helpers.serve_helpers import CHAT_MODEL, check_error_body, http_request, require_serving

require_serving()

from helpers.serve_helpers import CHAT, COMPLETIONS, chat  # noqa: E402
from llaisys_models.serve.errors import APIError  # noqa: E402
from llaisys_models.serve.openai.completions.protocol import MAX_PROMPTS  # noqa: E402
from llaisys_models.serve.openai.sampling import MAX_LOGPROB_ENTRIES, LogprobRequest, logprob_request  # noqa: E402

CONTEXT = 4096  # the chat model's max_position_embeddings


def post(server, path: str, body: dict):
    return http_request(server.base_url, "POST", path, body, timeout=120)


def most_tokens(choices: int, alternatives: int) -> int:
    """The longest reply each of ``choices`` may have with ``alternatives`` per token."""
    return MAX_LOGPROB_ENTRIES // (choices * (1 + alternatives))


# -- log-probabilities ----------------------------------------------------------------------------------------

def test_logprob_budget_at_its_edge():
    at = most_tokens(128, 20)
    assert logprob_request({"max_tokens": at}, 20, "top_logprobs", 128) == LogprobRequest(20, at)
    with pytest.raises(APIError) as refused:
        logprob_request({"max_tokens": at + 1}, 20, "top_logprobs", 128)
    assert (refused.value.param, refused.value.code) == ("max_tokens", "too_many_logprobs")
    assert logprob_request({"max_tokens": 10**6}, None, "top_logprobs", 128) is None  # none asked for: no budget
    four = most_tokens(4 * 64, 5)
    assert logprob_request({"max_tokens": four}, 5, "logprobs", 64, prompts=4).max_tokens == four
    with pytest.raises(APIError):
        logprob_request({"max_tokens": four + 1}, 5, "logprobs", 64, prompts=4)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("cap", ["max_tokens", "max_completion_tokens"])
def test_chat_over_the_logprob_budget_is_refused(chat_server, cap, stream):
    at = most_tokens(128, 20)
    body = chat(n=128, logprobs=True, top_logprobs=20, stream=stream, **{cap: at + 1})
    error = check_error_body(post(chat_server, CHAT, body), 400, cap, "too_many_logprobs")
    message = error["message"]
    assert f"'{cap}' = {at + 1}" in message and "'n' = 128" in message and "'top_logprobs' = 20" in message
    assert f"lower '{cap}' to {at} or less" in message and str(MAX_LOGPROB_ENTRIES) in message


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_completions_budget_counts_every_prompt(chat_server, stream):
    at = most_tokens(4 * 64, 5)
    body = {"model": CHAT_MODEL, "prompt": ["a", "b", "c", "d"], "n": 64, "logprobs": 5, "max_tokens": at + 1,
            "stream": stream}
    error = check_error_body(post(chat_server, COMPLETIONS, body), 400, "max_tokens", "too_many_logprobs")
    assert "'n' = 64 for 4 prompts" in error["message"] and "'logprobs' = 5" in error["message"]
    assert f"to {at} or less" in error["message"]


@pytest.mark.parametrize("path, body", [
    (CHAT, chat(n=128, logprobs=True, top_logprobs=20, max_tokens=most_tokens(128, 20))),
    (COMPLETIONS, {"prompt": ["a", "b", "c", "d"], "n": 64, "logprobs": 5, "max_tokens": most_tokens(4 * 64, 5)}),
], ids=["chat", "completions"])
def test_at_the_logprob_budget_a_request_passes_it(chat_server, path, body):
    """Checked up to the field after the budget (a bad ``seed``, refused by name): serving it in full would decode
    MAX_LOGPROB_ENTRIES / 21 tokens, ~12 s on two CPU cores."""
    check_error_body(post(chat_server, path, {**body, "seed": "x"}), 400, "seed", "invalid_type")


def test_a_default_reply_cap_is_what_the_budget_allows(chat_server):
    """A request that names no reply cap gets the server's default, or less where its log-probabilities say so."""
    from llaisys_models.serve.openai.serving import job_params

    server = chat_server.server
    def max_tokens(body: dict, logprobs: LogprobRequest | None) -> int:
        return job_params(server, body, 10, "messages", logprobs, None).max_tokens

    at = most_tokens(128, 20)
    assert max_tokens({}, None) == server.default_max_tokens
    assert max_tokens({"logprobs": True}, LogprobRequest(0, MAX_LOGPROB_ENTRIES)) == server.default_max_tokens
    assert max_tokens({"n": 128}, LogprobRequest(20, at)) == at < server.default_max_tokens
    assert max_tokens({"max_tokens": 7}, LogprobRequest(20, at)) == 7


# -- completions prompt lists ---------------------------------------------------------------------------------

def completions(prompt, **fields) -> dict:
    return {"model": CHAT_MODEL, "prompt": prompt, "max_tokens": 1, **fields}


def test_a_prompt_list_at_the_limits_is_served(chat_server):
    r = post(chat_server, COMPLETIONS, completions([[65] * (CONTEXT // 2)] * 2))  # the context's tokens in all
    assert r.status == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == CONTEXT and len(r.json()["choices"]) == 2
    r = post(chat_server, COMPLETIONS, completions([f"p{i}" for i in range(MAX_PROMPTS)]))
    assert r.status == 200 and len(r.json()["choices"]) == MAX_PROMPTS


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_prompt_list_over_the_context_is_refused(chat_server, stream):
    half = CONTEXT // 2
    cases = [
        ([[65] * half, [66] * (half + 1)], f"of at least {CONTEXT + 1} tokens"),  # token ids: counted before
        (["x" * half, "y" * (half + 1)], f"of {CONTEXT + 1} tokens"),  # one token a character: counted once tokenized
        # characters that no tokenizer of this model could make fewer tokens of: refused before tokenizing
        (["x" * (half * chat_server.server.longest_token)] * 2 + ["z"], "of at least"),
    ]
    for prompts, says in cases:
        error = check_error_body(post(chat_server, COMPLETIONS, completions(prompts, stream=stream)), 400, "prompt",
                                 "prompt_list_too_long")
        assert says in error["message"] and f"at most {CONTEXT} tokens in all" in error["message"]


def test_one_prompt_keeps_its_own_rule(chat_server):
    """A single prompt is bounded by the context with room for a reply, as before (context_length_exceeded)."""
    check_error_body(post(chat_server, COMPLETIONS, completions([65] * CONTEXT)), 400, "prompt",
                     "context_length_exceeded")
    check_error_body(post(chat_server, COMPLETIONS, completions([[65] * CONTEXT, [66]])), 400, "prompt[0]",
                     "context_length_exceeded")
    r = post(chat_server, COMPLETIONS, completions([65] * (CONTEXT - 1)))
    assert r.status == 200, r.text
