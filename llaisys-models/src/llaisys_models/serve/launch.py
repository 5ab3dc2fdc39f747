"""Starting one server: ``load_server`` (the model, its engine, the ``Server``), ``bind`` (its listening socket)
and ``serve`` (uvicorn on it until Ctrl+C or SIGTERM). ``llaisys serve`` (cli.py) runs them in this process; each
replica on Ray (replicas/deployments.py) loads its own server, and replicas/launch.py binds the address first.

Importing this module imports nothing heavy (registering the command imports it): FastAPI, uvicorn and the model
are imported when a function runs.
"""

from __future__ import annotations

import socket
import sys
from argparse import Namespace
from pathlib import Path
from typing import TYPE_CHECKING

from ..cli import speculative_flags
from ..cli.generate import split_cpu_threads, tensor_parallel_options

if TYPE_CHECKING:
    from ..families.causal_lm import CausalLM
    from .server import Server
    from .tenancy import Tenants


def load_server(args: Namespace, path: Path, kv_memory: int | None, tenants: Tenants, port: int) -> Server:
    """The ``Server`` the options ``args`` describe: the model at ``path`` loaded, its engine (not started), the
    ``tenants`` (tenancy.Tenants) and the address clients reach it at (``args.host``, ``port``). One per process of
    ``llaisys serve``, or one per replica on Ray (serve/replicas)."""
    from .. import load
    from ..text import generation_defaults
    from ..text.tokenizer import load_tokenizer
    from .access_log import configure
    from .engine import Engine
    from .server import Server

    configure(args.log_level, args.log_format)  # this process's log: the access lines, warnings, errors
    tokenizer_path = args.tokenizer or path
    parallel = tensor_parallel_options(args)
    split_cpu_threads(args.tensor_parallel)
    model = load(path, device=args.device, dtype=args.dtype, numerics=args.numerics, quantize=args.quantize,
                 dequantize=args.dequantize, kv_cache_dtype=getattr(args, "kv_cache_dtype", "auto"), **parallel)
    name = args.served_model_name or default_model_name(path, args.model)
    lora_paths = load_adapters(args, model, name)
    # two tokenizers: the HTTP side encodes prompts while the engine thread decodes tokens
    speculation, draft = speculative_flags.from_arguments(args, model)
    engine = Engine(model, load_tokenizer(tokenizer_path), max_running=args.max_running,
                    max_batch_tokens=args.max_batch_tokens, kv_memory=kv_memory, block_size=args.block_size,
                    prefix_reuse=not args.no_prefix_reuse, batched=not args.no_batching,
                    speculation=speculation, draft=draft, trace_dir=getattr(args, "trace_dir", None))
    sampling = generation_defaults.NONE if args.generation_config == "none" else None  # None: the model's
    return Server(engine, load_tokenizer(tokenizer_path), name, host=args.host, port=port,
                  cors_origins=args.cors_origin, tenants=tenants, default_max_tokens=args.default_max_tokens,
                  sampling=sampling, reasoning_parser=getattr(args, "reasoning_parser", "auto"),
                  chat_template_kwargs=getattr(args, "chat_template_kwargs", None),
                  thinking_token_budget=getattr(args, "thinking_token_budget", None),
                  allow_runtime_lora=getattr(args, "allow_runtime_lora", False), lora_paths=lora_paths)


def load_adapters(args: Namespace, model: CausalLM, name: str) -> dict[str, str]:
    """LoRA enabled on ``model`` (served as ``name``) where the options ask for adapters (--lora, --max-loras,
    --max-lora-rank, --allow-runtime-lora), and every --lora adapter loaded: {name: path as given}. An adapter that
    cannot load is a one-line error naming its option (the server does not start)."""
    from llaisys import LlaisysError, LlaisysValueError

    from .cli import lora_enabled
    from .defaults import DEFAULT_MAX_LORA_RANK, DEFAULT_MAX_LORAS
    from .lora import parse_modules

    if not lora_enabled(args):
        return {}
    modules = parse_modules(args.lora, name)
    max_loras = DEFAULT_MAX_LORAS if args.max_loras is None else args.max_loras
    max_rank = DEFAULT_MAX_LORA_RANK if args.max_lora_rank is None else args.max_lora_rank
    model.enable_lora(max_loras=max_loras, max_lora_rank=max_rank)
    for adapter_name, adapter_path in modules:
        try:
            model.load_lora(adapter_name, Path(adapter_path))
        except (LlaisysError, OSError) as e:
            message = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise LlaisysValueError(f"--lora {adapter_name}={adapter_path}: {message}") from None
    return dict(modules)


