"""paged_kv_write_q / paged_attention_q of the CUDA sources (ops/paged_attention.cu, ops/kv_quant.cuh): the quantized
paged KV cache (int8 and fp8 e4m3fn bytes, one f16 scale per (token, kv head) row), run on CPU threads (host
execution) at warp 32 and 64 under ASan / UBSan.

The writer must give llaisys.ops.quantize_kv's bytes and scales bit for bit (f32 / f16 / bf16 rows, ties of the
scale's and of the bytes' rounding, saturation, zero, tiny, inf and NaN rows, skipped tokens); attention must match
the float64 attention of the dequantized caches (llaisys.ops.dequantize_kv) within the dtype's tolerance, be
paged_attention's own bits over those caches widened to f32, give each sequence the same bits alone as in the
batch, and never read keys outside its window. Bad slots and bad block ids are reported."""

import math

import numpy as np
import pytest
import torch
from host_exec.device import SlotError

from helpers.host_exec_ops import CODE, check, dtype_ids, randn
from helpers.references.attention import reference as attention_reference
from llaisys.ops import dequantize_kv, quantize_kv

pytestmark = pytest.mark.slow  # compiles the CUDA sources under ASan for host execution (cached; minutes of CPU)
FORMATS = {"int8": 1, "fp8": 2}  # llaisys_kv_format
QMAX = {"int8": 127.0, "fp8": 448.0}


def f16_bits(scales: np.ndarray) -> np.ndarray:
    return np.asarray(scales, np.float16).view(np.uint16)


# ---- paged_kv_write_q ---------------------------------------------------------------------------------------

