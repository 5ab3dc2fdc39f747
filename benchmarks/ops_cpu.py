"""Every llaisys op on the CPU against torch, at the Qwen2-1.5B shapes of one decode step and a 512-token prefill.

    python benchmarks/ops_cpu.py                         # all ops, f32 and bf16
    python benchmarks/ops_cpu.py --ops linear --dtype bf16 --quick
    python benchmarks/ops_cpu.py --threads 1               # both sides on one thread
    python benchmarks/ops_cpu.py --omp-wait-policy passive # on a machine shared with other work
    python benchmarks/ops_cpu.py --ops linear_i8 --threads 2  # int8 weights vs bf16 (llaisys, torch) at decode
    python benchmarks/ops_cpu.py --ops paged_attention     # decode over 8192 keys: a 1024-key window vs none

Prints one row per (op, shape, dtype): llaisys ms, torch ms and ratio = torch / llaisys (> 1: llaisys is
faster), each the median of several timed calls after warm-up, llaisys and torch timed in alternating
rounds so that noise from other processes hits both. Both use every core (torch.set_num_threads(
os.cpu_count()); OMP_NUM_THREADS is left as it is). llaisys tensors are zero-copy views (DLPack) of the
torch inputs, so both read the same memory; outputs are preallocated on both sides where torch allows it.

Decode linears also report the weight-read bandwidth (weight bytes / time) next to this machine's read
bandwidth measured at start-up (a large multi-threaded sum); their weights rotate over enough copies to
exceed the last-level cache, as in a real decode step where every layer's weights come from DRAM.
Prefill linears report GFLOP/s. An op whose kernel the CPU backend does not export (yet) shows "n/a".
linear_i8 has its own table (decode only): int8 weights against the same shapes in bf16 through llaisys'
linear and torch, each side's weight GB/s, and int8's fraction of the measured read bandwidth.
paged_attention has its own table too: a decode step over a paged cache of 8192 keys with a sliding window of
1024 (Gemma 3's, Mistral's) against no window, both llaisys, and torch's sdpa with HF's sliding-window mask over
all 8192 keys and over the last 1024 only; ratio = no window / window (the keys before the window are skipped).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import ml_dtypes
import numpy as np
import torch
import torch.nn.functional as F

import llaisys

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB = 1536, 12, 2, 128, 8960, 151936
PREFILL = 512
ROPE_THETA, RMS_EPS = 1e6, 1e-6
TORCH = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
LINEARS = [  # name, N (out features), K (in features)
    ("q/o_proj", HIDDEN, HIDDEN),
    ("k/v_proj", KV_HEADS * HEAD_DIM, HIDDEN),
    ("gate/up_proj", INTER, HIDDEN),
    ("down_proj", HIDDEN, INTER),
    ("lm_head", VOCAB, HIDDEN),
]
ALL_OPS = ["linear", "linear_i8", "self_attention", "add", "rms_norm", "rope", "swiglu", "embedding", "argmax", "sample",
           "paged_attention"]
WINDOW_KEYS, WINDOW = 8192, 1024  # paged_attention: a decode step's keys, the sliding window


def lt(t: torch.Tensor) -> llaisys.Tensor:
    """A llaisys view of a torch CPU tensor (no copy)."""
    return llaisys.from_dlpack(t)


def last_level_cache_bytes() -> int:
    try:
        for index in sorted(os.listdir("/sys/devices/system/cpu/cpu0/cache"), reverse=True):
            with open(f"/sys/devices/system/cpu/cpu0/cache/{index}/size") as f:
                text = f.read().strip()
            return int(text[:-1]) * {"K": 1 << 10, "M": 1 << 20}[text[-1]] if text[-1] in "KM" else int(text)
    except (OSError, ValueError, KeyError):
        pass
    return 32 << 20


def machine_read_bandwidth() -> float:
    """GB/s: best of a 512 MiB f32 sum by numpy (1 thread), numpy split over the benchmark threads, and torch."""
    a = np.ones(1 << 27, np.float32)
    threads = torch.get_num_threads()
    parts = np.array_split(a, threads)
    ta = torch.from_numpy(a)
    best = 0.0
    with ThreadPoolExecutor(threads) as pool:
        for fn in (lambda: a.sum(), lambda: list(pool.map(np.sum, parts)), lambda: ta.sum()):
            fn()
            for _ in range(5):
                t0 = time.perf_counter()
                fn()
                best = max(best, a.nbytes / (time.perf_counter() - t0) / 1e9)
    return best


class Timer:
    def __init__(self, quick: bool, stat: str = "median"):
        self.rounds = 2 if quick else 5
        self.budget = 0.05 if quick else 0.15  # seconds per side per round
        self.stat = statistics.median if stat == "median" else min

    def compare(self, ours, theirs):
        """(llaisys seconds or None, torch seconds, why llaisys has no time): medians of per-call times."""
        times, why = self.sides({"ours": ours, "theirs": theirs})
        return times["ours"], times["theirs"], why.get("ours", "")

    def sides(self, fns: dict):
        """({side: seconds per call, or None}, {side: why it has no time}) for llaisys / torch callables
        fn(i), timed in alternating rounds; the number of calls per round comes from the last side."""
        why, fns = {}, dict(fns)
        for side, fn in fns.items():
            try:
                fn(0)
                fn(1)
            except llaisys.LlaisysError as e:  # not implemented (yet), or a kernel that refuses this input
                fns[side] = None
                why[side] = "not implemented" if "not implemented" in str(e) else f"error: {str(e)[:80]}"
        probe = time.perf_counter()
        list(fns.values())[-1](2)
        per_call = time.perf_counter() - probe
        n = max(1, min(200, int(self.budget / max(per_call, 1e-6))))
        samples = {side: [] for side in fns}
        i = 0
        for _ in range(self.rounds):
            for side, fn in fns.items():
                if fn is None:
                    continue
                for _ in range(n):
                    t0 = time.perf_counter()
                    fn(i)
                    samples[side].append(time.perf_counter() - t0)
                    i += 1
        return {k: self.stat(v) if v else None for k, v in samples.items()}, why


# Each case: (op, phase, shape text, setup) where setup(dtype) -> (ours(i), theirs(i), note(t_ours, t_theirs)).
# Inputs are created inside setup so that only one case's tensors are alive at a time.

def linear_case(name, n, k, m, bias, rotate_bytes, machine_bw):
    def setup(tdt):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(m, k, generator=g, dtype=torch.float32).to(tdt) * k ** -0.5
        w0 = torch.randn(n, k, generator=g, dtype=torch.float32).to(tdt)
        wbytes = w0.numel() * w0.element_size()
        copies = max(1, min(128, math.ceil(rotate_bytes / wbytes))) if m == 1 else 1
        ws = [w0] + [w0.clone() for _ in range(copies - 1)]
        b = torch.randn(n, generator=g).to(tdt) if bias else None
        out_t = torch.empty(m, n, dtype=tdt)
        lx, lws, lb, lout = lt(x), [lt(w) for w in ws], lt(b) if bias else None, lt(torch.empty(m, n, dtype=tdt))

        def ours(i):
            llaisys.ops.linear(lout, lx, lws[i % copies], lb)

        def theirs(i):
            w = ws[i % copies]
            if bias:
                torch.addmm(b, x, w.t(), out=out_t)
            else:
                torch.mm(x, w.t(), out=out_t)

        def bandwidth(t):
            return f"{wbytes / t / 1e9:5.1f}" if t else "  n/a"

        def gflops(t):
            return f"{2 * m * n * k / t / 1e9:6.1f}" if t else "   n/a"

        def note(t_ours, t_theirs):
            if m == 1:
                return (f"weights GB/s: llaisys {bandwidth(t_ours)} torch {bandwidth(t_theirs)} "
                        f"(machine {machine_bw:.1f})")
            return f"GFLOP/s: llaisys {gflops(t_ours)} torch {gflops(t_theirs)}"
        return ours, theirs, note
    bias_text = "+bias" if bias else ""
    return ("linear", "decode" if m == 1 else "prefill", f"{name} [{m},{k}]x[{n},{k}]^T{bias_text}", setup)


def int8_weights(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 weights and bf16 scales in the format of llaisys.ops.linear_i8 (blocks of 16 rows, pack_int8): per
    row and group of 32, scale = max|w| / 127 rounded up to bf16, q = round(w / scale). In slices of rows, so
    that the f32 temporaries of the lm_head stay small."""
    n, k = w.shape
    group = llaisys.ops.INT8_GROUP
    groups = -(-k // group)
    q = torch.empty(n, k, dtype=torch.int8)
    scales = torch.empty(n, groups, dtype=torch.bfloat16)
    for r0 in range(0, n, 8192):
        rows = w[r0:r0 + 8192]
        wg = F.pad(rows.float(), (0, groups * group - k)).view(rows.shape[0], groups, group)
        scale = wg.abs().amax(-1) / 127
        bits = scale.view(torch.int32)
        scale = torch.where(bits & 0xFFFF != 0, (bits & ~0xFFFF) + 0x10000, bits).view(torch.float32)  # round up
        qg = torch.where(scale[..., None] > 0, torch.round(wg / scale[..., None]), 0).clamp(-127, 127)
        q[r0:r0 + 8192] = qg.view(rows.shape[0], -1)[:, :k].to(torch.int8)
        scales[r0:r0 + 8192] = scale.to(torch.bfloat16)
    blocks, block_scales = llaisys.ops.pack_int8(q.numpy(), scales.view(torch.int16).numpy().view(ml_dtypes.bfloat16))
    return torch.from_numpy(blocks), torch.from_numpy(block_scales.view(np.int16)).view(torch.bfloat16)


def linear_i8_case(name, n, k, bias, rotate_bytes):
    """Decode (M = 1): linear_i8 (int8 weights + bf16 scales) against the bf16 weights through llaisys'
    linear and torch's F.linear, and a plain streaming read of as many bytes as the int8 side reads (torch
    summing f32 tensors of that size: the machine's read bandwidth for this size, in the same rounds). Each
    side's buffers rotate over enough copies to exceed the last-level cache."""
    def setup():
        g = torch.Generator().manual_seed(0)
        x = torch.randn(1, k, generator=g).to(torch.bfloat16)
        w16 = torch.empty(n, k, dtype=torch.bfloat16)
        for r0 in range(0, n, 8192):  # (bf16 directly: no f32 copy of the lm_head)
            w16[r0:r0 + 8192] = torch.randn(min(8192, n - r0), k, generator=g) * k ** -0.5
        q, scales = int8_weights(w16)
        b = torch.randn(n, generator=g).to(torch.bfloat16) if bias else None
        i8_bytes = q.numel() + 2 * scales.numel()
        bf16_bytes = 2 * w16.numel()
        i8_copies = max(1, min(128, math.ceil(rotate_bytes / i8_bytes)))
        bf16_copies = max(1, min(128, math.ceil(rotate_bytes / bf16_bytes)))
        qs = [(q, scales)] + [(q.clone(), scales.clone()) for _ in range(i8_copies - 1)]
        plain = [torch.randn(i8_bytes // 4, generator=g) for _ in range(i8_copies)]
        ws = [w16] + [w16.clone() for _ in range(bf16_copies - 1)]
        lx, lb, lout = lt(x), lt(b) if bias else None, lt(torch.empty(1, n, dtype=torch.bfloat16))
        lqs, lws = [(lt(a), lt(c)) for a, c in qs], [lt(w) for w in ws]
        out_t = torch.empty(1, n, dtype=torch.bfloat16)

        def int8(i):
            llaisys.ops.linear_i8(lout, lx, *lqs[i % i8_copies], lb)

        def bf16(i):
            llaisys.ops.linear(lout, lx, lws[i % bf16_copies], lb)

        def torch_bf16(i):
            w = ws[i % bf16_copies]
            if bias:
                torch.addmm(b, x, w.t(), out=out_t)
            else:
                torch.mm(x, w.t(), out=out_t)
        def read(i):
            plain[i % i8_copies].sum()
        sides = {"read": read, "int8": int8, "bf16": bf16, "torch": torch_bf16}
        return sides, {"read": 4 * (i8_bytes // 4), "int8": i8_bytes, "bf16": bf16_bytes, "torch": bf16_bytes}
    return f"{name} [1,{k}]x[{n},{k}]^T{'+bias' if bias else ''}", setup


def run_linear_i8(timer, rotate, machine_bw):
    """The int8 decode table: ms and weight GB/s per side, int8's fraction of the machine's read bandwidth
    (a streaming read of the same byte count timed in the same rounds, and the start-up measurement)."""
    print(f"\n# linear_i8 decode (M = 1, x bf16): weight bytes read per second (int8 + bf16 scales, or bf16); "
          f"read = torch summing as many bytes in the same rounds; /read and /bw: int8's fraction of it and of "
          f"the start-up {machine_bw:.1f} GB/s; ratio = the other side's ms / int8 ms")
    header = (f"{'shape':<42} {'int8 ms':>8} {'bf16 ms':>8} {'torch ms':>9} {'int8 GB/s':>9} {'bf16 GB/s':>9} "
              f"{'torch GB/s':>10} {'read GB/s':>9} {'/read':>5} {'/bw':>5} {'bf16/int8':>9} {'torch/int8':>10}")
    print(header)
    print("-" * len(header))
    for name, n, k in LINEARS:
        shape, setup = linear_i8_case(name, n, k, name in ("q/o_proj", "k/v_proj"), rotate)
        fns, nbytes = setup()
        times, why = timer.sides(fns)
        if times["int8"] is None:
            print(f"{shape:<42} {why['int8']}")
            continue
        ms = {side: (f"{t * 1e3:.3f}" if t else "n/a") for side, t in times.items()}
        gbs = {side: (f"{nbytes[side] / t / 1e9:.1f}" if t else "n/a") for side, t in times.items()}
        ratio = {side: (f"{t / times['int8']:.2f}" if t else "n/a") for side, t in times.items()}
        int8_gbs = nbytes["int8"] / times["int8"] / 1e9
        read_gbs = nbytes["read"] / times["read"] / 1e9
        print(f"{shape:<42} {ms['int8']:>8} {ms['bf16']:>8} {ms['torch']:>9} {gbs['int8']:>9} {gbs['bf16']:>9} "
              f"{gbs['torch']:>10} {gbs['read']:>9} {int8_gbs / read_gbs:>5.0%} {int8_gbs / machine_bw:>5.0%} "
              f"{ratio['bf16']:>9} {ratio['torch']:>10}", flush=True)
        del fns


def attention_case(seq_q, seq_k):
    def setup(tdt):
        g = torch.Generator().manual_seed(0)
        q = torch.randn(seq_q, HEADS, HEAD_DIM, generator=g).to(tdt)
        k = torch.randn(seq_k, KV_HEADS, HEAD_DIM, generator=g).to(tdt)
        v = torch.randn(seq_k, KV_HEADS, HEAD_DIM, generator=g).to(tdt)
        scale = HEAD_DIM ** -0.5
        lq, lk, lv, lout = lt(q), lt(k), lt(v), lt(torch.empty(seq_q, HEADS, HEAD_DIM, dtype=tdt))
        # bottom-right aligned causal mask: query i sees key j iff j <= i + S - L
        mask = None
        if seq_q > 1:
            i = torch.arange(seq_q)[:, None]
            j = torch.arange(seq_k)[None, :]
            mask = j <= i + (seq_k - seq_q)
        qt, kt, vt = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)

        def ours(i):
            llaisys.ops.self_attention(lout, lq, lk, lv, scale)

        def theirs(i):
            F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=scale, enable_gqa=True)
        return ours, theirs, None
    phase = "decode" if seq_q == 1 else "prefill"
    return ("self_attention", phase, f"q[{seq_q},{HEADS},{HEAD_DIM}] kv[{seq_k},{KV_HEADS},{HEAD_DIM}]", setup)


def paged_window_sides(n: int, tdt, block_size: int = 16) -> dict:
    """The callables run_paged_window times for n sequences (decode rows) over WINDOW_KEYS keys each, through
    shuffled cache blocks."""
    g = torch.Generator().manual_seed(0)
    blocks = n * WINDOW_KEYS // block_size
    k_cache = torch.randn(blocks, block_size, KV_HEADS, HEAD_DIM, generator=g).to(tdt)
    v_cache = torch.randn(blocks, block_size, KV_HEADS, HEAD_DIM, generator=g).to(tdt)
    tables = torch.randperm(blocks, generator=g).to(torch.int32).reshape(n, -1).contiguous()
    q = torch.randn(n, HEADS, HEAD_DIM, generator=g).to(tdt)
    seq_lens = torch.full((n,), WINDOW_KEYS, dtype=torch.int32)
    starts = torch.arange(n + 1, dtype=torch.int32)
    args = [lt(t) for t in (torch.empty(n, HEADS, HEAD_DIM, dtype=tdt), q, k_cache, v_cache, tables, seq_lens, starts)]
    scale = HEAD_DIM ** -0.5
    # torch: the first sequence's keys gathered (as a contiguous KV cache holds them), HF's window mask, n times
    rows = (tables[0].long()[:, None] * block_size + torch.arange(block_size)).reshape(-1)
    kt = k_cache.reshape(-1, KV_HEADS, HEAD_DIM)[rows].transpose(0, 1)[None]
    vt = v_cache.reshape(-1, KV_HEADS, HEAD_DIM)[rows].transpose(0, 1)[None]
    qt = q[:1].transpose(0, 1)[None]
    mask = (torch.arange(WINDOW_KEYS) > WINDOW_KEYS - 1 - WINDOW)[None]  # [1 query, keys]
    kw, vw = kt[:, :, -WINDOW:], vt[:, :, -WINDOW:]

    def torch_masked(i):
        for _ in range(n):
            F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=scale, enable_gqa=True)

    def torch_last(i):
        for _ in range(n):
            F.scaled_dot_product_attention(qt, kw, vw, scale=scale, enable_gqa=True)

    return {"window": lambda i: llaisys.ops.paged_attention(*args, scale, "exact", WINDOW),
            "none": lambda i: llaisys.ops.paged_attention(*args, scale, "exact"),
            "torch masked": torch_masked, "torch last-W": torch_last}


def run_paged_window(timer, dtypes, sequences=(1, 4)):
    """Decode over a paged cache of WINDOW_KEYS keys per sequence: the windowed call against the plain one, and
    torch's sdpa with the sliding-window mask over every key or over the window's keys only."""
    print(f"\n# paged_attention decode: {WINDOW_KEYS} keys per sequence, window {WINDOW}, load average "
          f"{os.getloadavg()[0]:.1f}; ratio = no window / window")
    print(f"{'sequences':>9} {'dtype':<5} {'window ms':>10} {'no window ms':>13} {'torch masked ms':>16} "
          f"{'torch last-W ms':>16} {'ratio':>6}")
    for n in sequences:
        for d in dtypes:
            times, _ = timer.sides(paged_window_sides(n, TORCH[d]))
            ms = {k: v * 1e3 for k, v in times.items()}
            print(f"{n:>9} {d:<5} {ms['window']:>10.3f} {ms['none']:>13.3f} {ms['torch masked']:>16.3f} "
                  f"{ms['torch last-W']:>16.3f} {ms['none'] / ms['window']:>6.2f}", flush=True)


def add_case(shape):
    def setup(tdt):
        a, b, c = torch.randn(shape).to(tdt), torch.randn(shape).to(tdt), torch.empty(shape, dtype=tdt)
        la, lb, lc = lt(a), lt(b), lt(torch.empty(shape, dtype=tdt))
        return (lambda i: llaisys.ops.add(lc, la, lb)), (lambda i: torch.add(a, b, out=c)), None
    return ("add", "decode" if shape[0] == 1 else "prefill", str(list(shape)), setup)


def rms_norm_case(rows):
    def setup(tdt):
        x, w = torch.randn(rows, HIDDEN).to(tdt), torch.rand(HIDDEN).to(tdt)
        lx, lw, lout = lt(x), lt(w), lt(torch.empty(rows, HIDDEN, dtype=tdt))
        return ((lambda i: llaisys.ops.rms_norm(lout, lx, lw, RMS_EPS)),
                (lambda i: F.rms_norm(x, (HIDDEN,), w, RMS_EPS)), None)
    return ("rms_norm", "decode" if rows == 1 else "prefill", f"[{rows},{HIDDEN}]", setup)


def rope_case(seq):
    def setup(tdt):
        x = torch.randn(seq, HEADS, HEAD_DIM).to(tdt)
        pos = torch.arange(PREFILL - seq, PREFILL, dtype=torch.int64)
        lx, lpos, lout = lt(x), lt(pos), lt(torch.empty_like(x))
        inv_freq = 1.0 / ROPE_THETA ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM)
        half = HEAD_DIM // 2

        def theirs(i):  # as HF computes it: angles from pos_ids each call, rotate_half layout
            angles = pos[:, None].float() * inv_freq[None, :]
            cos = torch.cat([angles.cos(), angles.cos()], -1)[:, None, :].to(tdt)
            sin = torch.cat([angles.sin(), angles.sin()], -1)[:, None, :].to(tdt)
            rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
            return x * cos + rotated * sin
        table = lt(torch.from_numpy(llaisys.ops.rope_inv_freq(HEAD_DIM, ROPE_THETA)))
        return (lambda i: llaisys.ops.rope(lout, lx, lpos, table)), theirs, None
    return ("rope", "decode" if seq == 1 else "prefill", f"[{seq},{HEADS},{HEAD_DIM}]", setup)


def swiglu_case(rows):
    def setup(tdt):
        gate, up = torch.randn(rows, INTER).to(tdt), torch.randn(rows, INTER).to(tdt)
        out = torch.empty(rows, INTER, dtype=tdt)
        lg, lu, lout = lt(gate), lt(up), lt(torch.empty(rows, INTER, dtype=tdt))
        return ((lambda i: llaisys.ops.swiglu(lout, lg, lu)),
                (lambda i: torch.mul(F.silu(gate), up, out=out)), None)
    return ("swiglu", "decode" if rows == 1 else "prefill", f"[{rows},{INTER}]", setup)


def embedding_case(n):
    def setup(tdt):
        weight = torch.randn(VOCAB, HIDDEN).to(tdt)
        index = torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(0))
        out = torch.empty(n, HIDDEN, dtype=tdt)
        lw, li, lout = lt(weight), lt(index), lt(torch.empty(n, HIDDEN, dtype=tdt))
        return ((lambda i: llaisys.ops.embedding(lout, li, lw)),
                (lambda i: torch.index_select(weight, 0, index, out=out)), None)
    return ("embedding", "decode" if n == 1 else "prefill", f"index[{n}] weight[{VOCAB},{HIDDEN}]", setup)


