"""The CUDA mixture-of-experts kernels (ops/moe.cu), run on CPU threads at warp 32 and 64 (host execution),
against float64 torch: the router's top k and weights, moe_linear against each (row, slot)'s matrix product
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
