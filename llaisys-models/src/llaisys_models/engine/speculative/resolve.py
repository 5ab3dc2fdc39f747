"""``generate(speculative=..., num_speculative_tokens=...)``: the user's words as a ``Speculation`` (above the
drafters, so config.py, which sequences import, needs none of them)."""

from __future__ import annotations

import llaisys

from .config import DEFAULT_NUM_TOKENS, Speculation, check_numerics
from .draft_model import DraftModelDrafter
from .drafters import Drafter, NgramDrafter


def resolve(speculative, num_speculative_tokens, model) -> Speculation | None:
    """``generate(speculative=..., num_speculative_tokens=...)`` for ``model``: None (plain decoding), "ngram"
    (prompt lookup), "mtp" (the model's multi-token-prediction module), a draft model (a loaded model of the same
    tokenizer), a ``Drafter`` or a ``Speculation``."""
    if speculative is None:
        if num_speculative_tokens is not None:
            raise llaisys.LlaisysValueError("num_speculative_tokens needs speculative= ('ngram' or a draft model)")
        return None
    k = DEFAULT_NUM_TOKENS if num_speculative_tokens is None else num_speculative_tokens
    if isinstance(speculative, Speculation):
        spec = speculative if num_speculative_tokens is None else Speculation(speculative.drafter, k)
    elif isinstance(speculative, Drafter):
        spec = Speculation(speculative, k)
    elif isinstance(speculative, str):
        if speculative == "mtp":  # the model's own multi-token-prediction module (DeepSeek-V3: families/deepseek_mtp.py)
            if not hasattr(model, "mtp_drafter"):
                raise llaisys.LlaisysValueError(f"speculative = 'mtp': {type(model).__name__} has no multi-token-"
                                                f"prediction module (DeepSeek-V3 checkpoints have one)")
            spec = Speculation(model.mtp_drafter(), k)
        elif speculative != "ngram":
            raise llaisys.LlaisysValueError(f"speculative = {speculative!r}: use 'ngram', 'mtp', a draft model or a "
                                            f"Drafter")
        else:
            spec = Speculation(NgramDrafter(), k)
    elif hasattr(speculative, "forward_batch") and hasattr(speculative, "config"):
        spec = Speculation(DraftModelDrafter.of(speculative, model), k)
    else:
        raise llaisys.LlaisysValueError(f"speculative must be 'ngram', a draft model or a Drafter, got "
                                        f"{type(speculative).__name__}")
    check_numerics(model)
    return spec
