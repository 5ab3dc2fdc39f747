"""``llaisys serve --trace-dir DIR``: one Chrome trace file per request, named by its response id, with its
queue, prefill, decode and detokenize spans and its counts, never its text; a bad DIR fails at start-up, a
failed write later is a warning and the server goes on."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

import llaisys_models
from helpers.chat_server import ChatServer, serve_device
from helpers.serve_helpers import CHAT_MODEL, require_serving, user

require_serving()

SECRET_PROMPT = "zebra quartz marmalade"  # (no digits: timestamps have all of them)


@pytest.fixture(scope="module")
def traced(chat_model_dir, pytestconfig, tmp_path_factory):
    """(server, trace dir): the chat model served with --trace-dir (a folder that does not exist yet)."""
    from llaisys_models.serve.engine import Engine
    from llaisys_models.serve.server import Server
    from llaisys_models.text.tokenizer import load_tokenizer

    trace_dir = tmp_path_factory.mktemp("traced") / "traces" / "new"
    model = llaisys_models.load(chat_model_dir, device=serve_device(pytestconfig))
    engine = Engine(model, load_tokenizer(chat_model_dir), max_running=8, kv_memory=64 << 20, trace_dir=trace_dir)
    assert trace_dir.is_dir()
    with ChatServer(Server(engine, load_tokenizer(chat_model_dir), CHAT_MODEL)) as server:
        yield server, trace_dir


def spans(path: Path) -> tuple[dict[int, list[dict]], str]:
    """The file's complete events by track (choice), after checking it is a Chrome trace; and its raw text."""
    raw = path.read_text()
    data = json.loads(raw)
    assert data["displayTimeUnit"] == "ms"
    tracks: dict[int, list[dict]] = {}
    for event in data["traceEvents"]:
        assert event["ph"] in ("X", "M") and event["pid"] > 0
        if event["ph"] == "X":
            assert event["dur"] >= 0 and event["cat"] == "serve"
            tracks.setdefault(event["tid"], []).append(event)
    for events in tracks.values():  # each track in time order
        assert [e["ts"] for e in events] == sorted(e["ts"] for e in events)
    return tracks, raw


def end(event: dict) -> float:
    return event["ts"] + event["dur"]


ROUNDING = 0.002  # µs: ts and dur are each rounded to the nanosecond


def at_or_before(a: float, b: float) -> bool:
    return a <= b + ROUNDING


def check_choice(events: list[dict]) -> dict:
    """The order of one choice's spans; returns its "request" span's args."""
    [request] = [e for e in events if e["name"] == "request"]
    [queue] = [e for e in events if e["name"] == "queue"]
    [prefill] = [e for e in events if e["name"] == "prefill"]
    chunks = [e for e in events if e["name"] == "prefill chunk"]
    decode = [e for e in events if e["name"] == "decode"]
    detokenize = [e for e in events if e["name"] == "detokenize"]
    assert request["ts"] == queue["ts"] and abs(end(queue) - prefill["ts"]) <= ROUNDING
    assert chunks and chunks[0]["ts"] >= prefill["ts"] and abs(end(chunks[-1]) - end(prefill)) <= ROUNDING
    steps = [prefill] + decode
    for before, after in zip(steps, steps[1:]):
        assert at_or_before(end(before), after["ts"])
    for span in events:
        assert request["ts"] <= span["ts"] and at_or_before(end(span), end(request))
    args = request["args"]
    assert len(decode) == args["decode_steps"] == args["completion_tokens"] - 1  # the first token ends prefill
    assert all(e["args"]["tokens"] == 1 and e["args"]["batch"] >= 1 for e in decode)
    assert len(detokenize) == args["completion_tokens"]  # a token per step, each step's text its own span
    assert at_or_before(end(prefill), detokenize[0]["ts"])
    return args


