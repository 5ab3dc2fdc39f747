"""lora_shrink / lora_expand: batched LoRA adapters, Punica-style (llaisys.ops.lora, backend.h ``lora_shrink``,
``lora_expand``).

The references are numpy in float64: h = scales[s] * x @ a[s].T (0 for rows without an adapter), out + h @ b[s]
rounded once to out's dtype (rows without an adapter untouched). h is f32 whatever the inputs (the kernel sums in f32:
within f32's tolerance); out is within its dtype's (f32 1e-5, f16 1e-3, bf16 1e-2; atol = rtol). A row's result is
the same bits alone, inside any batch and on any number of threads; every SIMD path of the CPU kernel runs the same
checks in a child process (LLAISYS_CPU_SIMD).
"""

from __future__ import annotations

import numpy as np
import pytest

import llaisys
from helpers import FLOAT_DTYPES, nan_filled, skip_without_kernels
from helpers.simd_paths import LEVELS, cpu_simd_level, run_in_child, skip_unless_level_available
from llaisys.testing.compare import TOLERANCE, close

OPS = ["lora_shrink", "lora_expand"]


@pytest.fixture(autouse=True)
def _device_has_the_kernels(request):
    if "device" in request.fixturenames:
        skip_without_kernels(request.getfixturevalue("device"), OPS, "this test")


def segments(rng, m: int, s: int) -> np.ndarray:
    """adapters int64 [m]: runs of 1..5 rows sharing a slot in [-1, s) (-1: no adapter), neighbours differing."""
    out, last = [], None
    while len(out) < m:
        choices = [v for v in range(-1, s) if v != last] or [last]
        last = int(rng.choice(choices))
        out += [last] * int(rng.integers(1, 6))
    return np.array(out[:m], np.int64)


class Lora:
    """Random adapters (stacked in S slots, each of a random rank <= R, zero-padded), inputs and float64 references."""

    def __init__(self, m, k, r, n, s, dtype=llaisys.float32, device="cpu", seed=0, adapters=None):
        rng = np.random.default_rng(seed)
        self.m, self.k, self.r, self.n, self.s, self.dtype, self.device = m, k, r, n, s, dtype, device
        ranks = rng.integers(1, r + 1, s) if r else np.zeros(s, int)
        a = rng.standard_normal((s, r, k)) / np.sqrt(max(k, 1))
        b = rng.standard_normal((s, r, n)) / np.sqrt(max(r, 1))
        for i, rank in enumerate(ranks):  # a lower rank padded with zero rows
            a[i, rank:], b[i, rank:] = 0, 0
        self.x = rng.standard_normal((m, k)).astype(dtype.numpy)
        self.a, self.b = a.astype(dtype.numpy), b.astype(dtype.numpy)
        self.scales = (rng.uniform(0.25, 2.0, s) * rng.choice([-1.0, 1.0], s)).astype(np.float32)
        self.adapters = segments(rng, m, s) if adapters is None else np.asarray(adapters, np.int64)
        self.h = rng.standard_normal((m, r)).astype(np.float32)  # expand's input, independent of shrink
        self.out0 = rng.standard_normal((m, n)).astype(dtype.numpy)
        self.t = {name: llaisys.from_numpy(getattr(self, name), device) for name in ("a", "b", "scales")}

    def rows(self, start: int, count: int) -> np.ndarray:
        return np.arange(start, start + count)

    def shrink(self, rows=None) -> np.ndarray:
        rows = np.arange(self.m) if rows is None else rows
        h = nan_filled((len(rows), self.r), llaisys.float32, self.device)
        llaisys.ops.lora_shrink(h, llaisys.from_numpy(self.x[rows], self.device), self.t["a"],
                                llaisys.from_numpy(self.adapters[rows], self.device), self.t["scales"])
        return h.numpy()

    def expand(self, rows=None, h=None) -> np.ndarray:
        rows = np.arange(self.m) if rows is None else rows
        out = llaisys.from_numpy(self.out0[rows], self.device)
        h = self.h[rows] if h is None else h
        llaisys.ops.lora_expand(out, llaisys.from_numpy(np.ascontiguousarray(h), self.device), self.t["b"],
                                llaisys.from_numpy(self.adapters[rows], self.device))
        return out.numpy()

    def shrink_reference(self) -> np.ndarray:
        h = np.zeros((self.m, self.r))
        for i, s in enumerate(self.adapters):
            if s >= 0:
                h[i] = float(self.scales[s]) * (self.a[s].astype(np.float64) @ self.x[i].astype(np.float64))
        return h

    def expand_reference(self, h=None) -> np.ndarray:
        h = self.h if h is None else h
        out = self.out0.astype(np.float64)
        for i, s in enumerate(self.adapters):
            if s >= 0:
                out[i] += h[i].astype(np.float64) @ self.b[s].astype(np.float64)
        return out

    def name(self) -> str:
        return f"{self.dtype.name} M={self.m} K={self.k} R={self.r} N={self.n} S={self.s} adapters={list(self.adapters)}"

    def check(self):
        close(self.shrink(), self.shrink_reference(), llaisys.float32, TOLERANCE[llaisys.float32],
              f"lora_shrink {self.name()}")
        got = self.expand()
        close(got, self.expand_reference(), self.dtype, TOLERANCE[self.dtype], f"lora_expand {self.name()}")
        idle = self.adapters < 0
        assert got[idle].tobytes() == self.out0[idle].tobytes(), f"rows without an adapter were changed: {self.name()}"


