"""Structured outputs: decode tok/s of a json_schema-constrained request against an unconstrained one (target: the
constrained one at >= 90%), and what the grammar costs per token (llguidance's host mask, the bitmask upload, the
``mask_logits`` op), side by side.

    python benchmarks/structured.py --model /tmp/qwen2-1.5b --tokenizer TOKENIZER   # the 1.5B shape
    python benchmarks/structured.py --tokenizer TOKENIZER                            # a random mid-size Qwen2

TOKENIZER: a model directory or a GGUF file with a tokenizer of the model's vocabulary (e.g. llama.cpp's
models/ggml-vocab-qwen2.gguf for the Qwen2 vocabulary of 151936). Without --model a random Qwen2 of that vocabulary
(hidden 896, 4 layers: the 0.5B shape, fewer layers) is written to --scratch once. Greedy; both requests run
exactly --tokens tokens (the schema's one string field is long enough, and EOS is off for the free one).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import llaisys
import llaisys_models
from llaisys_models import Grammar

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path)
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/llaisys-structured-model"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    tokenizer = llaisys_models.load_tokenizer(args.tokenizer)
    path = args.model or make_model(args.scratch, len(tokenizer))
    model = llaisys_models.load(path, device=args.device)
    print(f"model {path} vocab {model.config.vocab_size}, hidden {model.config.hidden_size}, "
          f"{model.config.num_hidden_layers} layers, {model.dtype.name} on {args.device}")
    t0 = time.perf_counter()
    grammar = Grammar.json_schema(tokenizer, SCHEMA)
    print(f"grammar: {1e3 * (time.perf_counter() - t0):.0f} ms (llguidance's tokenizer view, built once, and the schema)")
    ids = tokenizer("Write a long answer in JSON.", add_special_tokens=False).input_ids

    rates = {"unconstrained": [], "json_schema": []}
    for _ in range(args.repeats):
        for name, extra in (("unconstrained", {"eos_token_ids": ()}), ("json_schema", {"grammar": grammar})):
            out = model.generate(ids, args.tokens, **extra)
            assert len(out) - len(ids) == args.tokens, (name, len(out) - len(ids))
            rates[name].append(model.last_stats.decode_tokens_per_second)
    free, constrained = max(rates["unconstrained"]), max(rates["json_schema"])

    # the grammar's own cost per token, replaying the constrained tokens: the whole mask (llguidance's host
    # bitmask, its upload, the mask_logits op; .numpy() of one logit waits for the device), and the op alone
    tokens = out[len(ids):]
    matcher = grammar.matcher(model.config.vocab_size)
    logits = llaisys.empty((model.config.vocab_size,), model.dtype, model.device)
    bitmask = llaisys.empty(((model.config.vocab_size + 31) // 32,), llaisys.int32, model.device)
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
    print(f"{'request':>14} {'decode tok/s':>13} {'ratio':>7}")
    print(f"{'unconstrained':>14} {free:13.2f} {1.0:7.3f}")
    print(f"{'json_schema':>14} {constrained:13.2f} {constrained / free:7.3f}   (target >= 0.90)")
    print(f"mask per token: {1e6 * statistics.median(whole):.0f} us median, {1e6 * statistics.mean(whole):.0f} us mean "
          f"(llguidance + upload + op), of which the mask_logits op {1e6 * statistics.median(op):.0f} us; "
          f"a free decode step is {1e6 / free:.0f} us")


if __name__ == "__main__":
    main()