def special_rows(n: int, kv_format: str, dtype: torch.dtype) -> list[torch.Tensor]:
    """Rows of n values (float64, exact in dtype) at the edges of the format: ties of the bytes' rounding, a zero
    row, tiny rows (a subnormal f16 scale, and one that rounds to 0), saturation, inf and NaN."""
    qmax, s = QMAX[kv_format], 2.0 ** -3  # scale = s exactly when amax = qmax * s
    if kv_format == "int8":  # halves: x / s = k + 0.5 rounds to the even k
        ties = [qmax, 2.5, -3.5, 0.5, -0.5, 1.5, 126.5, -126.5, -0.0]
    else:  # midpoints of e4m3fn's grid, normal and subnormal (2^-9 steps below 2^-6), and 448 itself
        ties = [qmax, -qmax, 1.0625, 1.1875, -13.0, 0.5 * 2 ** -9, 1.5 * 2 ** -9, 7.5 * 2 ** -9, 416.0, -0.0, 3.25]
    tie = torch.tensor((ties * n)[:n], dtype=torch.float64) * s
    tie[0] = qmax * s  # the amax, whatever n
    tiny = 2.0 ** -12 * torch.linspace(-1, 1, n, dtype=torch.float64)  # amax / QMAX: an f16 subnormal scale
    tiny[0] = 2.0 ** -12
    big = torch.linspace(-3e38 if dtype != torch.float16 else -6e4, 6e4, n, dtype=torch.float64)
    big[-1] = 3e38 if dtype != torch.float16 else 65504.0  # amax / QMAX past f16's 65504 (f32, bf16): saturates
    vanishing = torch.full((n,), 2.0 ** -24, dtype=torch.float64)  # f16's smallest: amax / QMAX rounds to scale 0
    rows = [tie, torch.zeros(n, dtype=torch.float64), tiny, vanishing, big]
    with_inf = torch.linspace(-1, 1, n, dtype=torch.float64)
    with_inf[n // 2] = -math.inf
    with_nan = torch.linspace(-1, 1, n, dtype=torch.float64)
    with_nan[n - 1] = math.nan
    return [*rows, with_inf, with_nan]


def f32_scale_ties(n: int, kv_format: str) -> list[torch.Tensor]:
    """f32 rows whose amax / QMAX lies exactly between two f16 values (the scale rounds to the even one)."""
    rows = []
    for mantissa in (1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11):
        row = torch.linspace(-0.5, 0.5, n, dtype=torch.float64) * 2.0 ** -4
        row[0] = QMAX[kv_format] * mantissa * 2.0 ** -4  # exact in f32: 12 bits times 7 (or 3)
        rows.append(row)
    return rows


def write_case(T, Hkv, d, dv, dtype, kv_format, seed, special=True):
    """k [T, Hkv, d], v [T, Hkv, dv] of random rows at many magnitudes, with the special rows mixed in (not into
    token 0's: the tests skip it)."""
    g = torch.Generator().manual_seed(seed)
    magnitudes = 10.0 ** torch.randint(-3, 4, (T, Hkv, 1), generator=g)
    k = torch.randn((T, Hkv, d), generator=g, dtype=torch.float64) * magnitudes
    v = torch.randn((T, Hkv, dv), generator=g, dtype=torch.float64) * magnitudes
    if special:
        extra_k = special_rows(d, kv_format, dtype) + (f32_scale_ties(d, kv_format) if dtype == torch.float32 else [])
        extra_v = special_rows(dv, kv_format, dtype)
        places = [(t, h) for t in range(1, T) for h in range(Hkv)]
        assert len(places) >= max(len(extra_k), len(extra_v)), (T, Hkv)
        for place, row in zip(places, extra_k):
            k[place] = row
        for place, row in zip(reversed(places), extra_v):  # other rows than k's
            v[place] = row
    return k.to(dtype), v.to(dtype)


def write_q(dev, kv_format, k, v, slots, num_slots, caches=None, download=True):
    """paged_kv_write_q into caches (k_cache, v_cache, k_scale, v_scale: fresh sentinel-filled ones if None):
    (the caches before, the caches after: downloaded, or their device buffers)."""
    T, Hkv, d = k.shape
    dv = v.shape[2]
    if caches is None:
        caches = (torch.full((num_slots, Hkv, d), 0xA5, dtype=torch.uint8),
                  torch.full((num_slots, Hkv, dv), 0x5A, dtype=torch.uint8),
                  torch.full((num_slots, Hkv), -7.0, dtype=torch.float16),
                  torch.full((num_slots, Hkv), 3.0, dtype=torch.float16))
    buffers = [dev.upload(c) for c in caches]
    dev.op("paged_kv_write_q", CODE[k.dtype], FORMATS[kv_format], T, Hkv, d, dv, num_slots, *buffers,
           dev.upload(k), dev.upload(v), dev.upload(torch.as_tensor(slots, dtype=torch.int64)))
    return caches, [fetch(dev, b) for b in buffers] if download else buffers


def fetch(dev, buffer):
    return dev.download(buffer) if buffer.nbytes else torch.empty(buffer.shape, dtype=buffer.dtype)


def expected_caches(caches, kv_format, k, v, slots):
    """The caches after a write, from llaisys.ops.quantize_kv (numpy)."""
    k_cache, v_cache, k_scale, v_scale = (c.numpy().copy() for c in caches)
    kq, ks = quantize_kv(k.float().numpy(), kv_format)
    vq, vs = quantize_kv(v.float().numpy(), kv_format)
    for t, slot in enumerate(slots):
        if slot >= 0:
            k_cache[slot], k_scale[slot], v_cache[slot], v_scale[slot] = kq[t], ks[t], vq[t], vs[t]
    return k_cache, v_cache, k_scale, v_scale


def assert_caches_equal(got, want, what):
    names = ("k_cache", "v_cache", "k_scale", "v_scale")
    for name, g, w in zip(names, got, want):
        g = g.numpy()
        if name.endswith("scale"):
            nan = np.isnan(w)  # a NaN in a row: its scale is NaN (whose bits the conversions need not share)
            assert np.array_equal(np.isnan(g), nan), f"{what}: {name} NaN at other rows"
            g, w = f16_bits(np.where(nan, 0, g)), f16_bits(np.where(nan, 0, w))
        bad = np.argwhere(g != w)
        assert not len(bad), f"{what}: {name} differs at {bad[:5].tolist()}: got {g[tuple(bad[0])]} want " \
                             f"{w[tuple(bad[0])]} ({len(bad)} elements)"


# (T, Hkv, d, dv, num_slots): d below, at and past the warp (several values per lane), d != dv, one value per row
WRITES = [(7, 2, 40, 72, 20), (4, 4, 64, 64, 9), (12, 1, 200, 3, 30), (5, 3, 1, 1, 8)]


# (format, dtype, WRITES case): each format in every dtype and every case, not every product (ASan time)
WRITE_RUNS = [("int8", torch.float32, 0), ("int8", torch.float16, 1), ("int8", torch.bfloat16, 2),
              ("int8", torch.float32, 3), ("fp8", torch.float32, 2), ("fp8", torch.float16, 3),
              ("fp8", torch.bfloat16, 0), ("fp8", torch.bfloat16, 1)]


@pytest.mark.parametrize("kv_format,dtype,case", WRITE_RUNS, ids=lambda x: dtype_ids.get(x, str(x)))
def test_write_matches_quantize_kv_bit_for_bit(dev, kv_format, dtype, case):
    T, Hkv, d, dv, num_slots = WRITES[case]
    k, v = write_case(T, Hkv, d, dv, dtype, kv_format, seed=case)
    g = torch.Generator().manual_seed(100 + case)
    slots = torch.randperm(num_slots, generator=g)[:T].tolist()
    slots[0] = -1  # a skipped token: its slot keeps what it held
    caches, got = write_q(dev, kv_format, k, v, slots, num_slots)
    assert_caches_equal(got, expected_caches(caches, kv_format, k, v, slots), f"{kv_format} {WRITES[case]}")


@pytest.mark.parametrize("kv_format", FORMATS)
def test_write_of_every_byte_value(dev, kv_format):
    """Rows holding every value the format can store (times a power of two), and the midpoints between neighbours:
    each encodes to its own byte or to the even neighbour."""
    values = dequantize_kv(np.arange(256, dtype=np.uint8), np.float16(1.0), kv_format).astype(np.float64)
    values = np.unique(values[np.abs(values) <= QMAX[kv_format]])  # (int8's -128 is never written; NaN)
    mids = (values[1:] + values[:-1]) / 2
    row = np.concatenate([values, mids, [QMAX[kv_format]]])  # the amax is QMAX: the scale is 2^-2 exactly
    k = torch.from_numpy(row * 2.0 ** -2).reshape(1, 1, -1).float()
    v = -k
    caches, got = write_q(dev, kv_format, k, v, [0], 1)
    assert_caches_equal(got, expected_caches(caches, kv_format, k, v, [0]), kv_format)
    assert float(got[2][0, 0]) == 0.25


def test_empty_rows_write_zero_scales(dev):
    """d = 0: a row of no keys has amax 0, so its scale is 0 (and the values are written as ever)."""
    k, v = torch.zeros((2, 2, 0)), randn((2, 2, 5), torch.float32, 3)
    caches, got = write_q(dev, "int8", k, v, [3, 0], 4)
    assert_caches_equal(got, expected_caches(caches, "int8", k, v, [3, 0]), "d = 0")
    assert float(got[2][3, 0]) == 0.0


def test_a_slot_past_the_cache_writes_nothing(dev):
    T, Hkv, d, dv, num_slots = 5, 2, 8, 12, 24
    k, v = write_case(T, Hkv, d, dv, torch.float16, "fp8", seed=5, special=False)
    caches, buffers = write_q(dev, "fp8", k, v, [1, 2, 24, 3, 4], num_slots, download=False)
    with pytest.raises(SlotError) as info:
        dev.synchronize()
    assert info.value.status == 1, info.value.message
    assert "paged_kv_write_q: slot_mapping[2] = 24 is past the cache's 24 slots" in info.value.message
    assert_caches_equal([fetch(dev, b) for b in buffers], [c.numpy() for c in caches], "after a bad slot")


def test_an_unknown_format_is_refused(dev):
    k = torch.ones((1, 1, 4))
    status, message, _ = dev.call("paged_kv_write_q", 0, None, 0, 3, 1, 1, 4, 4, 2, *(dev.upload(k).ptr,) * 7,
                                  check=False)
    assert status == 1 and "kv_format 3" in message, message


# ---- paged_attention_q ----------------------------------------------------------------------------------------

class QuantBatch:
    """A batch of sequences over shuffled blocks of quantized caches (made by quantize_kv from random rows), with
    the dense dequantized keys and values of each sequence for the reference. lens: (L, S) per sequence;
    extra_rows past the last sequence belong to none."""

    def __init__(self, dev, dtype, kv_format, lens, H, Hkv, d, dv, block_size, extra_rows=0, seed=30):
        g = torch.Generator().manual_seed(seed)
        self.dev, self.dtype, self.kv_format, self.lens = dev, dtype, kv_format, lens
        need = [-(-S // block_size) for _, S in lens]
        num_blocks, max_blocks = sum(need) + 2, max(need + [1])
        # rows of several magnitudes (so of several scales), within what f32 attention keeps to its tolerance
        magnitudes = 2.0 ** torch.randint(-1, 2, (num_blocks, block_size, Hkv, 1), generator=g)
        k = torch.randn((num_blocks, block_size, Hkv, d), generator=g, dtype=torch.float64) * magnitudes
        v = torch.randn((num_blocks, block_size, Hkv, dv), generator=g, dtype=torch.float64) * magnitudes
        self.k_cache, self.k_scale = quantize_kv(k.float().numpy(), kv_format)
        self.v_cache, self.v_scale = quantize_kv(v.float().numpy(), kv_format)
        k_deq = torch.from_numpy(dequantize_kv(self.k_cache, self.k_scale, kv_format))
        v_deq = torch.from_numpy(dequantize_kv(self.v_cache, self.v_scale, kv_format))
        self.k_deq, self.v_deq = k_deq, v_deq
        order = torch.randperm(num_blocks, generator=g).tolist()
        self.tables = torch.zeros((len(lens), max_blocks), dtype=torch.int32)
        self.dense, self.rows = [], []
        for s, (_, S) in enumerate(lens):
            blocks = [order.pop() for _ in range(need[s])]
            self.tables[s, :len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
            rows = [(blocks[j // block_size], j % block_size) for j in range(S)]
            self.rows.append(rows)
            self.dense.append((k_deq[tuple(zip(*rows))], v_deq[tuple(zip(*rows))]))  # [S, Hkv, d | dv]
        self.starts = torch.tensor([0] + [L for L, _ in lens], dtype=torch.int32).cumsum(0).to(torch.int32)
        T = int(self.starts[-1]) + extra_rows
        self.q = randn((T, H, d), dtype, seed + 2)
        self.args = (T, len(lens), H, Hkv, d, dv, num_blocks, block_size, max_blocks)
        self.seq_lens = torch.tensor([S for _, S in lens], dtype=torch.int32)

    def caches(self):
        return (self.dev.upload(torch.from_numpy(self.k_cache)), self.dev.upload(torch.from_numpy(self.v_cache)),
                self.dev.upload(torch.from_numpy(self.k_scale)), self.dev.upload(torch.from_numpy(self.v_scale)))

    def index(self, tables=None, seq_lens=None, starts=None):
        return tuple(self.dev.upload(x) for x in (self.tables if tables is None else tables,
                                                  self.seq_lens if seq_lens is None else seq_lens,
                                                  self.starts if starts is None else starts))

    def attention(self, scale, window=0, caches=None, q=None, args=None, index=None):
        args = self.args if args is None else args
        T, H, dv = args[0], args[2], args[5]
        out = self.dev.empty((T, H, dv), self.dtype)
        self.dev.op("paged_attention_q", CODE[self.dtype], FORMATS[self.kv_format], *args, window, scale, out,
                    self.dev.upload(self.q if q is None else q), *(caches or self.caches()), *(index or self.index()))
        return self.dev.download(out)

    def check(self, got, scale, window=0):
        for s, (L, _) in enumerate(self.lens):
            rows = slice(int(self.starts[s]), int(self.starts[s + 1]))
            if L:
                check(got[rows], attention_reference(self.q[rows], *self.dense[s], scale, window), self.dtype)
        assert (got[int(self.starts[-1]):] == 0).all()  # rows outside every sequence


# (L, S) per sequence: decode rows, a chunk of a prompt, a sequence without rows (padding), keys over several
# tiles of 64, a partial last block; (H, Hkv, d, dv)
PAGED = [
    ([(1, 5), (4, 17), (0, 9), (1, 1)], (4, 2, 16, 16), 4),  # decode and prefill rows, GQA 2
    ([(1, 150), (3, 3), (2, 70)], (6, 2, 8, 12), 16),  # keys over several tiles, dv != d
    ([(2, 33)], (12, 2, 64, 64), 8),  # G = 6 heads of 64 share a kv head
    ([(5, 5), (1, 40)], (3, 1, 24, 40), 8),  # a whole prompt, MQA, dv > d
]


# (format, dtype, PAGED case): every case, format and dtype once (ASan time)
ATTENTION_RUNS = [("int8", torch.float32, 1), ("int8", torch.bfloat16, 2), ("fp8", torch.float16, 0),
                  ("fp8", torch.bfloat16, 3)]


@pytest.mark.parametrize("kv_format,dtype,case", ATTENTION_RUNS, ids=lambda x: dtype_ids.get(x, str(x)))
def test_attention_matches_the_dequantized_reference(dev, kv_format, dtype, case):
    lens, (H, Hkv, d, dv), block_size = PAGED[case]
    batch = QuantBatch(dev, dtype, kv_format, lens, H, Hkv, d, dv, block_size, extra_rows=2, seed=30 + case)
    scale = 1 / math.sqrt(d)
    batch.check(batch.attention(scale), scale)


@pytest.mark.parametrize("kv_format,case", [("int8", 1), ("fp8", 0)])
def test_attention_is_paged_attentions_over_the_widened_caches(dev, kv_format, case):
    """In f32, paged_attention over f32 caches holding decode(b) * scale gives the same bits: one kernel body."""
    lens, (H, Hkv, d, dv), block_size = PAGED[case]
    batch = QuantBatch(dev, torch.float32, kv_format, lens, H, Hkv, d, dv, block_size, extra_rows=1, seed=50 + case)
    got = batch.attention(0.3)
    out = dev.empty(got.shape, torch.float32)
    dev.op("paged_attention", CODE[torch.float32], 0, *batch.args, 0, 0.3, out, dev.upload(batch.q),
           dev.upload(batch.k_deq), dev.upload(batch.v_deq), *batch.index())
    assert torch.equal(dev.download(out).view(torch.int32), got.view(torch.int32))


# sliding windows: longer than a cache block and shorter than a tile of 64 keys; G = 6 heads of 64
WINDOWS = [("int8", torch.bfloat16, 1, 40), ("fp8", torch.float32, 2, 7)]  # (format, dtype, PAGED case, window)


@pytest.mark.parametrize("kv_format,dtype,case,window", WINDOWS, ids=lambda x: dtype_ids.get(x, str(x)))
def test_attention_window_reads_only_its_keys(dev, kv_format, dtype, case, window):
    """The scales of keys before each query's window hold NaN: they must not be read at all."""
    lens, (H, Hkv, d, dv), block_size = PAGED[case]
    batch = QuantBatch(dev, dtype, kv_format, lens, H, Hkv, d, dv, block_size, extra_rows=2, seed=70 + case)
    for s, (L, S) in enumerate(lens):  # NaN wherever no query of the sequence looks
        for j in range(max(0, S - L - window + 1)):
            batch.k_scale[batch.rows[s][j]] = np.nan
            batch.v_scale[batch.rows[s][j]] = np.nan
    scale = 1 / math.sqrt(d)
    batch.check(batch.attention(scale, window), scale, window)


@pytest.mark.parametrize("kv_format", FORMATS)
def test_a_sequence_alone_or_batched_bit_for_bit(dev, kv_format):
    """A sequence's rows do not depend on the other sequences of the batch nor on where its blocks lie."""
    dt = torch.bfloat16
    lens, (H, Hkv, d, dv), bs = PAGED[1]
    batch = QuantBatch(dev, dt, kv_format, lens, H, Hkv, d, dv, bs)
    batched = batch.attention(0.3)
    i32 = lambda *values: torch.tensor(values, dtype=torch.int32)  # noqa: E731
    for s, (L, S) in enumerate(lens):
        nb = -(-S // bs)
        blocks = batch.tables[s, :nb].tolist()  # the sequence's blocks copied to 0, 1, ... in order
        caches = [dev.upload(torch.from_numpy(np.ascontiguousarray(c[blocks])))
                  for c in (batch.k_cache, batch.v_cache, batch.k_scale, batch.v_scale)]
        rows = slice(int(batch.starts[s]), int(batch.starts[s + 1]))
        alone = batch.attention(0.3, caches=caches, q=batch.q[rows], args=(L, 1, H, Hkv, d, dv, nb, bs, nb),
                                index=tuple(dev.upload(x) for x in (i32(*range(nb)), i32(S), i32(0, L))))
        assert torch.equal(alone.view(torch.int16), batched[rows].view(torch.int16)), f"sequence {s}"


@pytest.mark.parametrize("case,named", [("block id", "paged_attention_q: block_tables entry 7 = 99 is not a block"),
                                        ("seq_len", "paged_attention_q: seq_lens[1] = 40"),
                                        ("query_start", "paged_attention_q: query_start[3] = 9")])
def test_bad_index_data_is_reported(dev, case, named):
    lens, (H, Hkv, d, dv), bs = PAGED[0]
    batch = QuantBatch(dev, torch.float32, "int8", lens, H, Hkv, d, dv, bs)
    tables, seq_lens, starts = None, None, None
    if case == "block id":
        tables = batch.tables.clone()
        tables[1, 2] = 99  # entry 1 * max_blocks + 2
    elif case == "seq_len":
        seq_lens = torch.tensor([5, 40, 9, 1], dtype=torch.int32)  # past max_blocks * block_size
    else:
        starts = torch.tensor([0, 1, 5, 9, 6], dtype=torch.int32)  # not ascending
    with pytest.raises(SlotError) as info:
        batch.attention(0.25, index=batch.index(tables, seq_lens, starts))
    assert info.value.status == 1 and named in info.value.message, info.value.message
    assert batch.args[8] == 5  # max_blocks: block_tables entry 7 is [1, 2]


def test_write_then_attend(dev):
    """The kernels together: k and v written by paged_kv_write_q, then read by paged_attention_q, against the
    reference over quantize_kv's caches."""
    T, H, Hkv, d, dv, bs, num_blocks = 9, 4, 2, 32, 16, 4, 4
    k, v = write_case(T, Hkv, d, dv, torch.float16, "fp8", seed=11, special=False)
    slots = [4, 5, 6, 7, 0, 1, 2, 3, 12]  # blocks 1, 0, 3 in order
    empty = (torch.zeros((num_blocks * bs, Hkv, d), dtype=torch.uint8),
             torch.zeros((num_blocks * bs, Hkv, dv), dtype=torch.uint8),
             torch.zeros((num_blocks * bs, Hkv), dtype=torch.float16),
             torch.zeros((num_blocks * bs, Hkv), dtype=torch.float16))
    _, written = write_q(dev, "fp8", k, v, slots, num_blocks * bs, empty)
    q = randn((3, H, d), torch.float16, 12)
    out = dev.empty((3, H, dv), torch.float16)
    shaped = [c.reshape(num_blocks, bs, *c.shape[1:]) for c in written]
    dev.op("paged_attention_q", CODE[torch.float16], FORMATS["fp8"], 3, 1, H, Hkv, d, dv, num_blocks, bs, 3, 0, 0.2,
           out, dev.upload(q), *(dev.upload(c) for c in shaped),
           *(dev.upload(torch.tensor(x, dtype=torch.int32)) for x in ([1, 0, 3], [T], [0, 3])))
    kq, ks = quantize_kv(k.float().numpy(), "fp8")
    vq, vs = quantize_kv(v.float().numpy(), "fp8")
    dense = torch.from_numpy(dequantize_kv(kq, ks, "fp8")), torch.from_numpy(dequantize_kv(vq, vs, "fp8"))
    check(dev.download(out), attention_reference(q, *dense, 0.2), torch.float16)