# (M, K, R, N, S): every size of each dimension, odd ones included; K = 1536 / N = 1536 the Qwen2-1.5B width
SHAPES = [(1, 1, 1, 1, 1), (3, 7, 8, 5, 2), (17, 64, 16, 256, 4), (17, 1536, 64, 1536, 3), (1, 1536, 16, 1536, 2),
          (3, 64, 64, 1, 1), (17, 7, 1, 256, 4), (3, 1536, 8, 5, 3), (17, 1, 8, 1536, 2), (1, 64, 64, 256, 4),
          (3, 1, 16, 1536, 1), (17, 1536, 1, 5, 4)]


def check_all(device="cpu", dtypes=FLOAT_DTYPES):
    for i, (m, k, r, n, s) in enumerate(SHAPES):
        for dtype in dtypes:
            Lora(m, k, r, n, s, dtype, device, seed=i).check()


def check_rows_independent(device="cpu"):
    """Each row (and windows of rows) computed alone is the same bits as inside the batch: mixed segments, and one
    long segment (several chunks of rows)."""
    for j, (m, k, r, n, s, adapters) in enumerate(((17, 1536, 64, 1536, 4, None), (17, 7, 16, 5, 3, None),
                                                    (70, 1536, 16, 300, 2, [1] * 70))):
        dtype = FLOAT_DTYPES[j % 3]
        case = Lora(m, k, r, n, s, dtype, device, seed=20 + j, adapters=adapters)
        h, out = case.shrink(), case.expand()
        windows = [(i, 1) for i in range(0, m, 3 if m < 20 else 11)] + [(m - 1, 1), (2, 5), (4, 9), (0, m - 1)]
        for start, count in windows:
            rows = case.rows(start, count)
            assert case.shrink(rows).tobytes() == h[rows].tobytes(), (
                f"lora_shrink {case.name()}: rows [{start}, {start + count}) alone differ from the batch")
            assert case.expand(rows).tobytes() == out[rows].tobytes(), (
                f"lora_expand {case.name()}: rows [{start}, {start + count}) alone differ from the batch")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_lora_ops_match_the_float64_reference(device, dtype):
    check_all(device, [dtype])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_shrink_then_expand_is_the_lora_update(device, dtype):
    """out + scale * (x @ A.T) @ B per row, end to end (h through the f32 intermediate)."""
    case = Lora(9, 256, 16, 320, 3, dtype, device, seed=5)
    h = case.shrink()
    got = case.expand(h=h)
    close(got, case.expand_reference(case.shrink_reference()), dtype, TOLERANCE[dtype])


def test_rows_do_not_depend_on_the_batch(device):
    check_rows_independent(device)


@pytest.mark.parametrize("level", LEVELS)
def test_every_simd_path(device, level):
    """The same checks on each build of the CPU kernel (portable, avx2, avx512), in a child process."""
    skip_unless_level_available(device, level)
    if level == cpu_simd_level():
        pytest.skip("this process's own path: the tests above ran it")
    run_in_child(__name__, {"LLAISYS_CPU_SIMD": level}, "t.check_all(); t.check_rows_independent()",
                 expect_level=level)


# sizes past the CPU kernel's threshold for the thread team, with mixed segments
THREADED = [(17, 1536, 64, 1536, 4), (64, 512, 16, 2048, 2)]


