"""``llaisys bench serve`` against the chat test server (conftest.py): the counts it reports, its percentiles, token
counts against the server's own, request-rate mode, JSONL datasets and the one-line errors of bad input.

The chat model has no EOS, so every reply runs exactly to its max_tokens: the tokens the benchmark reports can be
checked against what it asked for, and against the server's /metrics.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.serve_helpers import CHAT_MODEL, require_serving, wait_until

require_serving()

from llaisys import LlaisysValueError  # noqa: E402
from llaisys.cli import main  # noqa: E402
from llaisys_models.bench import serve, stats  # noqa: E402

METRICS = ("ttft", "tpot", "itl", "e2e")


def bench(server, tmp_path, *extra) -> dict:
    """Run ``llaisys bench serve`` in this process; its JSON output (the run must succeed)."""
    out = tmp_path / "bench.json"
    code = main(["bench", "serve", "--url", server.base_url, "--num-prompts", "6", "--concurrency", "2",
                 "--input-len", "8", "--output-len", "6", "--output", "json", "--output-file", str(out),
                 "--save-requests", *extra])
    assert code == 0
    return json.loads(out.read_text())


def generated_tokens(server) -> float:
    return sum(v for k, v in server.metrics().items() if k.startswith("llaisys_generation_tokens_total"))


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("llaisys: error: ") and "\n" not in err, err
    return err


def assert_percentiles_in_order(row: dict) -> None:
    for name in METRICS:
        p50, p90, p99 = (row[f"{name}_p{q}_ms"] for q in (50, 90, 99))
        assert 0 <= p50 <= p90 <= p99, (name, p50, p90, p99)
        assert row[f"{name}_mean_ms"] > 0


def test_every_request_is_measured_and_its_tokens_counted(chat_server, tmp_path, capsys):
    before = generated_tokens(chat_server)
    doc = bench(chat_server, tmp_path, "--max-tokens", "4", "--goodput", "ttft:600000", "tpot:600000", "--seed", "5")
    generated = generated_tokens(chat_server) - before
    row = doc["rows"][0]
    assert (row["completed"], row["failed"]) == (6, 0) and doc["failures"] == {}
    assert_percentiles_in_order(row)
    requests = doc["requests"]
    assert sorted(r["index"] for r in requests) == list(range(6))
    assert all(r["ok"] and r["output_tokens"] == r["max_tokens"] == 4 for r in requests)  # no EOS: to the cap
    assert row["output_tokens"] == 24
    assert generated == row["output_tokens"] + 1  # the server's count: and the one-token probe sent first
    assert row["input_tokens"] == sum(r["prompt_tokens"] for r in requests) > 0
    assert row["goodput"] == pytest.approx(row["request_throughput"])  # SLOs of 10 minutes: every request meets them
    assert doc["meta"]["model"] == CHAT_MODEL and doc["meta"]["url"] == chat_server.base_url
    assert "completed" in capsys.readouterr().out  # the table, on stdout too


def test_synthetic_output_lengths_vary_within_their_range(chat_server, tmp_path):
    out = tmp_path / "bench.json"
    assert main(["bench", "serve", "--url", chat_server.base_url, "--num-prompts", "6", "--concurrency", "3",
                 "--input-len", "10", "--input-len-range", "0.5", "--output-len", "6", "--output-len-range", "0.5",
                 "--output", "json", "--output-file", str(out), "--save-requests"]) == 0
    requests = json.loads(out.read_text())["requests"]
    assert all(3 <= r["max_tokens"] <= 9 and r["output_tokens"] == r["max_tokens"] for r in requests)


def test_request_rate_sends_poisson_arrivals_in_order(chat_server, tmp_path):
    doc = bench(chat_server, tmp_path, "--request-rate", "50", "--seed", "7", "--max-tokens", "3")
    row = doc["rows"][0]
    assert (row["completed"], row["failed"]) == (6, 0)
    assert_percentiles_in_order(row)
    starts = [r["start_s"] for r in sorted(doc["requests"], key=lambda r: r["index"])]
    assert starts == sorted(starts) and starts[-1] > 0
    assert doc["meta"]["arguments"]["request_rate"] == 50


def test_jsonl_dataset_with_prompts_messages_and_max_tokens(chat_server, tmp_path):
    dataset = tmp_path / "prompts.jsonl"
    lines = [{"prompt": "Hello there", "max_tokens": 2}, {"messages": [{"role": "user", "content": "Hi"}]},
             {"prompt": "A third one", "max_tokens": 5}]
    dataset.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    doc = bench(chat_server, tmp_path, "--dataset", str(dataset), "--num-prompts", "5")  # cycles through the lines
    requests = sorted(doc["requests"], key=lambda r: r["index"])
    assert [r["output_tokens"] for r in requests] == [2, 6, 5, 2, 6]  # its own max_tokens, else --output-len
    assert doc["rows"][0]["completed"] == 5


def test_completions_endpoint(chat_server, tmp_path):
    doc = bench(chat_server, tmp_path, "--endpoint", "completions", "--max-tokens", "3")
    row = doc["rows"][0]
    assert (row["completed"], row["failed"], row["output_tokens"]) == (6, 0, 18)


def test_a_request_the_server_refuses_mid_run_is_counted_as_failed(chat_server, tmp_path, capsys):
    dataset = tmp_path / "prompts.jsonl"
    lines = [{"prompt": "short"}, {"prompt": "x " * 5000}, {"prompt": "also short"}, {"prompt": "last"}]
    dataset.write_text("\n".join(json.dumps(line) for line in lines))
    doc = bench(chat_server, tmp_path, "--dataset", str(dataset), "--num-prompts", "4", "--max-tokens", "3")
    row = doc["rows"][0]
    assert (row["completed"], row["failed"]) == (3, 1)
    [(reason, count)] = doc["failures"].items()
    assert count == 1 and reason.startswith("HTTP 400: ") and "context length" in reason
    assert [r["index"] for r in doc["requests"] if not r["ok"]] == [1]
    assert "failed: 1 request: HTTP 400" in capsys.readouterr().err


def test_a_malformed_dataset_line_is_a_one_line_error_naming_it(chat_server, tmp_path, capsys):
    dataset = tmp_path / "bad.jsonl"
    dataset.write_text('{"prompt": "fine"}\n{"prompt": "broken"\n')
    assert main(["bench", "serve", "--url", chat_server.base_url, "--dataset", str(dataset)]) == 2
    assert f"{dataset}:2: not valid JSON" in one_line_error(capsys)
    dataset.write_text('{"prompt": "fine"}\n{"prompt": "ok"}\n{"max_tokens": 3}\n')
    assert main(["bench", "serve", "--url", chat_server.base_url, "--dataset", str(dataset)]) == 2
    assert f"{dataset}:3: expected exactly one of" in one_line_error(capsys)


def test_an_unreachable_server_is_a_quick_one_line_error(tmp_path, capsys):
    with socket.socket() as s:  # a port nothing listens on once this socket is closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    assert main(["bench", "serve", "--url", f"http://127.0.0.1:{port}", "--num-prompts", "2"]) == 2
    assert time.monotonic() - started < 30
    assert "cannot reach" in one_line_error(capsys)


def test_a_refused_first_request_is_the_servers_message_in_one_line(chat_server, capsys):
    assert main(["bench", "serve", "--url", chat_server.base_url, "--model", "no-such-model", "--num-prompts",
                 "2", "--input-len", "4"]) == 2
    err = one_line_error(capsys)
    assert "the first request" in err and "HTTP 4" in err and "no-such-model" in err


def test_bad_arguments_are_refused():
    with pytest.raises(LlaisysValueError, match="--goodput"):
        serve.parse_goodput(["ttft=5"])
    assert serve.parse_goodput(["ttft:500", "e2e:2000"]) == {"ttft": 500, "e2e": 2000}
    assert stats.percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert stats.percentile([1.0], 99) == 1.0


def test_ctrl_c_reports_what_was_measured_and_exits_130(chat_server, tmp_path):
    exe = Path(sys.executable).parent / "llaisys"
    if not exe.exists():
        pytest.skip("the llaisys command is not installed in this environment")
    out = tmp_path / "bench.json"
    before = chat_server.metrics()
    finished = sum(v for k, v in before.items() if k.startswith("llaisys_requests_finished_total"))
    proc = subprocess.Popen([str(exe), "bench", "serve", "--url", chat_server.base_url, "--num-prompts", "200",
                             "--concurrency", "1", "--input-len", "4", "--max-tokens", "48", "--output", "json",
                             "--output-file", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # the probe and two measured requests have finished
        assert wait_until(lambda: sum(v for k, v in chat_server.metrics().items()
                                      if k.startswith("llaisys_requests_finished_total")) >= finished + 3, 60)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    doc = json.loads(out.read_text())
    assert doc["meta"]["interrupted"] is True
    assert 2 <= doc["rows"][0]["completed"] < 200 and doc["rows"][0]["failed"] == 0
    assert "interrupted:" in stderr and "completed" in stdout
