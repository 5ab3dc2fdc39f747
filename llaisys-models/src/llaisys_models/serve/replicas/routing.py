"""What the prefix-aware router routes a request by: its cache scope and the text its prompt begins with.

Ray Serve LLM's prefix-aware router matches the prompt's text (the messages' contents run together) against
the texts each replica was sent. So does this one, with two differences:

- the text is looked up within the request's cache scope only (``tenancy.cache_scope``: the tenant its API key
  names, plus its ``cache_salt``), as each replica's prefix cache is scoped: one tenant's prompts never
  route, nor reveal anything to, another's;
- each message counts by its role and content, but an assistant message by its role alone: a conversation's
  next turn then begins with exactly the text of the turn before, however long the reply was (counted
  with its text, a long reply would make the earlier turn a small share of the new one, too small to route
  by, although the replica that wrote it holds both in its cache);
- messages match whole (``Route.boundary``): two conversations whose first messages merely begin alike
  ("What is the capital of France", "... of Spain") share no cached block worth routing by; a shared
  system prompt, or the turns before, match.

Requests that carry no prompt (GET /v1/models, a page, a preflight), requests that are not valid JSON or
whose key is unknown (a replica answers them with the error), have no route: they go to the least loaded of
two replicas picked at random.
"""

from __future__ import annotations

import dataclasses
import json

from ..errors import APIError
from ..openai.chat.protocol import chat_messages
from ..openai.responses.protocol import input_messages
from ..tenancy import Tenants, cache_salt, cache_scope

MAX_ROUTING_CHARS = 1 << 16  # a longer prompt routes by its beginning (conversations differ well before)


@dataclasses.dataclass(frozen=True)
class Route:
    scope: str  # the request's cache scope
    text: str  # what its prompt begins with
    boundary: str = ""  # where a match may end: just after this character ('': anywhere)

    def whole(self, matched: int) -> int:
        """``matched`` characters cut back to the last boundary within them."""
        return self.text.rfind(self.boundary, 0, matched) + 1 if self.boundary else matched


def route_of(method: str, path: str, authorization: str, body: bytes, tenants: Tenants) -> Route | None:
    """The route of an HTTP request to the OpenAI API, or None when it has none."""
    text_of = _PROMPT_TEXT.get(path)
    if method != "POST" or text_of is None:
        return None
    tenant = tenants.of(authorization)
    if tenant is None:
        return None
    try:
        payload = json.loads(body)
        if not isinstance(payload, dict):
            return None
        scope, text = cache_scope(tenant, cache_salt(payload)), text_of(payload)
    except (ValueError, RecursionError, APIError):  # not JSON, or a request a replica will refuse
        return None
    boundary = "" if path == "/v1/completions" else END_OF_MESSAGE
    return Route(scope, text[:MAX_ROUTING_CHARS], boundary) if text else None


END_OF_ROLE, END_OF_MESSAGE = "\x1f", "\x1e"  # so no message's text can pass for two, or for another role's


def _messages_text(messages: list[dict]) -> str:
    return "".join(f"{m['role']}{END_OF_ROLE}{'' if m['role'] == 'assistant' else m['content']}{END_OF_MESSAGE}"
                   for m in messages)


def _completion_text(payload: dict) -> str:
    """The first prompt (the engine caches each prompt of a request on its own): its text, or its token ids, each
    as the character of its number, after a \x02 (so that ids and text seldom share a prefix: if they do, a
    request only goes to a replica that cannot reuse it, as any unmatched request might)."""
    prompt = payload.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(t, int) and 0 <= t < 0x110000 for t in prompt):
        return "\x02" + "".join(map(chr, prompt))
    return ""


_PROMPT_TEXT = {
    "/v1/chat/completions": lambda payload: _messages_text(chat_messages(payload)),
    "/v1/completions": _completion_text,
    "/v1/responses": lambda payload: _messages_text(input_messages(payload)),
}
