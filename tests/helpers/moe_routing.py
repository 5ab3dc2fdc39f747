"""The near-tie rule's mixture-of-experts form (DESIGN §6), for the parity tests of test_moe_families.py.

A router's top-k choice can itself be a near-tie: two experts' router logits within rounding of each other,
so that HF and llaisys, whose hidden states differ by rounding, send a token to different experts in some
layer. That token's MLP output is then another expert's (not a rounding of the same sum), and so are the
logits at its position and, through attention, after it: further from HF's than the output-logit rule
(test_parity.near_tie) allows, although neither engine computed anything wrong. So a divergence that rule
does not explain is explained by routing, strictly, when all three hold:

1. llaisys' routing differs from HF's somewhere along the context: the sets of experts that llaisys'
   moe_router picked (recorded from a forward over the context; its prefill and decode paths compute the
   same bits) and HF's routers picked (hooked), per sparse layer and position;
2. every such difference that is not downstream of another is a near-tie of the routers: one expert llaisys
   picked and HF did not is within the tie tolerance (test_parity.tie_tolerance: a few ulps of the row's
   largest router logit in bf16) of the weakest one HF picked, in HF's router logits or in llaisys' own (the
   logits each engine chose from). Downstream: a difference at layer l, position p follows one at an earlier
   layer and a position <= p, whose other expert changed the hidden states layer l routes (through the
   residual stream and attention), so its router logits differ by more than rounding. A wrong router, or
   hidden states gone wrong, gives first differences far beyond rounding;
3. HF run again with every router forced to llaisys' choices (its own logits, softmax and weights as it
   computes them, only the top-k indices replaced) explains llaisys' token by the output-logit rule: given
   the same routing, the two engines agree (a wrong expert matrix or combine would not).
Generation then goes on from HF's token, as at any near-tie, and such steps count as near-ties.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

import llaisys
from helpers.parity_rule import near_tie, tie_tolerance


def choice_scores(logits: np.ndarray, scoring: str, bias: np.ndarray | None) -> np.ndarray:
    """What DeepSeek's grouped router ranks experts by, in float64: softmax or sigmoid of the router logits, plus
    the correction bias where it has one (its "logits" in the rule above: both engines' ties are judged on it)."""
    logits = logits.astype(np.float64)
    if scoring == "sigmoid":
        scores = 1.0 / (1.0 + np.exp(-logits))
    else:
        scores = np.exp(logits - logits.max(axis=-1, keepdims=True))
        scores /= scores.sum(axis=-1, keepdims=True)
    return scores if bias is None else scores + bias.astype(np.float64)


@contextlib.contextmanager
def recorded_routing():
    """(router logits [rows, E] float64, experts int64 [rows, k]) of every moe_router call (llaisys.ops.moe_router,
    which the model calls through the module at each sparse layer) while the block runs, in call order; for
    moe_router_grouped (DeepSeek) the choice scores (``choice_scores``) stand for the logits."""
    calls: list[tuple[np.ndarray, np.ndarray]] = []
    real, real_grouped = llaisys.ops.moe_router, llaisys.ops.moe_router_grouped

    def record(weights, experts, logits, normalize=False):
        real(weights, experts, logits, normalize)
        calls.append((logits.numpy().astype(np.float64), experts.numpy().copy()))

    def record_grouped(weights, experts, logits, bias=None, **options):
        real_grouped(weights, experts, logits, bias, **options)
        scores = choice_scores(logits.numpy(), options.get("scoring", "softmax"),
                               None if bias is None else bias.numpy())
        calls.append((scores, experts.numpy().copy()))

    llaisys.ops.moe_router, llaisys.ops.moe_router_grouped = record, record_grouped
    try:
        yield calls
    finally:
        llaisys.ops.moe_router, llaisys.ops.moe_router_grouped = real, real_grouped


def llaisys_routing(model, tokens: list[int]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(router logits, experts) per sparse layer ([len(tokens), E], [len(tokens), k]) that llaisys computes
    along ``tokens`` (one forward)."""
    with recorded_routing() as calls:
        model.logits(tokens)
    assert len(calls) == len(model.config.sparse_layers), (len(calls), model.config.sparse_layers)
    return [g for g, _ in calls], [e for _, e in calls]


def _routers(hf) -> list[torch.nn.Module]:
    """HF's routers (``*TopKRouter``, DeepSeek's ``*TopkRouter``: forward(h) -> (logits, weights, indices)) in
    layer order."""
    return [m for m in hf.modules() if type(m).__name__.lower().endswith("topkrouter")]


def _deepseek_scoring(router) -> str | None:
    """"sigmoid" (V3) or "softmax" (V2) for a DeepSeek router (it has routed_scaling_factor); None for others."""
    if not hasattr(router, "routed_scaling_factor"):
        return None
    return "sigmoid" if hasattr(router, "e_score_correction_bias") else "softmax"


def _forced_weights(router, logits: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """The weights HF's ``router`` gives the experts ``indices``, computed as it computes them for its own."""
    scoring = _deepseek_scoring(router)
    if scoring is None:
        top = torch.softmax(logits.float(), dim=-1).gather(1, indices)
        if getattr(router, "norm_topk_prob", True):  # (Mixtral always renormalises)
            top = top / top.sum(dim=-1, keepdim=True)
        return top
    scores = logits.float().sigmoid() if scoring == "sigmoid" else logits.float().softmax(dim=-1)
    top = scores.gather(1, indices)
    if scoring == "sigmoid" and router.norm_topk_prob:  # (DeepseekV2TopkRouter never renormalises)
        top = top / (top.sum(dim=-1, keepdim=True) + 1e-20)
    return top * router.routed_scaling_factor


def _hf_choice_scores(router, logits: torch.Tensor) -> np.ndarray:
    """What ``router`` ranks experts by (its logits; a DeepSeek router's choice_scores), float64."""
    scoring = _deepseek_scoring(router)
    if scoring is None:
        return logits.double().numpy()
    bias = router.e_score_correction_bias.double().numpy() if scoring == "sigmoid" else None
    return choice_scores(logits.double().numpy(), scoring, bias)


def hf_run(hf, tokens: list[int], forced: list[np.ndarray] | None = None):
    """(logits [len(tokens), vocab] float64, router logits per sparse layer [len(tokens), E] float64, experts per
    sparse layer [len(tokens), k]) of HF on ``tokens``; with ``forced``, each router's top-k indices replaced by
    forced[layer] (weights from its own softmax at those experts, renormalised as it renormalises)."""
    routers = _routers(hf)
    seen: list[tuple[np.ndarray, np.ndarray]] = []
    originals = [router.forward for router in routers]

    def wrap(i, router, original):
        def forward(hidden_states):
            logits, weights, indices = original(hidden_states)
            if forced is not None:
                indices = torch.from_numpy(forced[i]).to(indices.device)
                weights = _forced_weights(router, logits, indices).to(weights.dtype)
            seen.append((_hf_choice_scores(router, logits), indices.numpy()))
            return logits, weights, indices
        return forward

    for i, (router, original) in enumerate(zip(routers, originals)):
        router.forward = wrap(i, router, original)
    try:
        with torch.no_grad():
            logits = hf(torch.tensor([tokens])).logits[0].double().numpy()
    finally:
        for router, original in zip(routers, originals):
            router.forward = original
    return logits, [g for g, _ in seen], [e for _, e in seen]


def routing_differences(hf_logits, hf_experts, our_logits, our_experts, dtype: str) -> list[tuple]:
    """(layer, position, root, gap, tolerance) of every (sparse layer, position) where the two engines' sets of
    experts differ; root: not downstream of a difference at an earlier layer and a position <= this one; gap:
    the smaller of the two engines' own router-logit gaps between the weakest expert they picked and the worst
    one the other picked instead (inf where llaisys' picks are not the top k of its own logits)."""
    out = []
    first_position = None  # the earliest position with a difference in the layers so far
    for layer, (hg, he, og, oe) in enumerate(zip(hf_logits, hf_experts, our_logits, our_experts)):
        this_layer = []
        for position in range(len(he)):
            theirs, ours = set(he[position].tolist()), set(oe[position].tolist())
            if theirs == ours:
                continue
            hf_gap, our_gap = (min(g[position][e] for e in mine) - min(g[position][e] for e in other - mine)
                               for g, mine, other in ((hg, theirs, ours), (og, ours, theirs)))
            if our_gap < 0:  # llaisys did not pick the top k of its own logits: a bug, never a near-tie
                our_gap = hf_gap = np.inf
            tol = tie_tolerance(float(max(hg[position].max(), og[position].max())), dtype)
            root = first_position is None or position < first_position
            out.append((layer, position, root, round(float(min(hf_gap, our_gap)), 5), round(tol, 5)))
            this_layer.append(position)
        if this_layer:
            first_position = min(this_layer if first_position is None else [first_position, *this_layer])
    return out


def explain_by_routing(model, hf, exact_hf, context: list[int], mine: int, hf_token: int, dtype: str,
                       where: str) -> None:
    """Assert that llaisys' choice ``mine`` (HF's: ``hf_token``) for the token after ``context`` is explained by
    near-tied routing decisions (the module docstring's conditions 1-3)."""
    our_logits, ours = llaisys_routing(model, context)
    _, hf_logits, theirs = hf_run(hf, context)
    differences = routing_differences(hf_logits, theirs, our_logits, ours, dtype)
    assert differences, (f"{where}: llaisys picks {mine}, HF picks {hf_token}, not a near-tie of the logits, and "
                         f"llaisys routes every token of the context as HF does")
    for layer, position, root, gap, tol in differences:
        assert not root or gap <= tol, (
            f"{where}: at layer {layer} (of the sparse layers), position {position}, llaisys and HF route to "
            f"different experts, {gap:.4g} apart in router logits (tolerance {tol:.3g}) where no earlier "
            f"difference explains it: not a near-tie")
    forced_logits, _, _ = hf_run(hf, context, forced=ours)
    exact_logits, _, _ = hf_run(exact_hf, context, forced=ours)
    near_tie(forced_logits[-1], exact_logits[-1], mine, hf_token, dtype,
             f"{where}, HF with llaisys' routing ({len(differences)} routing differences: {differences[:4]})")
