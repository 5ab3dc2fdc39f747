"""Decode speed with speculative decoding (prompt lookup, or a draft model) against plain decoding, side by
side in one process.

    OMP_NUM_THREADS=2 python benchmarks/speculative.py --model SmolLM2-135M-Instruct.Q4_1.gguf [--k 4]
    OMP_NUM_THREADS=2 python benchmarks/speculative.py --model /tmp/qwen2-1.5b      # no tokenizer: token ids
    ... [--draft DRAFT_MODEL] [--new 128] [--rounds 5] [--tasks rewrite,summarise,code,story] [--ignore-eos]
    ... --step-costs [--max-rows 9]   # what a verify step of K drafts costs against a decode step

Tasks: a text model answers four greedy prompts, up to --new tokens each, ending at its EOS like a chat
reply (--ignore-eos goes on past it, into text no prompt grounds): three input-grounded ones (rewrite,
summarise, code edit: the reply copies spans of the prompt, where n-gram drafts are kept) and one where
drafts fail (story). A random checkpoint (no tokenizer) has no grounded text: prompt lookup there would only
find its random output's accidental repeats. It gets what bounds prompt lookup on its shape instead:
"oracle" drafts (its own greedy continuation, so every draft is kept: the most speculation brings), "wrong"
drafts (never kept: what failing drafts cost, the pauses included) and prompt lookup on random ids.

Rounds alternate plain and speculative runs of each task (after one warm-up of each, which also caches the
prompt); each checks that both give the same tokens. The table prints medians: decode tok/s by the wall
clock and the ratio, the ratio of CPU time per token (process CPU time, all threads: on a shared machine
other programs take the cores, not the CPU time, so this ratio moves less with the load; it counts the
thread team's spinning between kernels too), the acceptance (kept / drafted tokens) and new tokens per
step. The load average is printed with each table: absolute tok/s are only comparable within one run.

--step-costs: the time of one forward of M = 1 .. --max-rows new rows of a sequence of --context cached
tokens (a decode step, and verify steps of M - 1 drafts), replayed from decode graphs as the scheduler runs
them, rounds alternating over M; medians of the wall clock and of CPU time against M = 1, and for each
K = M - 1 the break-even acceptance: the per-token acceptance p at which a verify step of K drafts brings as
many tokens (1 + p + ... + p^K) as it costs decode steps.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time

import numpy as np

import llaisys_models
from llaisys_models.engine.speculative import Drafter, NgramDrafter, Speculation

TEXT = ("The city council met on Tuesday evening to discuss the new bicycle lanes on Main Street. Several "
        "residents said the lanes made the street safer for children walking to school, while shop owners "
        "worried that removing parking spaces would hurt their business. The council agreed to count the "
        "number of cyclists and shoppers for three months before making a final decision in the spring.")
CODE = '''def total_price(items, tax_rate):
    total = 0
    for item in items:
        if item["quantity"] > 0:
            total += item["price"] * item["quantity"]
    total = total * (1 + tax_rate)
    return round(total, 2)
'''
TASKS = {
    "rewrite": f"Rewrite the following text, changing only 'Tuesday' to 'Wednesday'. Output the full text.\n\n{TEXT}",
    "summarise": f"Summarise the following text in two sentences, reusing its wording.\n\n{TEXT}",
    "code": f"Rename the variable `total` to `amount` in this function. Output the full function only.\n\n{CODE}",
    "story": "Write a short original story about a lighthouse keeper who finds a strange bottle.",
}


class Oracle(Drafter):
    """Drafts the known greedy continuation (``wrong``: a token off at the first position, never kept)."""

    def __init__(self, full: list[int], vocab: int, wrong: bool = False):
        self.full, self.vocab, self.wrong = full, vocab, wrong

    def __repr__(self) -> str:
        return "wrong drafts" if self.wrong else "oracle drafts"

    def propose(self, seq, k: int) -> list[int]:
        drafts = list(self.full[len(seq.tokens):len(seq.tokens) + k])
        if self.wrong and drafts:
            drafts[0] = (drafts[0] + 1) % self.vocab
        return drafts


@dataclasses.dataclass
class Run:
    tokens: list[int]
    tok_s: float  # decode tokens per second (wall clock)
    cpu_per_token: float  # process CPU seconds per new token
    new: int
    steps: int
    drafted: int
    kept: int


def run(model, ids: list[int], new: int, eos, speculation) -> Run:
    kwargs = {} if speculation is None else {"speculative": speculation}
    scheduler = model.generator.scheduler
    steps = scheduler.stats.steps
    c0, t0 = time.process_time(), time.perf_counter()
    out = model.generate(ids, new, eos_token_ids=eos, **kwargs)
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    s = model.last_stats
    rate = s.decode_tokens_per_second if s.decode_seconds else s.new_tokens / wall
    return Run(out, rate, cpu / max(s.new_tokens, 1), s.new_tokens, scheduler.stats.steps - steps, s.draft_tokens,
               s.accepted_tokens)


def load_average() -> str:
    return "load average " + ", ".join(f"{x:.1f}" for x in os.getloadavg())


def compare(model, prompts: dict, speculations: dict, args, eos) -> None:
    """The table of tasks: medians over rounds alternating plain and speculative runs."""
    print(f"{load_average()}; {args.new} new tokens at most, {'past' if args.ignore_eos else 'up to'} EOS, "
          f"median of {args.rounds} rounds, plain and speculative alternating")
    print(f"{'task':<10} {'prompt':>6} {'new':>4} {'plain tok/s':>11} {'spec tok/s':>10} {'ratio':>6} "
          f"{'cpu ratio':>9} {'accepted':>15} {'tok/step':>8}")
    for name, ids in prompts.items():
        speculation = speculations[name]
        run(model, ids, args.new, eos, None)  # warm up: caches the prompt, captures the step shapes
        run(model, ids, args.new, eos, speculation)
        plain, spec = [], []
        for _ in range(args.rounds):
            plain.append(run(model, ids, args.new, eos, None))
            spec.append(run(model, ids, args.new, eos, speculation))
            if spec[-1].tokens != plain[-1].tokens:
                raise SystemExit(f"{name}: speculative tokens differ from plain greedy tokens")
        p_rate, s_rate = statistics.median(r.tok_s for r in plain), statistics.median(r.tok_s for r in spec)
        p_cpu = statistics.median(r.cpu_per_token for r in plain)
        s_cpu = statistics.median(r.cpu_per_token for r in spec)
        last = spec[-1]  # greedy: every round drafts and keeps the same tokens
        rate = last.kept / last.drafted if last.drafted else 0.0
        per_step = last.new / max(last.steps, 1)  # (the prompt is cached: its first step may verify drafts too)
        print(f"{name:<10} {len(ids):>6} {last.new:>4} {p_rate:>11.1f} {s_rate:>10.1f} {s_rate / p_rate:>5.2f}x "
              f"{p_cpu / s_cpu:>8.2f}x {rate:>6.0%} ({last.kept:>3}/{last.drafted:>3}) {per_step:>8.2f}")
    print(load_average())


def step_costs(model, args) -> None:
    """A forward of M rows (decode M = 1, verify M = K + 1) against M = 1, and the break-even acceptance."""
    vocab = model.config.vocab_size
    rng = np.random.default_rng(0)
    session = model.session()
    session.forward(rng.integers(0, vocab, args.context).tolist())
    base = len(session)
    rows = list(range(1, args.max_rows + 1))

    def once(m: int) -> tuple[float, float]:
        ids = rng.integers(0, vocab, m).tolist()
        session.pool.reserve_growing(session.kv, base + m)
        c0, t0 = time.process_time(), time.perf_counter()
        session.runner.forward([(session.kv, ids)], [m])  # every row's logits: a verify step
        elapsed = time.perf_counter() - t0, time.process_time() - c0
        session.truncate(base)
        return elapsed

    for m in rows:  # warm up and capture each shape's decode graph
        for _ in range(3):
            once(m)
    wall: dict[int, list[float]] = {m: [] for m in rows}
    cpu: dict[int, list[float]] = {m: [] for m in rows}
    print(f"{load_average()}; one sequence of {base} cached tokens, median of {args.rounds} rounds over M")
    for _ in range(args.rounds):
        for m in rows:
            w, c = once(m)
            wall[m].append(w)
            cpu[m].append(c)
    w1, c1 = statistics.median(wall[1]), statistics.median(cpu[1])
    print(f"{'rows M':>6} {'drafts K':>8} {'wall ms':>8} {'x decode':>8} {'cpu ms':>8} {'x decode':>8} "
          f"{'break-even p (cpu)':>18}")
    for m in rows:
        w, c = statistics.median(wall[m]), statistics.median(cpu[m])
        even = "" if m == 1 else f"{break_even(m - 1, c / c1):>18.2f}"
        print(f"{m:>6} {m - 1:>8} {1e3 * w:>8.1f} {w / w1:>7.2f}x {1e3 * c:>8.1f} {c / c1:>7.2f}x {even}")
    print(load_average())


def break_even(k: int, cost: float) -> float:
    """The acceptance p at which 1 + p + ... + p^k (tokens per verify step of k drafts) equals ``cost``."""
    lo, hi = 0.0, 1.0
    for _ in range(50):
        p = (lo + hi) / 2
        lo, hi = (p, hi) if sum(p ** i for i in range(k + 1)) < cost else (lo, p)
    return (lo + hi) / 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="model directory or GGUF file")
    parser.add_argument("--draft", default=None, help="a draft model of the same tokenizer (instead of n-grams)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--new", type=int, default=128, help="new tokens per run, at most")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tasks", default=None, help="comma-separated task names (default: all)")
    parser.add_argument("--ignore-eos", action="store_true", help="generate --new tokens, past the EOS")
    parser.add_argument("--step-costs", action="store_true", help="verify steps of M rows against a decode step")
    parser.add_argument("--max-rows", type=int, default=9, help="--step-costs: up to this many rows")
    parser.add_argument("--context", type=int, default=150, help="--step-costs: cached tokens before the step")
    args = parser.parse_args()

    model = llaisys_models.load(args.model, device=args.device)
    print(f"{model!r}, {os.environ.get('OMP_NUM_THREADS', 'all')} threads")
    if args.step_costs:
        return step_costs(model, args)
    if args.draft:
        drafter = llaisys_models.engine.speculative.DraftModelDrafter.of(llaisys_models.load(args.draft, device=args.device),
                                                                  model)
    else:
        drafter = NgramDrafter()
    eos = () if args.ignore_eos else None
    try:
        from llaisys_models.text.tokenizer import encode, load_tokenizer
        tokenizer = load_tokenizer(args.model)
        prompts = {name: encode(tokenizer, [{"role": "user", "content": text}]) for name, text in TASKS.items()}
        speculations = {name: Speculation(drafter, args.k) for name in prompts}
    except Exception as e:  # a random checkpoint has no tokenizer
        print(f"(no tokenizer: {type(e).__name__}; token-id prompts, oracle and wrong drafts)")
        vocab = model.config.vocab_size
        ids = np.random.default_rng(0).integers(0, vocab, 64).tolist()
        full = model.generate(ids, args.new, eos_token_ids=())
        prompts = {"oracle": ids, "wrong": ids, "random": ids}
        speculations = {"oracle": Speculation(Oracle(full, vocab), args.k),
                        "wrong": Speculation(Oracle(full, vocab, wrong=True), args.k),
                        "random": Speculation(drafter, args.k)}
        eos = ()  # random text has no reply to end
    if args.tasks:
        prompts = {name: prompts[name] for name in args.tasks.split(",")}
    print(f"{drafter!r}, K={args.k} at most (adapted to what is kept)")
    compare(model, prompts, speculations, args, eos)


if __name__ == "__main__":
    main()