def results(device="cpu") -> dict[str, np.ndarray]:
    found = {}
    for i, (m, k, r, n, s) in enumerate(THREADED):
        for dtype in FLOAT_DTYPES:
            case = Lora(m, k, r, n, s, dtype, device, seed=40 + i)
            found[f"h{i}{dtype.name}"], found[f"out{i}{dtype.name}"] = case.shrink(), case.expand()
    return found


def compare_with_saved(path: str) -> None:
    saved = np.load(path)
    for name, got in results().items():
        assert got.tobytes() == saved[name].tobytes(), f"{name} differs from the run with another thread count"


@pytest.mark.parametrize("threads", ["1", "3"])
def test_results_do_not_depend_on_the_thread_count(device, threads, tmp_path):
    if device.type != "cpu":
        pytest.skip("the thread team belongs to the CPU backend")
    path = tmp_path / "results.npz"
    np.savez(path, **results())
    run_in_child(__name__, {"OMP_NUM_THREADS": threads}, f"t.compare_with_saved({str(path)!r})")


def test_untouched_rows_keep_their_bits(device):
    """Rows without an adapter: expand leaves out's bits (NaN payloads, -0) as they were; shrink writes +0."""
    case = Lora(6, 32, 8, 40, 2, llaisys.float32, device, seed=3, adapters=[-1, 0, -1, 1, 1, -1])
    out0 = case.out0.view(np.uint32)
    out0[0, :4] = [0x7FC01234, 0xFFC00001, 0x80000000, 0x7F800000]  # NaN payloads, -0, +inf
    out0[5, 7] = 0x80000000
    got = case.expand()
    for row in (0, 2, 5):
        assert got[row].tobytes() == case.out0[row].tobytes(), row
    h = case.shrink()
    assert h[[0, 2, 5]].view(np.uint32).max() == 0, "rows without an adapter get +0"
    assert np.isfinite(h).all() and np.isfinite(got[[1, 3, 4]]).all()


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_every_row_without_an_adapter_and_empty_sizes(device, dtype):
    case = Lora(4, 16, 4, 8, 2, dtype, device, seed=4, adapters=[-1] * 4)
    assert not case.shrink().any() and case.expand().tobytes() == case.out0.tobytes()
    # M = 0: nothing to do
    empty = Lora(0, 16, 4, 8, 2, dtype, device, seed=4)
    assert empty.shrink().shape == (0, 4) and empty.expand().shape == (0, 8)
    # K = 0: h = scale * 0 (-0 for a negative scale), +0 without an adapter
    k0 = Lora(3, 0, 4, 8, 2, dtype, device, seed=6, adapters=[0, -1, 1])
    h = k0.shrink()
    assert (h == 0).all() and not h[1].view(np.uint32).any()
    assert (np.signbit(h[[0, 2]]) == np.signbit(k0.scales)[:, None]).all()


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("bad", [3, -2, 1 << 40])
def test_an_adapter_out_of_range_is_refused(device, op, bad):
    case = Lora(5, 64, 8, 32, 3, llaisys.float32, device, seed=8, adapters=[0, 1, -1, bad, 2])
    with pytest.raises(llaisys.LlaisysError, match=f"adapters\\[3\\] = {bad}") as info:
        h = llaisys.from_numpy(np.full((5, 8), 7.0, np.float32), device)
        out = llaisys.from_numpy(case.out0, device)
        adapters = llaisys.from_numpy(case.adapters, device)
        if op == "lora_shrink":
            llaisys.ops.lora_shrink(h, llaisys.from_numpy(case.x, device), case.t["a"], adapters, case.t["scales"])
        else:
            llaisys.ops.lora_expand(out, llaisys.from_numpy(case.h, device), case.t["b"], adapters)
        llaisys.synchronize(device)
    assert isinstance(info.value, ValueError) and op in str(info.value)
    if device.type == "cpu":  # the CPU refuses before writing anything
        assert (h.numpy() == 7.0).all() and out.numpy().tobytes() == case.out0.tobytes()


def test_an_adapter_out_of_range_is_refused_with_nothing_to_compute(device):
    adapters = llaisys.from_numpy(np.array([0, 5], np.int64), device)
    with pytest.raises(llaisys.LlaisysError, match=r"adapters\[1\] = 5"):
        llaisys.ops.lora_shrink(llaisys.empty((2, 0), llaisys.float32, device),
                                llaisys.zeros((2, 8), llaisys.float32, device),
                                llaisys.zeros((2, 0, 8), llaisys.float32, device), adapters,
                                llaisys.zeros((2,), llaisys.float32, device))
        llaisys.synchronize(device)


