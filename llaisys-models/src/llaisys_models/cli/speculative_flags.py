"""``--speculative`` and ``--num-speculative-tokens``: the same two flags on ``llaisys generate`` and
``llaisys serve`` (where requests may still choose with "speculative": "ngram" | "draft" | "off")."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--speculative", default=None, metavar="ngram|mtp|draft:PATH|off",
                        help=f"speculative decoding {what}: prompt lookup (ngram), the model's own multi-token-"
                             f"prediction module (mtp: DeepSeek-V3) or a draft model of the same tokenizer (a path or "
                             f"Hub id); the output is the same as without it")
    parser.add_argument("--num-speculative-tokens", type=int, default=None, metavar="K",
                        help="tokens drafted per step (default 4; needs --speculative)")


def check_arguments(args) -> None:
    """The flags' form, before any model loads (a typo fails at once)."""
    from llaisys import LlaisysValueError

    method = args.speculative
    if method is None or method == "off":
        if args.num_speculative_tokens is not None:
            raise LlaisysValueError("--num-speculative-tokens needs --speculative ngram|mtp|draft:PATH")
    elif method not in ("ngram", "mtp") and not (method.startswith("draft:") and method[len("draft:"):]):
        raise LlaisysValueError(f"--speculative = {method!r}: use ngram, mtp, draft:PATH or off")


def from_arguments(args, model):
    """(the ``Speculation`` the flags ask for or None, the draft model's drafter or None)."""
    from .. import load
    from ..engine.speculative.draft_model import DraftModelDrafter
    from ..engine.speculative.resolve import resolve

    check_arguments(args)
    method, k = args.speculative, args.num_speculative_tokens
    if method is None or method == "off":
        return None, None
    if method in ("ngram", "mtp"):
        return resolve(method, k, model), None
    draft_model = load(method[len("draft:"):], device=model.device, numerics=model.numerics)
    drafter = DraftModelDrafter.of(draft_model, model)
    return resolve(drafter, k, model), drafter