def argmax_case():
    def setup(tdt):
        vals = torch.randn(VOCAB).to(tdt)
        lv = lt(vals)
        lidx, lval = lt(torch.empty(1, dtype=torch.int64)), lt(torch.empty(1, dtype=tdt))
        return (lambda i: llaisys.ops.argmax(lidx, lval, lv)), (lambda i: torch.max(vals, 0)), None
    return ("argmax", "decode", f"[{VOCAB}]", setup)


def sample_case(temperature=0.8, top_k=50, top_p=0.9):
    def setup(tdt):
        logits = (torch.randn(VOCAB) * 3).to(tdt)
        ll, lidx = lt(logits), lt(torch.empty(1, dtype=torch.int64))
        gen = torch.Generator().manual_seed(0)

        def theirs(i):  # the usual top-k -> softmax -> top-p -> multinomial
            values, indices = torch.topk(logits.float() / temperature, top_k)
            probs = torch.softmax(values, -1)
            keep = probs.cumsum(-1) - probs < top_p
            probs = probs * keep
            return indices[torch.multinomial(probs, 1, generator=gen)]
        return (lambda i: llaisys.ops.sample(lidx, ll, temperature, top_k, top_p, i)), theirs, None
    return ("sample", "decode", f"[{VOCAB}] T={temperature} top_k={top_k} top_p={top_p}", setup)


