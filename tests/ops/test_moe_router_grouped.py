"""ops.moe_router_grouped: DeepSeek's group-limited router against a float64 torch reference and HF's own.

Per row of logits f32 [M, E] (always f32: DeepSeek computes its router in f32): s = softmax or sigmoid, c = s + bias
(DeepSeek-V3's e_score_correction_bias); with n_group > 1 only the topk_group best groups (a group scores the sum of
its group_top largest c) keep their experts; the experts are the k largest c (equal c by ascending id), the weights
(the op's dtype: f32, f16 or bf16, within that dtype's tolerance) their s (not c), normalized or not, times
route_scale; f16 or bf16 logits are refused. DeepSeek-V2 is softmax, group_top 1, a scale, no normalization
("greedy" = one group); V3 is sigmoid, a bias, group_top 2, normalized, scaled. HF transformers'
DeepseekV3TopkRouter must pick the same experts with the same weights (within f32 rounding). Every frontend check
raises, naming the problem.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import llaisys
from helpers import FLOAT_DTYPES, assert_close, from_torch, nan_filled, random, to_torch
from helpers.references.moe import bits, grouped_router_reference

GREEDY = dict(scoring="softmax")
V2 = dict(scoring="softmax", n_group=8, topk_group=3, group_top=1, route_scale=16.0)
V3 = dict(scoring="sigmoid", n_group=8, topk_group=4, group_top=2, normalize=True, route_scale=2.5)

# name: (E, k, bias, keywords)
CONFIGS = {
    "v2_lite_greedy_e64_k6": (64, 6, False, GREEDY),
    "v2_e160_k6_8groups_keep3": (160, 6, False, V2),
    "v3_e256_k8_8groups_keep4_top2": (256, 8, True, V3),
    "v3_e64_k6": (64, 6, True, V3),
    "e1_k1": (1, 1, False, GREEDY),
    "e15_k6_5groups_keep2_all_they_hold": (15, 6, False, dict(n_group=5, topk_group=2)),
    "e6_k2_sigmoid_bias_3groups_keep1_top2": (6, 2, True, dict(scoring="sigmoid", n_group=3, topk_group=1,
                                                               group_top=2, normalize=True)),
    "e5_groups_of_1_keep4_scale_half": (5, 3, True, dict(scoring="sigmoid", n_group=5, topk_group=4,
                                                         route_scale=0.5)),
    "e17_k17_sigmoid_greedy_normalized": (17, 17, True, dict(scoring="sigmoid", normalize=True)),
}


def route(logits: llaisys.Tensor, k: int, bias: llaisys.Tensor | None = None, dtype=llaisys.float32, **kw):
    """(weights in ``dtype``, experts as torch) of moe_router_grouped over f32 logits, the outputs prefilled with
    NaN and -1."""
    m = logits.shape[0]
    weights = nan_filled((m, k), dtype, logits.device)
    experts = from_torch(torch.full((m, k), -1, dtype=torch.int64), logits.device)
    llaisys.ops.moe_router_grouped(weights, experts, logits, bias, **kw)
    return weights, to_torch(experts)


def random_bias(e: int, g: torch.Generator, scale: float = 0.3) -> torch.Tensor:
    """f32 [E]: large enough next to sigmoid's (0, 1) to change which experts win."""
    return (torch.randn(e, generator=g, dtype=torch.float64) * scale).float()


def check(m, config, dtype, device, seed):
    """f32 logits whatever ``dtype`` (the weights'): the experts exactly, the weights within ``dtype``'s tolerance."""
    e, k, with_bias, kw = config
    g = torch.Generator().manual_seed(seed)
    logits, ref = random((m, e), llaisys.float32, device, g, scale=2.0)
    bias = random_bias(e, g) if with_bias else None
    weights, experts = route(logits, k, None if bias is None else from_torch(bias, device), dtype, **kw)
    assert weights.dtype == dtype
    want_experts, want_weights = grouped_router_reference(ref, k, bias, **kw)
    assert torch.equal(experts, want_experts), f"experts {experts.tolist()} != {want_experts.tolist()}"
    assert_close(weights, want_weights)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
@pytest.mark.parametrize("m", [1, 3, 33])
def test_matches_float64_reference(device, m, config, dtype):
    check(m, config, dtype, device, seed=m + config[0])


