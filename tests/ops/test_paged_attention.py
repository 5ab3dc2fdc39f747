"""ops.paged_attention and ops.paged_kv_write: attention of a batch of sequences over a paged KV cache.

References: the float64 masked softmax of each sequence's gathered keys and values (torch), and the dense
``self_attention`` op. Beyond accuracy, a query's result must not depend on the batch around it (bit for
bit): alone or batched, prefilled in one call or in chunks, on one thread or several; with a sliding window
too, whose keys before the window must not even be read (they hold NaN in those tests).
"""

from __future__ import annotations

import json
import math
import os
import re

import numpy as np
import pytest
import torch

import llaisys
from helpers import FLOAT_DTYPES, TORCH_DTYPES, assert_close, from_torch, nan_filled, random, skip_without_kernels, to_torch
from helpers.child_process import run_in_child
from helpers.references.attention import reference  # float64 causal GQA attention
from helpers.simd_paths import LEVELS, run_under_simd, skip_unless_level_available


@pytest.fixture(autouse=True)
def _device_has_the_kernels(request):
    if "device" in request.fixturenames:
        skip_without_kernels(request.getfixturevalue("device"), ("paged_attention", "paged_kv_write"), "this test")


class Paged:
    """A random batch laid out in a paged cache: sequences of (query rows L, keys S), their blocks in a
    shuffled order, unused cache rows NaN (a read of a wrong row shows)."""

    def __init__(self, seqs, H, Hkv, d, dv, block_size, dtype, device, seed=0, lead=0, tail=0, spare_blocks=3,
                 window=0):
        g = torch.Generator().manual_seed(seed)
        self.seqs, self.H, self.Hkv, self.d, self.dv, self.dtype, self.device = seqs, H, Hkv, d, dv, dtype, device
        self.window = window
        self.block_size = block_size
        counts = [-(-S // block_size) for _, S in seqs]
        num_blocks = sum(counts) + spare_blocks
        order = torch.randperm(num_blocks, generator=g).tolist()
        self.max_blocks = max(counts + [1])
        tdt = TORCH_DTYPES[dtype]
        self.k_cache = torch.full((num_blocks, block_size, Hkv, d), float("nan"), dtype=tdt)
        self.v_cache = torch.full((num_blocks, block_size, Hkv, dv), float("nan"), dtype=tdt)
        self.tables = torch.zeros((len(seqs), self.max_blocks), dtype=torch.int32)
        self.keys, self.values, starts = [], [], [lead]
        for s, ((L, S), n) in enumerate(zip(seqs, counts)):
            blocks, order = order[:n], order[n:]
            self.tables[s, :n] = torch.tensor(blocks, dtype=torch.int32)
            k = (torch.randn((S, Hkv, d), generator=g, dtype=torch.float64)).to(tdt)
            v = (torch.randn((S, Hkv, dv), generator=g, dtype=torch.float64)).to(tdt)
            for j in range(S):
                self.k_cache[blocks[j // block_size], j % block_size] = k[j]
                self.v_cache[blocks[j // block_size], j % block_size] = v[j]
            self.keys.append(k)
            self.values.append(v)
            starts.append(starts[-1] + L)
        self.query_start = torch.tensor(starts, dtype=torch.int32)
        self.seq_lens = torch.tensor([S for _, S in seqs], dtype=torch.int32)
        self.T = starts[-1] + tail
        self.q = (torch.randn((self.T, H, d), generator=g, dtype=torch.float64)).to(tdt)
        self.scale = 1.0 / math.sqrt(d)

    def run(self, q=None, query_start=None, seq_lens=None, tables=None, numerics="exact",
            window=None) -> llaisys.Tensor:
        q = self.q if q is None else q
        dev = self.device
        out = nan_filled((q.shape[0], self.H, self.dv), self.dtype, dev)
        llaisys.ops.paged_attention(out, from_torch(q, dev), from_torch(self.k_cache, dev),
                                    from_torch(self.v_cache, dev),
                                    from_torch(self.tables if tables is None else tables, dev),
                                    from_torch(self.seq_lens if seq_lens is None else seq_lens, dev),
                                    from_torch(self.query_start if query_start is None else query_start, dev),
                                    self.scale, numerics, self.window if window is None else window)
        return out

    def expected(self) -> torch.Tensor:
        out = torch.zeros((self.T, self.H, self.dv), dtype=torch.float64)
        for s, (L, _) in enumerate(self.seqs):
            if L:
                a, b = int(self.query_start[s]), int(self.query_start[s + 1])
                out[a:b] = reference(self.q[a:b], self.keys[s], self.values[s], self.scale, self.window)
        return out

    def poison_before_windows(self, margin=63) -> None:
        """NaN in the cache rows more than ``margin`` keys before the window of each sequence's first query
        row (backend.h: a kernel never reads those, its key blocks being at most 64 keys; the expected values
        do not use them)."""
        for s, (L, S) in enumerate(self.seqs):
            first = S - L - self.window + 1
            for j in range(max(0, first - margin)):
                row = (int(self.tables[s, j // self.block_size]), j % self.block_size)
                self.k_cache[row] = self.v_cache[row] = float("nan")


def bits(t: llaisys.Tensor) -> np.ndarray:
    array = t.numpy()
    return array.view({2: np.uint16, 4: np.uint32}[array.dtype.itemsize])


# (sequences as (query rows, keys), H, Hkv, d, dv, block_size)
CASES = {
    "decode_batch": ([(1, 1), (1, 17), (1, 600), (1, 1100)], 6, 2, 32, 32, 16),
    "mixed_prefill_decode": ([(5, 5), (1, 40), (17, 80), (0, 0), (3, 3), (1, 2)], 4, 2, 64, 64, 16),
    "qwen2_1_5b": ([(1, 513), (7, 70), (40, 40)], 12, 2, 128, 128, 16),
    "mha_block1": ([(3, 9), (1, 5)], 3, 3, 32, 32, 1),
    "gqa6_block3_odd_dims": ([(4, 6), (2, 11)], 6, 1, 3, 5, 3),
    "dv_ne_d_block64": ([(9, 130), (1, 64)], 4, 2, 32, 48, 64),
    "chunks_across_tiles": ([(40, 1100), (1, 1537)], 8, 2, 32, 32, 128),
    "many_sequences": ([(1, n) for n in (1, 2, 3, 5, 8, 13, 21, 34, 55, 89)] + [(6, 50)], 2, 1, 16, 16, 4),
}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_matches_reference(device, dtype, case):
    seqs, H, Hkv, d, dv, bs = case
    paged = Paged(seqs, H, Hkv, d, dv, bs, dtype, device, lead=2, tail=3)
    assert_close(paged.run(), paged.expected())  # rows outside every sequence are 0


def test_matches_dense_self_attention(device):
    """Qwen2-1.5B shape, bf16: one sequence through pages == the dense op on the same keys and values."""
    paged = Paged([(5, 300)], 12, 2, 128, 128, 16, llaisys.bfloat16, device, seed=3)
    dense = nan_filled((5, 12, 128), llaisys.bfloat16, device)
    llaisys.ops.self_attention(dense, from_torch(paged.q, device), from_torch(paged.keys[0], device),
                               from_torch(paged.values[0], device), paged.scale)
    assert_close(paged.run(), to_torch(dense).to(torch.float64))


@pytest.mark.parametrize("dtype", [llaisys.bfloat16, llaisys.float16], ids=lambda t: t.name)
def test_hf_numerics_equal_dense_hf_attention_bit_for_bit(device, dtype):
    """numerics="hf": each sequence's rows are exactly the dense op's hf rows over its keys (the rounding of
    HF's attention is tested on the dense op, tests/ops/test_numerics_hf.py); rows outside are 0."""
    if not str(device).startswith("cpu"):
        pytest.skip("numerics='hf' attention in f16 / bf16 is implemented on the CPU only")
    paged = Paged([(1, 700), (12, 12), (30, 530)], 6, 2, 64, 64, 16, dtype, device, seed=9, lead=2, tail=1)
    got = bits(paged.run(numerics="hf"))
    assert not got[:2].any() and not got[-1:].any()
    for s, (L, _) in enumerate(paged.seqs):
        a, b = int(paged.query_start[s]), int(paged.query_start[s + 1])
        dense = nan_filled((L, paged.H, paged.dv), dtype, device)
        llaisys.ops.self_attention(dense, from_torch(paged.q[a:b], device), from_torch(paged.keys[s], device),
                                   from_torch(paged.values[s], device), paged.scale, "hf")
        assert np.array_equal(got[a:b], bits(dense)), f"sequence {s} differs from the dense hf attention"
    assert not np.array_equal(got, bits(paged.run())), "the hf mode must round differently from the exact one"


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda t: t.name)
def test_alone_or_batched_bit_for_bit(device, dtype):
    """Each sequence computed alone gives exactly its rows of the batched call."""
    paged = Paged([(1, 700), (12, 12), (1, 3), (30, 1030), (1, 65)], 6, 2, 64, 64, 16, dtype, device, seed=5)
    batched = bits(paged.run())
    for s in range(len(paged.seqs)):
        a, b = int(paged.query_start[s]), int(paged.query_start[s + 1])
        alone = paged.run(q=paged.q[a:b], query_start=torch.tensor([0, b - a], dtype=torch.int32),
                          seq_lens=paged.seq_lens[s:s + 1], tables=paged.tables[s:s + 1])
        assert np.array_equal(bits(alone), batched[a:b]), f"sequence {s} differs alone and batched"


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda t: t.name)
def test_prefill_in_chunks_bit_for_bit(device, dtype):
    """A prompt prefilled in one call == the same prompt in chunks (each chunk seeing the keys so far)."""
    S = 1100
    paged = Paged([(S, S)], 6, 2, 32, 32, 16, dtype, device, seed=7)
    whole = bits(paged.run())
    for cut in ((0, 1, 2, 9, 600, 1099, S), (0, 513, 1024, 1025, S)):
        for a, b in zip(cut, cut[1:]):
            part = paged.run(q=paged.q[a:b], query_start=torch.tensor([0, b - a], dtype=torch.int32),
                             seq_lens=torch.tensor([b], dtype=torch.int32))
            assert np.array_equal(bits(part), whole[a:b]), f"rows [{a}, {b}) differ from the one-call prefill"


# sliding windows: (sequences as (query rows, keys), H, Hkv, d, dv, block_size, window); windows shorter than a
# cache block, longer than one, than the kernels' key blocks (64) and chunks (512), and than every sequence
WINDOW_CASES = {
    "decode_window_below_block": ([(1, 1), (1, 17), (1, 600), (1, 1100)], 6, 2, 32, 32, 16, 5),
    "window_1_block1": ([(3, 9), (1, 5)], 3, 3, 32, 32, 1, 1),
    "mixed_window_above_block": ([(5, 5), (1, 40), (17, 80), (0, 0), (3, 3), (1, 2)], 4, 2, 64, 64, 16, 24),
    "qwen2_1_5b_window_100": ([(1, 513), (7, 70), (40, 300)], 12, 2, 128, 128, 16, 100),
    "odd_dims_window_4": ([(4, 6), (2, 11)], 6, 1, 3, 5, 3, 4),
    "window_across_chunks": ([(40, 1100), (1, 1537), (300, 1300)], 8, 2, 32, 32, 128, 600),
    "window_beyond_sequences": ([(9, 130), (1, 64)], 4, 2, 32, 48, 64, 4096),
}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("case", WINDOW_CASES.values(), ids=WINDOW_CASES.keys())
def test_window_matches_reference(device, dtype, case):
    """Each query sees its last `window` keys only, and nothing more than 63 keys before its sequence's first
    query's window is read (those rows are NaN here)."""
    seqs, H, Hkv, d, dv, bs, window = case
    paged = Paged(seqs, H, Hkv, d, dv, bs, dtype, device, lead=2, tail=3, window=window)
    expected = paged.expected()
    paged.poison_before_windows()
    assert_close(paged.run(), expected)


def test_window_beyond_the_sequence_is_no_window(device):
    paged = Paged([(9, 130), (1, 700), (30, 30)], 4, 2, 32, 32, 16, llaisys.bfloat16, device, seed=2)
    assert np.array_equal(bits(paged.run(window=700)), bits(paged.run()))
    assert np.array_equal(bits(paged.run(window=None)), bits(paged.run(window=0)))
    assert not np.array_equal(bits(paged.run(window=699)), bits(paged.run())), "the window is ignored?"


@pytest.mark.parametrize("dtype", [llaisys.float32, llaisys.bfloat16], ids=lambda t: t.name)
@pytest.mark.parametrize("window", [7, 100, 700])
def test_window_alone_batched_or_chunked_bit_for_bit(device, dtype, window):
    """With a window as without: a sequence alone gives its rows of the batched call, and a prompt prefilled
    in chunks gives the rows of the one-call prefill."""
    paged = Paged([(1, 1300), (12, 12), (1, 3), (30, 1030), (1, 65)], 6, 2, 64, 64, 16, dtype, device, seed=5,
                  window=window)
    batched = bits(paged.run())
    for s in range(len(paged.seqs)):
        a, b = int(paged.query_start[s]), int(paged.query_start[s + 1])
        alone = paged.run(q=paged.q[a:b], query_start=torch.tensor([0, b - a], dtype=torch.int32),
                          seq_lens=paged.seq_lens[s:s + 1], tables=paged.tables[s:s + 1])
        assert np.array_equal(bits(alone), batched[a:b]), f"sequence {s} differs alone and batched"
    S = 1100
    paged = Paged([(S, S)], 6, 2, 32, 32, 16, dtype, device, seed=7, window=window)
    whole = bits(paged.run())
    for a, b in zip((0, 9, 600, 1025), (9, 600, 1025, S)):
        part = paged.run(q=paged.q[a:b], query_start=torch.tensor([0, b - a], dtype=torch.int32),
                         seq_lens=torch.tensor([b], dtype=torch.int32))
        assert np.array_equal(bits(part), whole[a:b]), f"rows [{a}, {b}) differ from the one-call prefill"


def every_check_on_this_path(device="cpu"):
    """The reference cases and the invariance checks, on whatever SIMD path this process takes."""
    for case in CASES.values():
        for dtype in FLOAT_DTYPES:
            test_matches_reference(llaisys.Device(device), dtype, case)
    for case in WINDOW_CASES.values():
        test_window_matches_reference(llaisys.Device(device), llaisys.bfloat16, case)
    test_alone_or_batched_bit_for_bit(llaisys.Device(device), llaisys.bfloat16)
    test_prefill_in_chunks_bit_for_bit(llaisys.Device(device), llaisys.float32)
    test_window_alone_batched_or_chunked_bit_for_bit(llaisys.Device(device), llaisys.float32, 100)


@pytest.mark.parametrize("level", LEVELS)
def test_simd_paths(device, level):
    skip_unless_level_available(device, level)
    run_under_simd(__name__, level, "t.every_check_on_this_path()")


def decode_bits(device) -> list[int]:
    """The bits of a decode over long caches, without and with a window (of several chunks)."""
    paged = Paged([(1, 2100), (1, 900)], 4, 1, 32, 32, 16, llaisys.bfloat16, device, seed=11)
    return np.concatenate([bits(paged.run()), bits(paged.run(window=1500))]).astype(np.int64).ravel().tolist()


def decode_bits_in_child() -> None:
    """The child (its thread count set by the environment): decode_bits as JSON."""
    print(json.dumps(decode_bits("cpu")))


def test_thread_count_does_not_change_results(device):
    """Decode over long caches splits each tile's key chunks among threads; one thread merges them itself:
    the same bits either way."""
    if device.type != "cpu":
        pytest.skip("the thread count is a CPU setting")
    here = decode_bits(device)
    for threads in ("1", "3"):
        env = {**os.environ, "OMP_NUM_THREADS": threads}
        child = run_in_child(decode_bits_in_child, env=env, check=True)
        assert json.loads(child.stdout) == here, f"OMP_NUM_THREADS={threads} gives other bits"


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda t: t.name)
def test_kv_write(device, dtype):
    g = torch.Generator().manual_seed(1)
    k_cache, k_cache_ref = random((5, 4, 2, 8), dtype, device, g)
    v_cache, v_cache_ref = random((5, 4, 2, 3), dtype, device, g)
    k, k_ref = random((4, 2, 8), dtype, device, g)
    v, v_ref = random((4, 2, 3), dtype, device, g)
    slots = [7, -1, 19, 0]  # block 1 row 3, skipped, block 4 row 3, block 0 row 0
    llaisys.ops.paged_kv_write(k_cache, v_cache, k, v, from_torch(torch.tensor(slots), device))
    for cache, ref, new in ((k_cache, k_cache_ref, k_ref), (v_cache, v_cache_ref, v_ref)):
        want = ref.reshape(20, *ref.shape[2:]).clone()
        for t, slot in enumerate(slots):
            if slot >= 0:
                want[slot] = new[t]
        assert torch.equal(to_torch(cache).to(torch.float64).reshape(want.shape), want)


def test_kv_write_slot_past_the_end_writes_nothing(device):
    k_cache = llaisys.zeros((2, 4, 1, 8), llaisys.float32, device)
    v_cache = llaisys.zeros((2, 4, 1, 8), llaisys.float32, device)
    k = llaisys.from_numpy(np.ones((2, 1, 8), np.float32), device)
    slots = from_torch(torch.tensor([1, 8]), device)
    with pytest.raises(llaisys.LlaisysValueError, match="slot_mapping\\[1\\] = 8 is past the cache's 8 slots"):
        llaisys.ops.paged_kv_write(k_cache, v_cache, k, k, slots)
        llaisys.synchronize(device)  # an asynchronous backend reports what its kernel found here
    assert not k_cache.numpy().any() and not v_cache.numpy().any()


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
    "negative query_start": (dict(query_start=[-1, 2]), "query_start\\[0\\] = -1 is negative", ("query_start", -1)),
}


@pytest.mark.parametrize("bad", BAD_DATA.values(), ids=BAD_DATA.keys())
def test_bad_index_data_raises(device, bad):
    """Data the kernel reads is checked there: a clear error, never a wild read.

    Every backend's error names the array and the bad value; the wording checked in full is the CPU
    backend's (an asynchronous backend reports at the next synchronizing call, in its own words)."""
    change, cpu_message, (array, bad_value) = bad
    args = dict(tables=[[0, 2]], seq_lens=[5], query_start=[0, 3])
    args.update(change)
    dt = llaisys.float32
    out = llaisys.empty((3, 2, 8), dt, device)
    q = llaisys.zeros((3, 2, 8), dt, device)
    cache = llaisys.zeros((3, 4, 1, 8), dt, device)
    i32 = {name: from_torch(torch.tensor(value, dtype=torch.int32), device) for name, value in args.items()}
    with pytest.raises(llaisys.LlaisysValueError) as info:
        llaisys.ops.paged_attention(out, q, cache, cache, i32["tables"], i32["seq_lens"], i32["query_start"], 0.5)
        llaisys.synchronize(device)  # an asynchronous backend reports what its kernel found here
    message = str(info.value)
    assert re.search(rf"\b{array}\b", message) and re.search(rf"(?<![\w-]){bad_value}(?!\w)", message), (
        f"the error does not name {array} and its value {bad_value}: {message}")
    if device.type == "cpu":
        assert re.search(cpu_message, message), message


def _attention_args(device, T=3, H=2, Hkv=1, d=8, dv=8, blocks=3, bs=4, seqs=1, max_blocks=2):
    f32, i32 = llaisys.float32, llaisys.int32
    return dict(out=llaisys.empty((T, H, dv), f32, device), q=llaisys.zeros((T, H, d), f32, device),
                k_cache=llaisys.zeros((blocks, bs, Hkv, d), f32, device),
                v_cache=llaisys.zeros((blocks, bs, Hkv, dv), f32, device),
                block_tables=llaisys.zeros((seqs, max_blocks), i32, device),
                seq_lens=llaisys.zeros((seqs,), i32, device), query_start=llaisys.zeros((seqs + 1,), i32, device),
                scale=0.5)


def test_frontend_checks(device):
    def fails(match, **change):
        args = _attention_args(device)
        args.update(change)
        with pytest.raises(llaisys.LlaisysValueError, match=match):
            llaisys.ops.paged_attention(**args)

    f32, i32, i64 = llaisys.float32, llaisys.int32, llaisys.int64
    fails("q has dtype bfloat16", q=llaisys.zeros((3, 2, 8), llaisys.bfloat16, device))
    fails("k_cache must be 4-d", k_cache=llaisys.zeros((12, 1, 8), f32, device))
    fails("v_cache has shape", v_cache=llaisys.zeros((3, 5, 1, 8), f32, device))
    fails("out has shape", out=llaisys.empty((3, 2, 7), f32, device))
    fails("query heads must be a multiple", q=llaisys.zeros((3, 3, 8), f32, device),
          out=llaisys.empty((3, 3, 8), f32, device), k_cache=llaisys.zeros((3, 4, 2, 8), f32, device),
          v_cache=llaisys.zeros((3, 4, 2, 8), f32, device))
    fails("block_tables has dtype int64", block_tables=llaisys.zeros((1, 2), i64, device))
    fails("seq_lens has shape", seq_lens=llaisys.zeros((2,), i32, device))
    fails("query_start has shape", query_start=llaisys.zeros((1,), i32, device))
    fails("scale must be finite", scale=float("inf"))
    fails("window must be >= 0", window=-1)
    fails("window must be an int", window=2.0)
    fails("window must be an int", window=True)
    fails("must be contiguous", q=llaisys.zeros((2, 3, 8), f32, device).permute(1, 0, 2))
    args = _attention_args(device)
    fails("out and k_cache overlap", out=args["k_cache"].view(12, 1, 8).slice(0, 0, 3).view(3, 1, 8),
          q=llaisys.zeros((3, 1, 8), f32, device), k_cache=args["k_cache"],
          v_cache=llaisys.zeros((3, 4, 1, 8), f32, device), block_tables=args["block_tables"])
    # out may be q itself
    args = _attention_args(device)
    args["q"] = args["out"] = llaisys.zeros((3, 2, 8), f32, device)
    llaisys.ops.paged_attention(**args)


def test_kv_write_frontend_checks(device):
    f32 = llaisys.float32
    cache = llaisys.zeros((2, 4, 1, 8), f32, device)
    k = llaisys.zeros((2, 1, 8), f32, device)
    slots32 = llaisys.zeros((2,), llaisys.int32, device)
    with pytest.raises(llaisys.LlaisysValueError, match="slot_mapping has dtype int32"):
        llaisys.ops.paged_kv_write(cache, llaisys.zeros((2, 4, 1, 8), f32, device), k, k, slots32)
    slots = llaisys.zeros((2,), llaisys.int64, device)
    with pytest.raises(llaisys.LlaisysValueError, match="k_cache and v_cache overlap"):
        llaisys.ops.paged_kv_write(cache, cache, k, k, slots)
    with pytest.raises(llaisys.LlaisysValueError, match="v has shape"):
        llaisys.ops.paged_kv_write(cache, llaisys.zeros((2, 4, 1, 8), f32, device), k,
                                   llaisys.zeros((3, 1, 8), f32, device), slots)


VALUE_LANES = "LLAISYS_CPU_PAGED_VALUE_LANES"  # 0: no value-lanes decode form (read at each call)
# decode rows (one chunk, several chunks, one key) and a sequence of 2 rows (2 G queries: value lanes for G <= 3)
VALUE_LANES_SEQS = [(1, 1100), (1, 37), (1, 1), (1, 600), (2, 70)]


def both_forms(run) -> tuple[np.ndarray, np.ndarray]:
    """The bits of run() with the value-lanes form off, then on."""
    before = os.environ.get(VALUE_LANES)
    try:
        os.environ[VALUE_LANES] = "0"
        off = bits(run())
        os.environ[VALUE_LANES] = "1"
        on = bits(run())
    finally:
        if before is None:
            os.environ.pop(VALUE_LANES, None)
        else:
            os.environ[VALUE_LANES] = before
    return off, on


def run_quantized(paged: Paged, fmt: str, window: int) -> llaisys.Tensor:
    """paged_attention_q over paged's caches quantized as fmt (quantize_kv; its NaN rows get NaN scales)."""
    dev = paged.device
    k, ks = llaisys.ops.quantize_kv(paged.k_cache.to(torch.float32).numpy(), fmt)
    v, vs = llaisys.ops.quantize_kv(paged.v_cache.to(torch.float32).numpy(), fmt)
    out = nan_filled((paged.T, paged.H, paged.dv), paged.dtype, dev)
    llaisys.ops.paged_attention_q(out, from_torch(paged.q, dev), *(llaisys.from_numpy(a, dev) for a in (k, v, ks, vs)),
                                  from_torch(paged.tables, dev), from_torch(paged.seq_lens, dev),
                                  from_torch(paged.query_start, dev), paged.scale, fmt, window)
    return out


def value_lanes_check_on_this_path(device="cpu"):
    """The value-lanes decode form gives the query-lanes form's bits: G = 1..8 (8: never value lanes), each
    dtype, plain and quantized caches, no window and one of 300 keys, odd d / dv, cache blocks of 1 to 64 rows
    (64: f32 values read in place), keys over several chunks (shared among the threads where there are several)."""
    dev, failures = llaisys.Device(device), []
    shapes = ((64, 64, 64), (17, 20, 16), (64, 40, 5), (32, 32, 64), (24, 7, 16), (40, 33, 16), (16, 16, 1))
    for G, (d, dv, block_size) in zip((1, 2, 3, 4, 6, 7, 8), shapes):  # (d, dv, block_size)
        Hkv = 2 if G <= 4 else 1
        for dtype in FLOAT_DTYPES:
            paged = Paged(VALUE_LANES_SEQS, G * Hkv, Hkv, d, dv, block_size, dtype, dev, seed=G)
            runs = {f"window {w}": (lambda w=w, paged=paged: paged.run(window=w)) for w in (0, 300)}
            if G in (3, 4) and dtype != llaisys.float16:
                runs |= {f"{fmt} window {w}": (lambda fmt=fmt, w=w, paged=paged: run_quantized(paged, fmt, w))
                         for fmt in ("int8", "fp8") for w in (0, 300)}
            for name, run in runs.items():
                off, on = both_forms(run)
                if not np.array_equal(off, on):
                    failures.append(f"G={G} {dtype.name} {name}: {np.count_nonzero(off != on)} elements differ")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("level", LEVELS)
def test_value_lanes_form_is_bit_identical(device, level):
    skip_unless_level_available(device, level)
    run_under_simd(__name__, level, "t.value_lanes_check_on_this_path()")
