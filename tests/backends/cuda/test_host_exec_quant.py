"""linear_q and embedding_q of the CUDA sources, run on CPU threads (host execution) at warp 32 and 64 under
ASan / UBSan, against the contract's arithmetic in float64 (tests/ops/test_linear_q.py's reference: x quantized
per group of 32, exact integer dots, f32 scales) and ggml's values (dequantize_quant, bit for bit)."""

import numpy as np
import pytest
import torch

import llaisys
from helpers.references.linear_q import K_FORMATS, contract_reference, random_blocks

pytestmark = pytest.mark.slow  # compiles the CUDA sources under ASan for host execution (cached; minutes of CPU)
CODE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
LLAISYS = {torch.float32: llaisys.float32, torch.float16: llaisys.float16, torch.bfloat16: llaisys.bfloat16}
FORMAT_CODE = {name: i for i, name in enumerate(llaisys.ops.QUANT_FORMATS)}
assert FORMAT_CODE == {"q8_0": 0, "q4_0": 1, "q4_1": 2, "q4_k": 3, "q6_k": 4}


def blocks(dev, fmt, n, k, seed):
    codes, *params = random_blocks(fmt, n, k, np.random.default_rng(seed))
    weight, scales = llaisys.ops.pack_quant(fmt, codes, *params)
    return codes, params, dev.upload(torch.from_numpy(weight)), dev.upload(torch.from_numpy(scales))


