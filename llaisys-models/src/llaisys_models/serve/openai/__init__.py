"""OpenAI's API over the engine, one folder per endpoint, each in three files (as vLLM's entrypoints):

    protocol.py   the request's fields, parsed and checked (each rejection a 400 naming its ``param``), and the
                  response's bodies
    serving.py    request -> the engine's jobs -> its events -> a JSON body or a stream of server-sent events
    router.py     the FastAPI route(s), which app.py includes behind the API key

    chat/         POST /v1/chat/completions (and tools.py: the request's tools and tool_choice)
    completions/  POST /v1/completions
    responses/    POST /v1/responses
    models/       GET /v1/models, /v1/models/{id}

What the endpoints share: protocol.py (fields, the usage body, the choices' response shape), sampling.py (the
sampling fields, by the rules of engine/sampling_rules.py that the Python API checks by too), prompts.py (prompts
to token ids, bounded) and serving.py (queueing jobs, a whole response, a stream of chunks).
"""