def build_cases(ops, quick, machine_bw):
    rotate = 2 * last_level_cache_bytes()
    cases = []
    if "linear" in ops:
        for name, n, k in LINEARS:
            cases.append(linear_case(name, n, k, 1, name == "k/v_proj" or name == "q/o_proj", rotate, machine_bw))
        for name, n, k in LINEARS:
            if quick and name == "lm_head":
                continue  # 239 GFLOP per call; a real prefill only needs the last row's logits
            cases.append(linear_case(name, n, k, PREFILL, False, rotate, machine_bw))
    if "self_attention" in ops:
        cases += [attention_case(1, 512), attention_case(1, 4096), attention_case(PREFILL, PREFILL)]
    if "add" in ops:
        cases += [add_case((1, HIDDEN)), add_case((PREFILL, HIDDEN))]
    if "rms_norm" in ops:
        cases += [rms_norm_case(1), rms_norm_case(PREFILL)]
    if "rope" in ops:
        cases += [rope_case(1), rope_case(PREFILL)]
    if "swiglu" in ops:
        cases += [swiglu_case(1), swiglu_case(PREFILL)]
    if "embedding" in ops:
        cases += [embedding_case(1), embedding_case(PREFILL)]
    if "argmax" in ops:
        cases.append(argmax_case())
    if "sample" in ops:
        cases.append(sample_case())
    return cases


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="f32,bf16", help="comma list of f32, bf16, f16 (default f32,bf16)")
    parser.add_argument("--ops", default=",".join(ALL_OPS), help=f"comma list of {','.join(ALL_OPS)}")
    parser.add_argument("--quick", action="store_true", help="fewer repeats; skips the prefill lm_head")
    parser.add_argument("--threads", type=int, default=0,
                        help="run both sides on this many threads (re-executes with OMP_NUM_THREADS set); "
                             "default: every core, OMP_NUM_THREADS left as it is")
    parser.add_argument("--stat", choices=["median", "min"], default="median",
                        help="per-call statistic (min: best case, for machines shared with other work)")
    parser.add_argument("--omp-wait-policy", choices=["active", "passive"], default=None,
                        help="set OMP_WAIT_POLICY for both OpenMP runtimes (torch's and llaisys'); passive "
                             "(threads sleep between parallel regions) avoids multi-ms stalls when other "
                             "processes share the cores")
    args = parser.parse_args(argv)
    wanted = {"OMP_NUM_THREADS": str(args.threads) if args.threads else None, "OMP_WAIT_POLICY": args.omp_wait_policy}
    if any(v is not None and os.environ.get(k) != v for k, v in wanted.items()):
        # the OpenMP runtimes read these once, when torch / the kernel library load: start again with them set
        os.environ.update({k: v for k, v in wanted.items() if v is not None})
        os.execv(sys.executable, [sys.executable, *sys.argv])
    dtypes = [d.strip() for d in args.dtype.split(",") if d.strip()]
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    for d in dtypes:
        if d not in TORCH:
            parser.error(f"unknown dtype {d!r}")
    for o in ops:
        if o not in ALL_OPS:
            parser.error(f"unknown op {o!r}")

    threads = args.threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    simd = "?"
    try:
        import ctypes

        import llaisys_backend_cpu
        fn = ctypes.CDLL(str(llaisys_backend_cpu.LIBRARY)).llaisys_cpu_simd_level
        fn.restype = ctypes.c_char_p
        simd = fn().decode()
    except (ImportError, OSError, AttributeError):
        pass
    machine_bw = machine_read_bandwidth() if {"linear", "linear_i8"} & set(ops) else float("nan")
    print(f"# llaisys CPU vs torch {torch.__version__}: {threads} threads (OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}), "
          f"llaisys SIMD path {simd}, "
          f"machine read bandwidth {machine_bw:.1f} GB/s, load average {os.getloadavg()[0]:.1f}")
    print(f"# ratio = torch ms / llaisys ms (> 1: llaisys faster); {args.stat} per call over alternating rounds")
    header = f"{'op':<15} {'phase':<8} {'shape':<42} {'dtype':<5} {'llaisys ms':>11} {'torch ms':>10} {'ratio':>6}  note"
    timer = Timer(args.quick, args.stat)
    cases = build_cases(ops, args.quick, machine_bw)
    if cases:
        print(header)
        print("-" * len(header))
    for op, phase, shape, setup in cases:
        for d in dtypes:
            ours, theirs, note = setup(TORCH[d])
            t_ours, t_theirs, why = timer.compare(ours, theirs)
            ours_ms = f"{t_ours * 1e3:11.3f}" if t_ours else f"{'n/a':>11}"
            ratio = f"{t_theirs / t_ours:6.2f}" if t_ours else f"{'n/a':>6}"
            text = why or (note(t_ours, t_theirs) if note else "")
            print(f"{op:<15} {phase:<8} {shape:<42} {d:<5} {ours_ms} {t_theirs * 1e3:10.3f} {ratio}  {text}",
                  flush=True)
            del ours, theirs, note
    if "linear_i8" in ops:
        # 256 MiB at least: on this 2-core VM a 64 MiB rotation (2x the L3 it reports) still read partly from
        # cache (a torch sum rotating over 64 MiB ran at 37 GB/s, over 256 MiB at 29.5)
        run_linear_i8(timer, max(2 * last_level_cache_bytes(), 256 << 20), machine_bw)
    if "paged_attention" in ops:
        run_paged_window(timer, dtypes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
