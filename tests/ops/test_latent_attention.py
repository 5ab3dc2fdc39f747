"""ops.paged_latent_attention: DeepSeek's multi-head latent attention (MLA) in its absorbed form, over a paged
latent cache.

Each token keeps c (dc values: the compressed keys and values) and r (dr values: the rope key every head
shares); head h of query row i scores key j as scale * (q[i, h, :dc] . c[j] + q[i, h, dc:] . r[j]) and its
output is softmax(scores) @ c. Reference: the float64 causal attention (torch) of one kv head whose keys are
(c, r) and whose values are c. Beyond accuracy, paged_attention's properties: rows of no sequence are 0, a
sequence's rows do not depend on the batch around it (bit for bit), prefill in chunks equals prefill in one
call, every SIMD path computes them, bad index data is refused by the kernel, bad arguments by the frontend.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

import llaisys
from helpers import FLOAT_DTYPES, TORCH_DTYPES, assert_close, from_torch, nan_filled
from helpers.references.attention import reference  # float64 causal GQA attention
from helpers.simd_paths import LEVELS, run_under_simd, skip_unless_level_available


@pytest.fixture(autouse=True)
def _device_has_the_kernel(request):
    if "device" in request.fixturenames:
        from helpers import skip_without_kernels

        skip_without_kernels(request.getfixturevalue("device"), ("paged_latent_attention",), "this test")


class Latent:
    """A random batch in a paged latent cache: sequences of (query rows L, keys S), their blocks in a shuffled
    order, unused cache rows NaN (a read of a wrong row shows), ``lead`` / ``tail`` query rows of no sequence."""

    def __init__(self, seqs, H, dc, dr, block_size, dtype, device, seed=0, lead=0, tail=0, spare_blocks=3):
        g = torch.Generator().manual_seed(seed)
        self.seqs, self.H, self.dc, self.dr, self.dtype, self.device = seqs, H, dc, dr, dtype, device
        counts = [-(-S // block_size) for _, S in seqs]
        num_blocks = sum(counts) + spare_blocks
        order = torch.randperm(num_blocks, generator=g).tolist()
        tdt = TORCH_DTYPES[dtype]
        self.c_cache = torch.full((num_blocks, block_size, dc), float("nan"), dtype=tdt)
        self.r_cache = torch.full((num_blocks, block_size, dr), float("nan"), dtype=tdt)
        self.tables = torch.zeros((len(seqs), max(counts + [1])), dtype=torch.int32)
        self.c, self.r, starts = [], [], [lead]
        for s, ((L, S), n) in enumerate(zip(seqs, counts)):
            blocks, order = order[:n], order[n:]
            self.tables[s, :n] = torch.tensor(blocks, dtype=torch.int32)
            c = torch.randn((S, dc), generator=g, dtype=torch.float64).to(tdt)
            r = torch.randn((S, dr), generator=g, dtype=torch.float64).to(tdt)
            for j in range(S):
                self.c_cache[blocks[j // block_size], j % block_size] = c[j]
                self.r_cache[blocks[j // block_size], j % block_size] = r[j]
            self.c.append(c)
            self.r.append(r)
            starts.append(starts[-1] + L)
        self.query_start = torch.tensor(starts, dtype=torch.int32)
        self.seq_lens = torch.tensor([S for _, S in seqs], dtype=torch.int32)
        self.T = starts[-1] + tail
        self.q = torch.randn((self.T, H, dc + dr), generator=g, dtype=torch.float64).to(tdt)
        self.scale = 1.0 / math.sqrt(dc + dr)
        self._caches = None

    def caches(self):
        if self._caches is None:
            self._caches = (from_torch(self.c_cache, self.device), from_torch(self.r_cache, self.device))
        return self._caches

    def run(self, q=None, query_start=None, seq_lens=None, tables=None, out=None) -> llaisys.Tensor:
        q = self.q if q is None else q
        dev = self.device
        q = from_torch(q, dev) if isinstance(q, torch.Tensor) else q
        out = nan_filled((q.shape[0], self.H, self.dc), self.dtype, dev) if out is None else out
        llaisys.ops.paged_latent_attention(out, q, *self.caches(),
                                           from_torch(self.tables if tables is None else tables, dev),
                                           from_torch(self.seq_lens if seq_lens is None else seq_lens, dev),
                                           from_torch(self.query_start if query_start is None else query_start, dev),
                                           self.scale)
        return out

    def expected(self) -> torch.Tensor:
        out = torch.zeros((self.T, self.H, self.dc), dtype=torch.float64)
        for s, (L, _) in enumerate(self.seqs):
            if L:
                a, b = int(self.query_start[s]), int(self.query_start[s + 1])
                keys = torch.cat([self.c[s], self.r[s]], 1)[:, None, :]
                out[a:b] = reference(self.q[a:b], keys, self.c[s][:, None, :], self.scale)
        return out


def bits(t: llaisys.Tensor) -> np.ndarray:
    array = t.numpy()
    return array.view({2: np.uint16, 4: np.uint32}[array.dtype.itemsize])


# (sequences as (query rows, keys), H, dc, dr, block_size)
CASES = {
    # DeepSeek-V3's latent (kv_lora_rank 512, qk_rope_head_dim 64) with 16 of its 128 heads (a TP rank's share)
    "deepseek_v3_h16": ([(1, 1), (1, 17), (1, 300), (7, 70)], 16, 512, 64, 64),
    "mixed_prefill_decode": ([(5, 5), (1, 40), (17, 80), (0, 0), (3, 3), (1, 2)], 4, 64, 16, 16),
    "odd_dc17_dr3_block1": ([(3, 9), (1, 5)], 3, 17, 3, 1),
    "one_head_dc5_dr1_block3": ([(4, 6), (2, 11)], 1, 5, 1, 3),
    "no_rope_part": ([(2, 7), (1, 20)], 2, 33, 0, 4),
    "chunks_across_tiles": ([(40, 700), (1, 1100)], 2, 32, 8, 128),
    "many_sequences": ([(1, n) for n in (1, 2, 3, 5, 8, 13, 21, 34, 55, 89)] + [(6, 50)], 2, 16, 4, 4),
}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_matches_reference(device, dtype, case):
    seqs, H, dc, dr, bs = case
    latent = Latent(seqs, H, dc, dr, bs, dtype, device, lead=2, tail=3)
    out = latent.run()
    assert_close(out, latent.expected())
    got = bits(out)
    assert not got[:2].any() and not got[-3:].any(), "rows of no sequence must be +0.0"


def test_equals_paged_attention_over_the_concatenated_keys(device):
    """The same attention as paged_attention with one kv head, keys (c, r) and values c (within f32 rounding)."""
    latent = Latent([(1, 90), (6, 40)], 4, 64, 16, 16, llaisys.float32, device, seed=2, lead=1, tail=1)
    k_cache = torch.cat([latent.c_cache, latent.r_cache], 2)[:, :, None, :]
    plain = nan_filled((latent.T, 4, 64), llaisys.float32, device)
    llaisys.ops.paged_attention(plain, from_torch(latent.q, device), from_torch(k_cache, device),
                                from_torch(latent.c_cache[:, :, None, :], device), from_torch(latent.tables, device),
                                from_torch(latent.seq_lens, device), from_torch(latent.query_start, device),
                                latent.scale)
    assert_close(latent.run(), torch.from_numpy(plain.numpy()).to(torch.float64))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda t: t.name)
def test_alone_or_batched_bit_for_bit(device, dtype):
    """Each sequence computed alone gives exactly its rows of the batched call."""
    latent = Latent([(1, 700), (12, 12), (1, 3), (30, 530), (1, 65)], 4, 64, 16, 16, dtype, device, seed=5, lead=1)
    batched = bits(latent.run())
    for s in range(len(latent.seqs)):
        a, b = int(latent.query_start[s]), int(latent.query_start[s + 1])
        alone = latent.run(q=latent.q[a:b], query_start=torch.tensor([0, b - a], dtype=torch.int32),
                           seq_lens=latent.seq_lens[s:s + 1], tables=latent.tables[s:s + 1])
        assert np.array_equal(bits(alone), batched[a:b]), f"sequence {s} differs alone and batched"


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda t: t.name)
def test_prefill_in_chunks_bit_for_bit(device, dtype):
    """A prompt prefilled in one call == the same prompt in chunks (each chunk seeing the keys so far)."""
    S = 600
    latent = Latent([(S, S)], 2, 32, 8, 16, dtype, device, seed=7)
    whole = bits(latent.run())
    for a, b in zip((0, 1, 9, 513), (1, 9, 513, S)):
        part = latent.run(q=latent.q[a:b], query_start=torch.tensor([0, b - a], dtype=torch.int32),
                          seq_lens=torch.tensor([b], dtype=torch.int32))
        assert np.array_equal(bits(part), whole[a:b]), f"rows [{a}, {b}) differ from the one-call prefill"


def every_check_on_this_path(device="cpu"):
    """The small reference cases and the invariance checks, on whatever SIMD path this process takes."""
    device = llaisys.Device(device)
    for name in ("mixed_prefill_decode", "odd_dc17_dr3_block1", "no_rope_part"):
        for dtype in FLOAT_DTYPES:
            test_matches_reference(device, dtype, CASES[name])
    test_alone_or_batched_bit_for_bit(device, llaisys.bfloat16)


@pytest.mark.parametrize("level", LEVELS)
def test_simd_paths(device, level):
    skip_unless_level_available(device, level)
    run_under_simd(__name__, level, "t.every_check_on_this_path()")


# (the change, the CPU backend's message, (the array and the value that every backend's message names))
BAD_DATA = {
    "block id past the pool": (dict(tables=[[0, 9]]), "block_tables\\[0, 1\\] = 9 is not a block in \\[0, 3\\)",
                               ("block_tables", 9)),
    "negative block id": (dict(tables=[[-1, 0]]), "block_tables\\[0, 0\\] = -1", ("block_tables", -1)),
    "seq_len past the table": (dict(seq_lens=[9]), "seq_lens\\[0\\] = 9 is outside \\[0, max_blocks \\* block_size = 8\\]",
                               ("seq_lens", 9)),
    "more queries than keys": (dict(seq_lens=[2]), "3 query rows but only 2 keys", ("seq_lens", 2)),
    "query_start descending": (dict(query_start=[2, 1]), "not ascending", ("query_start", 1)),
    "query_start past T": (dict(query_start=[1, 4]), "query_start\\[num_seqs\\] = 4 exceeds the 3 query rows",
                           ("query_start", 4)),
}


@pytest.mark.parametrize("bad", BAD_DATA.values(), ids=BAD_DATA.keys())
def test_bad_index_data_raises(device, bad):
    """Data the kernel reads is checked there: a clear error naming the array and the value, never a wild read
    (the wording checked in full is the CPU backend's), and nothing written."""
    change, cpu_message, (array, bad_value) = bad
    args = dict(tables=[[0, 2]], seq_lens=[5], query_start=[0, 3])
    args.update(change)
    dt = llaisys.float32
    out = nan_filled((3, 2, 8), dt, device)
    q = llaisys.zeros((3, 2, 12), dt, device)
    c, r = llaisys.zeros((3, 4, 8), dt, device), llaisys.zeros((3, 4, 4), dt, device)
    i32 = {name: from_torch(torch.tensor(value, dtype=torch.int32), device) for name, value in args.items()}
    with pytest.raises(llaisys.LlaisysValueError) as info:
        llaisys.ops.paged_latent_attention(out, q, c, r, i32["tables"], i32["seq_lens"], i32["query_start"], 0.5)
        llaisys.synchronize(device)  # an asynchronous backend reports what its kernel found here
    message = str(info.value)
    assert "paged_latent_attention" in message, message
    assert re.search(rf"\b{array}\b", message) and re.search(rf"(?<![\w-]){bad_value}(?!\w)", message), (
        f"the error does not name {array} and its value {bad_value}: {message}")
    if device.type == "cpu":
        assert re.search(cpu_message, message), message
        assert np.isnan(out.numpy()).all(), "a refused call must not write"


def _args(device, T=3, H=2, dc=8, dr=4, blocks=3, bs=4, seqs=1, max_blocks=2, dtype=llaisys.float32):
    i32 = llaisys.int32
    return dict(out=llaisys.empty((T, H, dc), dtype, device), q=llaisys.zeros((T, H, dc + dr), dtype, device),
                c_cache=llaisys.zeros((blocks, bs, dc), dtype, device),
                r_cache=llaisys.zeros((blocks, bs, dr), dtype, device),
                block_tables=llaisys.zeros((seqs, max_blocks), i32, device),
                seq_lens=llaisys.zeros((seqs,), i32, device), query_start=llaisys.zeros((seqs + 1,), i32, device),
                scale=0.5)


def test_frontend_checks(device):
    def fails(match, **change):
        args = _args(device)
        args.update(change)
        with pytest.raises(llaisys.LlaisysValueError, match=match) as info:
            llaisys.ops.paged_latent_attention(**args)
        assert "paged_latent_attention" in str(info.value), info.value

    f32, bf16, i32, i64 = llaisys.float32, llaisys.bfloat16, llaisys.int32, llaisys.int64
    z = lambda *shape, dtype=f32: llaisys.zeros(shape, dtype, device)  # noqa: E731
    fails("q's last dim 13 must be c_cache's 8 \\+ r_cache's 4", q=z(3, 2, 13))
    fails("q's last dim 8 must be c_cache's 8 \\+ r_cache's 4", q=z(3, 2, 8))
    fails("q has dtype bfloat16", q=z(3, 2, 12, dtype=bf16))
    fails("c_cache has dtype bfloat16", c_cache=z(3, 4, 8, dtype=bf16))
    fails("r_cache has dtype float16", r_cache=z(3, 4, 4, dtype=llaisys.float16))
    fails("out has dtype int32|out.*float", out=z(3, 2, 8, dtype=i32))
    fails("c_cache must be 3-d", c_cache=z(3, 4, 1, 8))
    fails("r_cache must be 3-d", r_cache=z(12, 4))
    fails("q must be 3-d", q=z(6, 12))
    fails("r_cache has shape", r_cache=z(2, 4, 4))  # another block count
    fails("r_cache has shape", r_cache=z(3, 2, 4))  # another block size
    fails("out has shape", out=z(3, 2, 12))  # out is [T, H, dc], not q's shape
    fails("out has shape", out=z(3, 3, 8))
    fails("block size", c_cache=z(3, 0, 8), r_cache=z(3, 0, 4))
    fails("block_tables has dtype int64", block_tables=z(1, 2, dtype=i64))
    fails("block_tables must be 2-d", block_tables=z(2, dtype=i32))
    fails("seq_lens has dtype int64", seq_lens=z(1, dtype=i64))
    fails("seq_lens has shape", seq_lens=z(2, dtype=i32))
    fails("query_start has shape", query_start=z(1, dtype=i32))
    fails("scale must be finite", scale=float("inf"))
    fails("scale must not be NaN", scale=float("nan"))
    fails("must be contiguous", q=z(2, 3, 12).permute(1, 0, 2))
    fails("must be contiguous", c_cache=z(4, 3, 8).permute(1, 0, 2))
    args = _args(device)
    fails("out and c_cache overlap", out=args["c_cache"].view(96).slice(0, 0, 48).view(3, 2, 8),
          c_cache=args["c_cache"])
    args = _args(device)
    fails("out and r_cache overlap", out=args["r_cache"].view(48).view(3, 2, 8), r_cache=args["r_cache"])
    args = _args(device)
    fails("out and q overlap", out=args["q"].view(72).slice(0, 24, 72).view(3, 2, 8), q=args["q"])
    # without a rope part, out and q have one shape, but out may still not be q (unlike paged_attention)
    args = _args(device, dr=0)
    args["out"] = args["q"]
    with pytest.raises(llaisys.LlaisysValueError, match="out and q overlap"):
        llaisys.ops.paged_latent_attention(**args)
    # a valid call (no keys: every row is of no sequence) runs
    args = _args(device)
    llaisys.ops.paged_latent_attention(**args)
    assert not args["out"].numpy().any()
