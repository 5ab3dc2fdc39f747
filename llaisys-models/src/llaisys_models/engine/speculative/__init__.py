"""Speculative decoding: a drafter guesses the next few tokens, one forward verifies them all.

Decode reads every weight once per token, so on a bandwidth-bound machine a step of one token per
sequence is nearly as fast as it gets. A verify step runs [last token, d1 .. dK] through the model in one
forward (the paged attention already takes several query rows per sequence), reads the weights once, and
keeps the drafted tokens the model would have chosen itself plus one token of its own.

    drafters.py     the ``Drafter`` interface and ``NgramDrafter`` (prompt lookup: no second model)
    draft_model.py  ``DraftModelDrafter``: a small model of the same tokenizer, with its own KV pool
    verify.py       which drafted tokens survive (the model's own choice, row by row; the rejection rule),
                    applied in each verify step by ``sampling.Verifier`` (re-exported here)
    config.py       ``Speculation`` (a drafter and K), the draft length's rules
    resolve.py      ``resolve``: what ``generate(speculative=...)`` takes, as a ``Speculation``

The scheduler (scheduler.py) drafts for its decoding sequences when it plans a step, the model runner
(runner.py) runs the verify rows in the step's one forward and verifies them, and the scheduler's commit keeps
what the verifier returned and truncates the KV cache past it (blocks freed).
"""

from ..sampling import Verifier
from .config import DEFAULT_NUM_TOKENS, MAX_NUM_TOKENS, Speculation
from .draft_model import DraftModelDrafter
from .drafters import Drafter, NgramDrafter
from .resolve import resolve
from .verify import rejection_step, target_probs

__all__ = ["DEFAULT_NUM_TOKENS", "MAX_NUM_TOKENS", "DraftModelDrafter", "Drafter", "NgramDrafter", "Speculation",
           "Verifier", "rejection_step", "resolve", "target_probs"]
