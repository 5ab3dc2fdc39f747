"""The CUDA mixture-of-experts kernels (ops/moe.cu), run on CPU threads at warp 32 and 64 (host execution),
against float64 torch: the router's top k and weights, the group-limited router's (DeepSeek-V2 and V3 forms, its
ties, its argument checks), moe_linear against each (row, slot)'s matrix product
and bit for bit against the linear kernel on that row and expert alone (so no row depends on its batch),
the weighted combine, and an expert id out of range reported at the next synchronizing call.
"""

import pytest
import torch
from host_exec.device import SlotError

from helpers.host_exec_ops import CODE, DTYPES, check, dtype_ids, randn

pytestmark = pytest.mark.slow


def router_reference(logits: torch.Tensor, k: int, normalize: bool):
    p = torch.softmax(logits.double(), dim=-1)
    order = torch.sort(p, dim=-1, descending=True, stable=True).indices[:, :k]
    top = torch.gather(p, 1, order)
    return order, top / top.sum(-1, keepdim=True) if normalize else top


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_ids.get)
@pytest.mark.parametrize("M,E,k", [(1, 8, 2), (5, 64, 8), (3, 3, 3), (70, 6, 1)])
@pytest.mark.parametrize("normalize", [0, 1], ids=["raw", "normalized"])
def test_moe_router(dev, dtype, M, E, k, normalize):
    logits = randn((M, E), dtype, M + E, scale=2.0)
    weights, experts = dev.empty((M, k), dtype), dev.empty((M, k), torch.int64, fill=-1)
    dev.op("moe_router", CODE[dtype], M, E, k, normalize, weights, experts, dev.upload(logits))
    want_experts, want_weights = router_reference(logits, k, bool(normalize))
    assert torch.equal(dev.download(experts), want_experts)
    check(dev.download(weights), want_weights, dtype)


def test_moe_router_ties_go_to_the_lower_id(dev):
    logits = torch.tensor([[0.5, 2.0, 1.0, 2.0, 2.0, 1.0], [1.0] * 6])
    weights, experts = dev.empty((2, 3), torch.float32), dev.empty((2, 3), torch.int64, fill=-1)
    dev.op("moe_router", 0, 2, 6, 3, 1, weights, experts, dev.upload(logits))
    assert dev.download(experts).tolist() == [[1, 3, 4], [0, 1, 2]]
    check(dev.download(weights), torch.full((2, 3), 1 / 3, dtype=torch.float64), torch.float32)


def random_experts(m, k, e, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(m)])


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_ids.get)
@pytest.mark.parametrize("M,k,E,N,K", [(1, 2, 8, 5, 64), (6, 2, 4, 9, 33), (9, 3, 5, 3, 264), (2, 1, 3, 4, 0)])
@pytest.mark.parametrize("per_slot", [0, 1], ids=["per-row", "per-slot"])
def test_moe_linear(dev, dtype, M, k, E, N, K, per_slot):
    x = randn((M, k, K) if per_slot else (M, K), dtype, 40 + M)
    w = randn((E, N, K), dtype, 41 + N)
    ids = random_experts(M, k, E, 42)
    out = dev.empty((M, k, N), dtype)
    dw, dids = dev.upload(w), dev.upload(ids)
    dev.op("moe_linear", CODE[dtype], M, k, E, N, K, per_slot, out, dev.upload(x), dw, dids)
    inputs = x.double() if per_slot else x.double()[:, None, :].expand(M, k, K)
    got = dev.download(out)
    check(got, torch.einsum("mjk,mjnk->mjn", inputs, w.double()[ids]), dtype)
    for m in range(M):  # each (row, slot): the linear kernel's bits on that input and expert alone
        for j in range(k):
            alone = dev.empty((1, N), dtype)
            row = x[m, j] if per_slot else x[m]
            dev.op("linear", CODE[dtype], 1, N, K, alone, dev.upload(row[None]), dev.upload(w[ids[m, j]]), None)
            assert torch.equal(dev.download(alone)[0], got[m, j]), (m, j)


def test_moe_linear_expert_out_of_range_is_reported_at_the_next_sync(dev):
    x, w = randn((2, 8), torch.float32, 50), randn((4, 3, 8), torch.float32, 51)
    out = dev.empty((2, 2, 3), torch.float32)
    dev.op("moe_linear", 0, 2, 2, 4, 3, 8, 0, out, dev.upload(x), dev.upload(w), dev.upload(torch.tensor([[0, 1], [4, 2]])))
    with pytest.raises(SlotError) as info:
        dev.download(out)
    assert info.value.status == 1 and "experts[1, 0] = 4 is not an expert id" in info.value.message


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_ids.get)
@pytest.mark.parametrize("M,k,N", [(1, 2, 64), (7, 3, 33), (2, 8, 5)])
def test_moe_combine(dev, dtype, M, k, N):
    y, w = randn((M, k, N), dtype, 60), randn((M, k), dtype, 61, scale=0.5)
    out = dev.empty((M, N), dtype)
    dev.op("moe_combine", CODE[dtype], M, k, N, out, dev.upload(y), dev.upload(w))
    check(dev.download(out), torch.einsum("mj,mjn->mn", w.double(), y.double()), dtype)