def test_each_request_gets_a_file_with_its_spans_and_counts(traced):
    server, trace_dir = traced
    client = server.client()
    replies = []
    for max_tokens in (4, 7, 10):
        reply = client.chat.completions.create(model=CHAT_MODEL, messages=user(f"{SECRET_PROMPT} {'x' * max_tokens}"),
                                               max_tokens=max_tokens, temperature=0)
        replies.append(reply)
    stream = client.chat.completions.create(model=CHAT_MODEL, messages=user(SECRET_PROMPT), max_tokens=6,
                                            temperature=0, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    files = sorted(p.name for p in trace_dir.iterdir())
    assert files == sorted(f"{r.id}.json" for r in replies + [chunks[0]])
    for reply in replies:
        tracks, raw = spans(trace_dir / f"{reply.id}.json")
        assert list(tracks) == [0]
        args = check_choice(tracks[0])
        usage = reply.usage
        cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
        assert args == {"prompt_tokens": usage.prompt_tokens, "cached_tokens": cached,
                        "completion_tokens": usage.completion_tokens, "finish_reason": reply.choices[0].finish_reason,
                        "decode_steps": usage.completion_tokens - 1, "detokenize_us": args["detokenize_us"]}
        assert args["completion_tokens"] == reply.usage.completion_tokens > 1
        text = reply.choices[0].message.content
        assert not any(word in raw for word in SECRET_PROMPT.split())
        assert len(text) < 4 or text not in raw, text
    tracks, _ = spans(trace_dir / f"{chunks[0].id}.json")
    assert check_choice(tracks[0])["completion_tokens"] == chunks[-1].usage.completion_tokens


def test_choices_are_tracks_and_prompts_are_files(traced):
    server, trace_dir = traced
    client = server.client()
    reply = client.completions.create(model=CHAT_MODEL, prompt=SECRET_PROMPT, max_tokens=5, n=2, temperature=0.8,
                                      seed=3)
    tracks, raw = spans(trace_dir / f"{reply.id}.json")
    assert sorted(tracks) == [0, 1]
    total = sum(check_choice(tracks[i])["completion_tokens"] for i in (0, 1))
    assert total == reply.usage.completion_tokens
    assert not any(choice.text in raw for choice in reply.choices if len(choice.text) > 3)
    # a forked choice reads no prompt of its own: its chunk has no token count
    assert "tokens" in [e for e in tracks[0] if e["name"] == "prefill chunk"][-1]["args"]
    assert [e["args"] for e in tracks[1] if e["name"] == "prefill chunk"] == [{}]
    several = client.completions.create(model=CHAT_MODEL, prompt=["first prompt", "second one"], max_tokens=3,
                                        temperature=0)
    for i in (0, 1):
        tracks, _ = spans(trace_dir / f"{several.id}-{i}.json")
        assert check_choice(tracks[0])["completion_tokens"] == 3


def test_a_failed_write_is_one_warning_and_the_server_goes_on(traced, caplog, tmp_path):
    server, trace_dir = traced
    tracer = server.engine.tracer
    client = server.client()
    tracer.directory = tmp_path / "gone"  # as if DIR had been removed
    with caplog.at_level(logging.WARNING, logger="llaisys.serve"):
        for _ in range(2):
            reply = client.chat.completions.create(model=CHAT_MODEL, messages=user("hi"), max_tokens=3)
            assert reply.usage.completion_tokens == 3
    tracer.directory = trace_dir
    warnings = [r for r in caplog.records if "--trace-dir" in r.getMessage()]
    assert len(warnings) == 1 and "cannot write the trace" in warnings[0].getMessage()
    reply = client.chat.completions.create(model=CHAT_MODEL, messages=user("hi"), max_tokens=3)
    assert (trace_dir / f"{reply.id}.json").is_file()


def test_an_unwritable_trace_dir_is_a_one_line_error_at_start_up(tmp_path):
    from llaisys import LlaisysValueError
    from llaisys.cli import build_parser
    from llaisys_models.serve.cli import checked_options

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    args = build_parser().parse_args(["serve", "--model", str(llaisys_models.DEMO_MODEL_DIR),
                                      "--trace-dir", str(blocker / "traces")])
    with pytest.raises(LlaisysValueError, match="^--trace-dir .*cannot write there"):
        checked_options(args)
    exe = Path(sys.executable).parent / "llaisys"
    if not exe.exists():
        pytest.skip("the llaisys command is not installed")
    done = subprocess.run([str(exe), "serve", "--port", "0", "--trace-dir", str(blocker / "traces")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [f"llaisys: error: --trace-dir {blocker / 'traces'}: cannot write "
                                                f"there: Not a directory"]


def test_without_a_trace_dir_the_engine_traces_nothing(chat_server):
    assert chat_server.engine.tracer is None


def test_a_long_prompt_is_read_in_chunks(traced):
    server, trace_dir = traced
    prompt = "".join(chr(97 + (i * 7) % 26) for i in range(400))  # no prefix of it is cached
    reply = server.client().completions.create(model=CHAT_MODEL, prompt=prompt, max_tokens=2, temperature=0)
    tracks, _ = spans(trace_dir / f"{reply.id}.json")
    args = check_choice(tracks[0])
    assert args["prompt_tokens"] == reply.usage.prompt_tokens and args["cached_tokens"] == 0
    chunks = [e["args"]["tokens"] for e in tracks[0] if e["name"] == "prefill chunk"]
    budget = server.engine.scheduler.max_batch_tokens  # tokens per forward: alone, it reads this many a step
    assert sum(chunks) == args["prompt_tokens"] and len(chunks) == -(-args["prompt_tokens"] // budget) > 1
    assert all(n == budget for n in chunks[:-1])
