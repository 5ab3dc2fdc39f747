"""The teacher-forced parity rule of DESIGN.md section 6: near-ties, their tolerance and how often they may happen."""

from __future__ import annotations

import numpy as np

MANTISSA_BITS = {"bf16": 7, "f16": 10}

ULPS = 4  # near-tie tolerance in ulps of the top logit (bf16/f16)


F32_REL = 1e-4  # near-tie tolerance relative to the top logit in f32 (DESIGN: <= 1e-3)

MAX_NEAR_TIE_RATE = {"f32": 0.01, "f16": 0.05, "bf16": 0.05}  # of all greedy steps of a checkpoint


def ulp(x: float, dtype: str) -> float:
    return 2.0 ** (np.floor(np.log2(max(abs(x), 1e-30))) - MANTISSA_BITS[dtype])


def tie_tolerance(top: float, dtype: str) -> float:
    return F32_REL * abs(top) if dtype == "f32" else ULPS * ulp(top, dtype)


def logits_error_bound(hf_error: float, scale: float, dtype: str) -> float:
    """llaisys may be off the exact logits by at most twice what HF is, plus a floor of a
    couple of ulps of the largest logit (a tiny model can make HF's own error nearly 0)."""
    floor = 1e-5 * scale if dtype == "f32" else 2 * ulp(scale, dtype)
    return 2 * hf_error + floor


def near_tie(hf_row: np.ndarray, exact_row: np.ndarray, mine: int, hf_token: int, dtype: str, where: str) -> None:
    """llaisys chose ``mine`` where HF chose ``hf_token``: fine only if HF itself nearly tied them, or if the
    exact (float64) logits of the same weights nearly tie ``mine`` with their maximum (DESIGN §6: in bf16 HF
    strays from the exact argmax more than an f32-accumulating kernel does, and how far depends on the CPU
    torch runs on: its AVX2 and AVX-512 kernels round differently)."""
    gap = float(hf_row.max() - hf_row[mine])
    tol = tie_tolerance(float(hf_row.max()), dtype)
    exact_gap = float(exact_row.max() - exact_row[mine])
    exact_tol = tie_tolerance(float(exact_row.max()), dtype)
    assert gap <= tol or exact_gap <= exact_tol, (
        f"{where}: llaisys picks {mine}, HF picks {hf_token}; HF's logit for {mine} is {gap:.4g} below its max "
        f"(tolerance {tol:.3g}), the exact one {exact_gap:.4g} (tolerance {exact_tol:.3g}): not a near-tie")


def check_against_reference(model, ref, dtype: str, routing=None) -> list[int]:
    """Returns the steps where llaisys' greedy choice differed from HF's (each one a near-tie). ``routing``
    (mixture-of-experts models: moe_routing.explain_by_routing with the model and HF's bound): called as
    ``routing(context, llaisys' token, HF's token, where)`` for a divergence the logits do not explain, it must
    explain it by near-tied router choices or raise."""
    n_prompt, hf_new = len(ref.prompt), ref.tokens[len(ref.prompt):]
    hf_logits, exact_logits = ref.logits[n_prompt - 1:], ref.exact_logits[n_prompt - 1:]

    def diverged_at(step: int, mine: int, where: str) -> None:
        try:
            near_tie(hf_logits[step], exact_logits[step], mine, hf_new[step], dtype, where)
        except AssertionError:
            if routing is None:
                raise
            routing(ref.tokens[:n_prompt + step], mine, hf_new[step], where)

    # 1. one forward over HF's whole sequence (the prefill path): logits as close to the exact
    #    ones as HF's, and the argmax at every position HF's token or a near-tie
    ours = model.logits(ref.tokens[:-1])
    scale = float(np.abs(ref.exact_logits).max())
    our_err = float(np.abs(ours - ref.exact_logits).max())
    hf_err = float(np.abs(ref.logits - ref.exact_logits).max())
    assert our_err <= logits_error_bound(hf_err, scale, dtype), (
        f"llaisys logits are {our_err:.3g} off the exact ones, HF's {hf_err:.3g} (max |logit| {scale:.3g})")
    ties = set()
    for step, (row, hf_token) in enumerate(zip(ours[n_prompt - 1:], hf_new)):
        if int(row.argmax()) != hf_token:
            diverged_at(step, int(row.argmax()), f"prefill path, step {step}")
            ties.add(step)

    # 2. generate() (prefill + cached decode steps) follows HF token for token; at a divergence
    #    llaisys' token must be a near-tie, and generation goes on from HF's token
    step = 0
    while step < len(hf_new):
        context = ref.tokens[:n_prompt + step]
        generated = model.generate(context, len(hf_new) - step, eos_token_ids=())
        assert generated[:len(context)] == context and len(generated) == len(ref.tokens)
        diverged = next((i for i in range(step, len(hf_new)) if generated[n_prompt + i] != hf_new[i]), None)
        if diverged is None:
            break
        diverged_at(diverged, generated[n_prompt + diverged], f"generate, step {diverged}")
        ties.add(diverged)
        step = diverged + 1
    return sorted(ties)