def serve(args: Namespace, path: Path, kv_memory: int | None, listener: socket.socket, keys: list[str]) -> int:
    """Load the server ``args`` describe and serve it on ``listener`` until stopped (Ctrl+C, SIGTERM, or a rank of
    its model that dies): the exit status."""
    import uvicorn

    from .app import create_app
    from .hosts import is_loopback
    from .kv_memory import describe
    from .shutdown import HTTPServer
    from .tenancy import Tenants

    port = listener.getsockname()[1]
    server = load_server(args, path, kv_memory, Tenants.of_keys(keys), port)
    engine, model, name = server.engine, server.engine.model, server.model_name
    if not is_loopback(args.host):
        print(f"llaisys serve: warning: binding {args.host} exposes the server beyond this machine"
              + ("" if keys else " without an API key"), file=sys.stderr)
    weights = f", {'/'.join(model.weight_formats)} weights" if model.weight_formats else ""
    if args.tensor_parallel > 1:
        weights += f", split over {args.tensor_parallel} ranks" + (" on Ray" if args.distributed_executor == "ray"
                                                                     else "")
    print(f"llaisys serve: {name} ({model.device}, {model.dtype.name}{weights}) at http://{url_host(args.host)}:{port}/"
          f"  (OpenAI API under /v1{', API key required' if keys else ''})", file=sys.stderr)
    print(f"llaisys serve: {describe(engine.pool)}; up to {args.max_running} sequences, {args.max_batch_tokens} "
          f"tokens per forward{'' if not args.no_batching else ' (batching off)'}", file=sys.stderr, flush=True)
    if server.reasoning is not None:
        budget = server.thinking_token_budget
        print(f"llaisys serve: replies think apart from their answers ({server.reasoning.name} reasoning parser; "
              f"{'unbounded' if budget is None else f'at most {budget} tokens'} by default)", file=sys.stderr)
    if server.adapters is not None and model.lora is not None:
        loaded = ", ".join(f"{a.name} (rank {a.rank})" for a in model.loras.values()) or "none yet"
        print(f"llaisys serve: LoRA adapters: {loaded}; up to {model.max_loras} in a batch, rank {model.lora.max_rank} "
              f"at most" + ("; loaded and unloaded at /v1/load_lora_adapter, /v1/unload_lora_adapter"
                            if server.adapters.runtime else ""), file=sys.stderr)
    if server.unused_template_kwargs:
        print(f"llaisys serve: warning: the chat template reads no {', '.join(server.unused_template_kwargs)} "
              f"(--chat-template-kwargs): ignored", file=sys.stderr)
    if server.sampling.describe():
        print(f"llaisys serve: requests that set none sample as the model says: {server.sampling.describe()}",
              file=sys.stderr, flush=True)
    # on Ctrl+C or SIGTERM the engine fails every open request at once, so each response ends (serve/shutdown.py);
    # the 5 s are for a handler still busy before it queued (a long prompt's tokenization), which is then cut.
    # uvicorn's access log is off (serve/access_log.py writes ours), its own lines from warnings up but with debug
    config = uvicorn.Config(create_app(server), log_level="debug" if args.log_level == "debug" else "warning",
                            access_log=False, timeout_graceful_shutdown=5)
    http = HTTPServer(config, engine)
    failures = []
    if model.followers is not None:  # a rank that dies or hangs ends the group, and the server with it
        def end(message: str) -> None:
            failures.append(message)
            print(f"llaisys serve: error: {message}", file=sys.stderr, flush=True)
            http.should_exit = True
        model.followers.on_failure.append(end)
    http.run(sockets=[listener])
    model.close()
    return 1 if failures else 0


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port); port 0 takes a free one. A port in use is a one-line error."""
    from llaisys import LlaisysValueError

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise LlaisysValueError(f"cannot listen on {url_host(host)}:{port}: {e.strerror or e}") from None
    sock.listen(2048)
    return sock


def default_model_name(path: Path, spec: str | Path | None = None) -> str:
    """The model id clients name: the demo's, the Hub id ``spec`` (--model) resolved to ``path``, or the
    model directory's name."""
    from .. import DEMO_MODEL_DIR
    from ..loading.hub import parse

    if spec is not None and Path(spec) != Path(path) and parse(spec) is not None:
        return str(parse(spec))
    return "llaisys-demo" if Path(path).resolve() == DEMO_MODEL_DIR.resolve() else Path(path).resolve().name


def url_host(host: str) -> str:
    """``host`` as a URL names it (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host else host