def test_the_bias_chooses_but_the_weights_are_the_scores(device):
    """V3: a large bias on a weak expert gets it chosen; its weight is its sigmoid, not sigmoid + bias."""
    logits = torch.tensor([[-4.0, 3.0, 2.0, 1.0, 0.0, -1.0, -2.0, -3.0]])
    bias = torch.tensor([5.0, 0, 0, 0, 0, 0, 0, 0])
    weights, experts = route(from_torch(logits, device), 2, from_torch(bias, device), scoring="sigmoid")
    assert experts.tolist() == [[0, 1]]
    assert_close(weights, torch.sigmoid(torch.tensor([[-4.0, 3.0]], dtype=torch.float64)))


def test_groups_limit_the_choice(device):
    """Experts outside the kept groups are never chosen, however high their score: groups ranked by their best
    expert (V2's group_top 1) or by their best two (V3's group_top 2); sigmoid scores."""
    # groups of 4: group 0 has the best expert (5) but a poor pair (5, -5); group 1 the best pair (3, 3); group 2
    # (2, 1) is second by pairs, third by best; group 3 is last either way
    logits = torch.tensor([[5.0, -5.0, -5.0, -5.0, 3.0, 3.0, -5.0, -5.0, 2.0, 1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -1.0]])
    lt = from_torch(logits, device)
    for kw, want in ((dict(topk_group=1, group_top=1), [0, 1, 2]),   # group 0: 5, then its -5s by ascending id
                     (dict(topk_group=1, group_top=2), [4, 5, 6]),   # group 1
                     (dict(topk_group=2, group_top=1), [0, 4, 5]),   # groups 0 and 1
                     (dict(topk_group=2, group_top=2), [4, 5, 8]),   # groups 1 and 2: expert 0 is out
                     (dict(topk_group=4, group_top=2), [0, 4, 5])):  # every group
        _, experts = route(lt, 3, scoring="sigmoid", n_group=4, **kw)
        assert experts.tolist() == [want], kw
        assert grouped_router_reference(logits, 3, scoring="sigmoid", n_group=4, **kw)[0].tolist() == [want]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_ties_go_to_the_lower_expert_and_the_lower_group(device, dtype):
    logits = torch.tensor([[2.0, 0.0, 1.0, 1.0, 2.0, 0.0, 1.0, 1.0],   # the 2 groups of 4 tie: group 0
                           [1.0] * 8,                                  # everything ties
                           [0.0, 3.0, 0.0, 3.0, 3.0, 0.0, 3.0, 0.0]])  # the groups tie, experts in pairs
    lt = from_torch(logits, device)  # (f32; the weights in dtype)
    for scoring in ("softmax", "sigmoid"):
        _, experts = route(lt, 3, dtype=dtype, scoring=scoring, n_group=2, topk_group=1)
        assert experts.tolist() == [[0, 2, 3], [0, 1, 2], [1, 3, 0]], scoring
        _, experts = route(lt, 3, dtype=dtype, scoring=scoring, n_group=2, topk_group=2)
        assert experts.tolist() == [[0, 4, 2], [0, 1, 2], [1, 3, 4]], scoring
        # groups of 2 ranked by their pairs: row 1 ties everywhere, row 2's groups all tie
        weights, experts = route(lt, 3, dtype=dtype, scoring=scoring, n_group=4, topk_group=2, group_top=2,
                                 normalize=True)
        want_experts, want_weights = grouped_router_reference(logits, 3, scoring=scoring, n_group=4, topk_group=2,
                                                              group_top=2, normalize=True)
        assert torch.equal(experts, want_experts) and experts[1:].tolist() == [[0, 1, 2], [1, 3, 0]], scoring
        assert_close(weights, want_weights)


def test_nan_scores_come_last(device):
    """A NaN score (a NaN logit under sigmoid) ranks as -inf: chosen only when nothing else is left."""
    logits = torch.tensor([[float("nan"), 3.0, 1.0, 0.0], [1.0, float("nan"), -1.0, 3.0]])
    lt = from_torch(logits, device)
    weights, experts = route(lt, 4, scoring="sigmoid")
    assert experts.tolist() == [[1, 2, 3, 0], [3, 0, 2, 1]]
    want = torch.sigmoid(torch.gather(logits.double(), 1, experts))
    assert_close(weights, want)  # (the NaN expert's weight is its NaN score)
    _, experts = route(lt, 2, scoring="sigmoid", n_group=2, topk_group=1)
    assert experts.tolist() == [[1, 0], [3, 2]]  # groups by their best: row 0's group 0 (3), NaN last in it
    _, experts = route(lt, 2, scoring="sigmoid", n_group=2, topk_group=1, group_top=2)
    assert experts.tolist() == [[2, 3], [3, 2]]  # a pair with a NaN sums to -inf: its group loses


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_rows_do_not_depend_on_the_batch(device, dtype):
    e, k, _, kw = CONFIGS["v3_e256_k8_8groups_keep4_top2"]
    g = torch.Generator().manual_seed(4)
    logits, ref = random((20, e), llaisys.float32, device, g, scale=2.0)
    bias = from_torch(random_bias(e, g), device)
    weights, experts = route(logits, k, bias, dtype, **kw)
    for row in (0, 9, 19):
        alone_w, alone_e = route(from_torch(ref[row:row + 1].float(), device), k, bias, dtype, **kw)
        assert torch.equal(alone_e[0], experts[row])
        assert torch.equal(bits(to_torch(alone_w)[0]), bits(to_torch(weights)[row])), f"row {row}"


