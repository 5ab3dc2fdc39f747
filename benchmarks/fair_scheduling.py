#!/usr/bin/env python
"""How long a small chat waits beside a big request: fair scheduling (engine/fairness.py) against first-come order.

    python benchmarks/fair_scheduling.py                          # the embedded demo model (context 256)
    python benchmarks/fair_scheduling.py --model DIR --long 4000 --big-new 256   # e.g. SmolLM2-135M

Two scenarios, each run with the scheduler's fair policy and with first-come order (the policy before it:
admission by arrival, no fairness preemption, the prefill budget oldest first; swapped in by replacing the
functions of engine/fairness.py), through the real scheduler and model runner (``Scheduler``, a KV pool of the
model):

    n           a request of ``--n`` choices (``--big-new`` tokens each) fills every slot (``--max-running``);
                a chat (``--chat`` prompt tokens, ``--chat-new`` new ones) of another request arrives
    long        ``--prompts`` prompts of ``--long`` tokens are being read; the chat arrives

The table gives the chat's steps and seconds from its arrival to its first token and to its last, and the chat
alone. Greedy: the chat's tokens are the same in every run (checked).
"""

from __future__ import annotations

import argparse
import time
from contextlib import contextmanager

import llaisys_models
from llaisys_models.engine import fairness
from llaisys_models.engine.sampling import SamplingParams
from llaisys_models.engine.scheduler import Scheduler


@contextmanager
def first_come():
    """The policy before fairness: arrival order, no preemption for fairness, prefill oldest first."""
    saved = fairness.next_to_admit, fairness.victim, fairness.prefill_shares

    def prefill(readers, budget):
        shares = {}
        for s in sorted(readers, key=lambda s: s.id):
            if budget <= 0:
                break
            shares[s.id] = min(s.pending, budget)
            budget -= shares[s.id]
        return shares

    fairness.next_to_admit = lambda waiting, counts: min(waiting, key=lambda s: s.id)
    fairness.victim = lambda running, newcomer=None: None if newcomer is not None else max(running, key=lambda s: s.id)
    fairness.prefill_shares = prefill
    try:
        yield
    finally:
        fairness.next_to_admit, fairness.victim, fairness.prefill_shares = saved


def ids(n: int, start: int, vocab: int) -> list[int]:
    return [(start + 7 * i) % (vocab - 1) + 1 for i in range(n)]


def run(model, args, scenario: str) -> tuple[int, float, int, float, list[int]]:
    """The chat's (steps, seconds) to its first token and to its end, and its tokens."""
    vocab = model.config.vocab_size
    pool = model.new_kv_pool(num_blocks=args.blocks, block_size=16)
    try:
        sched = Scheduler(model, pool, max_running=args.max_running, max_batch_tokens=args.max_batch_tokens)
        greedy = dict(top_k=1, eos_token_ids=frozenset())
        if scenario == "n":
            first = sched.add(ids(args.big_prompt, 3, vocab), SamplingParams(args.big_new, seed=1, **greedy))
            for i in range(1, args.n):
                sched.fork(first, SamplingParams(args.big_new, seed=1 + i, **greedy))
            while len(sched.running) < args.max_running:
                sched.step()
        elif scenario == "long":
            for i in range(args.prompts):
                sched.add(ids(args.long, 11 * i, vocab), SamplingParams(4, seed=i, **greedy))
            sched.step()
        chat = sched.add(ids(args.chat, 5, vocab), SamplingParams(args.chat_new, seed=9, **greedy))
        start, steps, first_steps, first_seconds = time.perf_counter(), 0, 0, 0.0
        while not chat.finished:
            sched.step()
            steps += 1
            if chat.num_generated and not first_steps:
                first_steps, first_seconds = steps, time.perf_counter() - start
        return first_steps, first_seconds, steps, time.perf_counter() - start, chat.tokens
    finally:
        model.release_kv_pool(pool)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model directory (default: the embedded demo model)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--max-running", type=int, default=16)
    ap.add_argument("--max-batch-tokens", type=int, default=128)
    ap.add_argument("--blocks", type=int, default=1024, help="KV pool blocks of 16 positions")
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--big-prompt", type=int, default=24)
    ap.add_argument("--big-new", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--long", type=int, default=200)
    ap.add_argument("--chat", type=int, default=24)
    ap.add_argument("--chat-new", type=int, default=8)
    args = ap.parse_args()
    model = llaisys_models.load(args.model or llaisys_models.DEMO_MODEL_DIR, device=args.device)
    alone = run(model, args, "alone")
    print(f"{args.model or 'demo model'}: max_running {args.max_running}, max_batch_tokens {args.max_batch_tokens}")
    print(f"{'scenario':<34} {'policy':<10} {'first: steps':>12} {'s':>8} {'last: steps':>12} {'s':>8}")
    print(f"{'chat alone':<34} {'':<10} {alone[0]:>12} {alone[1]:>8.3f} {alone[2]:>12} {alone[3]:>8.3f}")
    for scenario, label in (("n", f"beside n={args.n} x {args.big_new} new"),
                            ("long", f"beside {args.prompts} prompts x {args.long}")):
        for policy in ("fair", "first-come"):
            if policy == "fair":
                r = run(model, args, scenario)
            else:
                with first_come():
                    r = run(model, args, scenario)
            assert r[4] == alone[4], "the chat's tokens changed with what ran beside it"
            print(f"{label:<34} {policy:<10} {r[0]:>12} {r[1]:>8.3f} {r[2]:>12} {r[3]:>8.3f}")


if __name__ == "__main__":
    main()
