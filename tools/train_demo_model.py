#!/usr/bin/env python
"""Train the embedded llaisys demo model: a tiny Qwen2 that adds numbers.

The model reads a prompt such as ``1234+5678=`` (one token per character) and
answers ``6912`` followed by ``<|endoftext|>``. Operands have 1 to 4 digits;
the answer is written in normal digit order. Everything runs on the CPU with
torch and transformers, and the result is a standard HuggingFace model
directory (config.json, model.safetensors in bf16, tokenizer.json,
tokenizer_config.json with a chat template, generation_config.json, README.md).

The run is deterministic: fixed seeds, data drawn from a seeded numpy
generator, deterministic torch algorithms, a fixed learning-rate schedule and
accuracy checks at fixed steps. Only ``--minutes`` (a time budget) can make a
slow machine take a different path: when the step schedule would not fit in
the budget, the learning-rate decay follows the clock instead, so the run
still ends fully annealed in time. The run reports which of accuracy, steps or
time ended it.

    python tools/train_demo_model.py --out llaisys-models/src/llaisys_models/demo
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

# --------------------------------------------------------------------------
# Vocabulary and tokenizer
# --------------------------------------------------------------------------

EOS = "<|endoftext|>"
CHARS = list("0123456789+=")
# ids: '0'..'9' -> 0..9, '+' -> 10, '=' -> 11, EOS -> 12.
VOCAB = {c: i for i, c in enumerate(CHARS)}
VOCAB[EOS] = len(VOCAB)
EOS_ID = VOCAB[EOS]
VOCAB_SIZE = 16  # embedding rows (ids 13..15 are unused padding rows)

# Renders only the last user message, as is: [{"role": "user", "content":
# "12+34="}] -> "12+34=". The model was trained on single problems, so a chat's
# earlier turns are not shown to it (joined together they would make a prompt
# such as "12+30=4299+1=" that it never saw); the generation prompt adds
# nothing, so the model sees exactly the text it was trained on.
CHAT_TEMPLATE = ("{% for message in messages if message['role'] == 'user' %}"
                 "{% if loop.last %}{{ message['content'] }}{% endif %}{% endfor %}")

MAX_DIGITS = 4

# Qwen2's pre-tokenizer regex. For a config with model_type "qwen2",
# transformers 5 `AutoTokenizer` always builds `Qwen2Tokenizer`, which rebuilds
# a byte-level BPE with this regex from the vocab in tokenizer.json. We build
# exactly that pipeline ourselves (with no merges, hence one token per
# character), so loading tokenizer.json with the `tokenizers` library and
# loading the directory with `AutoTokenizer` give the same ids.
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""  # noqa: E501
)


def build_tokenizer_core():
    """Character-level tokenizer: BPE without merges over '0'-'9', '+', '='
    (ASCII bytes are their own byte-level symbols), plus the EOS special
    token. Characters outside the vocabulary (e.g. spaces) are dropped."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE

    chars = {c: i for c, i in VOCAB.items() if c != EOS}
    tok = Tokenizer(
        BPE(
            vocab=chars,
            merges=[],
            dropout=None,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(EOS, special=True, normalized=False)])
    assert tok.token_to_id(EOS) == EOS_ID
    return tok


def build_tokenizer():
    """The core tokenizer wrapped for transformers."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer_core(),
        eos_token=EOS,
        pad_token=EOS,
        model_max_length=256,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def encode(text: str) -> list[int]:
    return [VOCAB[c] for c in text]


# --------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------


def draw_operands(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Digit counts uniform over 1..4 for each operand (all 16 combinations
    equally likely), then the value uniform among numbers with that many
    digits (1 digit: 0..9)."""
    out = []
    for _ in range(2):
        d = rng.integers(1, MAX_DIGITS + 1, size=n)
        lo = np.where(d == 1, 0, 10 ** (d - 1))
        hi = 10**d  # exclusive
        out.append(lo + (rng.random(n) * (hi - lo)).astype(np.int64))
    return out[0], out[1]


