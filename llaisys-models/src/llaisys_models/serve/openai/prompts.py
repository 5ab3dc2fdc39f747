"""A request's prompt as token ids: chat messages through the chat template (with the request's tools), or a
plain text, on the server's tokenizer threads (serve/tokenizer_pool.py).

No tokenizer reads a text longer than the context could hold: ``Server.max_prompt_chars`` (the context times the
tokenizer's longest token, in characters) bounds it first, and the messages again once rendered in the chat
template. Prompts longer than LONG_PROMPT_CHARS go to threads of their own, so a short one never waits for them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llaisys import LlaisysValueError

from ...text.tokenizer import EmptyPromptError, PromptTooLongError, encode
from ..errors import APIError, invalid

if TYPE_CHECKING:
    from ..server import Server

LONG_PROMPT_CHARS = 1 << 13  # prompts longer than this are tokenized on threads of their own


async def tokenize(server: Server, prompt: str | list, chat: bool, param: str | None = None,
                   tools: list[dict] | None = None, template_kwargs: dict | None = None) -> list[int]:
    """Token ids of chat messages (through the chat template, with ``tools``: the request's, checked, and
    ``template_kwargs``: its variables, reasoning.template_kwargs) or of a plain text (``param``: the request field
    that holds it, for errors). A text longer than the context could hold is refused before any tokenizer reads
    it; an empty one is refused."""
    param = param or ("messages" if chat else "prompt")
    if isinstance(prompt, list) and not chat:
        return prompt  # already token ids
    if chat and not getattr(server.tokenizer, "chat_template", None):
        raise invalid("this model's tokenizer has no chat template; use /v1/completions", param, "no_chat_template")

    chars = len(prompt) if isinstance(prompt, str) else sum(len(m["content"]) for m in prompt)
    if chars > server.max_prompt_chars:
        raise _too_many_chars(server, param, chars)

    def run(tokenizer: object) -> list[int]:
        try:
            return encode(tokenizer, prompt, chat=chat, max_chars=server.max_prompt_chars, tools=tools,
                          template_kwargs=template_kwargs)
        except EmptyPromptError as e:  # says which text and which tokenizer
            raise invalid(str(e), param, "empty_prompt") from None
        except PromptTooLongError as e:  # the messages in their chat template
            raise _too_many_chars(server, param, e.chars, " once in the chat template") from None
        except LlaisysValueError as e:  # text that is not valid Unicode (a lone surrogate)
            raise invalid(str(e), param, "invalid_text") from None
        except Exception as e:  # a template that rejects these messages (e.g. their order)
            if not chat:
                raise
            raise invalid(f"the chat template cannot render these messages: {e}", "messages",
                          "template_error") from None
    ids = await server.tokenizers.run(run, long=chars > LONG_PROMPT_CHARS)
    if not ids:
        raise invalid(f"the '{param}' is empty once tokenized", param, "empty_prompt")
    return ids


def _too_many_chars(server: Server, param: str, chars: int, where: str = "") -> APIError:
    return invalid(f"'{param}': {chars} characters{where}, more than this model's maximum context length of "
                   f"{server.context} tokens can hold ({server.max_prompt_chars} characters: a token of its tokenizer "
                   f"stands for {server.longest_token} at most)", param, "context_length_exceeded")