# ---- moe_router_grouped (DeepSeek-V2 / V3) ------------------------------------------------------------------

def grouped_reference(logits, bias, scoring, n_group, topk_group, group_top, k, normalize, route_scale):
    """float64 (experts, weights) of backend.h's moe_router_grouped: s = softmax or sigmoid, c = s + bias (NaN as
    -inf), the topk_group groups of the largest sums of their group_top largest c kept (ties by ascending group),
    the others' c -inf; the k largest c (ties by ascending id); their s, normalized to (sum + 1e-20), scaled."""
    x = logits.double()
    s = torch.softmax(x, dim=-1) if scoring == 0 else torch.sigmoid(x)
    c = s + bias.double() if bias is not None else s.clone()
    c = torch.where(torch.isnan(c), float("-inf"), c)
    M, E = c.shape
    per = E // n_group
    groups = torch.sort(c.reshape(M, n_group, per), dim=-1, descending=True).values[..., :group_top].sum(-1)
    groups = torch.where(torch.isnan(groups), float("-inf"), groups)  # (inf + -inf)
    kept_groups = torch.sort(groups, dim=-1, descending=True, stable=True).indices[:, :topk_group]
    kept = torch.zeros((M, n_group), dtype=torch.bool).scatter_(1, kept_groups, True)
    c = c.masked_fill(~kept.repeat_interleave(per, dim=1), float("-inf"))
    order = torch.sort(c, dim=-1, descending=True, stable=True).indices[:, :k]
    top = torch.gather(s, 1, order)
    if normalize:
        top = top / (top.sum(-1, keepdim=True) + 1e-20)
    return order, top * route_scale


# (M, E, k, n_group, topk_group, group_top): DeepSeek-V2's form (softmax, its max per group, no bias, raw weights
# times 16) and V3's (sigmoid, its 2 largest per group, a bias, normalized, times 2.5), with odd sizes; one group
# (V2-Lite) and every group kept, where the groups change nothing
V2 = [(5, 24, 3, 4, 2, 1), (3, 9, 2, 3, 1, 1), (4, 10, 6, 1, 1, 1), (70, 16, 4, 4, 4, 1)]
V3 = [(7, 64, 8, 8, 4, 2), (2, 15, 5, 5, 3, 2), (3, 256, 8, 8, 4, 2), (9, 6, 3, 2, 2, 3)]
GROUPED = [("v2", *case) for case in V2] + [("v3", *case) for case in V3]
FORMS = {"v2": dict(scoring=0, bias=False, normalize=0, route_scale=16.0),
         "v3": dict(scoring=1, bias=True, normalize=1, route_scale=2.5)}


def grouped_router(dev, logits, bias, k, scoring, n_group, topk_group, group_top, normalize, route_scale,
                   dtype=torch.float32):
    """experts, weights (``dtype``) of moe_router_grouped over f32 ``logits`` (its logits are f32 always)."""
    M, E = logits.shape
    weights, experts = dev.empty((M, k), dtype), dev.empty((M, k), torch.int64, fill=-1)
    dev.op("moe_router_grouped", CODE[dtype], M, E, k, scoring, n_group, topk_group, group_top, normalize,
           route_scale, weights, experts, dev.upload(logits.float()), None if bias is None else dev.upload(bias))
    return dev.download(experts), dev.download(weights)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_ids.get)
@pytest.mark.parametrize("form,M,E,k,n_group,topk_group,group_top", GROUPED,
                         ids=lambda x: x if isinstance(x, str) else None)
def test_moe_router_grouped(dev, dtype, form, M, E, k, n_group, topk_group, group_top):
    f = FORMS[form]
    logits = randn((M, E), torch.float32, M + E + 1, scale=2.0)
    bias = randn((E,), torch.float32, E + 2, scale=0.5) if f["bias"] else None
    got_experts, got_weights = grouped_router(dev, logits, bias, k, f["scoring"], n_group, topk_group, group_top,
                                              f["normalize"], f["route_scale"], dtype)
    want_experts, want_weights = grouped_reference(logits, bias, f["scoring"], n_group, topk_group, group_top, k,
                                                   f["normalize"], f["route_scale"])
    assert torch.equal(got_experts, want_experts)
    check(got_weights, want_weights, dtype)


