"""Where a model's f16 / bf16 ops round: the ``numerics=`` load option.

* ``"exact"`` (the default): each op computes in f32 and rounds once to the model dtype; the logits are
  as close to the exact (float64) forward as an f32-accumulating engine gets.
* ``"hf"``: the ops round where HuggingFace transformers' default forward rounds (RoPE's cos/sin and
  products, silu(gate) before the product, attention's unnormalised probabilities as torch's CPU
  flash-attention kernel does), so greedy generations follow HF's own near-tie choices more often.

In float32 the two modes are the same. ``LLAISYS_NUMERICS`` sets the default for every load.
"""

from __future__ import annotations

import argparse
import os

from ..errors import ModelLoadError

MODES = ("exact", "hf")
ENV = "LLAISYS_NUMERICS"


def resolve(numerics: str | None) -> str:
    """The mode for ``numerics`` (None: ``$LLAISYS_NUMERICS``, else "exact"); anything else raises."""
    source = "numerics"
    if numerics is None:
        numerics, source = os.environ.get(ENV, "").strip() or "exact", ENV
    if not isinstance(numerics, str) or numerics.lower() not in MODES:
        raise ModelLoadError(f"{source} must be one of {', '.join(MODES)}, got {numerics!r}")
    return numerics.lower()


def add_argument(parser: argparse.ArgumentParser) -> None:
    """``--numerics exact|hf`` on a CLI command that loads a model."""
    parser.add_argument("--numerics", default=None, choices=MODES,
                        help=f"where f16 / bf16 ops round: exact (f32 inside, one rounding; the default) or hf "
                             f"(where HF transformers rounds, to follow its greedy choices at near-ties); default "
                             f"${ENV}, else exact")
