"""Greedy parity with HF transformers that explains every divergence (``llaisys infer --test``).

Both engines compute in the same low-precision dtype, so both are off the exact answer by
rounding, and where two tokens' logits nearly tie, rounding alone can make them choose
differently without either being wrong. So the comparison is made against the exact
logits (the same weights, run by transformers in float64):

1. HF generates greedily; its tokens and the logits it chose them from are kept.
2. llaisys runs teacher-forced on HF's tokens (prefill of the prompt, then one cached decode
   step per HF token), so every step compares the two engines on the same context.
3. At a step where llaisys' argmax differs from HF's token, the verdict is *near-tie* when
   both tokens' exact logits are within ``bound`` of the exact maximum, else *mismatch*.

The bound is measured on the run itself, from HF: ``eps`` = the largest |HF logit - exact
logit| over every step and every vocabulary entry. HF is the reference implementation, so
``eps`` is the rounding error this dtype produces on this model and context. An engine
whose logits are each within ``eps`` of exact can prefer token X over the exact argmax M
only if exact[M] - exact[X] <= 2 * eps (X's logit rounded up by eps, M's down by eps); a
greater gap cannot come from rounding of that size: a mismatch. Hence ``bound = 2 eps`` (HF's
own choice is within it by construction). llaisys' error does not enter the bound, so a bug
in llaisys cannot widen it. One bound per run, not per step: a single step's few logits
estimate the rounding error too noisily (at a step where HF happened to round little,
llaisys' equally legitimate rounding would read as a bug).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # (transformers and torch are imported when a reference is made)
    from transformers import PreTrainedModel

    from ..families.causal_lm import CausalLM

NEAR_TIE, MISMATCH = "near-tie", "mismatch"


@dataclasses.dataclass
class Reference:
    """HF's greedy continuation of a prompt, with the logits it chose from and the exact logits."""

    prompt: list[int]
    tokens: list[int]  # HF's new tokens, one per step
    logits: np.ndarray  # [steps, vocab] float32: HF's logits at each step (computed in `dtype`)
    exact_logits: np.ndarray  # [steps, vocab] float64: the same weights run in float64
    dtype: str  # "bfloat16", "float16" or "float32"
    seconds: float  # HF's generate time


@dataclasses.dataclass
class Divergence:
    """A step where llaisys' greedy choice differs from HF's; logits are (of HF's token, of llaisys')."""

    step: int
    hf_token: int
    llaisys_token: int
    hf_logits: tuple[float, float]
    llaisys_logits: tuple[float, float]
    exact_logits: tuple[float, float]
    exact_max: float
    verdict: str  # NEAR_TIE or MISMATCH

    @property
    def exact_gaps(self) -> tuple[float, float]:
        """How far each choice's exact logit is below the exact maximum."""
        return self.exact_max - self.exact_logits[0], self.exact_max - self.exact_logits[1]