def test_moe_router_grouped_limits_the_choice_to_the_best_groups(dev):
    """Rows whose overall top k lies across groups: only the kept groups' experts are chosen, and the bias decides
    the choice (and the groups) but not the weights."""
    logits = torch.tensor([[3.0, -1.0, 2.9, 2.8, -2.0, -2.0, 0.0, 0.1],
                           [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    bias = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.25])
    experts, weights = grouped_router(dev, logits, bias, 2, 1, 4, 2, 2, 0, 1.0)
    # row 0: groups (c summed over both experts) 0: 0.95 + 0.27, 1: 0.95 + 0.94, 2: 0.12 + 0.12, 3: 0.5 + 0.77
    # -> groups 1 and 3 kept (not 0): experts 2, 3 (the bias lifts 7 to 0.77, below 3's 0.94)
    # row 1: every s is 0.5; group 3 sums 1.25 and then groups 0 .. 2 tie at 1.0: group 0 wins; 7 first
    assert experts.tolist() == [[2, 3], [7, 0]]
    want = torch.sigmoid(torch.tensor([[2.9, 2.8], [0.0, 0.0]], dtype=torch.float64))  # s, not c
    check(weights, want, torch.float32)


@pytest.mark.parametrize("group_top,want", [(1, [[0, 1], [0, 1]]), (2, [[4, 5], [0, 1]])])
def test_moe_router_grouped_ties_go_to_the_lower_group_and_id(dev, group_top, want):
    """Groups of 2, one kept. Row 0: groups 0 and 2 tie at their largest c (group_top 1: group 0 is kept), group 2
    wins by its 2 largest (whose tie 4, 5 goes to 4). Row 1: every group holds the same c (a tie either way)."""
    logits = torch.tensor([[2.0, 0.0, 1.0, 1.0, 2.0, 2.0, 1.0, 0.0],
                           [2.0, 0.0, 0.0, 2.0, 2.0, 0.0, 0.0, 2.0]])
    experts, weights = grouped_router(dev, logits, None, 2, 0, 4, 1, group_top, 1, 1.0)
    assert experts.tolist() == want
    want_experts, want_weights = grouped_reference(logits, None, 0, 4, 1, group_top, 2, 1, 1.0)
    assert experts.tolist() == want_experts.tolist()
    check(weights, want_weights, torch.float32)


def test_moe_router_grouped_nan_is_last(dev):
    """sigmoid scoring: a NaN logit's c is -inf, after every other expert (and its weight is its s, NaN)."""
    logits = torch.tensor([[0.5, float("nan"), -1.0, 2.0, float("-inf")]])
    experts, weights = grouped_router(dev, logits, None, 5, 1, 1, 1, 1, 0, 1.0)
    assert experts.tolist() == [[3, 0, 2, 4, 1]]
    check(weights[0, :4], torch.sigmoid(torch.tensor([2.0, 0.5, -1.0, float("-inf")], dtype=torch.float64)),
          torch.float32)
    assert torch.isnan(weights[0, 4])


@pytest.mark.parametrize("E,k,scoring,n_group,topk_group,group_top,named", [
    (8, 2, 2, 4, 2, 1, "scoring = 2"),
    (8, 2, 0, 3, 1, 1, "n_group = 3 does not divide E = 8"),
    (8, 2, 0, 0, 1, 1, "n_group = 0"),
    (8, 2, 0, 4, 0, 1, "topk_group = 0 must be in [1, n_group = 4]"),
    (8, 2, 0, 4, 5, 1, "topk_group = 5 must be in [1, n_group = 4]"),
    (8, 2, 0, 4, 2, 0, "group_top = 0 must be in [1, E / n_group = 2]"),
    (8, 2, 0, 4, 2, 3, "group_top = 3 must be in [1, E / n_group = 2]"),
    (8, 5, 0, 4, 2, 1, "k = 5 must be in [1, topk_group * E / n_group = 4]"),
    (8, 0, 0, 4, 2, 1, "k = 0 must be in [1, topk_group * E / n_group = 4]"),
])
def test_moe_router_grouped_bad_arguments(dev, E, k, scoring, n_group, topk_group, group_top, named):
    logits = dev.upload(torch.zeros((2, E)))
    weights, experts = dev.empty((2, max(k, 1)), torch.float32), dev.empty((2, max(k, 1)), torch.int64, fill=-1)
    status, message, _ = dev.call("moe_router_grouped", 0, None, 0, 2, E, k, scoring, n_group, topk_group, group_top,
                                  0, 1.0, weights.ptr, experts.ptr, logits.ptr, None, check=False)
    assert status == 1 and named in message, message
    assert message.startswith("moe_router_grouped: "), message
    assert (dev.download(experts) == -1).all()  # nothing written
