"""``llaisys bench`` and ``llaisys bench serve``: registered in the entry-point group ``llaisys.commands``.

Registering imports nothing heavy: each mode's module adds its own arguments and runs when chosen.
"""

from __future__ import annotations

import argparse

from ..cli.generate import _command
from . import model, serve


def register_bench(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "bench", help="measure a model's prefill and decode rates, or a server under load (bench serve)",
        description="Measure prefill and decode rates of a model (a grid over the axes given), as llama-bench "
                    "does; `llaisys bench serve` measures an OpenAI-compatible server under load.")
    model.add_arguments(p)
    p.set_defaults(func=_command(model.run))
    modes = p.add_subparsers(dest="bench_mode", metavar="{serve}")
    s = modes.add_parser("serve", help="load an OpenAI-compatible server: TTFT, ITL, TPOT, E2E percentiles",
                         description="Send a dataset of prompts to an OpenAI-compatible server (llaisys serve, "
                                     "llama-server, vLLM, ...) at a concurrency or a request rate and report TTFT, "
                                     "inter-token latency, TPOT and end-to-end latency percentiles, throughput "
                                     "and goodput.")
    serve.add_arguments(s)
    s.set_defaults(func=_command(serve.run))