@pytest.mark.parametrize("normalize", [False, True], ids=["raw", "normalized"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_one_group_of_softmax_is_moe_router(device, dtype, normalize):
    """softmax, one group, no bias, scale 1: moe_router's choice (by logit) and weights. moe_router's logits are in
    dtype; the grouped router gets the same values in f32 (exact), its weights in dtype."""
    g = torch.Generator().manual_seed(6)
    logits, ref = random((17, 64), dtype, device, g, scale=2.0)
    weights, experts = route(from_torch(ref.float(), device), 6, dtype=dtype, normalize=normalize)
    plain_w = nan_filled((17, 6), dtype, device)
    plain_e = from_torch(torch.full((17, 6), -1, dtype=torch.int64), device)
    llaisys.ops.moe_router(plain_w, plain_e, logits, normalize)
    assert torch.equal(experts, to_torch(plain_e))
    assert_close(weights, to_torch(plain_w).to(torch.float64))


def hf_router(e, k, n_group, topk_group, hidden, seed):
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    config = DeepseekV3Config(hidden_size=hidden, n_routed_experts=e, num_experts_per_tok=k, n_group=n_group,
                              topk_group=topk_group, norm_topk_prob=True, routed_scaling_factor=2.5,
                              num_hidden_layers=1, vocab_size=64, intermediate_size=32, moe_intermediate_size=16,
                              num_attention_heads=2, num_key_value_heads=2)
    router = DeepseekV3TopkRouter(config).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        router.weight.copy_(torch.randn((e, hidden), generator=g) * hidden ** -0.5 * 2)
        router.e_score_correction_bias.copy_(random_bias(e, g, 0.1))
    return router, g


@pytest.mark.parametrize("shape", [(64, 6, 8, 4), (256, 8, 8, 4), (32, 4, 4, 2)],
                         ids=lambda s: "e{}_k{}_groups{}_keep{}".format(*s))
def test_matches_hf_deepseek_v3_router(device, shape):
    """HF's DeepseekV3TopkRouter and llaisys, on the same f32 logits: the same experts (HF's come unordered),
    the same weights within f32 rounding."""
    e, k, n_group, topk_group = shape
    hidden, m = 48, 64
    router, g = hf_router(e, k, n_group, topk_group, hidden, seed=e + k)
    x = torch.randn((m, hidden), generator=g)
    logits = x @ router.weight.detach().T  # f32
    with torch.no_grad():
        hf_logits, hf_weights, hf_experts = router(x)
    assert torch.allclose(hf_logits, logits, rtol=1e-5, atol=1e-5)
    # (the logits both routers see: HF's own, so that a choice can only differ by the routing itself)
    weights, experts = route(from_torch(hf_logits.contiguous(), device), k,
                             from_torch(router.e_score_correction_bias.detach(), device), scoring="sigmoid",
                             n_group=n_group, topk_group=topk_group, group_top=2, normalize=True, route_scale=2.5)
    hf_order = torch.sort(hf_experts, -1).indices
    ours_order = torch.sort(experts, -1).indices
    assert torch.equal(torch.gather(experts, 1, ours_order), torch.gather(hf_experts, 1, hf_order))
    got = torch.gather(to_torch(weights), 1, ours_order).double()
    want = torch.gather(hf_weights, 1, hf_order).double()
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), (got - want).abs().max()
    # and our order: by the choice score descending
    c = torch.sigmoid(hf_logits.double()) + router.e_score_correction_bias.double()
    chosen = torch.gather(c, 1, experts)
    assert (chosen[:, :-1] >= chosen[:, 1:]).all()


def test_frontend_checks(device):
    f32, f16, bf16, i32, i64 = llaisys.float32, llaisys.float16, llaisys.bfloat16, llaisys.int32, llaisys.int64
    z = lambda *shape, dtype=f32: llaisys.zeros(shape, dtype, device)  # noqa: E731

    def fails(match, weights=None, experts=None, logits=None, bias=None, **kw):
        weights = z(2, 4) if weights is None else weights
        experts = z(2, 4, dtype=i64) if experts is None else experts
        logits = z(2, 16) if logits is None else logits
        with pytest.raises(llaisys.LlaisysError, match=match) as info:
            llaisys.ops.moe_router_grouped(weights, experts, logits, bias, **kw)
        assert isinstance(info.value, ValueError)
        assert "moe_router_grouped" in str(info.value), info.value

    fails("n_group = 3 does not divide the 16 experts", n_group=3)
    fails("n_group", n_group=0)
    fails("n_group", n_group=32)
    fails("n_group", n_group=2.0)
    fails("topk_group", n_group=4, topk_group=5)
    fails("topk_group", n_group=4, topk_group=0)
    fails("k = 4 experts cannot be chosen from topk_group = 1 groups of 2", n_group=8, topk_group=1)
    fails("group_top", n_group=4, topk_group=2, group_top=5)
    fails("group_top", n_group=4, topk_group=2, group_top=0)
    fails("scoring must be one of 'softmax', 'sigmoid', got 'relu'", scoring="relu")
    fails("route_scale must be finite", route_scale=float("inf"))
    fails("route_scale", route_scale="2")
    fails("bias has dtype bfloat16", bias=z(16, dtype=bf16))
    fails("bias has shape", bias=z(15))
    fails("bias has shape", bias=z(2, 8))
    fails("weights has dtype int32", weights=z(2, 4, dtype=i32))
    fails("logits has dtype int32", logits=z(2, 16, dtype=i32))
    # logits are f32 whatever the weights' dtype: f16 / bf16 logits are refused, even with weights of that dtype
    for half in (f16, bf16):
        fails(f"logits has dtype {half.name}; expected float32", logits=z(2, 16, dtype=half))
        fails(f"logits has dtype {half.name}; expected float32", weights=z(2, 4, dtype=half),
              logits=z(2, 16, dtype=half))
    fails("experts", experts=z(2, 4, dtype=i32))
    fails("experts", experts=z(2, 3, dtype=i64))
    fails("weights", weights=z(3, 4))
    fails("k = 17", weights=z(2, 17), experts=z(2, 17, dtype=i64))
    fails("logits must be 2-d", logits=z(32))
    fails("contiguous", logits=z(16, 2).permute(1, 0))
    logits = z(2, 16)
    fails("weights and logits overlap", weights=logits.view(32).slice(0, 8, 16).view(2, 4), logits=logits)
    bias = z(16)
    fails("weights and bias overlap", weights=bias.slice(0, 4, 12).view(2, 4), bias=bias)
    # the frontend refuses before any kernel runs: the outputs are untouched
    weights = nan_filled((2, 4), f32, device)
    fails("topk_group", weights=weights, n_group=4, topk_group=9)
    assert np.isnan(weights.numpy()).all()


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_non_f32_logits_raise_naming_logits(device, dtype):
    """Only f32 logits are routed: f16 or bf16 logits raise a ValueError naming logits (whatever the weights'
    dtype), the outputs untouched; the same weights over f32 logits run."""
    weights, experts = nan_filled((2, 4), dtype, device), from_torch(torch.full((2, 4), -1), device)
    for half in (torch.float16, torch.bfloat16):
        logits = from_torch(torch.zeros((2, 16), dtype=half), device)
        with pytest.raises(llaisys.LlaisysError, match="logits") as info:
            llaisys.ops.moe_router_grouped(weights, experts, logits, n_group=4, topk_group=2)
        assert isinstance(info.value, ValueError)
        assert "logits" in str(info.value) and "float32" in str(info.value), info.value
        assert torch.isnan(to_torch(weights)).all() and (to_torch(experts) == -1).all()
    llaisys.ops.moe_router_grouped(weights, experts, from_torch(torch.zeros((2, 16)), device), n_group=4,
                                   topk_group=2)
    assert to_torch(experts).tolist() == [[0, 1, 2, 3]] * 2  # (all tie: the lower groups, the lower ids)
    assert_close(weights, torch.full((2, 4), 1 / 16, dtype=torch.float64))
