#!/usr/bin/env python
"""How often llaisys' greedy generations are token-identical to HF transformers', and why not.

    flock /tmp/llaisys-heavy.lock python benchmarks/parity.py            # every model, both modes
    python benchmarks/parity.py --models demo,bf16_mha_hd64 --prompts 8 --numerics exact

For each model and each of ``--prompts`` prompts, HF generates ``--new-tokens`` greedy
tokens (EOS ignored, except on the ``demo-eos`` row), and llaisys runs teacher-forced on
them (``llaisys_models.cli.parity``): a divergence is a step where llaisys' argmax differs from
HF's token, classified against the exact (float64) logits as a near-tie or a mismatch. A
generation is token-identical when it has no divergence (llaisys' own greedy run follows
HF's tokens exactly up to the first one).

Models: the demo (in-distribution addition prompts; ``demo`` runs past EOS, ``demo-eos``
stops there as a user's run does) and tiny random checkpoints made with transformers
(tests/models/tiny_models.py) in bf16 and f16, an f32 one converted to bf16 at load, one
larger bf16 one, and an f32 control. Columns per llaisys numerics mode (``exact``: f32
inside every op, one rounding at its output; ``hf``: rounding where HF's default (sdpa)
forward rounds) side by side; a mode this llaisys_models has no ``numerics=`` option for is
"n/a". HF's reference run is shared by both modes. Besides the tokens, each mode shows how
close its logits come to HF's own: the share of teacher-forced steps whose logits equal HF's
bit for bit, and the largest |llaisys - HF| logit difference.

``--speed DIR`` instead times decoding in both modes on one model (the demo: ``--speed demo``;
the 1.5B-shaped random model: ``--speed /tmp/qwen2-1.5b``): one load, the mode switched
between rounds that alternate (exact, hf, exact, hf, ...) so that machine noise hits both;
prefill and decode tok/s per mode, and the ratio hf / exact.

``--bug`` plants a real bug into every loaded llaisys model (its config or weights changed in
memory) to show how the classifier sees one: ``rope_theta`` (10x the model's), ``q_bias``
(layer 0's q_proj bias dropped).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import inspect
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# torch and llaisys share one OpenMP runtime here, and spinning worker threads make HF's generate
# 10-20x slower on a busy machine; this script measures agreement, not speed
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "models"))

from tiny_models import SPECS, Spec, make_checkpoint  # noqa: E402

MODES = ("exact", "hf")
TEXTS = [  # prompts for the byte-level tiny models (their ids are the UTF-8 bytes)
    "Hello", "Who are you?", "The quick brown fox jumps over the lazy dog.", "1, 2, 3, 4,",
    "def fib(n):", "Once upon a time", "Translate to French: good morning", "SELECT * FROM users WHERE",
    "The capital of France is", "Q: What is 7 times 8?\nA:", "<html><body>", "import numpy as np",
    "Roses are red,", "In 1492,", "The mitochondria is", "Dear Sir or Madam,", "x", "{\"name\":",
    "To be, or not to be, that is the question:", "Summarize: the meeting was moved to Tuesday.",
    "// TODO:", "Ingredients: flour, sugar,", "The derivative of sin(x) is", "ok",
    "A long time ago in a galaxy far, far away....", "Step 1:", "#!/bin/bash\n", "Why is the sky blue?",
]
EXTRA_SPECS = {  # a little bigger than the test checkpoints: 6 layers, hidden 256, vocab 1024
    "bf16_h256_l6": Spec(dtype="bf16", vocab=1024, hidden=256, inter=704, layers=6, heads=8, kv_heads=2,
                         rope_theta=1e6, seed=11),
}
# name -> (checkpoint, compute dtype or None for the stored one, stop at EOS)
MODELS = {
    "demo": ("demo", None, False),
    "demo-eos": ("demo", None, True),
    "bf16_mha_hd64": ("bf16_mha_hd64", None, False),
    "bf16_gqa4_hd128": ("bf16_gqa4_hd128_sharded", None, False),
    "bf16_h256_l6": ("bf16_h256_l6", None, False),
    "f16_gqa3_hd64": ("f16_gqa3_hd64_legacy", None, False),
    "f32->bf16_gqa2_hd32": ("f32_gqa2_hd32", "bfloat16", False),
    "f32->f16_mha_hd64": ("f32_mha_hd64_tied", "float16", False),
    "f32_gqa2_hd32": ("f32_gqa2_hd32", None, False),
}


@dataclasses.dataclass
class Tally:
    """One (model, mode) row: per-prompt results summed up."""

    prompts: int = 0
    identical: int = 0
    first_divergences: list = dataclasses.field(default_factory=list)
    steps: int = 0
    near_ties: int = 0
    mismatches: int = 0
    llaisys_error: float = 0.0
    hf_error: float = 0.0
    worst_ratio: float = 0.0  # max over prompts of llaisys' error / HF's
    hf_distance: float = 0.0  # max |llaisys logit - HF logit|
    hf_identical_rows: int = 0  # steps whose logits equal HF's bit for bit
    worst_near_tie_gap: float = 0.0  # largest exact gap of a choice at a near-tie
    smallest_bound: float = float("inf")  # the near-tie bound (2x HF's error) over the prompts
    largest_bound: float = 0.0

    def add(self, report) -> None:
        self.prompts += 1
        self.identical += not report.divergences
        if report.divergences:
            self.first_divergences.append(report.first_divergence)
        self.steps += report.steps
        self.near_ties += report.near_ties
        self.mismatches += report.mismatches
        self.llaisys_error = max(self.llaisys_error, report.llaisys_error)
        self.hf_error = max(self.hf_error, report.hf_error)
        self.hf_distance = max(self.hf_distance, report.hf_distance)
        self.hf_identical_rows += report.hf_identical_rows
        if report.hf_error > 0:
            self.worst_ratio = max(self.worst_ratio, report.llaisys_error / report.hf_error)
        for d in report.divergences:
            if d.verdict == "near-tie":
                self.worst_near_tie_gap = max(self.worst_near_tie_gap, max(d.exact_gaps))
        self.smallest_bound = min(self.smallest_bound, report.bound)
        self.largest_bound = max(self.largest_bound, report.bound)


def checkpoint(name: str, root: Path) -> Path:
    import llaisys_models
    from llaisys_models.cli.parity import quiet_transformers

    if name == "demo":
        return llaisys_models.DEMO_MODEL_DIR
    directory = root / name
    if not directory.is_dir():
        directory.mkdir()
        with quiet_transformers():
            make_checkpoint(directory, {**SPECS, **EXTRA_SPECS}[name])
    return directory


def prompts(name: str, path: Path, count: int) -> list[list[int]]:
    from llaisys_models.text.tokenizer import encode, load_tokenizer

    if name == "demo":  # addition problems like the demo's training data: 1-4 digit operands
        rng = np.random.default_rng(1)
        texts = [f"{rng.integers(0, 10 ** rng.integers(1, 5))}+{rng.integers(0, 10 ** rng.integers(1, 5))}="
                 for _ in range(count)]
    else:
        texts = [TEXTS[i % len(TEXTS)] + " " * (i // len(TEXTS)) for i in range(count)]
    tokenizer = load_tokenizer(path)
    return [encode(tokenizer, text, chat=False) for text in texts]


def wrong_rope_theta(model) -> None:
    model.config = dataclasses.replace(model.config, rope_theta=model.config.rope_theta * 10)
    model.set_rope()  # the rope table is computed from the config at load


def dropped_q_bias(model) -> None:
    model.weights.layers[0].q_bias = None


BUGS = {"rope_theta": wrong_rope_theta, "q_bias": dropped_q_bias}


def load(path: Path, dtype, device, mode: str):
    """The llaisys model in numerics ``mode``, or None where this llaisys_models has no such mode."""
    import llaisys_models

    if "numerics" in inspect.signature(llaisys_models.load).parameters:
        return llaisys_models.load(path, device=device, dtype=dtype, numerics=mode, progress=False)
    return llaisys_models.load(path, device=device, dtype=dtype, progress=False) if mode == "exact" else None


def run(args) -> dict[str, dict[str, Tally | None]]:
    import torch

    from llaisys_models.cli import parity

    results = {}
    for name in args.models:
        t0 = time.perf_counter()
        ckpt, dtype, stop_at_eos = MODELS[name]
        path = checkpoint(ckpt, args.root)
        models = {mode: load(path, dtype, args.device, mode) for mode in args.numerics}
        for model in models.values():
            if model is not None and args.bug:
                BUGS[args.bug](model)
        some = next(m for m in models.values() if m is not None) if any(models.values()) else None
        if some is None:
            results[name] = {mode: None for mode in args.numerics}
            continue
        tallies = {mode: Tally() if model is not None else None for mode, model in models.items()}
        eos = some.eos_token_ids if stop_at_eos else ()
        hf = parity.load_hf(path, some.dtype.name)
        hf_models = (hf, copy.deepcopy(hf).to(torch.float64))  # loaded once for every prompt
        for ids in prompts(ckpt, path, args.prompts):
            reference = parity.hf_reference(path, ids, args.new_tokens, some.dtype.name, eos, models=hf_models)
            for mode, model in models.items():
                if model is not None:
                    report = parity.compare(model, ids, args.new_tokens, reference=reference)
                    tallies[mode].add(report)
                    if args.verbose and report.divergences:
                        print(f"{name} [{mode}] prompt {ids[:12]}...: {report.summary()}", file=sys.stderr)
        results[name] = tallies
        print(f"{name}: {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    return results


MODE_COLUMNS = ["token-identical", "first divergences (step)", "near-ties / mismatches", "largest near-tie gap",
                "llaisys max|err| (worst x HF)", "logits = HF's (steps)", "max|llaisys - HF|"]


def mode_cells(tally: Tally | None, width: int) -> list[str]:
    if tally is None:
        return ["n/a"] + [""] * (width - 1)
    firsts = sorted(tally.first_divergences)
    return [f"{tally.identical}/{tally.prompts} ({100 * tally.identical / max(tally.prompts, 1):.0f}%)",
            ", ".join(map(str, firsts)) if firsts else "-",
            f"{tally.near_ties} / {tally.mismatches}",
            f"{tally.worst_near_tie_gap:.3g}" if tally.near_ties else "-",
            f"{tally.llaisys_error:.3g} ({tally.worst_ratio:.2f}x)",
            f"{100 * tally.hf_identical_rows / max(tally.steps, 1):.0f}%",
            f"{tally.hf_distance:.3g}"]


def table(results, modes) -> str:
    """A markdown table: model columns, then one group of columns per numerics mode (a mode that
    no model could run in shrinks to one column)."""
    ran = {mode: any(t[mode] is not None for t in results.values()) for mode in modes}
    header = ["model", "dtype", "steps", "HF max|err|", "near-tie bound"]
    for mode in modes:
        header += [f"{title} [{mode}]" for title in MODE_COLUMNS] if ran[mode] else [f"[{mode}]"]
    rows = []
    for name, tallies in results.items():
        ckpt, dtype, _ = MODELS[name]
        stored = "bf16" if ckpt == "demo" else {**SPECS, **EXTRA_SPECS}[ckpt].dtype
        known = next((t for t in tallies.values() if t is not None), None)
        row = [name, {"bfloat16": "bf16", "float16": "f16"}.get(dtype, stored)]
        if known:
            row += [str(known.steps), f"{known.hf_error:.3g}", f"{known.smallest_bound:.3g}-{known.largest_bound:.3g}"]
        else:
            row += ["-", "-", "-"]
        for mode in modes:
            row += mode_cells(tallies[mode], len(MODE_COLUMNS) if ran[mode] else 1)
        rows.append(row)
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    return "\n".join(lines)


def speed(args) -> str:
    """Decode (and prefill) tok/s of each numerics mode on one model, rounds alternating between the modes."""
    import llaisys_models

    path = llaisys_models.DEMO_MODEL_DIR if str(args.speed) == "demo" else args.speed
    model = llaisys_models.load(path, device=args.device, progress=False)
    n_ctx = min(args.speed_context, model.config.max_position_embeddings - args.new_tokens - 1)
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, size=n_ctx).tolist()
    prefill = {mode: [] for mode in args.numerics}
    decode = {mode: [] for mode in args.numerics}
    for rnd in range(args.speed_rounds + 1):  # round 0 warms up (page-ins, buffers) and is not counted
        for mode in args.numerics:
            model.numerics = mode  # the same weights; each forward reads the mode
            model.generate(ids, args.new_tokens, eos_token_ids=())
            if rnd:
                prefill[mode].append(model.last_stats.prefill_tokens_per_second)
                decode[mode].append(model.last_stats.decode_tokens_per_second)
    lines = [f"decode speed by numerics mode: {path} ({model.dtype.name}, {model.device}), prompt of {n_ctx} "
             f"tokens, {args.new_tokens} new tokens, {args.speed_rounds} alternating rounds (median)",
             "| mode | prefill tok/s | decode tok/s | decode vs exact |", "|---|---|---|---|"]
    base = float(np.median(decode[args.numerics[0]]))
    for mode in args.numerics:
        d = float(np.median(decode[mode]))
        lines.append(f"| {mode} | {np.median(prefill[mode]):.1f} | {d:.2f} | {d / base:.3f}x |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {', '.join(MODELS)}")
    p.add_argument("--prompts", type=int, default=24, help="prompts per model (default 24)")
    p.add_argument("--new-tokens", type=int, default=128, help="greedy tokens per prompt (default 128)")
    p.add_argument("--numerics", default="exact,hf",
                   help="llaisys numerics modes to run, comma-separated: exact, hf (default both)")
    p.add_argument("--device", default=None, help="llaisys device (default: the best available)")
    p.add_argument("--root", type=Path, default=None, help="where to write the tiny checkpoints (default: a temp dir)")
    p.add_argument("--verbose", action="store_true", help="print every prompt that diverged")
    p.add_argument("--speed", type=Path, default=None, metavar="DIR",
                   help="time decoding in each mode on this model directory ('demo': the demo) instead")
    p.add_argument("--speed-context", type=int, default=16, help="--speed: prompt tokens (default 16)")
    p.add_argument("--speed-rounds", type=int, default=3, help="--speed: rounds per mode (default 3)")
    p.add_argument("--bug", choices=sorted(BUGS), default=None,
                   help="plant this bug into llaisys' models (a check that the classifier calls it a mismatch)")
    args = p.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    args.numerics = [m.strip() for m in args.numerics.split(",") if m.strip()]
    for m in args.models:
        if m not in MODELS:
            p.error(f"unknown model {m!r}; choose from {', '.join(MODELS)}")
    for m in args.numerics:
        if m not in MODES:
            p.error(f"unknown numerics mode {m!r}; choose from {', '.join(MODES)}")

    if args.speed is not None:
        print(speed(args))
        return 0

    import torch

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="llaisys-parity-") as tmp:
        if args.root is None:
            args.root = Path(tmp)
        args.root.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        results = run(args)
    planted = f", planted bug: {args.bug}" if args.bug else ""
    print(f"greedy parity with HF transformers (torch {torch.__version__}{planted}): "
          f"{args.prompts} prompts x {args.new_tokens} new tokens per model, teacher-forced on HF's tokens "
          f"({time.perf_counter() - t0:.0f}s)")
    print(table(results, args.numerics))
    print("max|err|: the largest |logit - exact logit| over every step and vocabulary entry; worst x HF: the "
          "largest ratio of llaisys' to HF's over the prompts; near-tie bound: 2x HF's max|err| on a prompt "
          "(smallest-largest); near-tie gap: how far below the exact maximum a near-tie's choice was")
    return 0


if __name__ == "__main__":
    sys.exit(main())
