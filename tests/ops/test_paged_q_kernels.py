"""ops.paged_kv_write_q and ops.paged_attention_q: the kernels over a quantized paged KV cache.

The write must give the bytes and f16 scales of ``quantize_kv`` bit for bit (rounding ties, saturation at
+-QMAX, zero and tiny rows, every e4m3 value and the midpoints between them), for f32, f16 and bf16 rows.
The attention must match a float64 attention over ``dequantize_kv``'s keys and values, equal bit for bit the
plain kernel over an f32 cache holding those same values (q and out f32: the kernels share one body and only
the cache reader differs), and keep paged_attention's batch invariance and index checks.
"""

from __future__ import annotations

import math
import re

import ml_dtypes
import numpy as np
import pytest

import llaisys
from helpers import skip_without_kernels
from helpers.simd_paths import LEVELS, run_under_simd, skip_unless_level_available
from llaisys.ops import dequantize_kv, quantize_kv
from llaisys.testing.references import attention

FORMATS = ["int8", "fp8"]
QMAX = {"int8": 127.0, "fp8": 448.0}
NP_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
TOL = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 1.6e-2}  # out's rounding, relative to the largest value


@pytest.fixture(autouse=True)
def _device_has_the_kernels(request):
    if "device" in request.fixturenames:
        skip_without_kernels(request.getfixturevalue("device"), ("paged_attention_q", "paged_kv_write_q"),
                             "this test")


def bits(x: np.ndarray) -> np.ndarray:
    return x.view(np.uint32 if x.dtype.itemsize == 4 else np.uint16)


def write_q(k: np.ndarray, v: np.ndarray, slots, num_blocks: int, block_size: int, fmt: str, device,
            fill: int = 0xA5):
    """paged_kv_write_q of rows k [T, Hkv, d] and v [T, Hkv, dv] into caches prefilled with `fill` bytes and
    scales 7.0; returns the four host arrays (caches [blocks, bs, Hkv, d | dv], scales [blocks, bs, Hkv])."""
    Hkv, d, dv = k.shape[1], k.shape[2], v.shape[2]
    caches = [llaisys.from_numpy(np.full((num_blocks, block_size, Hkv, n), fill, np.uint8), device) for n in (d, dv)]
    scales = [llaisys.from_numpy(np.full((num_blocks, block_size, Hkv), 7.0, np.float16), device) for _ in "kv"]
    llaisys.ops.paged_kv_write_q(*caches, *scales, llaisys.from_numpy(k, device), llaisys.from_numpy(v, device),
                                 llaisys.from_numpy(np.asarray(slots, np.int64), device), fmt)
    return [t.numpy() for t in (*caches, *scales)]


def special_rows(fmt: str, dtype: str, d: int = 32) -> np.ndarray:
    """Rows [n, d] of `dtype` that probe the rules' corners (each row is quantized on its own)."""
    qmax, rng = QMAX[fmt], np.random.default_rng(3)
    rows = [rng.standard_normal(d) * 10.0 ** rng.integers(-3, 3) for _ in range(24)]  # plain rows
    rows.append(np.zeros(d))                                  # all zeros: scale 0, zero bytes
    rows.append(np.full(d, -0.0))                             # negative zeros
    rows.append(rng.standard_normal(d) * 1e-9)                # amax / QMAX rounds to an f16 zero
    for amax in (1e-6, 3e-5, 2e-4, 1e-3):                     # f16 subnormal scales
        rows.append(np.clip(rng.standard_normal(d), -1, 1) * amax)
    ties = np.arange(d) - d / 2 + 0.5                         # scale 1 (amax = QMAX): x / 1 = k + 0.5
    ties[0] = qmax
    rows.append(ties)
    rows.append(-ties)
    for ratio in (1.0002, 0.9997, 1.0004, 1.5001):            # f16(amax / QMAX) rounds down: x / s past QMAX clamps
        r = rng.uniform(-1, 1, d) * qmax * ratio
        r[:3] = (qmax * ratio, -qmax * ratio, qmax * ratio * 0.99)
        rows.append(r)
    if dtype != "float16":                                    # past f16's largest scale: saturate at 65504
        rows.append(rng.uniform(-1, 1, d) * qmax * 65504 * 4)
    x = np.stack(rows).astype(NP_DTYPES[dtype])
    return x