# (M, N, K): partial CUDA blocks of 32 rows and tiles of 4 rows of x, K tails (the group formats) and groups split
# unevenly among the 8 threads of a row
@pytest.mark.parametrize("fmt", llaisys.ops.QUANT_FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_linear_q(dev, fmt, dtype):
    shapes = [(1, 17, 256), (6, 40, 512)] if fmt in K_FORMATS else [(1, 17, 33), (6, 40, 300), (3, 5, 32)]
    for i, (m, n, k) in enumerate(shapes):
        codes, params, dw, ds = blocks(dev, fmt, n, k, seed=i)
        x = torch.randn((m, k), generator=torch.Generator().manual_seed(i), dtype=torch.float64).to(dtype)
        bias = torch.randn(n, generator=torch.Generator().manual_seed(9), dtype=torch.float64).to(dtype)
        out = dev.empty((m, n), dtype)
        dev.op("linear_q", CODE[dtype], FORMAT_CODE[fmt], m, n, k, out, dev.upload(x), dw, ds, dev.upload(bias))
        got = dev.download(out).to(torch.float64).numpy()
        w = llaisys.ops.dequantize_quant(fmt, codes, *params).astype(np.float64)
        exact, tight, _ = contract_reference(fmt, codes, params, w, x, bias, LLAISYS[dtype])
        bad = ~(np.abs(got - exact) <= tight)
        assert not bad.any(), f"{fmt} {(m, n, k)}: {int(bad.sum())} outputs off the exact arithmetic"


def test_linear_q_rows_do_not_depend_on_the_batch(dev):
    codes, params, dw, ds = blocks(dev, "q4_k", 20, 512, seed=3)
    x = torch.randn((9, 512), generator=torch.Generator().manual_seed(4))

    def rows(xs):
        out = dev.empty((xs.shape[0], 20), torch.float32)
        dev.op("linear_q", 0, FORMAT_CODE["q4_k"], xs.shape[0], 20, 512, out, dev.upload(xs), dw, ds, None)
        return dev.download(out)

    everything = rows(x)
    for start, m in ((0, 1), (8, 1), (3, 2), (1, 5)):
        assert torch.equal(rows(x[start:start + m]), everything[start:start + m]), (start, m)


def test_linear_q_nan_and_empty_k(dev):
    codes, params, dw, ds = blocks(dev, "q4_0", 5, 64, seed=5)
    x = torch.randn((3, 64), generator=torch.Generator().manual_seed(6))
    x[1, 40] = float("nan")
    out = dev.empty((3, 5), torch.float32)
    dev.op("linear_q", 0, FORMAT_CODE["q4_0"], 3, 5, 64, out, dev.upload(x), dw, ds, None)
    got = dev.download(out)
    assert torch.isnan(got[1]).all() and torch.isfinite(got[[0, 2]]).all()
    bias = torch.arange(5, dtype=torch.float32)
    dev.op("linear_q", 0, FORMAT_CODE["q4_0"], 3, 5, 0, out, dev.upload(torch.zeros((3, 0))), dw, ds,
           dev.upload(bias))
    assert torch.equal(dev.download(out), bias.expand(3, 5))


@pytest.mark.parametrize("fmt", llaisys.ops.QUANT_FORMATS)
def test_embedding_q_gives_ggml_values(dev, fmt):
    vocab, dim = 21, (256 if fmt in K_FORMATS else 40)
    codes, params, dw, ds = blocks(dev, fmt, vocab, dim, seed=7)
    want = torch.from_numpy(llaisys.ops.dequantize_quant(fmt, codes, *params))
    index = torch.tensor([0, 20, 16, 15, 3], dtype=torch.int64)
    for dtype in (torch.float32, torch.bfloat16):
        out = dev.empty((5, dim), dtype)
        dev.op("embedding_q", CODE[dtype], FORMAT_CODE[fmt], 5, dim, vocab, out, dev.upload(index), dw, ds)
        got, expected = dev.download(out), want[index].to(dtype)
        assert torch.equal(got.view(torch.int16) if dtype == torch.bfloat16 else got,
                           expected.view(torch.int16) if dtype == torch.bfloat16 else expected), fmt


def test_embedding_q_index_out_of_range_is_reported(dev):
    from host_exec.device import SlotError

    _, _, dw, ds = blocks(dev, "q8_0", 4, 32, seed=8)
    out = dev.empty((2, 32), torch.float32)
    dev.op("embedding_q", 0, FORMAT_CODE["q8_0"], 2, 32, 4, out, dev.upload(torch.tensor([1, 4])), dw, ds)
    with pytest.raises(SlotError) as info:
        dev.download(out)
    assert info.value.status == 1 and "index value 4 at position 1" in info.value.message


# moe_linear_q: each (row, slot) output bit for bit linear_q of its input row and its expert's blocks alone
@pytest.mark.parametrize("fmt", ["q8_0", "q4_1", "q4_k", "q6_k"])
@pytest.mark.parametrize("per_slot", [0, 1], ids=["per-row", "per-slot"])
def test_moe_linear_q_is_linear_q_per_pair(dev, fmt, per_slot):
    m, k, e, n = 5, 2, 3, 37
    kk = 256 if fmt in K_FORMATS else 96
    experts = [llaisys.ops.pack_quant(fmt, *random_blocks(fmt, n, kk, np.random.default_rng(10 + i)))
               for i in range(e)]
    weight = dev.upload(torch.from_numpy(np.stack([w for w, _ in experts])))
    scales = dev.upload(torch.from_numpy(np.stack([s for _, s in experts])))
    ids = torch.tensor([[0, 2], [1, 0], [2, 1], [2, 0], [1, 2]], dtype=torch.int64)
    x = torch.randn((m, k, kk) if per_slot else (m, kk), generator=torch.Generator().manual_seed(11))
    out = dev.empty((m, k, n), torch.float32)
    dev.op("moe_linear_q", 0, FORMAT_CODE[fmt], m, k, e, n, kk, per_slot, out, dev.upload(x), weight, scales,
           dev.upload(ids))
    got = dev.download(out)
    for r in range(m):
        for j in range(k):
            w, s = experts[int(ids[r, j])]
            alone = dev.empty((1, n), torch.float32)
            row = x[r, j] if per_slot else x[r]
            dev.op("linear_q", 0, FORMAT_CODE[fmt], 1, n, kk, alone, dev.upload(row[None].contiguous()),
                   dev.upload(torch.from_numpy(w)), dev.upload(torch.from_numpy(s)), None)
            assert torch.equal(got[r, j], dev.download(alone)[0]), (fmt, r, j)


def test_moe_linear_q_expert_out_of_range_is_reported(dev):
    from host_exec.device import SlotError

    w, s = llaisys.ops.pack_quant("q4_0", *random_blocks("q4_0", 4, 32, np.random.default_rng(12)))
    weight = dev.upload(torch.from_numpy(np.stack([w, w])))
    scales = dev.upload(torch.from_numpy(np.stack([s, s])))
    out = dev.empty((2, 1, 4), torch.float32)
    dev.op("moe_linear_q", 0, FORMAT_CODE["q4_0"], 2, 1, 2, 4, 32, 0, out, dev.upload(torch.randn(2, 32)), weight,
           scales, dev.upload(torch.tensor([[1], [2]])))
    with pytest.raises(SlotError) as info:
        dev.download(out)
    assert info.value.status == 1 and "experts[1, 0] = 2 is not an expert id" in info.value.message
