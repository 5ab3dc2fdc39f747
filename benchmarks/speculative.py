"""Decode speed with speculative decoding (prompt lookup, or a draft model) against plain decoding, side by
side in one process.

    OMP_NUM_THREADS=2 python benchmarks/speculative.py --model SmolLM2-135M-Instruct.Q4_1.gguf [--k 4]
    OMP_NUM_THREADS=2 python benchmarks/speculative.py --model /tmp/qwen2-1.5b      # no tokenizer: token ids
    ... [--draft DRAFT_MODEL] [--new 128] [--rounds 2] [--tasks rewrite,summarise,code,story]

Each task is one greedy prompt: three input-grounded ones (rewrite, summarise, code edit: the answer copies
spans of the prompt, where n-gram drafts are accepted) and one where drafts mostly fail (story). For each, the
rounds alternate plain and speculative runs (best decode tokens/s of each), check that both give the same
tokens, and print decode tok/s, the ratio and the acceptance rate (kept / drafted tokens). A model without a
tokenizer (a random checkpoint) gets token-id prompts: a copy of its input (grounded) and random ids.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import llaisys_models
from llaisys_models.speculative import NgramDrafter, Speculation

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


def token_prompts(vocab: int) -> dict[str, list[int]]:
    rng = np.random.default_rng(0)
    passage = rng.integers(0, vocab, 200).tolist()
    return {"copy": passage + passage[:20], "random": rng.integers(0, vocab, 64).tolist()}


def run(model, ids: list[int], new: int, speculation) -> tuple[float, list[int], int, int]:
    drafted = accepted = 0
    t0 = time.perf_counter()
    kwargs = {} if speculation is None else {"speculative": speculation}
    out = model.generate(ids, new, eos_token_ids=(), **kwargs)
    elapsed = time.perf_counter() - t0
    stats = model.last_stats
    if speculation is not None:
        scheduler = model.generator.scheduler
        drafted, accepted = scheduler.stats.draft_tokens, scheduler.stats.accepted_tokens
    rate = stats.decode_tokens_per_second if stats.decode_seconds else stats.new_tokens / elapsed
    return rate, out, drafted, accepted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="model directory or GGUF file")
    parser.add_argument("--draft", default=None, help="a draft model of the same tokenizer (instead of n-grams)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--new", type=int, default=128, help="new tokens per run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tasks", default=None, help="comma-separated task names (default: all)")
    args = parser.parse_args()

    model = llaisys_models.load(args.model, device=args.device)
    if args.draft:
        drafter = llaisys_models.speculative.DraftModelDrafter.of(llaisys_models.load(args.draft, device=args.device),
                                                                  model)
    else:
        drafter = NgramDrafter()
    speculation = Speculation(drafter, args.k)
    try:
        from llaisys_models.tokenizer import encode, load_tokenizer
        tokenizer = load_tokenizer(args.model)
        prompts = {name: encode(tokenizer, [{"role": "user", "content": text}]) for name, text in TASKS.items()}
    except Exception as e:  # a random checkpoint has no tokenizer
        print(f"(no tokenizer: {type(e).__name__}; token-id prompts)")
        prompts = token_prompts(model.config.vocab_size)
    if args.tasks:
        prompts = {name: prompts[name] for name in args.tasks.split(",")}
    print(f"{model!r}\n{drafter!r}, K={args.k}, {args.new} new tokens, best of {args.rounds} rounds")
    print(f"{'task':<10} {'prompt':>6} {'plain tok/s':>11} {'spec tok/s':>10} {'ratio':>6} {'accepted':>9}")
    run(model, prompts[next(iter(prompts))], 8, None)  # warm up (decode graphs, allocator)
    for name, ids in prompts.items():
        plain_best = spec_best = 0.0
        for _ in range(args.rounds):
            plain, plain_out, _, _ = run(model, ids, args.new, None)
            model.generator.scheduler.stats.draft_tokens = model.generator.scheduler.stats.accepted_tokens = 0
            spec, spec_out, drafted, accepted = run(model, ids, args.new, speculation)
            if spec_out != plain_out:
                raise SystemExit(f"{name}: speculative tokens differ from plain greedy tokens")
            plain_best, spec_best = max(plain_best, plain), max(spec_best, spec)
        rate = accepted / drafted if drafted else 0.0
        print(f"{name:<10} {len(ids):>6} {plain_best:>11.1f} {spec_best:>10.1f} {spec_best / plain_best:>5.2f}x "
              f"{rate:>8.0%} ({accepted}/{drafted})")


if __name__ == "__main__":
    main()