@dataclasses.dataclass
class ParityReport:
    prompt: list[int]
    hf_tokens: list[int]
    llaisys_choices: list[int]  # llaisys' argmax at each teacher-forced step
    divergences: list[Divergence]
    hf_error: float  # max |HF logit - exact| over every step and vocabulary entry
    llaisys_error: float  # the same for llaisys
    hf_distance: float  # max |llaisys logit - HF logit|: how closely llaisys rounds as HF does
    hf_identical_rows: int  # steps whose logits llaisys computed bit for bit as HF did
    bound: float  # a choice this close to the exact maximum is explained by rounding (2 * hf_error)
    dtype: str

    @property
    def steps(self) -> int:
        return len(self.hf_tokens)

    @property
    def near_ties(self) -> int:
        return sum(d.verdict == NEAR_TIE for d in self.divergences)

    @property
    def mismatches(self) -> int:
        return sum(d.verdict == MISMATCH for d in self.divergences)

    @property
    def identical(self) -> int:
        return self.steps - len(self.divergences)

    @property
    def first_divergence(self) -> int | None:
        return self.divergences[0].step if self.divergences else None

    def ok(self, strict: bool = False) -> bool:
        """No mismatch (``strict``: no divergence at all)."""
        return not self.divergences if strict else self.mismatches == 0

    def summary(self) -> str:
        return (f"{_count(self.identical, 'identical step')}, {_count(self.near_ties, 'near-tie')}, "
                f"{_count(self.mismatches, 'mismatch', 'es')} ({self.dtype}); max |logit - exact|: llaisys "
                f"{self.llaisys_error:.3g}, HF {self.hf_error:.3g}; near-tie bound {self.bound:.3g} (2x HF's)")

    def describe(self, decode: Callable[[int], str] = str) -> list[str]:
        """Lines explaining each divergence; ``decode(token_id)`` gives a token's text."""
        lines = []
        for d in self.divergences:
            gaps = d.exact_gaps
            lines.append(f"step {d.step}: HF chose {decode(d.hf_token)!r} ({d.hf_token}), llaisys "
                         f"{decode(d.llaisys_token)!r} ({d.llaisys_token}): {d.verdict}")
            lines.append(f"    logits of HF's / llaisys' choice: HF {d.hf_logits[0]:.4f} / {d.hf_logits[1]:.4f}, "
                         f"llaisys {d.llaisys_logits[0]:.4f} / {d.llaisys_logits[1]:.4f}, "
                         f"exact {d.exact_logits[0]:.4f} / {d.exact_logits[1]:.4f}")
            lines.append(f"    below the exact maximum {d.exact_max:.4f} by {gaps[0]:.4g} / {gaps[1]:.4g} "
                         f"(bound {self.bound:.3g})")
        return lines


def _count(n: int, noun: str, plural: str = "s") -> str:
    return f"{n} {noun}{plural * (n != 1)}"


def classify(reference: Reference, llaisys_logits: np.ndarray) -> ParityReport:
    """Compare llaisys' teacher-forced logits [steps, vocab] with HF's run and the exact logits."""
    hf, exact = reference.logits.astype(np.float64), reference.exact_logits
    ours = np.asarray(llaisys_logits, dtype=np.float64)
    steps = len(reference.tokens)
    if not (ours.shape == hf.shape == exact.shape and ours.shape[0] == steps):
        raise ValueError(f"logits of llaisys {ours.shape}, HF {hf.shape}, exact {exact.shape}, expected "
                         f"[{steps}, vocab] each")
    hf_error = float(np.abs(hf - exact).max()) if steps else 0.0
    llaisys_error = float(np.abs(ours - exact).max()) if steps else 0.0
    hf_distance = float(np.abs(ours - hf).max()) if steps else 0.0
    hf_identical_rows = int((ours == hf).all(axis=-1).sum())
    bound = 2.0 * hf_error
    choices = [int(row.argmax()) for row in ours]
    divergences = []
    for step, (theirs, mine) in enumerate(zip(reference.tokens, choices)):
        if theirs == mine:
            continue
        pair = (theirs, mine)
        exact_max = float(exact[step].max())
        worst_gap = exact_max - min(float(exact[step, t]) for t in pair)
        divergences.append(Divergence(
            step=step, hf_token=theirs, llaisys_token=mine,
            hf_logits=(float(hf[step, theirs]), float(hf[step, mine])),
            llaisys_logits=(float(ours[step, theirs]), float(ours[step, mine])),
            exact_logits=(float(exact[step, theirs]), float(exact[step, mine])),
            exact_max=exact_max,
            verdict=NEAR_TIE if worst_gap <= bound else MISMATCH))
    return ParityReport(prompt=list(reference.prompt), hf_tokens=list(reference.tokens), llaisys_choices=choices,
                        divergences=divergences, hf_error=hf_error, llaisys_error=llaisys_error,
                        hf_distance=hf_distance, hf_identical_rows=hf_identical_rows, bound=bound,
                        dtype=reference.dtype)


