"""``llaisys serve``: an OpenAI-compatible HTTP server and web chat page over one llaisys model.

From the top down (each imports only what is below it):

    cli.py            the ``serve`` subcommand of ``llaisys``: its options, checked; one server or replicas
    ray_app.py        the replicas application for Ray's own ``serve run``
    replicas/         replicas of this server on Ray Serve (``--replicas N``; the ``ray`` extra)
    launch.py         one server started: load_server (model, engine, Server), bind, serve (uvicorn)
    background.py     the server on a thread of this process (scripts, benchmarks, tests)
    app.py            the FastAPI application assembled: routers, error responses, middleware
    routes.py         the web page, /health, /metrics
    openai/           OpenAI's endpoints, each a protocol (request and response bodies), a serving (request ->
                      engine jobs -> events -> response) and a router: chat/, completions/, responses/, models/
    server.py         Server: what the routes share (engine, tokenizers, grammars, the model's limits)
    lora.py           LoRA adapters served by name; /v1/load_lora_adapter, /v1/unload_lora_adapter
    tenancy.py        API keys and tenants, cache_salt and the cache scope
    hosts.py          a loopback server answers loopback Host names only
    request_body.py   a request's JSON body, bounded before it is read
    sse.py            server-sent events framing
    tokenizer_pool.py the prompt tokenizers' threads
    structured.py     response_format, text.format and forcing tool_choice as grammars (forced_calls.py)
    tool_calls.py     tool calls parsed from a model's output, per family syntax
    engine.py         the engine thread: owns the model, batches sequences (llaisys_models.engine), streams text
    access_log.py, metrics.py, tracing.py, kv_memory.py, shutdown.py, errors.py, defaults.py
    static/           the web chat page (one file, no build step)

Needs the ``serve`` extra: ``pip install './llaisys-models[serve]'`` (FastAPI and uvicorn).
"""
