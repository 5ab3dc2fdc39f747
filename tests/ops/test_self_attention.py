"""ops.self_attention: causal GQA attention against an explicit float64 masked softmax from torch."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

import llaisys
from helpers import FLOAT_DTYPES, assert_close, from_torch, nan_filled, random
from helpers.child_process import run_in_child
from helpers.references.attention import reference


def run_case(device, dtype, L, S, H, Hkv, d, dv, scale=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q, q_ref = random((L, H, d), dtype, device, g)
    k, k_ref = random((S, Hkv, d), dtype, device, g)
    v, v_ref = random((S, Hkv, dv), dtype, device, g)
    out = nan_filled((L, H, dv), dtype, device)
    llaisys.ops.self_attention(out, q, k, v, scale)
    assert_close(out, reference(q_ref, k_ref, v_ref, scale))


# (L, S, H, Hkv, d, dv)
SHAPES = [
    (1, 1, 1, 1, 32, 32),          # decode, first token
    (1, 17, 4, 2, 64, 64),         # decode with a cache, GQA ratio 2
    (1, 4097, 6, 1, 32, 32),       # decode, long odd cache, GQA ratio 6
    (5, 17, 6, 3, 32, 32),         # chunk of queries against a longer cache
    (3, 3, 2, 2, 128, 128),        # L == S, MHA
    (17, 17, 3, 3, 64, 64),        # L == S, odd
    (33, 40, 12, 2, 64, 64),       # many queries per kv head (several tiles)
    (7, 9, 4, 2, 32, 48),          # dv != d
    (2, 9, 2, 2, 32, 48),          # dv != d with 1..4 queries per kv head (the row form)
    (1, 3000, 3, 3, 64, 64),       # decode, MHA, long (row form, split keys)
    (4, 6, 2, 1, 3, 5),            # tiny odd head dims (vector tails)
]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "L{}_S{}_H{}_Hkv{}_d{}_dv{}".format(*s))
def test_shapes(device, dtype, shape):
    run_case(device, dtype, *shape)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("L", [1, 512], ids=lambda n: f"L{n}")
def test_qwen2_shape(device, dtype, L):
    # Qwen2-1.5B: 12 query heads, 2 kv heads, head_dim 128; decode and prefill at S=512
    run_case(device, dtype, L, 512, 12, 2, 128, 128)


@pytest.mark.parametrize("scale", [0.0, 0.05, 0.3, 1.0, -0.7])
def test_scales(device, scale):
    # scale 0: every visible key weighs the same (a running mean of v); negative flips the ranking
    run_case(device, llaisys.float32, 6, 20, 4, 2, 32, 32, scale=scale)


def test_rows_see_only_the_past(device):
    # v_j = j (one column): out of query i is the weighted mean of 0..i+S-L, so it can never exceed i+S-L,
    # and with scale 0 it is exactly the plain mean (i + S - L) / 2.
    L, S, H, Hkv, d = 4, 9, 2, 1, 8
    g = torch.Generator().manual_seed(1)
    q, _ = random((L, H, d), llaisys.float32, device, g)
    k, _ = random((S, Hkv, d), llaisys.float32, device, g)
    v = from_torch(torch.arange(S, dtype=torch.float32).reshape(S, 1, 1), device)
    out = nan_filled((L, H, 1), llaisys.float32, device)
    llaisys.ops.self_attention(out, q, k, v, 0.0)
    got = torch.from_numpy(out.numpy())[:, :, 0]
    want = ((torch.arange(L) + S - L) / 2.0).to(torch.float32)[:, None].expand(L, H)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_output_views_are_written_in_place(device):
    # out may be a contiguous view into a bigger buffer (as a KV-cache model would pass)
    g = torch.Generator().manual_seed(2)
    L, S, H, Hkv, d = 3, 5, 4, 2, 32
    q, q_ref = random((L, H, d), llaisys.float32, device, g)
    k, k_ref = random((S, Hkv, d), llaisys.float32, device, g)
    v, v_ref = random((S, Hkv, d), llaisys.float32, device, g)
    buffer = nan_filled((L + 2, H, d), llaisys.float32, device)
    out = buffer.slice(0, 1, 1 + L)
    llaisys.ops.self_attention(out, q, k, v, 0.125)
    assert_close(out, reference(q_ref, k_ref, v_ref, 0.125))
    rest = torch.from_numpy(buffer.numpy())
    assert torch.isnan(rest[0]).all() and torch.isnan(rest[L + 1]).all(), "wrote outside the out view"


# -- every SIMD path, in a subprocess per forced level ---------------------------------------------

def _supported_levels():
    try:
        import ctypes

        import llaisys_backend_cpu
    except ImportError:
        return []
    lib = ctypes.CDLL(str(llaisys_backend_cpu.LIBRARY))
    lib.llaisys_cpu_simd_level.restype = ctypes.c_char_p
    best = lib.llaisys_cpu_simd_level().decode()
    order = ["portable", "avx2", "avx512"]
    return order[: order.index(best) + 1]


# Run with 8 OpenMP threads so that the parallel and split-key (flash-decoding) paths run too:
# (1, 4097, 6, 1): one (kv head, tile) pair -> 16 key splits, the last ones empty;
# (32, 3850, 1, 1): splits of 320 keys, one of which starts past the last key of most rows;
# (1, 4097, 4, 4) and (2, 600, 2, 1): the row form (<= 4 queries per kv head) with split keys.
SIMD_SHAPES = [(1, 1, 1, 1, 32, 32), (1, 33, 12, 2, 128, 128), (5, 17, 6, 3, 32, 32), (9, 9, 2, 2, 64, 64),
               (20, 20, 4, 1, 17, 33), (4, 6, 2, 1, 3, 5), (40, 70, 3, 1, 32, 32), (1, 4097, 6, 1, 32, 32),
               (32, 3850, 1, 1, 16, 16), (1, 4097, 4, 4, 64, 64), (2, 600, 2, 1, 16, 24), (1, 70, 12, 3, 32, 32)]


def simd_paths_in_child() -> None:
    """The child (its SIMD level and thread count set by the environment): every case of SIMD_SHAPES, then
    the level the library ran and the failures, as JSON."""
    import ctypes

    import llaisys_backend_cpu

    lib = ctypes.CDLL(str(llaisys_backend_cpu.LIBRARY))
    lib.llaisys_cpu_simd_level.restype = ctypes.c_char_p
    failures = []
    for dtype in FLOAT_DTYPES:
        for shape in SIMD_SHAPES:
            try:
                run_case(llaisys.Device("cpu"), dtype, *shape, seed=3)
            except AssertionError as e:
                failures.append(f"{dtype.name} {shape}: {e}")
    print(json.dumps({"level": lib.llaisys_cpu_simd_level().decode(), "failures": failures}))


@pytest.mark.parametrize("level", ["portable", "avx2", "avx512"])
def test_simd_paths(device, level):
    if device.type != "cpu":
        pytest.skip("SIMD paths are a CPU backend matter")
    if level not in _supported_levels():
        pytest.skip(f"this CPU (or build) does not support {level}")
    # passive waiting: 8 threads on fewer cores must not spin against each other (and torch's reference)
    env = {**os.environ, "LLAISYS_CPU_SIMD": level, "OMP_NUM_THREADS": "8", "OMP_WAIT_POLICY": "passive"}
    proc = run_in_child(simd_paths_in_child, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["level"] == level
    assert not result["failures"], "\n".join(result["failures"])


# -- bad input -------------------------------------------------------------------------------------

def _tensors(device, L=2, S=3, H=4, Hkv=2, d=8, dv=8, dtype=llaisys.float32):
    return (llaisys.zeros((L, H, dv), dtype, device), llaisys.zeros((L, H, d), dtype, device),
            llaisys.zeros((S, Hkv, d), dtype, device), llaisys.zeros((S, Hkv, dv), dtype, device))


def _raises(match, out, q, k, v, scale=1.0):
    with pytest.raises(llaisys.LlaisysError, match=match) as info:
        llaisys.ops.self_attention(out, q, k, v, scale)
    assert isinstance(info.value, ValueError)


def test_heads_not_a_multiple_of_kv_heads(device):
    _raises(r"query heads.*kv heads", *_tensors(device, H=5, Hkv=2))


def test_fewer_keys_than_queries(device):
    _raises(r"\bk\b.*fewer than", *_tensors(device, L=4, S=3))


def test_wrong_dtype(device):
    out, q, k, v = _tensors(device)
    _raises(r"\bk\b.*dtype", out, q, llaisys.zeros(k.shape, llaisys.float16, device), v)
    i_out, i_q, i_k, i_v = _tensors(device, dtype=llaisys.int32)
    _raises(r"\bout\b.*dtype", i_out, i_q, i_k, i_v)


def test_non_contiguous_q(device):
    out, q, k, v = _tensors(device)
    q_t = llaisys.zeros((q.shape[1], q.shape[0], q.shape[2]), llaisys.float32, device).permute(1, 0, 2)
    assert q_t.shape == q.shape and not q_t.is_contiguous()
    _raises(r"\bq\b.*contiguous", out, q_t, k, v)


@pytest.mark.parametrize("which", ["k_d", "v_S", "v_Hkv", "out_dv", "out_L", "q_ndim"])
def test_shape_mismatch(device, which):
    out, q, k, v = _tensors(device)
    z = lambda *shape: llaisys.zeros(shape, llaisys.float32, device)  # noqa: E731
    if which == "k_d":
        _raises(r"\bk\b.*shape", out, q, z(3, 2, 9), v)
    elif which == "v_S":
        _raises(r"\bv\b.*shape", out, q, k, z(4, 2, 8))
    elif which == "v_Hkv":
        _raises(r"\bv\b.*shape", out, q, k, z(3, 1, 8))
    elif which == "out_dv":
        _raises(r"\bout\b.*shape", z(2, 4, 7), q, k, v)
    elif which == "out_L":
        _raises(r"\bout\b.*shape", z(3, 4, 8), q, k, v)
    else:
        _raises(r"\bq\b.*3-d", out, z(2, 32), k, v)


def test_bad_scale(device):
    _raises(r"scale", *_tensors(device), scale=float("nan"))