def make_batch(a: np.ndarray, b: np.ndarray):
    """Token ids (right-padded with EOS) and labels (-100 except on the
    answer digits and the EOS that follows them)."""
    seqs, plens = [], []
    for x, y in zip(a.tolist(), b.tolist()):
        prompt = f"{x}+{y}="
        seqs.append(encode(prompt) + encode(str(x + y)) + [EOS_ID])
        plens.append(len(prompt))
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), EOS_ID, dtype=torch.long)
    labels = torch.full((len(seqs), L), -100, dtype=torch.long)
    for i, (s, p) in enumerate(zip(seqs, plens)):
        ids[i, : len(s)] = torch.tensor(s)
        labels[i, p : len(s)] = torch.tensor(s[p:])
    return ids, labels


def problems(seed: int, n: int) -> list[tuple[int, int]]:
    rng = np.random.default_rng(seed)
    a, b = draw_operands(rng, n)
    return list(zip(a.tolist(), b.tolist()))


# --------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------


@torch.no_grad()
def greedy_accuracy(model, probs, max_new=6):
    """Fast greedy check without KV cache: problems grouped by prompt length
    (no padding), one full forward per generated token."""
    model.eval()
    groups: dict[int, list[tuple[int, int]]] = {}
    for x, y in probs:
        groups.setdefault(len(f"{x}+{y}="), []).append((x, y))
    correct = 0
    for plen, grp in sorted(groups.items()):
        ids = torch.tensor([encode(f"{x}+{y}=") for x, y in grp])
        done = torch.zeros(len(grp), dtype=torch.bool)
        for _ in range(max_new):
            nxt = model(input_ids=ids).logits[:, -1, :].argmax(dim=-1)
            ids = torch.cat([ids, nxt[:, None]], dim=1)
            done |= nxt == EOS_ID
            if bool(done.all()):
                break
        for (x, y), row in zip(grp, ids[:, plen:].tolist()):
            want = encode(str(x + y)) + [EOS_ID]
            correct += row[: len(want)] == want
    model.train()
    return correct / len(probs)


@torch.no_grad()
def answer_margins(model, probs):
    """Teacher-forced margin at every answer position (answer digits and EOS):
    logit of the right token minus the best other logit. Negative means a
    wrong greedy token; large positive means a decisive prediction."""
    model.eval()
    groups: dict[int, list[tuple[int, int]]] = {}
    for x, y in probs:
        groups.setdefault(len(f"{x}+{y}={x + y}"), []).append((x, y))
    margins = []
    for _, grp in sorted(groups.items()):
        seqs = [encode(f"{x}+{y}=") + encode(str(x + y)) + [EOS_ID] for x, y in grp]
        plen = [len(f"{x}+{y}=") for x, y in grp]
        ids = torch.tensor(seqs)
        logits = model(input_ids=ids).logits.float()
        for i, (seq, p) in enumerate(zip(seqs, plen)):
            lg = logits[i, p - 1 : len(seq) - 1]
            tgt = torch.tensor(seq[p:])
            right = lg.gather(1, tgt[:, None])[:, 0]
            other = lg.scatter(1, tgt[:, None], float("-inf")).max(dim=1).values
            margins.extend((right - other).tolist())
    return np.array(margins)


