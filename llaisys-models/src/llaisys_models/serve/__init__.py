"""``llaisys serve``: an OpenAI-compatible HTTP server and web chat page over one llaisys model.

    engine.py       the engine thread: owns the model, batches sequences (llaisys_models.engine.scheduler), streams tokens
    kv_memory.py    the KV cache's memory budget (--kv-memory sizes, the default)
    output.py       per-sequence text: incremental detokenization and stop strings
    schemas.py      request validation (OpenAI's parameters) and response/chunk bodies
    errors.py       OpenAI-style error bodies for every rejected request
    metrics.py      the engine's counters in Prometheus text format
    app.py          the FastAPI application: routes, auth, streaming (SSE), disconnect = cancel
    background.py   the server on a thread of this process (scripts, benchmarks, tests)
    cli.py          the ``serve`` subcommand of ``llaisys``
    replicas/       replicas of this server on Ray Serve (``--replicas N``; the ``ray`` extra)
    ray_app.py      the replicas application for Ray's own ``serve run``
    static/         the web chat page (one file, no build step)

Needs the ``serve`` extra: ``pip install './llaisys-models[serve]'`` (FastAPI and uvicorn).
"""
