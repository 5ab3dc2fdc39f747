"""``llaisys bench serve``: load an OpenAI-compatible server and report latency percentiles and throughput.

Like ``vllm bench serve`` and SGLang's ``bench_serving``: a dataset of prompts is streamed to the server at a
concurrency and/or a request rate (Poisson arrivals), and each request's time to first token (TTFT), inter-token
latencies (ITL), time per output token (TPOT) and end-to-end latency (E2E) are measured on the client side.
Token counts come from the server's ``usage`` (``stream_options.include_usage``). Example::

    llaisys serve --port 8000 &
    llaisys bench serve --url http://127.0.0.1:8000 --num-prompts 200 --concurrency 8 \\
        --input-len 256 --output-len 128 --goodput ttft:500 tpot:50 --output json --output-file run.json

The HTTP client is the standard library's (a thread and a fresh connection per request in flight), so nothing
beyond llaisys is needed. One short request (max_tokens 1) goes first, unmeasured: a wrong model name, API key or
endpoint is then one error rather than N failed requests.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import json
import math
import os
import queue
import random
import sys
import threading
import time
from typing import Any

from llaisys import LlaisysValueError

from . import datasets, report
from .client import Client, Record, Target, served_models
from .stats import PERCENTILES, summarize

SLO_METRICS = ("ttft", "tpot", "e2e")
LATENCIES = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2e", "E2E"))


def add_arguments(p: argparse.ArgumentParser) -> None:
    target = p.add_argument_group("server")
    target.add_argument("--url", required=True, help="the server's base URL, e.g. http://127.0.0.1:8000 (the OpenAI "
                                                     "API is under /v1)")
    target.add_argument("--model", default=None, help="model name to send (default: the first id of GET /v1/models)")
    target.add_argument("--api-key", default=None, help="bearer token (default: $OPENAI_API_KEY, else none)")
    target.add_argument("--endpoint", choices=("chat", "completions"), default="chat",
                        help="chat: /v1/chat/completions with one user message; completions: /v1/completions "
                             "(default: %(default)s)")
    target.add_argument("--timeout", type=float, default=600.0, metavar="S",
                        help="seconds a request may wait for the server's next bytes (default: %(default)s)")
    load = p.add_argument_group("load")
    load.add_argument("--num-prompts", type=int, default=100, metavar="N",
                      help="requests to send, after one short probe request that is not measured (default: "
                           "%(default)s)")
    load.add_argument("--concurrency", type=int, default=None, metavar="C",
                      help="at most C requests in flight (default: no bound)")
    load.add_argument("--request-rate", type=float, default=math.inf, metavar="R",
                      help="requests per second, Poisson arrivals (exponential gaps from --seed); inf sends all at "
                           "once, within --concurrency (default: %(default)s)")
    load.add_argument("--seed", type=int, default=0, help="seed of the synthetic prompts and the arrivals "
                                                          "(default: %(default)s)")
    data = p.add_argument_group("requests")
    data.add_argument("--dataset", default="synthetic", metavar="synthetic|FILE.jsonl",
                      help="synthetic: random words; FILE.jsonl: one object a line with \"prompt\" (a string) or "
                           "\"messages\" (a list), and optionally \"max_tokens\"; its lines in order, repeated "
                           "where it holds fewer than --num-prompts (default: %(default)s)")
    data.add_argument("--input-len", type=int, default=256, metavar="WORDS",
                      help="synthetic prompts' mean length in WORDS, not tokens (no tokenizer on this side; the "
                           "server's usage reports the tokens) (default: %(default)s)")
    data.add_argument("--input-len-range", type=float, default=0.0, metavar="F",
                      help="input lengths uniform in mean * (1 ± F) (default: %(default)s)")
    data.add_argument("--output-len", type=int, default=128, metavar="TOKENS",
                      help="mean max_tokens per request where the dataset gives none (default: %(default)s)")
    data.add_argument("--output-len-range", type=float, default=0.0, metavar="F",
                      help="output lengths uniform in mean * (1 ± F) (default: %(default)s)")
    data.add_argument("--max-tokens", type=int, default=None, help="max_tokens of every request (default: the "
                                                                   "dataset's, else drawn from --output-len)")
    data.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default: %(default)s)")
    out = p.add_argument_group("results")
    out.add_argument("--goodput", nargs="+", default=None, metavar="METRIC:MS",
                     help="SLOs in ms, of ttft, tpot, e2e (e.g. ttft:500 tpot:50): goodput is the rate of requests "
                          "that meet every one")
    out.add_argument("--output", choices=report.FORMATS, default="table",
                     help="format of the summary (default: %(default)s; the table always goes to stdout)")
    out.add_argument("--output-file", default=None, metavar="FILE",
                     help="write the summary there (default: stdout)")
    out.add_argument("--save-requests", action="store_true", help="with --output json: every request's measurements")
    # the options above, by name: what the JSON's meta records (not `llaisys bench`'s own, nor the API key)
    p.set_defaults(serve_options=tuple(a.dest for a in p._actions if a.dest not in ("help", "api_key")))


# -- arguments ------------------------------------------------------------------------------------------------

def check_arguments(args: argparse.Namespace) -> dict[str, float]:
    """Refuse impossible values in one line; the SLOs of --goodput as {metric: ms}."""
    positive = {"--num-prompts": args.num_prompts, "--concurrency": args.concurrency,
                "--request-rate": args.request_rate, "--input-len": args.input_len, "--output-len": args.output_len,
                "--max-tokens": args.max_tokens, "--timeout": args.timeout}
    for name, value in positive.items():
        if value is not None and not value > 0:
            raise LlaisysValueError(f"{name} must be positive, got {value}")
    for name, value in {"--input-len-range": args.input_len_range, "--output-len-range": args.output_len_range}.items():
        if not 0 <= value < 1:
            raise LlaisysValueError(f"{name} must be in [0, 1), got {value}")
    if args.save_requests and args.output != "json":
        raise LlaisysValueError("--save-requests needs --output json")
    return parse_goodput(args.goodput or [])


def parse_goodput(items: list[str]) -> dict[str, float]:
    slos = {}
    for item in items:
        name, _, value = item.partition(":")
        try:
            ms = float(value)
        except ValueError:
            ms = math.nan
        if name not in SLO_METRICS or not ms > 0:
            raise LlaisysValueError(f"--goodput {item!r}: expected METRIC:MS with METRIC one of "
                                    f"{', '.join(SLO_METRICS)} and MS > 0")
        slos[name] = ms
    return slos


# -- HTTP -----------------------------------------------------------------------------------------------------


def request_body(args: argparse.Namespace, model: str, prompt: datasets.Prompt, max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": args.temperature, "stream": True,
            "stream_options": {"include_usage": True}}
    if args.endpoint == "chat":
        body["messages"] = prompt.as_messages()
    else:
        body["prompt"] = prompt.text
    return body


# -- the run --------------------------------------------------------------------------------------------------

def run_load(client: Client, bodies: list[dict[str, Any]], rate: float, concurrency: int | None, seed: int,
             done: list[Record]) -> float:
    """Send every request, each on a thread of its own, at ``rate`` (Poisson) with at most ``concurrency`` in
    flight; finished records are appended to ``done`` as they come (so an interrupt keeps them). The run's
    duration: from the first send to the last answer."""
    arrivals = random.Random(f"{seed}-arrivals")  # its own RNG: the same dataset whatever the rate
    slots = threading.BoundedSemaphore(concurrency) if concurrency else None
    finished: queue.Queue[Record] = queue.Queue()
    t0 = time.perf_counter()

    def work(record: Record, body: dict[str, Any]) -> None:
        try:
            finished.put(client.send(record, body, t0))
        finally:
            if slots:
                slots.release()

    try:
        due = t0
        for i, body in enumerate(bodies):
            if i and math.isfinite(rate):  # the first at once, then exponential gaps
                due += arrivals.expovariate(rate)
                time.sleep(max(0.0, due - time.perf_counter()))
            if slots:
                slots.acquire()
            # daemon: an interrupted run returns without waiting for requests it has cut
            threading.Thread(target=work, args=(Record(i, body["max_tokens"]), body), daemon=True).start()
        while len(done) < len(bodies):
            done.append(finished.get())
    finally:
        while not finished.empty():  # interrupted: keep what finished meanwhile
            done.append(finished.get_nowait())
    return time.perf_counter() - t0


def tables(row: dict[str, Any]) -> str:
    """The summary for people: the counts and rates, then one line per latency."""
    overview = [{"metric": k, "value": row[k]} for k in ("completed", "failed", "duration_s", "input_tokens",
                                                         "output_tokens", "request_throughput", "output_throughput",
                                                         "total_token_throughput", "goodput")
                if row[k] is not None or k != "goodput"]
    latencies = [{"latency": label, "mean_ms": row[f"{name}_mean_ms"],
                  **{f"p{q}_ms": row[f"{name}_p{q}_ms"] for q in PERCENTILES}} for name, label in LATENCIES]
    return report.render(overview, "table") + "\n" + report.render(latencies, "table")


def document(args: argparse.Namespace, fmt: str, row: dict[str, Any], meta: dict[str, Any], records: list[Record],
             failures: dict[str | None, int]) -> str:
    if fmt == "table":
        return tables(row)
    if fmt != "json":
        return report.render([row], fmt)
    doc = {"meta": meta, "rows": [row], "failures": failures}  # report.render's shape, and more
    if args.save_requests:
        doc["requests"] = [r.as_json() for r in sorted(records, key=lambda r: r.index)]
    return json.dumps(doc, indent=2, allow_nan=False) + "\n"


def write_results(args: argparse.Namespace, target: Target, model: str, records: list[Record], duration: float,
                  slos: dict[str, float], interrupted: bool) -> None:
    row = summarize(records, duration, slos)
    failures = dict(collections.Counter(r.error for r in records if not r.ok).most_common())
    for reason, count in failures.items():
        print(f"failed: {count} request{'s' * (count > 1)}: {reason}", file=sys.stderr)
    arguments = {k: getattr(args, k) for k in args.serve_options}
    meta = {"tool": "llaisys bench serve", "url": target.url, "model": model, "endpoint": args.endpoint,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "interrupted": interrupted, "slos_ms": slos,
            "arguments": {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                          for k, v in arguments.items()}}
    if args.output_file is None and args.output != "table":
        sys.stdout.write(document(args, args.output, row, meta, records, failures))
        return
    sys.stdout.write(tables(row))
    if args.output_file is not None:
        with open(args.output_file, "w", encoding="utf-8") as f:
            f.write(document(args, args.output, row, meta, records, failures))


def load_prompts(args: argparse.Namespace) -> list[datasets.Prompt]:
    rng = random.Random(args.seed)
    if args.dataset == "synthetic":
        prompts = datasets.synthetic(args.num_prompts, args.input_len, args.input_len_range, args.output_len,
                                     args.output_len_range, rng)
    else:
        drawn = datasets.lengths(args.output_len, args.output_len_range, args.num_prompts, rng)
        prompts = datasets.from_jsonl(args.dataset, args.num_prompts, drawn, args.endpoint == "chat")
    if args.max_tokens is not None:
        prompts = [dataclasses.replace(p, max_tokens=args.max_tokens) for p in prompts]
    return prompts


def run(args: argparse.Namespace) -> int:
    slos = check_arguments(args)
    prompts = load_prompts(args)  # a bad dataset is reported before the server is bothered
    target = Target.parse(args.url, args.api_key if args.api_key is not None else os.environ.get("OPENAI_API_KEY"))
    model = args.model
    if model is None:
        models = served_models(target)
        if not models:
            raise LlaisysValueError(f"{target.url} serves no models (GET /v1/models is empty); name one with --model")
        model = models[0]
    else:
        served_models(target)  # reachable, and the key is accepted
    client = Client(target, "/v1/chat/completions" if args.endpoint == "chat" else "/v1/completions", args.timeout)
    bodies = [request_body(args, model, p, p.max_tokens) for p in prompts]

    # One short request first (as vLLM's test prompt): a wrong model name, key or endpoint is one error, not N.
    probe = client.send(Record(-1, 1), {**bodies[0], "max_tokens": 1}, time.perf_counter())
    if not probe.ok:
        raise LlaisysValueError(f"the first request to {target.url} failed: {probe.error}")

    print(f"bench serve: {len(bodies)} requests to {target.url} ({model}, {args.endpoint}), concurrency "
          f"{args.concurrency or 'unbounded'}, request rate {args.request_rate}/s", file=sys.stderr)
    records: list[Record] = []
    t0 = time.perf_counter()
    try:
        duration = run_load(client, bodies, args.request_rate, args.concurrency, args.seed, records)
    except KeyboardInterrupt:
        duration = time.perf_counter() - t0
        client.close_all()
        print(f"\ninterrupted: {len(records)} of {len(bodies)} requests measured", file=sys.stderr)
        write_results(args, target, model, records, duration, slos, interrupted=True)
        return 130
    write_results(args, target, model, records, duration, slos, interrupted=False)
    return 0
