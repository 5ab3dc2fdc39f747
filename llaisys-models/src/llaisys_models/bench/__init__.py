"""``llaisys bench``: what a user measures with, from the installed packages.

    llaisys bench --model M [--prompt-tokens 512 --new-tokens 128 ...]   prefill / decode rates (model.py)
    llaisys bench serve --url http://127.0.0.1:8000 [...]               an OpenAI-compatible server under load
                                                                        (serve.py)

Both print a table and write ``--output json|csv|md`` (report.py).
"""
