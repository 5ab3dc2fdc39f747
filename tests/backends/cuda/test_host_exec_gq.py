"""linear_gq of the CUDA sources (ops/linear_gq.cu), run on CPU threads (host execution) at warp 32 and 64 under
ASan / UBSan, against the float64 reference: x (gathered through perm) @ the exactly dequantized weights
(q - z) * s, + bias (tests/ops/test_linear_gq.py's), within the dtype's tolerance; rows alone and in a batch bit for
bit; a perm value out of range reported at the next synchronizing call."""

import numpy as np
import pytest
import torch

import llaisys
from llaisys.testing.compare import TOLERANCE, close

pytestmark = pytest.mark.slow  # compiles the CUDA sources under ASan for host execution (cached; minutes of CPU)
CODE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
LLAISYS = {torch.float32: llaisys.float32, torch.float16: llaisys.float16, torch.bfloat16: llaisys.bfloat16}
I32, I64 = 5, 6  # llaisys_dtype_t codes of perm


def gq_case(dev, n, k, bits, gs, seed, symmetric=False):
    """Random blocks on the device and the float64 weights [n, k]."""
    rng = np.random.default_rng(seed)
    top, groups = (1 << bits) - 1, k // gs
    q = rng.integers(0, top + 1, (n, k)).astype(np.uint8)
    scales = (rng.choice([-1.0, 1.0], (n, groups)) * k ** -0.5 / (top / 2) * (0.5 + rng.random((n, groups))))
    scales = scales.astype(np.float16)
    zeros = (np.full((n, groups), 1 << (bits - 1)) if symmetric else rng.integers(0, top + 1, (n, groups))).astype(np.uint8)
    blocks = [dev.upload(torch.from_numpy(a)) for a in llaisys.ops.pack_gq(q, scales, zeros, bits, gs)]
    return blocks, llaisys.ops.dequantize_gq(q, scales, zeros, gs).astype(np.float64)


def run(dev, dtype, bits, gs, x, blocks, n, bias=None, perm=None, perm_code=I64):
    m, k = x.shape
    out = dev.empty((m, n), dtype)
    dev.op("linear_gq", CODE[dtype], bits, gs, perm_code if perm is not None else 0, m, n, k, out, dev.upload(x),
           *blocks, None if bias is None else dev.upload(bias), None if perm is None else dev.upload(perm))
    return dev.download(out)


# (M, N, K, bits, group size, perm): a partial CUDA block of 16 rows, tiles of 8 rows of x and their tails, K not a
# multiple of the 256-wide chunk of x in shared memory, groups of 32 (fewer words than threads per row) to K.
SHAPES = [(1, 17, 96, 4, 32, None), (3, 40, 320, 4, 64, I32), (9, 16, 288, 8, 96, I64), (17, 5, 64, 8, 64, None),
          (2, 33, 512, 4, 512, I64)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_linear_gq(dev, dtype):
    for i, (m, n, k, bits, gs, perm_code) in enumerate(SHAPES):
        blocks, w = gq_case(dev, n, k, bits, gs, seed=i, symmetric=i % 2 == 1)
        g = torch.Generator().manual_seed(i)
        x = torch.randn((m, k), generator=g, dtype=torch.float64).to(dtype)
        bias = torch.randn(n, generator=g, dtype=torch.float64).to(dtype) if i % 2 == 0 else None
        order = torch.randperm(k, generator=g) if perm_code else torch.arange(k)
        perm = None if perm_code is None else order.to(torch.int32 if perm_code == I32 else torch.int64)
        got = run(dev, dtype, bits, gs, x, blocks, n, bias, perm, perm_code or I64).to(torch.float64).numpy()
        want = x.to(torch.float64)[:, order].numpy() @ w.T + (0 if bias is None else bias.to(torch.float64).numpy())
        close(got, want, LLAISYS[dtype], TOLERANCE[LLAISYS[dtype]], f"{bits}-bit gs {gs} {(m, n, k)}")


def test_linear_gq_rows_do_not_depend_on_the_batch(dev):
    blocks, _ = gq_case(dev, 20, 256, 4, 64, seed=3)
    x = torch.randn((19, 256), generator=torch.Generator().manual_seed(4))
    perm = torch.randperm(256, generator=torch.Generator().manual_seed(5))
    everything = run(dev, torch.float32, 4, 64, x, blocks, 20, perm=perm)
    for start, m in ((0, 1), (18, 1), (3, 2), (1, 9), (8, 11)):
        rows = run(dev, torch.float32, 4, 64, x[start:start + m], blocks, 20, perm=perm)
        assert torch.equal(rows, everything[start:start + m]), (start, m)


def test_linear_gq_nan_and_empty_k(dev):
    blocks, _ = gq_case(dev, 5, 64, 4, 32, seed=5)
    x = torch.randn((3, 64), generator=torch.Generator().manual_seed(6))
    x[1, 40] = float("nan")
    got = run(dev, torch.float32, 4, 32, x, blocks, 5)
    assert torch.isnan(got[1]).all() and torch.isfinite(got[[0, 2]]).all()
    bias = torch.arange(5, dtype=torch.float32)
    assert torch.equal(run(dev, torch.float32, 4, -1, torch.zeros((3, 0)), blocks, 5, bias), bias.expand(3, 5))


@pytest.mark.parametrize("bad", [64, -1])
def test_linear_gq_perm_out_of_range_is_reported(dev, bad):
    from host_exec.device import SlotError

    blocks, _ = gq_case(dev, 4, 64, 4, 32, seed=8)
    perm = torch.arange(64)
    perm[9] = bad
    with pytest.raises(SlotError) as info:
        run(dev, torch.float32, 4, 32, torch.randn((2, 64)), blocks, 4, perm=perm)
    assert info.value.status == 1 and f"perm[9] = {bad}" in info.value.message, info.value.message
