"""Outputs that share memory with inputs: exact in-place updates where the kernel supports them
(the comments of llaisys/backend.h), a clear error naming both arguments for any other overlap.

Before the checks, ``linear(t, t, w)`` was off by up to 1e4 or NaN, ``add`` with an output shifted
by one element matched no semantics and ``rearrange(t, t.permute(1, 0))`` was wrong; torch raises
in these cases too.
"""

import pytest
import torch

import llaisys
from helpers import assert_close, from_torch, random, rope_table, to_torch

F32 = llaisys.float32


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def overlap_error(names):
    out, inp = names
    return pytest.raises(llaisys.LlaisysValueError, match=rf"\b{out} and {inp} overlap in memory")


# -- allowed: exact in place -------------------------------------------------------------------

def test_add_in_place_on_either_input(device):
    g = gen(1)
    for target in ("a", "b", "both"):
        a, ra = random((37,), F32, device, g)
        b, rb = random((37,), F32, device, g)
        if target == "both":
            llaisys.ops.add(a, a, a)
            assert_close(a, ra + ra)
        else:
            c = a if target == "a" else b
            llaisys.ops.add(c, a, b)
            assert_close(c, ra + rb)


def test_rms_norm_swiglu_rope_in_place(device):
    g = gen(2)
    x, rx = random((3, 64), F32, device, g)
    w, rw = random((64,), F32, device, g)
    llaisys.ops.rms_norm(x, x, w, 1e-6)
    assert_close(x, rx * rw / torch.sqrt((rx * rx).mean(-1, keepdim=True) + 1e-6))

    for into in ("gate", "up"):
        gate, rgate = random((50,), F32, device, g)
        up, rup = random((50,), F32, device, g)
        llaisys.ops.swiglu(gate if into == "gate" else up, gate, up)
        assert_close(gate if into == "gate" else up, torch.nn.functional.silu(rgate) * rup)
        gate, rgate = random((50,), F32, device, g)
        up, rup = random((50,), F32, device, g)
        llaisys.ops.geglu_tanh(gate if into == "gate" else up, gate, up)
        assert_close(gate if into == "gate" else up, torch.nn.functional.gelu(rgate, approximate="tanh") * rup)
    x, rx = random((50,), F32, device, g)
    llaisys.ops.scale(x, x, 3.0)
    assert_close(x, rx * 3.0)

    # rope in place must give what the out-of-place call gives (whose values test_rope checks against torch)
    x, _ = random((5, 2, 16), F32, device, g)
    pos = from_torch(torch.arange(5), device)
    out = llaisys.empty((5, 2, 16), F32, device)
    table = rope_table(16, 1e4, device)
    llaisys.ops.rope(out, x, pos, table)
    llaisys.ops.rope(x, x, pos, table)
    assert torch.equal(to_torch(x), to_torch(out))


def attention_reference(q, k, v, scale):
    L, S = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("lhd,shd->hls", q, k) * scale
    visible = torch.arange(S)[None, :] <= torch.arange(L)[:, None] + (S - L)
    return torch.einsum("hls,shd->lhd", scores.masked_fill(~visible, float("-inf")).softmax(-1), v)


@pytest.mark.parametrize("into", ["q", "v"])
def test_attention_output_may_be_q_or_v(device, into):
    g = gen(3)
    q, rq = random((6, 2, 16), F32, device, g)
    k, rk = random((6, 2, 16), F32, device, g)
    v, rv = random((6, 2, 16), F32, device, g)
    out = q if into == "q" else v
    llaisys.ops.self_attention(out, q, k, v, 0.25)
    assert_close(out, attention_reference(rq, rk, rv, 0.25))


def test_rearrange_onto_itself_is_a_no_op(device):
    x, rx = random((4, 5), F32, device, gen(4))
    llaisys.ops.rearrange(x, x)
    assert_close(x, rx)


# -- rejected: any other overlap -------------------------------------------------------------------

def test_linear_output_overlapping_any_input(device):
    g = gen(5)
    t, _ = random((4, 8), F32, device, g)
    w, _ = random((8, 8), F32, device, g)
    with overlap_error(("out", "x")):
        llaisys.ops.linear(t, t, w)  # M <= 8, N == K: the case that gave 1e4 errors or NaN
    x, _ = random((8, 8), F32, device, g)
    with overlap_error(("out", "weight")):
        llaisys.ops.linear(w, x, w)
    base = llaisys.empty((40,), F32, device)
    out, bias = base.slice(0, 0, 32).view(4, 8), base.slice(0, 8, 16)  # bias inside out
    x = x.slice(0, 0, 4)
    with overlap_error(("out", "bias")):
        llaisys.ops.linear(out, x, w, bias)


