"""``llaisys serve``'s access log (serve/access_log.py): a line per request on stderr, as text or JSON
(``--log-format``), shown from ``--log-level info`` (the default) and hidden by ``warning``; it names the request,
its status, its tokens, timings, finish reasons and tenant, and never an API key, a prompt or a reply."""

from __future__ import annotations

import hashlib
import json
import re
import signal

import pytest

from helpers.serve_helpers import http_request, require_serving
from helpers.serve_process import ServeProcess

require_serving()

import openai  # noqa: E402

KEY = "sk-access-log-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
TENANT = hashlib.sha256(KEY.encode()).hexdigest()[:8]
PROMPT = "PROMPT-TEXT-THAT-MUST-NOT-BE-LOGGED"
FIELDS = ["method", "path", "status", "prompt_tokens", "cached_tokens", "generated_tokens", "ttft", "duration",
          "finish", "tenant", "client"]
TEXT_LINE = re.compile(r"\S+ (?P<method>\S+) (?P<path>\S+) (?P<status>\S+) " +
                       " ".join(f"{name}=(?P<{name}>\\S+)" for name in FIELDS[3:]))


def text_fields(line: str) -> dict | None:
    """A text access line's fields as the JSON format gives them (None: not an access line)."""
    match = TEXT_LINE.fullmatch(line)
    if match is None:
        return None
    fields = {name: None if value == "-" else value for name, value in match.groupdict().items()}
    for name in ("status", "prompt_tokens", "cached_tokens", "generated_tokens"):
        fields[name] = None if fields[name] is None else int(fields[name])
    for name in ("ttft", "duration"):
        fields[name] = None if fields[name] is None else float(fields[name].removesuffix("s"))
    return fields


def json_fields(line: str) -> dict | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return {name: record[name] for name in FIELDS} if isinstance(record, dict) and "path" in record else None


PARSERS = {"text": text_fields, "json": json_fields}


def access_lines(server: ServeProcess, fmt: str, count: int = 1) -> list[dict]:
    """The server's access lines as fields, once there are at least ``count`` (a line is written once its response
    has been sent, maybe a moment after its client has read it)."""
    def lines(log):
        return [f for f in map(PARSERS[fmt], log.splitlines()) if f is not None]
    return lines(server.wait_log(lambda log: len(lines(log)) >= count))


@pytest.fixture(scope="module", params=["text", "json"])
def logged(request, chat_model_dir, tmp_path_factory):
    """(the server, its log format): ``llaisys serve`` with an API key, logging as ``--log-format`` says."""
    with ServeProcess(tmp_path_factory.mktemp(f"log_{request.param}"), "--model", str(chat_model_dir),
                      "--kv-memory", "8MiB", "--api-key", KEY, "--log-format", request.param) as server:
        yield server, request.param


def test_a_line_per_request(logged):
    server, fmt = logged
    start = len(access_lines(server, fmt))  # (the /health that found the server started, at least)
    chat = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 40, "temperature": 0}
    replies = [
        http_request(server.base_url, "GET", "/health"),
        http_request(server.base_url, "GET", "/v1/models", headers=AUTH),
        http_request(server.base_url, "GET", "/v1/models", headers={"Authorization": "Bearer wrong"}),
        http_request(server.base_url, "POST", "/v1/chat/completions", chat, headers=AUTH),
        http_request(server.base_url, "POST", "/v1/completions",
                     {"prompt": PROMPT, "max_tokens": 3, "n": 2, "stream": True}, headers=AUTH),
        http_request(server.base_url, "POST", "/v1/chat/completions", {**chat, "max_tokens": 0}, headers=AUTH),
    ]
    assert [r.status for r in replies] == [200, 200, 401, 200, 200, 400]
    lines = {(line["path"], line["status"]): line for line in access_lines(server, fmt, start + len(replies))[start:]}
    health, models, refused, chatted, streamed, invalid = (lines[key] for key in [
        ("/health", 200), ("/v1/models", 200), ("/v1/models", 401), ("/v1/chat/completions", 200),
        ("/v1/completions", 200), ("/v1/chat/completions", 400)])
    for line in lines.values():
        assert line["client"].startswith("127.0.0.1:") and line["duration"] >= 0
    for line in (health, models, refused, invalid):  # no generation: no token fields
        assert [line[name] for name in ("prompt_tokens", "cached_tokens", "generated_tokens", "ttft", "finish")] == \
            [None] * 5, line
    assert (health["method"], health["status"], health["tenant"]) == ("GET", 200, None)
    assert (models["status"], models["tenant"]) == (200, TENANT)
    assert (refused["status"], refused["tenant"]) == (401, None)
    assert invalid["status"] == 400
    usage = replies[3].json()["usage"]
    assert chatted["method"] == "POST" and chatted["status"] == 200 and chatted["tenant"] == TENANT
    assert (chatted["prompt_tokens"], chatted["cached_tokens"], chatted["generated_tokens"], chatted["finish"]) == \
        (usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"], 40, "length")
    assert 0 < chatted["ttft"] <= chatted["duration"]
    assert (streamed["generated_tokens"], streamed["finish"], streamed["tenant"]) == (6, "length", TENANT)
    log = server.log()
    text = replies[3].json()["choices"][0]["message"]["content"]
    assert KEY not in log and PROMPT not in log and text not in log


def test_a_stream_whose_client_hangs_up_is_logged_as_cancelled(logged):
    server, fmt = logged
    start = len(access_lines(server, fmt))
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0, timeout=60)
    model = client.models.list().data[0].id
    start += 1  # (that request's line)
    stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2000,
                                            stream=True)
    for i, _ in enumerate(stream):  # the role's chunk, then a few tokens'
        if i == 3:
            break
    stream.close()  # hangs up
    line = access_lines(server, fmt, start + 1)[start]
    assert (line["path"], line["status"], line["finish"], line["tenant"]) == ("/v1/chat/completions", 200,
                                                                             "cancelled", TENANT)
    assert 3 <= line["generated_tokens"] < 2000 and line["ttft"] <= line["duration"]


def test_log_level_warning_hides_the_lines(chat_model_dir, tmp_path):
    with ServeProcess(tmp_path, "--model", str(chat_model_dir), "--kv-memory", "8MiB", "--log-level", "warning") \
            as server:
        assert http_request(server.base_url, "GET", "/v1/models").status == 200
        r = http_request(server.base_url, "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2})
        assert r.status == 200
        assert http_request(server.base_url, "GET", "/nothing-here").status == 404
        server.signal(signal.SIGTERM)  # (every line it would write is written by the time it exits)
        assert server.wait_exit() == 0
        assert not [line for line in server.log().splitlines() if "/v1/" in line or "/nothing-here" in line]