def hf_generate_accuracy(model_dir: Path, probs, show=5):
    """Accuracy as a user sees it: reload the saved (bf16) model and the
    tokenizer from disk, apply the chat template, HF greedy generate."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)  # dtype from config
    model.eval()
    assert next(model.parameters()).dtype == torch.bfloat16
    groups: dict[int, list[tuple[int, int]]] = {}
    for x, y in probs:
        groups.setdefault(len(f"{x}+{y}="), []).append((x, y))
    correct, failures = 0, []
    with torch.no_grad():
        for _, grp in sorted(groups.items()):
            prompts = [
                tok.apply_chat_template(
                    [{"role": "user", "content": f"{x}+{y}="}],
                    tokenize=False,
                    add_generation_prompt=True,
                )
                for x, y in grp
            ]
            enc = tok(prompts, return_tensors="pt")
            out = model.generate(
                **enc,
                max_new_tokens=8,
                do_sample=False,
                eos_token_id=tok.eos_token_id,
                pad_token_id=tok.eos_token_id,
            )
            plen = enc["input_ids"].shape[1]
            for (x, y), row in zip(grp, out[:, plen:].tolist()):
                want = encode(str(x + y)) + [EOS_ID]
                if row[: len(want)] == want:
                    correct += 1
                elif len(failures) < show:
                    failures.append(f"{x}+{y}={tok.decode(row, skip_special_tokens=True)!r} (want {x + y})")
    return correct / len(probs), failures


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="llaisys-models/src/llaisys_models/demo")
    ap.add_argument(
        "--minutes",
        type=float,
        default=18.0,
        help="training time budget; if the step schedule would take longer, the LR schedule follows the clock "
        "instead (still ends fully decayed, but the result then depends on the machine's speed)",
    )
    ap.add_argument("--steps", type=int, default=3000, help="length of the LR schedule (max steps)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=256)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--target", type=float, default=0.995, help="stop when val accuracy (f32 and bf16) reaches this")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (results can differ by thread count)")
    ap.add_argument("--test-size", type=int, default=1000)
    args = ap.parse_args(argv)

    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    t_start = time.time()
    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)

    tokenizer = build_tokenizer()
    # The hand-rolled encoder used for training must agree with the tokenizer.
    for s in ["1234+5678=", "0+0=", "12+34=46" + EOS, "9999+9999=19998"]:
        assert tokenizer(s)["input_ids"] == (encode(s[: -len(EOS)]) + [EOS_ID] if s.endswith(EOS) else encode(s)), s

    head_dim = args.hidden // args.heads
    config = Qwen2Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=head_dim,
        # Training sequences are at most 16 tokens; 256 leaves room for
        # engines that check prompt + max_new_tokens (e.g. a default of 128)
        # against it. With default RoPE the value does not change the math.
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
        use_sliding_window=False,
        bos_token_id=None,
        eos_token_id=EOS_ID,
        pad_token_id=EOS_ID,
        attention_dropout=0.0,
    )
    config._attn_implementation = "sdpa"
    model = Qwen2ForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"parameters: {n_params:,}", flush=True)

    # Disjoint seeds: training stream, validation (early stop), final test.
    data_rng = np.random.default_rng(args.seed)
    val = problems(args.seed + 1, 2000)
    test = problems(args.seed + 2, args.test_size)

    decay, no_decay = [], []
    for p in model.parameters():
        (no_decay if p.ndim < 2 else decay).append(p)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.98),
        eps=1e-8,
    )

    def progress(step, elapsed_min):
        """Fraction of the run done: by steps, or by the time budget if that
        binds first (only then does the run depend on the machine's speed)."""
        by_steps = (step - args.warmup) / max(1, args.steps - args.warmup)
        return max(by_steps, elapsed_min / args.minutes)

    def lr_at(step, elapsed_min):
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        t = min(1.0, progress(step, elapsed_min))
        return args.lr * (0.02 + 0.98 * 0.5 * (1 + math.cos(math.pi * t)))

    model.train()
    t_train = time.time()
    stop_reason = "steps"
    step = 0
    ema = None
    history = []
    time_bound = False
    while True:
        elapsed = (time.time() - t_train) / 60
        if step >= args.warmup and progress(step, elapsed) >= 1.0:
            time_bound = step < args.steps
            stop_reason = f"time budget ({args.minutes:g} min) reached" if time_bound else "end of schedule"
            break
        lr = lr_at(step, elapsed)
        for g in opt.param_groups:
            g["lr"] = lr
        a, b = draw_operands(data_rng, args.batch)
        ids, labels = make_batch(a, b)
        logits = model(input_ids=ids).logits
        loss = F.cross_entropy(
            logits[:, :-1].reshape(-1, VOCAB_SIZE).float(), labels[:, 1:].reshape(-1), ignore_index=-100
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        if step % 50 == 0:
            elapsed = (time.time() - t_train) / 60
            print(f"step {step:5d}  loss {ema:.4f}  lr {lr:.2e}  {elapsed:5.1f} min", flush=True)
        if step % args.eval_every == 0:
            acc = greedy_accuracy(model, val)
            msg = f"  val acc f32 {acc:.4f}"
            acc_bf = None
            if acc >= args.target:
                bf = Qwen2ForCausalLM(config)
                bf.load_state_dict(model.state_dict())
                bf = bf.to(torch.bfloat16)
                acc_bf = greedy_accuracy(bf, val)
                msg += f"  bf16 {acc_bf:.4f}"
                del bf
            print(msg, flush=True)
            history.append((step, acc, acc_bf))
            if acc_bf is not None and acc_bf >= args.target:
                stop_reason = f"val accuracy >= {args.target}"
                break
    train_minutes = (time.time() - t_train) / 60
    print(f"stopped after {step} steps, {train_minutes:.1f} min: {stop_reason}", flush=True)

    # ---- save: bf16 weights, config, tokenizer, generation config ----
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in ["model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
                 "tokenizer_config.json", "special_tokens_map.json", "README.md"]:
        if (out / name).exists():
            (out / name).unlink()
    model.eval()
    model = model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.generation_config = GenerationConfig(
        bos_token_id=None,
        eos_token_id=EOS_ID,
        pad_token_id=EOS_ID,
        do_sample=False,
        max_new_tokens=8,
    )
    model.save_pretrained(out, safe_serialization=True)
    os.chmod(out / "model.safetensors", 0o644)  # saved 0600 by some versions
    tokenizer.save_pretrained(out)
    # Make sure the chat template sits in tokenizer_config.json (some
    # versions write chat_template.jinja instead).
    tc_path = out / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text())
    tc["chat_template"] = CHAT_TEMPLATE
    # What transformers 5 builds for model_type "qwen2" anyway; say so.
    tc["tokenizer_class"] = "Qwen2Tokenizer"
    tc["bos_token"] = None
    tc["unk_token"] = None
    tc["add_bos_token"] = False
    tc["add_eos_token"] = False
    tc_path.write_text(json.dumps(tc, indent=2, ensure_ascii=False) + "\n")
    if (out / "chat_template.jinja").exists():
        (out / "chat_template.jinja").unlink()

    # ---- check the saved files as a user would load them ----
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    p = tok.apply_chat_template([{"role": "user", "content": "12+34="}], tokenize=False, add_generation_prompt=True)
    assert p == "12+34=", repr(p)
    ids = tok(p)["input_ids"]
    assert ids == encode("12+34="), ids
    assert tok("1234+5678=")["input_ids"] == encode("1234+5678=")
    assert tok.eos_token_id == EOS_ID
    assert tok.decode(encode("6912") + [EOS_ID], skip_special_tokens=True) == "6912"
    assert tok.bos_token_id is None
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(out / "tokenizer.json"))
    for s in ["1234+5678=", "0+0=", "12 + 34 =", "9999+9999=19998" + EOS, "7+=x"]:
        assert raw.encode(s).ids == tok(s)["input_ids"], s

    test_acc, failures = hf_generate_accuracy(out, test)
    bf_reload = __import__("transformers").AutoModelForCausalLM.from_pretrained(out)
    margins = answer_margins(bf_reload, test)
    margin, margin_p1, margin_med = margins.min(), np.percentile(margins, 1), np.median(margins)
    size = (out / "model.safetensors").stat().st_size
    total_minutes = (time.time() - t_start) / 60
    print(f"held-out test accuracy (bf16, HF generate, {len(test)} problems): {test_acc:.4f}", flush=True)
    print(
        f"teacher-forced answer-token logit margins (bf16): min {margin:.3f}, 1st percentile {margin_p1:.3f}, "
        f"median {margin_med:.3f}",
        flush=True,
    )
    for f in failures:
        print("  failure:", f)
    print(f"model.safetensors: {size:,} bytes", flush=True)

    cmd = " ".join(["python tools/train_demo_model.py"] + sys.argv[1:]) if argv is None else "(called from Python)"
    pace = (
        "the clock set the pace in this run, so a rerun on a machine of another speed gives a similar but "
        "not bit-identical model"
        if time_bound
        else "the steps set the pace in this run"
    )
    card = f"""# llaisys demo model: tiny Qwen2 that adds numbers

A `Qwen2ForCausalLM` with {n_params:,} parameters ({size / 1e6:.2f} MB of bf16
safetensors), trained from scratch on multi-digit addition. It is the model
that `llaisys generate --prompt "12+34="` runs when no model is named.

## Task

Prompt `A+B=` with A and B of 1 to 4 digits (digit counts uniform over all 16
combinations, then the value uniform with that many digits); completion: the
sum in normal digit order followed by `<|endoftext|>`, e.g.
`1234+5678=` -> `6912<|endoftext|>`.

## Tokenizer and chat template

Character level: `0`..`9` -> ids 0..9, `+` -> 10, `=` -> 11,
`<|endoftext|>` -> 12 (EOS and pad). Embedding rows 13..15 are unused. No
BOS token is added. `tokenizer.json` is a byte-level BPE with no merges and
Qwen2's pre-tokenizer, i.e. exactly what transformers' `Qwen2Tokenizer` (which
`AutoTokenizer` picks for a qwen2 config) builds from it, so every character
is one token and characters outside the vocabulary (spaces) are dropped. The
chat template renders the last user message only (the model answers one
problem at a time, so a chat's earlier turns are left out), so
`[{{"role": "user", "content": "12+34="}}]` with `add_generation_prompt=True`
gives `12+34=` -> ids `{encode("12+34=")}`.

## Architecture

hidden {args.hidden}, {args.layers} layers, {args.heads} attention heads / {args.kv_heads}
key-value heads (head_dim {head_dim}), intermediate {args.intermediate}, vocab {VOCAB_SIZE},
RoPE theta 10000 (default rope type), max_position_embeddings 256 (trained on
sequences of at most 16 tokens), RMSNorm eps 1e-6,
tie_word_embeddings false, Qwen2 q/k/v biases.

## Training

AdamW (lr {args.lr}, betas 0.9/0.98, weight decay {args.weight_decay}), {args.warmup} warmup
steps then cosine decay to 2% over {args.steps} steps or {args.minutes:g} minutes, whichever
ends first ({pace}), batch {args.batch}, f32 on the CPU
({args.threads} thread{"s" if args.threads > 1 else ""}), loss on the answer tokens and EOS only; fresh random
problems every step (seed {args.seed}). Stopped after {step} steps
({stop_reason}); training took {train_minutes:.1f} min, the whole script
{total_minutes:.1f} min.

    {cmd}

## Evaluation

Held-out greedy exact match on {len(test)} problems (seed {args.seed + 2}, same
distribution), measured with HF transformers `generate` on this bf16 model
reloaded from disk through the chat template: **{test_acc * 100:.1f}%**.
Teacher-forced logit margin on the answer tokens (right token's logit minus
the best other logit, bf16, {len(margins)} tokens): minimum {margin:.2f}, 1st
percentile {margin_p1:.2f}, median {margin_med:.2f}.
"""
    (out / "README.md").write_text(card)
    print(f"wrote {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