def test_shifted_outputs_are_refused(device):
    base, _ = random((9,), F32, device, gen(6))
    c, a, b = base.slice(0, 1, 9), base.slice(0, 0, 8), llaisys.zeros((8,), F32, device)
    with overlap_error(("c", "a")):
        llaisys.ops.add(c, a, b)
    with overlap_error(("c", "b")):
        llaisys.ops.add(c, b, a)
    with overlap_error(("out", "gate")):
        llaisys.ops.swiglu(c, a, b)
    with overlap_error(("out", "gate")):
        llaisys.ops.geglu_tanh(c, a, b)
    with overlap_error(("out", "x")):
        llaisys.ops.scale(c, a, 2.0)
    x = base.slice(0, 0, 8).view(2, 4)
    with overlap_error(("out", "x")):
        llaisys.ops.rms_norm(base.slice(0, 1, 9).view(2, 4), x, b.slice(0, 0, 4), 1e-6)
    with overlap_error(("out", "weight")):
        llaisys.ops.rms_norm(x, b.view(2, 4), base.slice(0, 2, 6), 1e-6)


def test_rearrange_of_a_permuted_self(device):
    t, _ = random((5, 5), F32, device, gen(7))
    with overlap_error(("out", "x")):
        llaisys.ops.rearrange(t, t.permute(1, 0))


def test_attention_embedding_argmax_overlaps(device):
    g = gen(8)
    q, _ = random((3, 2, 8), F32, device, g)
    k, _ = random((3, 2, 8), F32, device, g)
    v, _ = random((3, 2, 4), F32, device, g)
    with overlap_error(("out", "k")):
        llaisys.ops.self_attention(k.view(-1).slice(0, 0, 24).view(3, 2, 4), q, k, v, 1.0)
    with overlap_error(("out", "q")):  # same pointer as q but a different shape (dv != d): not the same elements
        llaisys.ops.self_attention(q.view(-1).slice(0, 0, 24).view(3, 2, 4), q, k, v, 1.0)

    weight, _ = random((10, 4), F32, device, g)
    index = from_torch(torch.tensor([3, 1], dtype=torch.int64), device)
    with overlap_error(("out", "weight")):
        llaisys.ops.embedding(weight.slice(0, 0, 2), index, weight)

    vals, _ = random((6,), F32, device, g)
    max_idx = llaisys.empty((1,), llaisys.int64, device)
    with overlap_error(("max_val", "vals")):
        llaisys.ops.argmax(max_idx, vals.slice(0, 2, 3), vals)


def test_outputs_of_another_dtype_over_the_same_bytes():
    """Views of different dtypes over one buffer (from_buffer) overlap too."""
    buffer = bytearray(64)
    logits = llaisys.from_buffer(buffer, F32, (8,))
    out_idx = llaisys.from_buffer(buffer, llaisys.int64, (1,), offset=8)
    with overlap_error(("out_idx", "logits")):
        llaisys.ops.sample(out_idx, logits, 1.0, 0, 1.0, 0)
    disjoint = llaisys.from_buffer(buffer, llaisys.int64, (1,), offset=32)
    llaisys.ops.sample(disjoint, logits, 1.0, 0, 1.0, 0)
    assert 0 <= int(disjoint.numpy()[0]) < 8


def test_the_same_layout_with_new_pointers_is_checked_every_call(device):
    """The op path validates layouts once, but overlap depends on pointers: a valid call first, then an
    overlapping one with the very same layouts, must still raise."""
    base = llaisys.zeros((16,), F32, device)
    a, b, c = base.slice(0, 0, 4), base.slice(0, 4, 8), base.slice(0, 8, 12)
    llaisys.ops.add(c, a, b)
    with overlap_error(("c", "a")):
        llaisys.ops.add(base.slice(0, 2, 6), a, b)


def test_read_only_output_with_a_known_layout_still_raises():
    t = llaisys.zeros((4,))
    llaisys.ops.add(t, t, t)  # a plan for writable (4,) f32 tensors now exists
    ro = llaisys.from_buffer(bytes(16), F32, (4,))
    with pytest.raises(llaisys.LlaisysValueError, match="read-only"):
        llaisys.ops.add(ro, t, t)
