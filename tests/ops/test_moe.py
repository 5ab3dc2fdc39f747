"""The mixture-of-experts ops against torch float64 on the same (rounded) inputs, on every SIMD path.

moe_router: softmax, top k (ties by ascending expert id), weights renormalised or not (Mixtral, Qwen3-MoE's
norm_topk_prob). moe_linear: each (row, slot) output is its input times its expert's matrix; it must be,
bit for bit, what ``linear`` gives for that row and matrix alone (the same dot products: so no row depends on
the batch). moe_combine: the weighted sum of the k expert outputs of a row.
"""

import pytest
import torch

import llaisys
from helpers import FLOAT_DTYPES, TORCH_DTYPES, assert_close, from_torch, nan_filled, random, to_torch
from helpers.references.moe import bits, random_experts
from helpers.simd_paths import LEVELS, run_in_child, skip_unless_level_available

# (M, E, k): Mixtral's 8 / top 2, Qwen3-MoE's 128 / top 8, 64 / top 8, k = E, k = 1, odd sizes
ROUTER_SHAPES = [(1, 8, 2), (17, 8, 2), (5, 128, 8), (64, 64, 8), (3, 3, 3), (4, 17, 1), (1, 1, 1)]
# (M, k, E, N, K): odd sizes, rows past the tiles (rows per expert > 4), long K, many experts few selected
LINEAR_SHAPES = [(1, 2, 8, 17, 33), (1, 8, 64, 40, 300), (5, 2, 8, 64, 100), (17, 2, 4, 33, 129),
                 (3, 1, 3, 1, 1), (9, 4, 6, 70, 4097), (40, 8, 16, 24, 64), (2, 3, 5, 4097, 17)]


def router_reference(logits: torch.Tensor, k: int, normalize: bool):
    p = torch.softmax(logits.to(torch.float64), dim=-1)
    order = torch.sort(p, dim=-1, descending=True, stable=True).indices[:, :k]  # equal p: lower id first
    top = torch.gather(p, 1, order)
    return order, top / top.sum(-1, keepdim=True) if normalize else top


def run_router(logits: llaisys.Tensor, k: int, normalize: bool):
    m = logits.shape[0]
    weights = nan_filled((m, k), logits.dtype, logits.device)
    experts = from_torch(torch.full((m, k), -1, dtype=torch.int64), logits.device)
    llaisys.ops.moe_router(weights, experts, logits, normalize)
    return weights, to_torch(experts)


def check_router(shape, dtype, normalize, device="cpu", seed=0):
    m, e, k = shape
    logits, ref = random((m, e), dtype, device, torch.Generator().manual_seed(seed), scale=2.0)
    weights, experts = run_router(logits, k, normalize)
    want_experts, want_weights = router_reference(ref, k, normalize)
    assert torch.equal(experts, want_experts), f"{shape}: experts {experts.tolist()} != {want_experts.tolist()}"
    assert_close(weights, want_weights)


def check_linear(shape, dtype, per_slot, device="cpu", seed=0):
    m, k, e, n, kk = shape
    g = torch.Generator().manual_seed(seed)
    x, rx = random((m, k, kk) if per_slot else (m, kk), dtype, device, g, scale=kk ** -0.5)
    w, rw = random((e, n, kk), dtype, device, g)
    ids = random_experts(m, k, e, g)
    out = nan_filled((m, k, n), dtype, device)
    llaisys.ops.moe_linear(out, x, w, from_torch(ids, device))
    inputs = rx if per_slot else rx[:, None, :].expand(m, k, kk)
    expected = torch.einsum("mjk,mjnk->mjn", inputs, rw[ids])
    assert_close(out, expected)
    return x, w, ids, to_torch(out)