def overlapping(z, first_shape, second_shape, first, second) -> dict:
    """{first: a view, second: a view} of one f32 buffer, sharing one element."""
    n1, n2 = int(np.prod(first_shape)), int(np.prod(second_shape))
    shared = z((n1 + n2 - 1,))
    return {first: shared.slice(0, 0, n1).view(*first_shape),
            second: shared.slice(0, n1 - 1, n1 - 1 + n2).view(*second_shape)}


def test_bad_arguments_are_refused_naming_them(device):
    f32, f16, i64 = llaisys.float32, llaisys.float16, llaisys.int64
    m, k, r, n, s = 3, 16, 4, 8, 2
    z = lambda shape, dtype=f32: llaisys.zeros(shape, dtype, device)  # noqa: E731
    h, x, a, scales, adapters = z((m, r)), z((m, k)), z((s, r, k)), z((s,)), z((m,), i64)
    out, b = z((m, n)), z((s, r, n))
    shrink = [
        ("x has dtype int32", dict(x=z((m, k), llaisys.int32))),
        ("a has dtype float16 but x has float32", dict(a=z((s, r, k), f16))),
        ("h has dtype float16; expected float32", dict(h=z((m, r), f16))),
        ("scales has dtype float16", dict(scales=z((s,), f16))),
        ("adapters has dtype int32", dict(adapters=z((m,), llaisys.int32))),
        ("x must be 2-d", dict(x=z((m, k, 1)))),
        ("a must be 3-d", dict(a=z((r, k)))),
        (r"a has shape \(2, 4, 15\); expected \(S, R, K\)", dict(a=z((s, r, k - 1)))),
        ("adapters has shape", dict(adapters=z((m + 1,), i64))),
        ("scales has shape", dict(scales=z((s + 1,)))),
        ("h has shape", dict(h=z((m, r + 1)))),
        ("x must be contiguous", dict(x=z((k, m)).permute(1, 0))),
        ("a must be contiguous", dict(a=z((s, k, r)).permute(0, 2, 1))),
        ("h must be contiguous", dict(h=z((r, m)).permute(1, 0))),
        ("h and x overlap", overlapping(z, (m, r), (m, k), "h", "x")),
        ("h and scales overlap", overlapping(z, (m, r), (s,), "h", "scales")),
        ("all tensors must share a device", dict(x=llaisys.zeros((m, k), f32, "cpu"))),
    ]
    for what, override in shrink:
        if "share a device" in what and device.type == "cpu":
            continue
        args = dict(h=h, x=x, a=a, adapters=adapters, scales=scales)
        args.update(override)
        with pytest.raises(llaisys.LlaisysError, match=f"lora_shrink: .*{what}") as info:
            llaisys.ops.lora_shrink(**args)
        assert isinstance(info.value, ValueError), info.value
    expand = [
        ("out has dtype int32", dict(out=z((m, n), llaisys.int32))),
        ("b has dtype float16 but out has float32", dict(b=z((s, r, n), f16))),
        ("h has dtype float16; expected float32", dict(h=z((m, r), f16))),
        ("adapters has dtype float32", dict(adapters=z((m,)))),
        ("b must be 3-d", dict(b=z((r, n)))),
        (r"b has shape \(2, 4, 9\); expected \(S, R, N\)", dict(b=z((s, r, n + 1)))),
        ("h has shape", dict(h=z((m, r + 1)))),
        ("h has shape", dict(h=z((m + 1, r)))),
        ("adapters has shape", dict(adapters=z((m - 1,), i64))),
        ("out must be contiguous", dict(out=z((n, m)).permute(1, 0))),
        ("b must be contiguous", dict(b=z((s, n, r)).permute(0, 2, 1))),
        ("out and h overlap", overlapping(z, (m, n), (m, r), "out", "h")),
        ("out and b overlap", overlapping(z, (m, n), (s, r, n), "out", "b")),
    ]
    for what, override in expand:
        args = dict(out=out, h=h, b=b, adapters=adapters)
        args.update(override)
        with pytest.raises(llaisys.LlaisysError, match=f"lora_expand: .*{what}") as info:
            llaisys.ops.lora_expand(**args)
        assert isinstance(info.value, ValueError), info.value
