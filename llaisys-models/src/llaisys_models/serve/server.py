"""``Server``: what the routes share: the engine, the prompt tokenizers, the grammars, the served model's limits
and the address it listens on. One per process of ``llaisys serve`` (serve/launch.py builds it), one per replica
on Ray (serve/replicas), or one a script makes (``BackgroundServer``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from fastapi.responses import JSONResponse

from llaisys import LlaisysValueError

from ..text.generation_defaults import GenerationDefaults
from ..text.reasoning import load_parser
from ..text.template_kwargs import parse_kwargs, template_names, usable
from ..text.tokenizer import longest_token
from . import metrics, structured
from .defaults import DEFAULT_MAX_TOKENS
from .engine import Engine
from .errors import PathScrubber, error_body
from .lora import ServedAdapters
from .request_body import MAX_BODY_BYTES
from .tenancy import Tenants
from .tokenizer_pool import PromptTokenizers
from .tool_calls import special_openers, tool_support

log = logging.getLogger("llaisys.serve")


class Server:
    """What the routes share.

    ``api_keys``: each key its own tenant (none: no key needed, one tenant; ``tenants``: the keys' digests instead).
    ``host`` and ``port``: the address the server listens on, set by whoever binds it (``llaisys serve``,
    ``BackgroundServer``); on a loopback address, requests must name a loopback host and that port (serve/hosts.py).
    ``cors_origins``: origins (``https://app.example``) whose pages may call the API from a browser.
    ``default_max_tokens``: the reply cap of requests that set none (at most the room their prompt leaves in the
    context). ``sampling``: what requests that set no temperature, top_p, top_k or repetition_penalty get (default:
    the model's own, ``model.generation_defaults``, as vLLM applies them; OpenAI's defaults for what the model does
    not set). ``reasoning_parser``: how a reasoning model's replies think (text/reasoning.py: ``auto``, as its chat
    template says; ``none``: the text as it comes); ``chat_template_kwargs``: the chat template's variables for
    every request (each may override them); ``thinking_token_budget``: the thinking's default budget (None:
    unbounded). A LlaisysValueError says which of them cannot apply to this model.

    LoRA adapters (serve/lora.py): where the model has LoRA enabled (``model.enable_lora``, ``llaisys serve --lora``),
    ``adapters`` serves its loaded adapters under their names (``lora_paths``: where each was read from, as given:
    ``/v1/models``' ``root``), and ``allow_runtime_lora`` opens the endpoints that load and unload them.
    """

    def __init__(self, engine: Engine, tokenizer: Any, model_name: str, api_keys: Iterable[str] = (),
                 max_body_bytes: int = MAX_BODY_BYTES, host: str | None = None, port: int | None = None,
                 cors_origins: Iterable[str] = (), tenants: Tenants | None = None,
                 default_max_tokens: int = DEFAULT_MAX_TOKENS, sampling: GenerationDefaults | None = None,
                 reasoning_parser: str = "auto", chat_template_kwargs: Mapping[str, Any] | None = None,
                 thinking_token_budget: int | None = None, allow_runtime_lora: bool = False,
                 lora_paths: Mapping[str, str] | None = None) -> None:
        self.tenants = Tenants.of_keys(api_keys) if tenants is None else tenants  # (given: the keys' digests only)
        self.engine = engine
        self.tokenizer = tokenizer  # the HTTP side's own instance; the engine thread decodes with another
        self.tokenizers = PromptTokenizers(tokenizer)
        # response_format, text.format, a forcing tool_choice: compiled with a tokenizer of its own
        self.grammars = structured.Grammars(tokenizer)
        self.model_name = model_name
        # what clients are told names no file of the server's (the log keeps the paths)
        self.scrub_paths = PathScrubber([getattr(engine.model, "path", None), getattr(tokenizer, "name_or_path", None)],
                                        model_name)
        self.max_body_bytes = max_body_bytes
        self.host, self.port = host, port
        self.cors_origins = tuple(cors_origins)  # web origins whose pages may call the API (none: same origin only)
        self.created = int(time.time())
        config = engine.model.config
        self.vocab_size = config.vocab_size
        self.context = engine.max_length  # the longest prompt + reply: the model's context, or what the KV cache holds
        self.default_max_tokens = default_max_tokens
        self.sampling = engine.model.generation_defaults if sampling is None else sampling
        # a prompt of more characters has more tokens than the context holds (see longest_token)
        self.longest_token = longest_token(tokenizer)
        self.max_prompt_chars = self.context * self.longest_token
        # the format of the model's tool calls, from its chat template (None: requests with tools are refused, why)
        self.tool_format, self.no_tools_why = tool_support(tokenizer)
        # its call opener where that is a special token (Llama 3, Mistral): kept in the text of requests with tools
        self.tool_markers = frozenset(special_openers(tokenizer, self.tool_format).values() if self.tool_format else ())
        # a reasoning model's thinking, parsed apart from its answer (None: the text as it comes), and its switches
        self.reasoning = load_parser(tokenizer, reasoning_parser)
        self.template_names = template_names(tokenizer)  # what a request's chat_template_kwargs may set
        self.chat_template_kwargs, self.unused_template_kwargs = usable(
            parse_kwargs(chat_template_kwargs, "--chat-template-kwargs"), self.template_names)
        if thinking_token_budget is not None and self.reasoning is None:
            raise LlaisysValueError("--thinking-token-budget needs a reasoning model: this model's chat template opens "
                                    "no thinking (or --reasoning-parser is none)")
        self.thinking_token_budget = thinking_token_budget
        # what ``GET /metrics`` answers: this engine's metrics (a replica on Ray answers every replica's instead:
        # serve/replicas/deployments.py sets its own)
        self.metrics_text: Callable[[], str] = self.engine_metrics_text
        # the model's LoRA adapters, served by name (None: LoRA is not enabled on the model)
        self.adapters: ServedAdapters | None = None
        if getattr(engine.model, "lora", None) is not None:
            self.adapters = ServedAdapters(engine, model_name, runtime=allow_runtime_lora, paths=dict(lora_paths or {}))
        elif allow_runtime_lora:
            raise LlaisysValueError("runtime LoRA loading needs LoRA enabled on the model (model.enable_lora)")

    def engine_metrics_text(self) -> str:
        """This engine's metrics, in Prometheus' text format."""
        return metrics.render(self.engine, self.model_name)

    def public_error(self, status: int, message: str, code: str | None = None, param: str | None = None) -> dict:
        """An error body for a client, the server's paths taken out of its message (and logged with them)."""
        public = self.scrub_paths(message)
        if public != message:
            log.warning("error %d sent to the client without the server's paths: %s", status, message)
        return error_body(status, public, param, code)

    def error_response(self, status: int, body: dict) -> JSONResponse:
        """The response to a refused request (an error ``body``): counted in the metrics, its paths scrubbed."""
        self.engine.metrics.http_errors[status] += 1
        error = body["error"]
        body = self.public_error(status, error["message"], error["code"], error["param"])
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        return JSONResponse(body, status_code=status, headers=headers)
