"""``llaisys serve``: registered in the entry-point group ``llaisys.commands``: its options, checked, then one
server in this process (launch.py) or replicas on Ray (replicas/launch.py).

Registering imports nothing heavy; FastAPI and uvicorn are imported when the command runs,
with a clear message when the ``serve`` extra is not installed.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from ..cli import speculative_flags
from ..cli.generate import (
    MODEL_HELP,
    _command,
    add_generation_config_argument,
    add_tensor_parallel_argument,
    tensor_parallel_options,
)
from ..engine import kv_cache
from ..families import numerics
from ..loading import quantize
from .defaults import DEFAULT_MAX_LORA_RANK, DEFAULT_MAX_LORAS, DEFAULT_MAX_TOKENS
from .launch import bind, serve

LOOPBACK = "127.0.0.1"


def register_serve(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "serve", help="an OpenAI-compatible HTTP server with a web chat page",
        description="Serve a model over OpenAI's chat/completions API (streaming included) with a web chat "
                    "page at /. Binds to 127.0.0.1 unless --host says otherwise.")
    p.add_argument("--model", type=Path, default=None, metavar="PATH|ID", help=MODEL_HELP)
    p.add_argument("--tokenizer", type=Path, default=None, help="tokenizer directory (default: the model's)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1, ... (default: the best available)")
    p.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16", "f32", "f16", "bf16"],
                   help="compute dtype (default: the dtype the weights are stored in)")
    numerics.add_argument(p)
    quantize.add_argument(p)
    kv_cache.add_argument(p)
    add_tensor_parallel_argument(p)
    add_generation_config_argument(p)
    p.add_argument("--host", default=LOOPBACK, help=f"address to bind (default {LOOPBACK}: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 picks a free one)")
    p.add_argument("--api-key", action="append", default=None, metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on every endpoint but /health and the page; "
                        "repeatable, each key its own tenant (its cached prompts are its own) "
                        "(default: $LLAISYS_API_KEY, else no key)")
    p.add_argument("--api-key-file", type=Path, default=None, metavar="FILE",
                   help="API keys, one per line (blank lines and lines starting with # are ignored); "
                        "with --api-key, the keys of both")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="let web pages of ORIGIN (e.g. https://app.example) call the API from a browser (CORS); "
                        "repeatable (default: none)")
    p.add_argument("--served-model-name", default=None,
                   help="the model id clients name (default: the model directory's name; 'llaisys-demo')")
    p.add_argument("--default-max-tokens", type=int, default=DEFAULT_MAX_TOKENS, metavar="N",
                   help=f"the longest reply to a request that sets no max_tokens (max_completion_tokens, "
                        f"max_output_tokens), or the room its prompt leaves in the context if less (default "
                        f"{DEFAULT_MAX_TOKENS}; a request may ask for more)")
    reasoning = p.add_argument_group(
        "reasoning models", "A reasoning model's thinking (DeepSeek-R1 and its distills, QwQ, Qwen3) comes back apart "
                            "from its answer, as message.reasoning_content (docs/serving.md, 'Reasoning models').")
    reasoning.add_argument("--reasoning-parser", default="auto", metavar="auto|deepseek_r1|qwen3|none",
                           help="how replies think: deepseek_r1 (the chat template opens <think>), qwen3 (the model "
                                "opens it, unless enable_thinking is false), none (the reply's text as it is); "
                                "default auto: as the chat template says")
    reasoning.add_argument("--chat-template-kwargs", default=None, metavar="JSON",
                           help="a JSON object of chat template variables for every request, e.g. "
                                "'{\"enable_thinking\": false}'; a request's chat_template_kwargs override them "
                                "(default: none)")
    reasoning.add_argument("--thinking-token-budget", type=int, default=None, metavar="N",
                           help="think at most N tokens, then close the thinking and answer; a request's "
                                "thinking_token_budget overrides it (default: unbounded)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="the least severe log lines printed (default info: a line per request, on stderr; warning "
                        "leaves those out)")
    p.add_argument("--log-format", default="text", choices=["text", "json"],
                   help="log lines as text, or as one JSON object each (default text)")
    p.add_argument("--trace-dir", type=Path, default=None, metavar="DIR",
                   help="write a Chrome trace of each request to DIR/<response id>.json when it ends (created if "
                        "missing): its time queued, in prefill, in each decode step (with the step's batch) and "
                        "detokenizing, with its token counts and finish reason, never its text; open one in "
                        "https://ui.perfetto.dev (default: no traces)")
    p.add_argument("--max-running", type=int, default=16,
                   help="sequences generated together, every one a token per forward pass (default 16)")
    p.add_argument("--max-batch-tokens", type=int, default=128,
                   help="tokens per forward pass: every running sequence's next token, then chunks of new "
                        "prompts (default 128; a long prompt holds the other streams up by one chunk at most)")
    p.add_argument("--kv-memory", default=None,
                   help="memory of the paged KV cache, e.g. 4GiB or 512MB (default: one full context, or "
                        "--max-running sequences of 2048 tokens if more, at most a quarter of the free memory); "
                        "printed at start-up")
    p.add_argument("--block-size", type=int, default=16, help="positions per KV cache block (default 16)")
    p.add_argument("--no-prefix-reuse", action="store_true",
                   help="always compute the whole prompt (no KV blocks shared between requests)")
    speculative_flags.add_arguments(p, "by default (requests may choose with \"speculative\": "
                                       "\"ngram\" | \"draft\" | \"off\")")
    p.add_argument("--no-batching", action="store_true",
                   help="one forward pass per sequence, prompts in one piece (the unbatched engine, to compare)")
    lora = p.add_argument_group(
        "LoRA adapters", "Serve LoRA adapters beside the model, each under its own name: a request's \"model\" picks "
                         "the base model or an adapter; the base model and the adapters share every batch. See "
                         "docs/serving.md, 'LoRA adapters'.")
    lora.add_argument("--lora", action="append", default=[], metavar="NAME=PATH",
                      help="serve the adapter at PATH (a PEFT directory or a llama.cpp GGUF adapter) as the model "
                           "NAME; repeatable (default: none)")
    lora.add_argument("--max-loras", type=int, default=None, metavar="N",
                      help=f"adapters in one batch; requests under one more wait (default {DEFAULT_MAX_LORAS})")
    lora.add_argument("--max-lora-rank", type=int, default=None, metavar="R",
                      help=f"the largest rank of an adapter (default {DEFAULT_MAX_LORA_RANK})")
    lora.add_argument("--allow-runtime-lora", action="store_true",
                      help="enable POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's), which let every "
                           "API key load adapter files from this machine (default: off; those routes are absent)")
    replicas = p.add_argument_group(
        "replicas on Ray", "Serve copies of the model through Ray Serve (the 'ray' extra), each with its own engine, "
                           "behind this one address: a conversation's next turn goes to the replica that holds its "
                           "prefix; Ray replaces a replica that dies. See docs/multi-device.md, 'Replicas on Ray Serve'.")
    replicas.add_argument("--replicas", type=int, default=None, metavar="N",
                          help="serve N replicas (default: one server in this process, without Ray)")
    replicas.add_argument("--max-replicas", type=int, default=None, metavar="M",
                          help="scale between --replicas and M replicas with the load (default: --replicas, fixed)")
    replicas.add_argument("--target-ongoing-requests", type=float, default=None, metavar="R",
                          help="the requests per replica the scaling aims at (default: --max-running)")
    replicas.add_argument("--replica-cpus", type=float, default=None, metavar="C",
                          help="CPU cores each replica (with --tensor-parallel N: each of its N ranks) reserves, "
                               "which also sizes its kernels' threads (default 1)")
    replicas.add_argument("--replica-gpus", type=float, default=None, metavar="G",
                          help="GPUs each replica (with --tensor-parallel N: each of its N ranks) reserves (default: "
                               "1 where --device names a GPU, else 0)")
    replicas.add_argument("--ray-address", default=None, metavar="ADDR",
                          help="join this Ray cluster ('auto': the one `ray start` started on this machine; "
                               "default: start one for this server, on this machine); also for the ranks of "
                               "--distributed-executor ray")
    # (Ctrl+C while the model loads: status 130, no traceback; once it serves, serve/shutdown.py takes the signals)
    p.set_defaults(func=_command(run_serve))


def run_serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn  # noqa: F401 (the extra's packages, checked before anything else runs)

        from .app import create_app  # noqa: F401
    except ImportError as e:
        print(f"llaisys: error: serving needs the 'serve' extra ({e.name or e} is missing): "
              f"pip install 'llaisys-models[serve]'", file=sys.stderr)
        return 2
    path, kv_memory, keys = checked_options(args)
    if args.replicas is not None:
        from .replicas.launch import serve_replicas

        return serve_replicas(args, path, kv_memory, keys)
    if args.ray_address is not None:  # (the ranks' cluster: Ray's own variable, read when it connects)
        os.environ["RAY_ADDRESS"] = args.ray_address
    # bound before the model loads: a port in use fails at once, and the banner names the real port (--port 0)
    listener = bind(args.host, args.port)
    try:
        return serve(args, path, kv_memory, listener, keys)
    finally:
        listener.close()


def checked_options(args: argparse.Namespace) -> tuple[Path, int | None, list[str]]:
    """The options checked (a LlaisysValueError names the first one wrong): (the model's directory, the KV
    memory in bytes or None, the API keys)."""
    from llaisys import LlaisysValueError

    from ..cli.generate import model_dir
    from .kv_memory import parse_size
    from .tracing import prepare_trace_dir

    keys = api_keys(args, os.environ)  # before anything else: an empty key must not start a server without one
    for origin in args.cors_origin:
        check_origin(origin)
    for name in ("port", "max_running", "max_batch_tokens", "block_size", "default_max_tokens"):
        low = 0 if name == "port" else 1
        if getattr(args, name) < low or (name == "port" and args.port > 65535):
            raise LlaisysValueError(f"--{name.replace('_', '-')} = {getattr(args, name)} is out of range")
    tensor_parallel_options(args)
    check_reasoning_options(args)
    check_replica_options(args)
    check_lora_options(args)
    kv_memory = None if args.kv_memory is None else parse_size(args.kv_memory)
    speculative_flags.check_arguments(args)
    if args.trace_dir is not None:  # made and checked now, not after the model loaded; absolute for replicas
        args.trace_dir = prepare_trace_dir(args.trace_dir)
    return model_dir(args), kv_memory, keys


def check_reasoning_options(args: argparse.Namespace) -> None:
    """--reasoning-parser, --chat-template-kwargs and --thinking-token-budget, each a one-line error if wrong (what
    the model's tokenizer says of them is checked as it loads: serve/server.py)."""
    from llaisys import LlaisysValueError

    from ..text.reasoning import CHOICES
    from ..text.template_kwargs import parse_kwargs

    if args.reasoning_parser not in CHOICES:
        raise LlaisysValueError(f"--reasoning-parser {args.reasoning_parser!r} is not a reasoning parser: use one of "
                                f"{', '.join(CHOICES)}")
    parse_kwargs(args.chat_template_kwargs, "--chat-template-kwargs")
    if args.thinking_token_budget is not None and args.thinking_token_budget < 0:
        raise LlaisysValueError(f"--thinking-token-budget = {args.thinking_token_budget} is out of range (at least 0)")


def lora_enabled(args: argparse.Namespace) -> bool:
    """Whether the options serve LoRA adapters (any of --lora, --max-loras, --max-lora-rank, --allow-runtime-lora)."""
    return bool(getattr(args, "lora", None) or getattr(args, "max_loras", None) is not None
                or getattr(args, "max_lora_rank", None) is not None or getattr(args, "allow_runtime_lora", False))


def check_lora_options(args: argparse.Namespace) -> None:
    """--lora (NAME=PATH each, names distinct and not --served-model-name), --max-loras and --max-lora-rank in
    range; runtime loading with one server only (each replica would load its own)."""
    from llaisys import LlaisysValueError

    from ..lora.model import MAX_RANK
    from .lora import parse_modules

    parse_modules(args.lora, args.served_model_name)
    for name, top in (("max_loras", 64), ("max_lora_rank", MAX_RANK)):
        value = getattr(args, name)
        if value is not None and not 1 <= value <= top:
            raise LlaisysValueError(f"--{name.replace('_', '-')} = {value} is out of range (1 to {top})")
    if args.allow_runtime_lora and args.replicas is not None:
        raise LlaisysValueError("--allow-runtime-lora loads an adapter into one server: it cannot go with --replicas "
                                "(give the adapters with --lora)")


def check_replica_options(args: argparse.Namespace) -> None:
    """--replicas and the options that go with it: in range, and none without it."""
    from llaisys import LlaisysValueError

    from .replicas.launch import replica_resources

    dependent = ("max_replicas", "target_ongoing_requests", "replica_cpus", "replica_gpus", "ray_address")
    if args.replicas is None:
        given = [name for name in dependent if getattr(args, name) is not None
                 and not (name == "ray_address" and args.distributed_executor == "ray")]
        if given:
            raise LlaisysValueError(f"--{given[0].replace('_', '-')} needs --replicas"
                                    + (" or --distributed-executor ray" if given[0] == "ray_address" else ""))
        return
    if args.tensor_parallel > 1 and args.distributed_executor == "local":
        raise LlaisysValueError("a replica's tensor-parallel ranks are Ray actors in its placement group: "
                                "--distributed-executor local cannot go with --replicas")
    if args.tensor_parallel > 1 and not any(replica_resources(args).values()):
        raise LlaisysValueError("each rank of a replica reserves --replica-cpus cores and --replica-gpus GPUs (a "
                                "placement-group bundle): they cannot both be 0 with --tensor-parallel")
    if args.replicas < 1:
        raise LlaisysValueError(f"--replicas = {args.replicas} is out of range (at least 1)")
    if args.max_replicas is not None and args.max_replicas < args.replicas:
        raise LlaisysValueError(f"--max-replicas = {args.max_replicas} is less than --replicas = {args.replicas}")
    for name in ("target_ongoing_requests", "replica_cpus", "replica_gpus"):
        value = getattr(args, name)
        if value is not None and (value <= 0 if name == "target_ongoing_requests" else value < 0):
            raise LlaisysValueError(f"--{name.replace('_', '-')} = {value} is out of range")


def api_keys(args: argparse.Namespace, environ: Mapping[str, str]) -> list[str]:
    """The keys of every --api-key and of --api-key-file; without either, $LLAISYS_API_KEY (one key) if set.
    An empty key, from any of them, is an error: it would serve without a key."""
    from .tenancy import check_api_key

    keys = [(key, "--api-key") for key in args.api_key or ()]
    if args.api_key_file is not None:
        keys += _read_key_file(args.api_key_file)
    if not keys and "LLAISYS_API_KEY" in environ:
        keys = [(environ["LLAISYS_API_KEY"], "LLAISYS_API_KEY")]
    for key, source in keys:
        check_api_key(key, source)
    return [key for key, _ in keys]


def check_origin(origin: str) -> None:
    """A LlaisysValueError unless ``origin`` is a web origin as a browser sends it: scheme://host[:port], or '*'."""
    from urllib.parse import urlsplit

    from llaisys import LlaisysValueError

    if origin == "*":
        return
    url = urlsplit(origin)
    if url.scheme not in ("http", "https") or not url.netloc or url.path or url.query or url.fragment or "@" in origin:
        raise LlaisysValueError(f"--cors-origin {origin!r} is not an origin: give scheme://host[:port] as the browser "
                                f"sends it (e.g. https://app.example), with no path or trailing slash")


def _read_key_file(path: Path) -> list[tuple[str, str]]:
    from llaisys import LlaisysValueError

    from ..loading.files import check_regular

    try:
        check_regular(path)
        lines = path.read_text(encoding="utf-8").splitlines()
    except (LlaisysValueError, OSError, UnicodeError) as e:
        raise LlaisysValueError(f"--api-key-file {path}: {e}") from None
    keys = [(line.strip(), f"line {n} of {path}") for n, line in enumerate(lines, 1)
            if line.strip() and not line.strip().startswith("#")]
    if not keys:
        raise LlaisysValueError(f"--api-key-file {path} holds no key (one per line; # starts a comment line)")
    return keys
