"""Decode speed with captured decode graphs against eager decode steps, side by side in one run.

    python benchmarks/decode_graph.py [--model DIR] [--device cpu] [--prompt 16] [--new 64] [--rounds 3]

Loads the model twice (LLAISYS_GRAPHS=0 for the eager one), alternates the two for --rounds greedy runs of
--new tokens after a --prompt-token prompt, and prints decode tokens/s of each (best round) and their ratio.
Both must produce the same tokens (checked). Without --model it uses the embedded demo model.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

import llaisys_models


def decode_rate(model, prompt: list[int], new: int) -> tuple[float, list[int]]:
    out = model.generate(prompt, new, eos_token_ids=())
    return model.last_stats.decode_tokens_per_second, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model directory (default: the embedded demo model)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--prompt", type=int, default=16, help="prompt tokens")
    parser.add_argument("--new", type=int, default=64, help="new tokens per run")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    path = args.model or llaisys_models.DEMO_MODEL_DIR
    graphed = llaisys_models.load(path, device=args.device)
    os.environ["LLAISYS_GRAPHS"] = "0"
    eager = llaisys_models.load(path, device=args.device)
    del os.environ["LLAISYS_GRAPHS"]
    vocab = graphed.config.vocab_size
    prompt = np.random.default_rng(0).integers(0, min(vocab, 10), args.prompt).tolist()
    best = {"eager": 0.0, "graphs": 0.0}
    outputs = {}
    for _ in range(args.rounds):
        for name, model in (("eager", eager), ("graphs", graphed)):
            rate, outputs[name] = decode_rate(model, prompt, args.new)
            best[name] = max(best[name], rate)
    assert outputs["eager"] == outputs["graphs"], "graph replay changed the tokens"
    replays = graphed._decode_graphs.replays
    print(f"{path} on {args.device}: prompt {args.prompt}, {args.new} new tokens, best of {args.rounds} rounds")
    print(f"{'':>10} {'decode tok/s':>14}")
    print(f"{'eager':>10} {best['eager']:>14.2f}")
    print(f"{'graphs':>10} {best['graphs']:>14.2f}   ({replays} steps replayed)")
    print(f"{'ratio':>10} {best['graphs'] / best['eager']:>14.3f}x  (graphs / eager; same tokens)")


if __name__ == "__main__":
    main()