def e4m3_rows(dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Rows of scale 1 (each holds 448) covering every finite e4m3 value, and every midpoint between
    neighbours (ties to even), both signs; and the codes of the representable ones."""
    codes = np.array([b for b in range(256) if (b & 0x7F) != 0x7F], np.uint8)
    values = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    positive = np.unique(np.abs(values))
    mids = (positive[:-1] + positive[1:]) / 2
    stream = np.concatenate([values, mids, -mids])
    d = 32
    n = -(-len(stream) // (d - 1))
    stream = np.concatenate([stream, np.zeros(n * (d - 1) - len(stream))]).reshape(n, d - 1)
    rows = np.concatenate([np.full((n, 1), 448.0), stream], axis=1).astype(NP_DTYPES[dtype])
    return rows, codes


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", list(NP_DTYPES))
def test_write_bits_equal_quantize_kv(device, fmt, dtype):
    rows = special_rows(fmt, dtype)
    if fmt == "fp8":
        rows = np.concatenate([rows, e4m3_rows(dtype)[0]])
    # k: rows as 2 kv heads of d = 32; v: the same rows cut to d = 16 (another amax per row)
    T = len(rows) // 2 * 2
    k = rows[:T].reshape(T // 2, 2, 32)
    v = rows[:T, :16].reshape(T // 2, 2, 16)[::-1].copy()
    n, bs = k.shape[0], 4
    blocks = -(-n // bs) + 2
    slots = np.random.default_rng(0).permutation(blocks * bs)[:n]
    slots[1] = -1  # skipped
    kc, vc, ks, vs = write_q(k, v, slots, blocks, bs, fmt, device)
    for cache, scale, x in ((kc, ks, k), (vc, vs, v)):
        want_bytes, want_scale = quantize_kv(x, fmt)
        flat_c, flat_s = cache.reshape(blocks * bs, *cache.shape[2:]), scale.reshape(blocks * bs, -1)
        untouched = np.setdiff1d(np.arange(blocks * bs), slots[slots >= 0])
        assert (flat_c[untouched] == 0xA5).all() and (flat_s[untouched] == 7.0).all()
        for t, slot in enumerate(slots):
            if slot < 0:
                continue
            assert np.array_equal(bits(flat_s[slot]), bits(want_scale[t])), (t, flat_s[slot], want_scale[t])
            assert np.array_equal(flat_c[slot], want_bytes[t]), (t, flat_c[slot], want_bytes[t])


def test_e4m3_encodes_every_value_and_rounds_midpoints_to_even(device):
    """Against the format itself (not only quantize_kv): each finite e4m3 value gets its own code."""
    rows, codes = e4m3_rows("float32")
    kc, _, ks, _ = write_q(rows[:, None, :], rows[:, None, :], np.arange(len(rows)), len(rows), 1, "fp8", device)
    assert (ks == 1.0).all()
    got = kc.reshape(len(rows), -1)[:, 1:].ravel()
    assert np.array_equal(got[:len(codes)], codes)
    mids = got[len(codes):len(codes) + 2 * 126].reshape(2, 126)  # +mid, -mid per pair of positive neighbours
    even = lambda lo, hi: np.where(lo % 2 == 0, lo, hi)          # noqa: E731 (the code with the even mantissa)
    lo = np.arange(126, dtype=np.uint8)
    assert np.array_equal(mids[0], even(lo, lo + 1))
    assert np.array_equal(mids[1], even(lo, lo + 1) | 0x80)


def test_int8_ties_round_to_even(device):
    row = np.array([127, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -126.5, 3.49, -3.51, 0], np.float32)
    kc, _, ks, _ = write_q(row[None, None], row[None, None], [0], 1, 1, "int8", device)
    assert ks.ravel()[0] == 1.0
    assert kc.ravel().view(np.int8).tolist() == [127, 0, 2, 2, 0, -2, -2, 126, -126, 3, -4, 0]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("scale", [1.0, 3.1e-5, 65504.0])  # (an f16 subnormal scale, the largest)
def test_every_byte_decodes_as_dequantize_kv(device, fmt, scale):
    """One key, values = the 256 bytes: the output is the value row itself (weight 1), decoded in the kernel
    (up to the sign of zero: P V's sum starts at +0)."""
    codes = np.arange(256, dtype=np.uint8)
    kc = np.zeros((1, 1, 1, 4), np.uint8)
    vc = codes.reshape(1, 1, 1, 256)
    ks, vs = np.ones((1, 1, 1), np.float16), np.full((1, 1, 1), scale, np.float16)
    out = llaisys.from_numpy(np.full((1, 1, 256), np.nan, np.float32), device)
    arrays = (np.ones((1, 1, 4), np.float32), kc, vc, ks, vs, np.zeros((1, 1), np.int32), np.ones(1, np.int32),
              np.array([0, 1], np.int32))
    llaisys.ops.paged_attention_q(out, *(llaisys.from_numpy(a, device) for a in arrays), 0.5, fmt)
    got, want = out.numpy().ravel(), dequantize_kv(vc, vs, fmt).ravel()
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan], want[~nan])


