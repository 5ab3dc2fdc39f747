#!/usr/bin/env python
"""Time to first token of a follow-up chat turn, with and without KV prefix reuse, through the server.

    python benchmarks/make_model.py --out /tmp/qwen2-1.5b      # once (3.5 GB)
    python benchmarks/serve_ttft.py --model /tmp/qwen2-1.5b

The model is served over HTTP on 127.0.0.1 (``BackgroundServer``). Each repeat holds a
conversation: turn 1 (a system prompt of --history tokens and a question) and its reply, then the
follow-up turn sent twice, back to back (so machine noise hits both alike): once with prefix
reuse, once with it switched off (the whole prompt computed). Time to first token is measured
with the ``openai`` client (request sent -> first chunk with text); the server's usage says how
many prompt tokens it reused.

The model directory needs no tokenizer: a character-level one (token id i is one character)
with a ChatML template is written to a temporary directory, so every token the random model
picks prints as text and a reply re-encodes to the tokens that produced it, as with a real
tokenizer.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import string
import sys
import tempfile
import time
from pathlib import Path

MODES = {"with prefix reuse": True, "without (full prefill)": False}
SPECIALS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}  # Qwen2's ids
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def token_char(token_id: int) -> str:
    """The character of a token id: id i is code point i, surrogates skipped (so every id is one character)."""
    return chr(token_id if token_id < 0xD800 else token_id + 0x800)


def write_tokenizer(directory: Path, vocab_size: int) -> None:
    """A character-level tokenizer covering every id: text round-trips to the same ids, as with a real one."""
    from tokenizers import AddedToken, Tokenizer, decoders
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    names = {token_id: text for text, token_id in SPECIALS.items()}  # in the vocabulary at Qwen2's ids
    vocab = {names.get(i, token_char(i)): i for i in range(vocab_size)}
    core = Tokenizer(BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False, byte_fallback=False))
    core.decoder = decoders.Fuse()
    core.add_special_tokens([AddedToken(text, special=True, normalized=False) for text in SPECIALS])
    assert all(core.token_to_id(text) == token_id for text, token_id in SPECIALS.items())
    fast = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHATML
    fast.save_pretrained(directory)


def conversation(seed: int, history: int) -> list[dict]:
    rng = random.Random(seed)
    words = " ".join("".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) for _ in range(history))
    return [{"role": "system", "content": f"Conversation {seed}. " + words[:history]},
            {"role": "user", "content": "What do you make of that?"}]


def stream_turn(client, model: str, messages, max_tokens: int) -> tuple[float, str, object]:
    """(seconds to the first text, the reply, usage) of one streamed request."""
    t0 = time.perf_counter()
    first, text, usage = None, [], None
    for chunk in client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0,
                                                stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        if chunk.choices and chunk.choices[0].delta.content:
            first = first if first is not None else time.perf_counter() - t0
            text.append(chunk.choices[0].delta.content)
    return first, "".join(text), usage


def measure(model, tokenizer_dir: Path, args) -> dict[str, dict]:
    """Per repeat: turn 1, then its follow-up twice, back to back: reusing the cached prefix, then not."""
    import openai

    from llaisys_models.serve.background import BackgroundServer
    from llaisys_models.serve.engine import Engine
    from llaisys_models.serve.server import Server
    from llaisys_models.text.tokenizer import load_tokenizer

    engine = Engine(model, load_tokenizer(tokenizer_dir))
    rows = {mode: {"ttft": [], "computed": [], "reused": []} for mode in MODES}
    with BackgroundServer(Server(engine, load_tokenizer(tokenizer_dir), "bench")) as server:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="-", max_retries=0, timeout=3600)
        stream_turn(client, "bench", [{"role": "user", "content": "warm up"}], 2)
        for repeat in range(args.repeats):
            turn1 = conversation(1000 * repeat + 7, args.history)
            _, reply, _ = stream_turn(client, "bench", turn1, args.reply_tokens)
            turn2 = turn1 + [{"role": "assistant", "content": reply},
                             {"role": "user", "content": "And what follows from it, in a few words?"}]
            for mode, reuse in MODES.items():
                engine.pool.prefix_caching = reuse  # the engine is idle between requests; applies from the next one
                ttft, _, usage = stream_turn(client, "bench", turn2, 1)
                cached = usage.prompt_tokens_details.cached_tokens
                for key, value in (("ttft", ttft), ("computed", usage.prompt_tokens - cached), ("reused", cached)):
                    rows[mode][key].append(value)
                print(f"  #{repeat} {mode}: TTFT {ttft:.3f}s, prompt {usage.prompt_tokens} tokens ({cached} reused)",
                      file=sys.stderr)
            engine.pool.prefix_caching = True
    with_reuse, without = (rows[mode]["ttft"] for mode in MODES)
    ratio = statistics.median(b / a for a, b in zip(with_reuse, without))  # per back-to-back pair
    return {mode: {k: statistics.median(v) for k, v in row.items()} for mode, row in rows.items()}, ratio


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=Path("/tmp/qwen2-1.5b"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--history", type=int, default=512, help="system prompt length in characters (= tokens)")
    ap.add_argument("--reply-tokens", type=int, default=16, help="length of the first turn's reply")
    ap.add_argument("--repeats", type=int, default=3, help="conversations (medians are shown)")
    args = ap.parse_args()

    import llaisys_models

    config = json.loads((args.model / "config.json").read_text())
    t0 = time.perf_counter()
    model = llaisys_models.load(args.model, device=args.device, progress=False)
    print(f"loaded {args.model} ({model.dtype.name}, {model.device}) in {time.perf_counter() - t0:.1f}s; "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(default)')}", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        write_tokenizer(Path(tmp), config["vocab_size"])
        rows, ratio = measure(model, Path(tmp), args)

    print(f"\nfollow-up turn time to first token, {args.model.name} ({model.dtype.name}, {model.device}), "
          f"history {args.history} + reply {args.reply_tokens} tokens, median of {args.repeats}")
    print(f"{'':<24}{'TTFT (s)':>10}{'prompt computed':>18}{'prompt reused':>16}")
    for name, r in rows.items():
        print(f"{name:<24}{r['ttft']:>10.3f}{r['computed']:>18.0f}{r['reused']:>16.0f}")
    print(f"{'speed-up (without / with)':<24}{ratio:>10.1f}x   (median over the back-to-back pairs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
