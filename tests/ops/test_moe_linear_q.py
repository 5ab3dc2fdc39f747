"""moe_linear_q: the grouped expert linear with each expert's weight in linear_q's blocks (a GGUF file's experts).

The checks are the conformance suite's (llaisys.testing.cases.quant): every format against the float64 reference
of linear_q's arithmetic, odd shapes and per-slot inputs, each (row, slot) output bit for bit ``linear_q`` of that
row and expert alone, an expert id out of range and overlapping buffers refused. Here they also run on the decode
shape of a Qwen3-30B-A3B-like layer, with the argument checks, and on every SIMD path of the CPU backend (a child
process per path: test_linear_q.test_block_linears_every_simd_path runs check_all).
"""

from __future__ import annotations

import numpy as np
import pytest

import llaisys
import llaisys.testing
from helpers import skip_without_kernels
from llaisys.device import as_device
from llaisys.testing.case import Ctx
from llaisys.testing.cases.quant import MoeQuant

CASES = [c for c in llaisys.testing.cases() if c.op == "moe_linear_q"]


@pytest.fixture(autouse=True)
def _device_has_the_kernel(request):
    if "device" in request.fixturenames:
        skip_without_kernels(request.getfixturevalue("device"), ["moe_linear_q"], "this test")


def check_all(device="cpu"):
    for case in CASES:
        case.run(device)


def test_every_format_has_cases():
    assert {c.detail.split()[0] for c in CASES if c.layout == "batch-invariant"} == set(llaisys.ops.QUANT_FORMATS)


def test_moe_linear_q_qwen3_moe_decode_shape(device):
    """A decode step of a Qwen3-30B-A3B-like gate projection (hidden 2048, experts of 768, top 8), 9 experts
    stored: each slot bit for bit linear_q of the row with its expert's blocks."""
    ctx = Ctx(as_device(device), llaisys.bfloat16, 3)
    case = MoeQuant(ctx, "q4_k", (1, 8, 9, 768, 2048), False)
    got = case.run()
    for j in range(8):
        weight, scales = (ctx.upload(a) for a in case.blocks[case.ids[0, j]])
        alone = ctx.nan((1, 768))
        llaisys.ops.linear_q(alone, case.x, weight, scales, "q4_k")
        np.testing.assert_array_equal(alone.numpy()[0].view(np.uint16), got[0, j].view(np.uint16))


def test_moe_linear_q_rejects_bad_arguments(device):
    ctx = Ctx(as_device(device), llaisys.float32, 4)
    case = MoeQuant(ctx, "q4_0", (2, 2, 3, 20, 64), False)
    ids, op = ctx.upload(case.ids), llaisys.ops.moe_linear_q
    out = ctx.nan((2, 2, 20))
    with pytest.raises(llaisys.LlaisysError, match="fmt must be one of"):
        op(out, case.x, case.weight, case.scales, ids, "q5_0")
    with pytest.raises(llaisys.LlaisysError, match="weight has shape"):
        op(out, case.x, case.weight, case.scales, ids, "q8_0")  # q4_0's blocks read as q8_0's
    with pytest.raises(llaisys.LlaisysError, match="weight has shape"):
        op(ctx.nan((2, 2, 15)), case.x, case.weight, case.scales, ids, "q4_0")  # N from out
    with pytest.raises(llaisys.LlaisysError, match="4-d"):
        op(out, case.x, case.weight.view(3, int(np.prod(case.weight.shape[1:]))), case.scales, ids, "q4_0")
    with pytest.raises(llaisys.LlaisysError, match="multiple of 256"):
        op(out, case.x, case.weight, case.scales, ids, "q4_k")
    with pytest.raises(llaisys.LlaisysError, match="x must be"):
        op(out, ctx.nan((2,)), case.weight, case.scales, ids, "q4_0")
