"""Structured outputs: decode tok/s of a json_schema-constrained request against an unconstrained one (target: the
constrained one at >= 90%), and what the grammar costs per token (llguidance's host mask, the bitmask upload, the
``mask_logits`` op), side by side.

    python benchmarks/make_model.py --out /tmp/qwen2-1.5b      # the 1.5B shape (DeepSeek-R1-Distill-Qwen-1.5B)
    python benchmarks/structured.py --model /tmp/qwen2-1.5b --tokenizer TOKENIZER
    python benchmarks/structured.py --tokenizer TOKENIZER        # a random mid-size Qwen2 instead

TOKENIZER: a model directory or a GGUF file with a tokenizer of the model's vocabulary (e.g. llama.cpp's
models/ggml-vocab-qwen2.gguf for the Qwen2 vocabulary of 151936). Without --model a random Qwen2 of that vocabulary
(hidden 896, 4 layers: the 0.5B shape, fewer layers) is written to --scratch once. Greedy; every request runs
exactly --tokens tokens (the schema's one string field is long enough, and EOS is off for the free one).

Rows, run in alternation --rounds times (medians; the machine's load moves between runs): unconstrained;
json_schema as served (each step's masks computed on the mask thread while the forward runs); json_schema with the
mask computed after the forward on the engine thread (the overlap switched off, to show what it hides).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import llaisys
import llaisys_models
from llaisys_models import Grammar
from llaisys_models.engine.grammar import Matcher

SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 100000}},
          "required": ["answer"], "additionalProperties": False}


def make_model(directory: Path, vocab: int) -> Path:
    if (directory / "model.safetensors").exists():
        return directory
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=vocab, hidden_size=896, intermediate_size=4864, num_hidden_layers=4,
                         num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096,
                         tie_word_embeddings=False)
    Qwen2ForCausalLM(config).to(torch.bfloat16).save_pretrained(directory)
    return directory


def mask_costs(model, grammar, tokens: list[int]) -> tuple[list[float], list[float]]:
    """The grammar's own cost per token, replaying the constrained tokens on this thread: the whole mask
    (llguidance's host bitmask, its upload, the mask_logits op; .numpy() of one logit waits for the device), and
    the op alone."""
    logits = llaisys.empty((model.config.vocab_size,), model.dtype, model.device)
    bitmask = llaisys.empty(((model.config.vocab_size + 31) // 32,), llaisys.int32, model.device)
    grammar.matcher(model.config.vocab_size).mask(logits)  # warm-up: the op's first call in this process (plans)
    logits.slice(0, 0, 1).numpy()
    matcher = grammar.matcher(model.config.vocab_size)
    whole, op = [], []
    for token in tokens:
        t0 = time.perf_counter()
        matcher.mask(logits)
        logits.slice(0, 0, 1).numpy()
        t1 = time.perf_counter()
        llaisys.ops.mask_logits(logits, bitmask)
        logits.slice(0, 0, 1).numpy()
        t2 = time.perf_counter()
        matcher.accept(token)
        whole.append(t1 - t0)
        op.append(t2 - t1)
    return whole, op


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path)
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/llaisys-structured-model"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    tokenizer = llaisys_models.load_tokenizer(args.tokenizer)
    path = args.model or make_model(args.scratch, len(tokenizer))
    model = llaisys_models.load(path, device=args.device)
    print(f"model {path} vocab {model.config.vocab_size}, hidden {model.config.hidden_size}, "
          f"{model.config.num_hidden_layers} layers, {model.dtype.name} on {args.device}; load average "
          f"{os.getloadavg()[0]:.1f}")
    t0 = time.perf_counter()
    grammar = Grammar.json_schema(tokenizer, SCHEMA)
    print(f"grammar: {1e3 * (time.perf_counter() - t0):.0f} ms (llguidance's tokenizer view, built once, and the schema)")
    ids = tokenizer("Write a long answer in JSON.", add_special_tokens=False).input_ids
    model.generate(ids, 4)  # warm-up: first-touch of the weights, decode graphs

    overlapped = Matcher.prepare
    rows = {"unconstrained": ({"eos_token_ids": ()}, overlapped), "json_schema": ({"grammar": grammar}, overlapped),
            "json_schema, serial mask": ({"grammar": grammar}, lambda self: None)}
    rates: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(args.rounds):
        for name, (extra, prepare) in rows.items():
            Matcher.prepare = prepare
            out = model.generate(ids, args.tokens, **extra)
            assert len(out) - len(ids) == args.tokens, (name, len(out) - len(ids))
            rates[name].append(model.last_stats.decode_tokens_per_second)
    Matcher.prepare = overlapped
    whole, op = mask_costs(model, grammar, out[len(ids):])

    free = statistics.median(rates["unconstrained"])
    print(f"{'request':>25} {'decode tok/s (median)':>22} {'ratio':>7}   runs")
    for name, values in rates.items():
        runs = " ".join(f"{v:.2f}" for v in values)
        print(f"{name:>25} {statistics.median(values):22.2f} {statistics.median(values) / free:7.3f}   {runs}")
    print("target: json_schema >= 0.90 of unconstrained")
    print(f"mask per token: {1e6 * statistics.median(whole):.0f} us median, {1e6 * statistics.mean(whole):.0f} us mean "
          f"(llguidance + upload + op, on one thread; the first token's {1e3 * whole[0]:.1f} ms), of which the "
          f"mask_logits op {1e6 * statistics.median(op):.0f} us; a free decode step is {1e6 / free:.0f} us; "
          f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