def check_linear_is_linear(device="cpu"):
    """Each (row, slot) output, bit for bit, what ``linear`` computes for that input and matrix alone; and the
    same whether the row comes alone or with the batch (rows of 1 to 40 per expert: every tile height)."""
    for dtype in FLOAT_DTYPES:
        for shape in ((40, 2, 4, 33, 300), (9, 8, 16, 17, 1101), (6, 2, 8, 40, 64)):
            x, w, ids, out = check_linear(shape, dtype, per_slot=False, device=device, seed=sum(shape))
            xt, wt = to_torch(x), to_torch(w)
            m, k = ids.shape
            for row in (0, m // 2, m - 1):
                for j in range(k):
                    alone = nan_filled((1, w.shape[1]), dtype, device)
                    llaisys.ops.linear(alone, from_torch(xt[row:row + 1], device), from_torch(wt[ids[row, j]], device))
                    assert torch.equal(bits(to_torch(alone)[0]), bits(out[row, j])), (
                        f"{dtype.name} {shape}: row {row} slot {j} differs from linear of that row and expert")
                single = nan_filled((1, k, w.shape[1]), dtype, device)
                llaisys.ops.moe_linear(single, from_torch(xt[row:row + 1], device), w, from_torch(ids[row:row + 1], device))
                assert torch.equal(bits(to_torch(single)[0]), bits(out[row])), f"{dtype.name} {shape}: row {row}"


def check_small():
    for dtype in FLOAT_DTYPES:
        for i, shape in enumerate(LINEAR_SHAPES[:5]):
            check_linear(shape, dtype, per_slot=i % 2 == 1, seed=i)
        check_combine((7, 3, 33), dtype)
    check_linear_is_linear()


def check_combine(shape, dtype, device="cpu", seed=0):
    m, k, n = shape
    g = torch.Generator().manual_seed(seed)
    y, ry = random((m, k, n), dtype, device, g)
    w, rw = random((m, k), dtype, device, g, scale=0.5)
    out = nan_filled((m, n), dtype, device)
    llaisys.ops.moe_combine(out, y, w)
    assert_close(out, torch.einsum("mj,mjn->mn", rw, ry))


@pytest.mark.parametrize("normalize", [False, True], ids=["raw", "normalized"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("shape", ROUTER_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_router_matches_torch(device, shape, dtype, normalize):
    check_router(shape, dtype, normalize, device, seed=sum(shape))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_router_ties_go_to_the_lower_expert_id(device, dtype):
    logits = torch.tensor([[0.5, 2.0, 1.0, 2.0, 2.0, 1.0], [1.0] * 6, [3.0, -1.0, 3.0, -1.0, 3.0, 0.0]])
    weights, experts = run_router(from_torch(logits.to(TORCH_DTYPES[dtype]), device), 3, normalize=True)
    assert experts.tolist() == [[1, 3, 4], [0, 1, 2], [0, 2, 4]]
    assert_close(weights, torch.full((3, 3), 1 / 3, dtype=torch.float64))


@pytest.mark.parametrize("per_slot", [False, True], ids=["per-row", "per-slot"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("shape", LINEAR_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_moe_linear_matches_torch(device, shape, dtype, per_slot):
    check_linear(shape, dtype, per_slot, device, seed=sum(shape) + per_slot)


def test_moe_linear_is_linear_and_batch_invariant(device):
    check_linear_is_linear(device)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_moe_linear_empty_k_gives_zeros(device, dtype):
    x, w = llaisys.zeros((3, 0), dtype, device), llaisys.zeros((4, 5, 0), dtype, device)
    out = nan_filled((3, 2, 5), dtype, device)
    llaisys.ops.moe_linear(out, x, w, from_torch(torch.tensor([[0, 3], [1, 2], [3, 0]]), device))
    assert_close(out, torch.zeros(3, 2, 5, dtype=torch.float64))


@pytest.mark.parametrize("bad", [-1, 4, 1 << 40])
def test_moe_linear_refuses_an_expert_id_out_of_range(device, bad):
    f32 = llaisys.float32
    x, w = llaisys.zeros((2, 8), f32, device), llaisys.zeros((4, 3, 8), f32, device)
    out = nan_filled((2, 2, 3), f32, device)
    with pytest.raises(llaisys.LlaisysError, match=rf"experts\[1, 0\] = {bad} is not an expert id in \[0, 4\)"):
        llaisys.ops.moe_linear(out, x, w, from_torch(torch.tensor([[0, 1], [bad, 2]]), device))
    assert torch.isnan(to_torch(out)).all(), "a refused call must not write"


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("shape", [(1, 2, 64), (7, 3, 33), (17, 8, 4097), (2, 1, 1)], ids=lambda s: "x".join(map(str, s)))
def test_moe_combine_matches_torch(device, shape, dtype):
    check_combine(shape, dtype, device, seed=sum(shape))


def test_moe_combine_rows_do_not_depend_on_the_batch(device):
    g = torch.Generator().manual_seed(3)
    y, ry = random((9, 2, 100), llaisys.bfloat16, device, g)
    w, rw = random((9, 2), llaisys.bfloat16, device, g)
    out = nan_filled((9, 100), llaisys.bfloat16, device)
    llaisys.ops.moe_combine(out, y, w)
    for row in (0, 4, 8):
        alone = nan_filled((1, 100), llaisys.bfloat16, device)
        llaisys.ops.moe_combine(alone, from_torch(ry[row:row + 1].bfloat16(), device),
                                from_torch(rw[row:row + 1].bfloat16(), device))
        assert torch.equal(bits(to_torch(alone)[0]), bits(to_torch(out)[row]))


@pytest.mark.parametrize("level", LEVELS)
def test_moe_simd_paths(device, level):
    skip_unless_level_available(device, level)
    run_in_child(__name__, {"LLAISYS_CPU_SIMD": level}, "t.check_small()", expect_level=level)


def test_moe_avx512_without_bf16_dot(device):
    skip_unless_level_available(device, "avx512")
    run_in_child(__name__, {"LLAISYS_CPU_SIMD": "avx512", "LLAISYS_CPU_LINEAR_BF16DOT": "0"}, "t.check_small()",
                 expect_level="avx512")


def test_moe_ops_reject_bad_arguments(device):
    f32, bf16, i64 = llaisys.float32, llaisys.bfloat16, llaisys.int64
    z = lambda *shape, dtype=f32: llaisys.zeros(shape, dtype, device)  # noqa: E731
    cases = [
        (llaisys.ops.moe_router, (z(2, 3), z(2, 3, dtype=i64), z(2, 2)), "k = 3"),             # k > E
        (llaisys.ops.moe_router, (z(2, 2, dtype=bf16), z(2, 2, dtype=i64), z(2, 8)), "weights"),  # dtype
        (llaisys.ops.moe_router, (z(2, 2), z(2, 2, dtype=llaisys.int32), z(2, 8)), "experts"),  # int32 ids
        (llaisys.ops.moe_router, (z(3, 2), z(3, 2, dtype=i64), z(2, 8)), "weights"),           # M mismatch
        (llaisys.ops.moe_linear, (z(2, 2, 3), z(2, 8), z(4, 3, 7), z(2, 2, dtype=i64)), "x"),  # K mismatch
        (llaisys.ops.moe_linear, (z(2, 2, 3), z(2, 3, 8), z(4, 3, 8), z(2, 2, dtype=i64)), "x"),  # slots
        (llaisys.ops.moe_linear, (z(2, 2, 4), z(2, 8), z(4, 3, 8), z(2, 2, dtype=i64)), "out"),  # N mismatch
        (llaisys.ops.moe_linear, (z(2, 2, 3), z(2, 8), z(3, 8), z(2, 2, dtype=i64)), "weight"),  # not 3-D
        (llaisys.ops.moe_linear, (z(2, 2, 3), z(8, 2).permute(1, 0), z(4, 3, 8), z(2, 2, dtype=i64)), "x"),
        (llaisys.ops.moe_combine, (z(2, 5), z(2, 3, 5), z(2, 2)), "weights"),                   # k mismatch
        (llaisys.ops.moe_combine, (z(2, 4), z(2, 3, 5), z(2, 3)), "out"),                       # N mismatch
    ]
    for op, args, name in cases:
        with pytest.raises(llaisys.LlaisysError, match=name) as info:
            op(*args)
        assert isinstance(info.value, ValueError)