def test_write_slot_past_the_end_writes_nothing(device):
    k = np.ones((2, 1, 8), np.float32)
    kc = llaisys.zeros((2, 4, 1, 8), llaisys.uint8, device)
    ks = llaisys.zeros((2, 4, 1), llaisys.float16, device)
    vc, vs = llaisys.zeros((2, 4, 1, 8), llaisys.uint8, device), llaisys.zeros((2, 4, 1), llaisys.float16, device)
    with pytest.raises(llaisys.LlaisysValueError, match="slot_mapping\\[1\\] = 8 is past the cache's 8 slots"):
        llaisys.ops.paged_kv_write_q(kc, vc, ks, vs, llaisys.from_numpy(k, device), llaisys.from_numpy(k, device),
                                     llaisys.from_numpy(np.array([1, 8], np.int64), device), "int8")
        llaisys.synchronize(device)
    assert not any(t.numpy().any() for t in (kc, vc, ks, vs))


class PagedQ:
    """A random batch written with paged_kv_write_q into a shuffled block pool (unused rows: byte 0x7f and
    scale NaN, so that a read of a wrong row shows); keeps the dequantized keys and values of each sequence."""

    def __init__(self, seqs, H, Hkv, d, dv, block_size, dtype, fmt, device, seed=0, window=0, spare_blocks=2):
        rng = np.random.default_rng(seed)
        self.seqs, self.H, self.Hkv, self.dv, self.fmt, self.device = seqs, H, Hkv, dv, fmt, device
        self.window, self.dtype = window, dtype
        counts = [-(-S // block_size) for _, S in seqs]
        num_blocks = sum(counts) + spare_blocks
        order = rng.permutation(num_blocks)
        self.tables = np.zeros((len(seqs), max(counts + [1])), np.int32)
        slots, k_rows, v_rows, starts = [], [], [], [0]
        for s, ((L, S), n) in enumerate(zip(seqs, counts)):
            blocks, order = order[:n], order[n:]
            self.tables[s, :n] = blocks
            k_rows.append(rng.standard_normal((S, Hkv, d)) * rng.uniform(0.5, 3, (S, Hkv, 1)))
            v_rows.append(rng.standard_normal((S, Hkv, dv)))
            slots += [blocks[j // block_size] * block_size + j % block_size for j in range(S)]
            starts.append(starts[-1] + L)
        k = np.concatenate(k_rows).astype(NP_DTYPES[dtype])
        v = np.concatenate(v_rows).astype(NP_DTYPES[dtype])
        self.kc, self.vc, self.ks, self.vs = write_q(k, v, slots, num_blocks, block_size, fmt, device, fill=0x7F)
        for scale in (self.ks, self.vs):  # the rows no token was written to
            flat = scale.reshape(num_blocks * block_size, Hkv)
            flat[np.setdiff1d(np.arange(len(flat)), slots)] = np.nan
        self.keys, self.values = [], []
        for s, (_, S) in enumerate(seqs):
            rows = [self.tables[s, j // block_size] * block_size + j % block_size for j in range(S)]
            self.keys.append(dequantize_kv(self.kc.reshape(-1, Hkv, d)[rows], self.ks.reshape(-1, Hkv)[rows], fmt))
            self.values.append(dequantize_kv(self.vc.reshape(-1, Hkv, dv)[rows], self.vs.reshape(-1, Hkv)[rows], fmt))
        self.query_start = np.array(starts, np.int32)
        self.seq_lens = np.array([S for _, S in seqs], np.int32)
        self.q = rng.standard_normal((starts[-1], H, d)).astype(NP_DTYPES[dtype])
        self.scale = 1.0 / math.sqrt(d)

    def run(self, q=None, query_start=None, seq_lens=None, tables=None, window=None) -> np.ndarray:
        dev = self.device
        q = self.q if q is None else q
        out = llaisys.from_numpy(np.full((q.shape[0], self.H, self.dv), np.nan, NP_DTYPES[self.dtype]), dev)
        arrays = (q, self.kc, self.vc, self.ks, self.vs, self.tables if tables is None else tables,
                  self.seq_lens if seq_lens is None else seq_lens,
                  self.query_start if query_start is None else query_start)
        llaisys.ops.paged_attention_q(out, *(llaisys.from_numpy(a, dev) for a in arrays), self.scale, self.fmt,
                                      self.window if window is None else window)
        return out.numpy()

    def run_plain_f32(self) -> np.ndarray:
        """The plain paged_attention over f32 caches holding the dequantized values, in the same blocks."""
        dev = self.device
        kf = dequantize_kv(self.kc, self.ks, self.fmt)
        vf = dequantize_kv(self.vc, self.vs, self.fmt)
        out = llaisys.from_numpy(np.full((self.q.shape[0], self.H, self.dv), np.nan, np.float32), dev)
        args = (self.q, kf, vf, self.tables, self.seq_lens, self.query_start)
        llaisys.ops.paged_attention(out, *(llaisys.from_numpy(a, dev) for a in args), self.scale, "exact",
                                    self.window)
        return out.numpy()

    def reference(self) -> np.ndarray:
        parts = []
        for s in range(len(self.seqs)):
            q = self.q[self.query_start[s]:self.query_start[s + 1]].astype(np.float64)
            parts.append(attention(q, self.keys[s].astype(np.float64), self.values[s].astype(np.float64),
                                   self.scale, self.window))
        return np.concatenate(parts)


# (seqs [(query rows L, keys S)], H, Hkv, d, dv, block_size, window)
CASES = {
    "decode": ([(1, 37), (1, 5), (1, 600), (1, 1)], 6, 2, 32, 32, 16, 0),
    "decode-gqa3-dv": ([(1, 70), (1, 129)], 9, 3, 64, 24, 1, 0),
    "prefill": ([(23, 23), (9, 40), (1, 17)], 4, 1, 16, 16, 16, 0),
    "prefill-bs1-dv": ([(12, 12), (5, 30)], 4, 2, 24, 40, 1, 0),
    "window": ([(30, 90), (1, 700), (1, 20)], 6, 3, 32, 32, 16, 25),
}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("dtype", list(NP_DTYPES))
def test_attention_matches_reference(device, dtype, case, fmt):
    seqs, H, Hkv, d, dv, bs, window = case
    paged = PagedQ(seqs, H, Hkv, d, dv, bs, dtype, fmt, device, window=window)
    got, want = paged.run().astype(np.float64), paged.reference()
    assert np.isfinite(got).all()
    err = np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)
    assert err <= TOL[dtype], f"relative error {err:.3g}"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_attention_equals_the_plain_kernel_on_dequantized_f32(device, case, fmt):
    seqs, H, Hkv, d, dv, bs, window = case
    paged = PagedQ(seqs, H, Hkv, d, dv, bs, "float32", fmt, device, seed=5, window=window)
    assert np.array_equal(bits(paged.run()), bits(paged.run_plain_f32()))


@pytest.mark.parametrize("dtype", list(NP_DTYPES))
def test_each_sequence_alone_equals_the_batch(device, dtype):
    seqs = [(1, 300), (7, 33), (1, 1), (16, 16), (1, 1100)]
    paged = PagedQ(seqs, 6, 2, 32, 16, 16, dtype, "fp8", device, seed=2, window=0)
    whole = bits(paged.run())
    for s, (L, S) in enumerate(seqs):
        a, b = paged.query_start[s], paged.query_start[s + 1]
        alone = paged.run(q=paged.q[a:b], query_start=np.array([0, L], np.int32),
                          seq_lens=np.array([S], np.int32), tables=paged.tables[s:s + 1])
        assert np.array_equal(bits(alone), whole[a:b]), f"sequence {s} alone differs from its rows in the batch"


@pytest.mark.parametrize("bad", [9, -1])
def test_bad_block_ids_are_refused(device, bad):
    paged = PagedQ([(3, 5)], 2, 1, 8, 8, 4, "float32", "int8", device)
    tables = paged.tables.copy()
    tables[0, 1] = bad
    with pytest.raises(llaisys.LlaisysValueError) as info:
        paged.run(tables=tables)
        llaisys.synchronize(device)
    assert re.search(rf"block_tables\b.*(?<![\w-]){bad}(?!\w)", str(info.value)), str(info.value)


def every_check_on_this_path(device="cpu"):
    """The bit-exact writes, the reference cases and the invariance, on whatever SIMD path this process takes."""
    dev = llaisys.Device(device)
    for fmt in FORMATS:
        test_write_bits_equal_quantize_kv(dev, fmt, "bfloat16")
        for case in CASES.values():
            test_attention_matches_reference(dev, "float16", case, fmt)
            test_attention_equals_the_plain_kernel_on_dequantized_f32(dev, case, fmt)
    test_e4m3_encodes_every_value_and_rounds_midpoints_to_even(dev)
    for fmt in FORMATS:
        test_every_byte_decodes_as_dequantize_kv(dev, fmt, 3.1e-5)
    test_each_sequence_alone_equals_the_batch(dev, "bfloat16")


@pytest.mark.parametrize("level", LEVELS)
def test_simd_paths(device, level):
    skip_unless_level_available(device, level)
    run_under_simd(__name__, level, "t.every_check_on_this_path()")