def teacher_forced_logits(model: CausalLM, prompt: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
    """llaisys' logits [len(tokens), vocab] (float32) for each step of HF's continuation ``tokens``:
    the prompt's prefill, then one cached decode step per token (the path ``generate`` takes)."""
    prompt = model.check_input_ids(prompt)
    if not tokens:
        return np.zeros((0, model.config.vocab_size), np.float32)
    model.check_length(len(prompt) + len(tokens) - 1)
    session = model.session()
    rows, pending = [], prompt
    for token in tokens:
        rows.append(session.forward(pending).numpy().astype(np.float32)[0])
        pending = [token]
    return np.stack(rows)


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Keep transformers' progress bars ("Loading weights") and advisories off the console."""
    from transformers.utils import logging

    bars, verbosity = logging.is_progress_bar_enabled(), logging.get_verbosity()
    logging.disable_progress_bar()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()


DTYPES = ("float32", "float16", "bfloat16")


def load_hf(path: str | Path, dtype: str) -> PreTrainedModel:
    """HF transformers' model of the checkpoint at ``path`` (torch, CPU), its weights in ``dtype``."""
    import torch
    from transformers import AutoModelForCausalLM

    from ..loading import gguf, quantized_checkpoint
    from ..loading.files import is_gguf

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if quantized_checkpoint.is_quantized(path):  # GPTQ / AWQ: the exactly dequantized weights
        return quantized_hf_model(path, dtype)
    where, kwargs = gguf.hf_from_pretrained_args(path) if is_gguf(path) else (str(path), {})
    with quiet_transformers():
        return AutoModelForCausalLM.from_pretrained(where, dtype=getattr(torch, dtype), **kwargs).eval()


def quantized_hf_model(directory: str | Path, dtype: str) -> PreTrainedModel:
    """HF transformers' model of the GPTQ / AWQ checkpoint ``directory`` (torch, CPU) with the exactly dequantized
    weights, in ``dtype`` ("float32", "float64", ...): the reference a kept-quantized llaisys model must match."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from ..errors import ModelLoadError
    from ..loading.quantized_checkpoint import dequantized_state

    config = AutoConfig.from_pretrained(directory)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with quiet_transformers():
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    state = {name: torch.from_numpy(array) for name, array in dequantized_state(directory).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise ModelLoadError(f"{directory}: the dequantized weights do not fit HF's model: missing "
                             f"{sorted(set(missing) - tied)[:4]}, unexpected {sorted(unexpected)[:4]}")
    if tied:
        model.tie_weights()
    return model.eval()


def hf_reference(path: str | Path, prompt: Sequence[int], max_new_tokens: int, dtype: str, eos_token_ids: Sequence[int] = (),
                 *, models: tuple[PreTrainedModel, PreTrainedModel] | None = None) -> Reference:
    """HF transformers' greedy run of ``prompt`` (torch, CPU) in ``dtype``, then the exact logits of
    the same weights in float64 along HF's tokens. ``eos_token_ids`` empty: never stop early.

    ``models``: (the HF model in ``dtype``, a float64 copy of it) to reuse across prompts; without
    them the checkpoint is loaded here and widened in place once HF has generated, so the
    reference needs 8 bytes of host memory per parameter."""
    import torch

    model, exact_model = models if models is not None else (load_hf(path, dtype), None)
    tokens, logits, seconds = hf_greedy(model, prompt, max_new_tokens, eos_token_ids)
    from ..loading import quantized_checkpoint

    if exact_model is None and quantized_checkpoint.is_quantized(path):  # GPTQ / AWQ: the dequantized values
        exact_model = quantized_hf_model(path, "float64")  # exactly, not rounded to dtype
    if exact_model is None:
        # in place: the weights already rounded to dtype, widened exactly. (The ignore: transformers wraps to() in
        # functools.wraps(torch.nn.Module.to), whose type mypy reads unbound, self first; without torch installed,
        # as where lint runs, there is no such error)
        exact_model = model.to(torch.float64)  # type: ignore[arg-type, unused-ignore]
    exact = exact_logits(exact_model, list(prompt) + tokens[:-1], len(tokens))
    return Reference(prompt=list(prompt), tokens=tokens, logits=logits, exact_logits=exact, dtype=dtype,
                     seconds=seconds)


def hf_greedy(model: PreTrainedModel, prompt: Sequence[int], max_new_tokens: int,
              eos_token_ids: Sequence[int] = ()) -> tuple[list[int], np.ndarray, float]:
    """HF ``model``'s greedy tokens after ``prompt``, the float32 logits [steps, vocab] it chose them
    from, and its generate time in seconds."""
    import torch
    from transformers import GenerationConfig

    eos = list(eos_token_ids)
    # plain greedy: replace the checkpoint's generation_config, whose sampling settings and
    # penalties (a chat model's repetition_penalty, say) generate() would otherwise merge in;
    # the model's own config comes back afterwards (the caller may share the model)
    saved = model.generation_config
    model.generation_config = GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos or None, pad_token_id=(eos or [0])[0],
        output_logits=True, return_dict_in_generate=True)
    ids = torch.tensor([list(prompt)])
    try:
        with torch.no_grad(), quiet_transformers():
            t0 = time.perf_counter()
            # (the ignore: PreTrainedModel does not declare generate, which the causal-LM classes mix in, and with
            # torch installed mypy reads it from torch.nn.Module.__getattr__: a Tensor; without torch, no error)
            out = model.generate(ids, attention_mask=torch.ones_like(ids))  # type: ignore[operator, unused-ignore]
            seconds = time.perf_counter() - t0
    finally:
        model.generation_config = saved
    tokens = out.sequences[0, len(prompt):].tolist()
    if not tokens:
        return tokens, np.zeros((0, model.config.vocab_size), np.float32), seconds
    logits = torch.cat(out.logits).float().numpy()
    chosen = logits.argmax(axis=-1).tolist()
    if chosen != tokens:  # the comparison assumes HF took the argmax of the logits it reports
        step = next(i for i, (a, b) in enumerate(zip(chosen, tokens)) if a != b)
        raise RuntimeError(f"HF generate chose token {tokens[step]} at step {step}, not the argmax "
                           f"{chosen[step]} of its logits: a logits processor is active")
    return tokens, logits, seconds


def exact_logits(model: PreTrainedModel, sequence: list[int], last: int) -> np.ndarray:
    """Float64 logits [last, vocab] of the last ``last`` positions of ``sequence`` from the float64
    HF ``model``."""
    import torch

    if last == 0:
        return np.zeros((0, model.config.vocab_size))
    with torch.no_grad():
        return model(torch.tensor([sequence]), logits_to_keep=last).logits[0].numpy()


def compare(model: CausalLM, prompt: Sequence[int], max_new_tokens: int, *, path: str | Path | None = None,
            eos_token_ids: Sequence[int] | None = None, reference: Reference | None = None) -> ParityReport:
    """Run HF greedily on ``prompt`` (or take ``reference``), llaisys ``model`` teacher-forced on HF's
    tokens, and classify every divergence. ``path`` defaults to the model's own directory."""
    prompt = model.check_input_ids(prompt)
    if reference is None:
        eos = model.eos_token_ids if eos_token_ids is None else eos_token_ids
        reference = hf_reference(path or model.path, prompt, max_new_tokens, model.dtype.name, eos)
    return classify(reference, teacher_forced_logits(model, prompt, reference.tokens))


__all__ = ["MISMATCH", "NEAR_TIE", "Divergence", "ParityReport", "Reference", "classify", "compare",
           "exact_logits", "hf_greedy", "hf_reference", "load_hf", "quiet_transformers", "teacher_forced_logits"]

