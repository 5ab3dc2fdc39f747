"""Every CUDA kernel body, run on CPU threads (host execution) at warp 32 and 64 under ASan / UBSan,
against float64 torch references with the tolerances of DESIGN §6.

Shapes are small (host execution runs one OS thread per CUDA thread) but reach every path of the
launchers: vector and scalar element-wise paths (aligned and misaligned views), partial tiles, the decode
and prefill attention kernels with and without key splits, paged attention over shuffled blocks (alone ==
batched bit for bit), outputs aliasing inputs, and kernel-reported errors.
"""

import math

import numpy as np
import pytest
import torch
from host_exec.device import HostExecDevice, SlotError

import llaisys
from helpers.host_exec_ops import CODE, DTYPES, check, dtype_ids, randn
from helpers.references.attention import reference as attention_reference
from helpers.references.glu import gelu_tanh
from helpers.references.logprobs import reference as logprobs_reference
from helpers.references.numerics_hf import hf_rope
from helpers.references.penalize_logits import entries
from helpers.references.penalize_logits import reference as penalty_reference
from helpers.references.rope import hf_angles, rotate
from helpers.references.sample import reference_token

pytestmark = pytest.mark.slow  # compiles the CUDA sources under ASan for host execution (cached; minutes of CPU)


# ---- element-wise ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_ids.get)
@pytest.mark.parametrize("n", [1, 17, 4097])
@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "misaligned"])
def test_add_and_swiglu(dev, dtype, n, offset):
    a, b = randn(n + offset, dtype, 1), randn(n + offset, dtype, 2)
    da, db = dev.upload(a), dev.upload(b)
    dc = dev.empty((n + offset,), dtype)
    view = lambda t: t.offset(offset, (n,))  # noqa: E731
    dev.op("add", CODE[dtype], n, view(dc), view(da), view(db))
    add_tol = None if dtype == torch.float32 else 1e-3  # DESIGN §6: add is held to 1e-3 in bf16
    check(dev.download(dc)[offset:], a[offset:].double() + b[offset:].double(), dtype, add_tol)
    dev.op("swiglu", CODE[dtype], 0, n, view(dc), view(da), view(db))
    g64, u64 = a[offset:].double(), b[offset:].double()
    check(dev.download(dc)[offset:], u64 * g64 / (1 + torch.exp(-g64)), dtype)
    dev.op("geglu_tanh", CODE[dtype], 0, n, view(dc), view(da), view(db))
    check(dev.download(dc)[offset:], u64 * gelu_tanh(g64), dtype)
    dev.op("scale", CODE[dtype], n, 8.9375, view(dc), view(da))
    check(dev.download(dc)[offset:], a[offset:].double() * 8.9375, dtype)


def test_add_in_place(dev):
    a, b = randn(300, torch.bfloat16, 3), randn(300, torch.bfloat16, 4)
    da, db = dev.upload(a), dev.upload(b)
    dev.op("add", 2, 300, da, da, db)
    check(dev.download(da), a.double() + b.double(), torch.bfloat16, 1e-3)
    dev.op("scale", 2, 300, -3.5, da, da)
    check(dev.download(da), (a.double() + b.double()).to(torch.bfloat16).double() * -3.5, torch.bfloat16)


# ---- argmax --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_ids.get)
@pytest.mark.parametrize("n", [1, 5, 4097])
def test_argmax(dev, dtype, n):
    vals = randn(n, dtype, 5)
    if n > 3:
        vals[n // 2] = vals[n - 1] = vals.max() + 1  # ties: the first index wins
    idx, val = dev.empty((1,), torch.int64, -1), dev.empty((1,), dtype)
    dev.op("argmax", CODE[dtype], n, idx, val, dev.upload(vals))
    assert int(dev.download(idx)[0]) == int(torch.argmax(vals.double()))
    assert dev.download(val)[0].item() == vals.max().item()


def test_argmax_nan_is_the_maximum(dev):
    vals = torch.tensor([1.0, float("nan"), 5.0, float("nan")])
    idx, val = dev.empty((1,), torch.int64, -1), dev.empty((1,), torch.float32, 0)
    dev.op("argmax", 0, 4, idx, val, dev.upload(vals))
    assert int(dev.download(idx)[0]) == 1 and math.isnan(dev.download(val)[0].item())


# ---- embedding -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_ids.get)
@pytest.mark.parametrize("dim", [3, 64])
def test_embedding(dev, dtype, dim):
    weight = randn((13, dim), dtype, 6)
    index = torch.tensor([0, 12, 5, 5, 7], dtype=torch.int64)
    out = dev.empty((5, dim), dtype)
    dev.op("embedding", CODE[dtype], 5, dim, 13, out, dev.upload(index), dev.upload(weight))
    assert torch.equal(dev.download(out).view(torch.int16) if dtype == torch.bfloat16 else dev.download(out),
                       weight[index].view(torch.int16) if dtype == torch.bfloat16 else weight[index])


def test_embedding_index_out_of_range_is_reported_at_the_next_sync(dev):
    weight = randn((4, 8), torch.float32, 7)
    out = dev.empty((3, 8), torch.float32)
    dev.op("embedding", 0, 3, 8, 4, out, dev.upload(torch.tensor([1, 4, 0])), dev.upload(weight))  # queued: OK
    with pytest.raises(SlotError) as info:
        dev.download(out)
    assert info.value.status == 1
    assert "index value 4 at position 1" in info.value.message and "[0, 4)" in info.value.message
    dev.download(out)  # the error was reported once and cleared
    assert torch.equal(dev.download(out)[[0, 2]], weight[[1, 0]])


# ---- linear ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_ids.get)
@pytest.mark.parametrize("M,N,K", [(1, 3, 5), (2, 9, 64), (4, 17, 33), (9, 6, 300), (3, 5, 0)])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "nobias"])
def test_linear(dev, dtype, M, N, K, with_bias):
    x, w, b = randn((M, K), dtype, 8), randn((N, K), dtype, 9), randn(N, dtype, 10)
    out = dev.empty((M, N), dtype)
    dev.op("linear", CODE[dtype], M, N, K, out, dev.upload(x), dev.upload(w), dev.upload(b) if with_bias else None)
    want = x.double() @ w.double().T + (b.double() if with_bias else 0)
    check(dev.download(out), want, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_ids.get)
@pytest.mark.parametrize("K", [264, 263], ids=["K%8=0", "K%8=7"])
def test_linear_rows_do_not_depend_on_the_batch(dev, dtype, K):
    # every tile shape (M = 1, 2, 3..4, >= 5 rows) and row position gives a row the same bits; a row read
    # at an offset that breaks the 16-byte alignment of its chunks (x from row 1 of a copy shifted by one
    # element) too
    N = 11
    x, w, b = randn((13, K), dtype, 31), randn((N, K), dtype, 32), randn(N, dtype, 33)
    dw, db = dev.upload(w), dev.upload(b)

    def rows(xs):
        out = dev.empty((xs.shape[0], N), dtype)
        dev.op("linear", CODE[dtype], xs.shape[0], N, K, out, dev.upload(xs), dw, db)
        return dev.download(out)

    everything = rows(x)
    for start, m in ((0, 1), (12, 1), (3, 2), (5, 3), (0, 4), (2, 5), (4, 9)):
        assert torch.equal(rows(x[start:start + m]), everything[start:start + m]), (start, m)
    shifted = torch.cat([x.flatten()[:1], x.flatten()])  # row i of x starts at element 1 + i * K
    out = dev.empty((13, N), dtype)
    dev.op("linear", CODE[dtype], 13, N, K, out, dev.upload(shifted).offset(1, (13, K)), dw, db)
    assert torch.equal(dev.download(out), everything)


# ---- rearrange ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.uint8, torch.float16, torch.float32, torch.float64, torch.complex128],
                         ids=lambda t: str(t).split(".")[1])
@pytest.mark.parametrize("shape,perm", [((5,), (0,)), ((3, 4), (1, 0)), ((2, 3, 5), (2, 0, 1)),
                                        ((1, 3, 1, 4), (3, 2, 1, 0))])
def test_rearrange(dev, dtype, shape, perm):
    src = (torch.arange(int(np.prod(shape))) * 3 + 1).to(dtype).reshape(shape)
    view = src.permute(perm)  # copy the permuted view into a contiguous tensor
    d_src = dev.upload(src)
    out = dev.empty(view.shape, dtype, 0)
    contiguous = [int(np.prod(view.shape[i + 1:])) for i in range(view.ndim)]
    elem = src.element_size()
    dev.op("rearrange", elem, view.ndim, list(view.shape), out, contiguous, d_src, list(view.stride()))
    assert torch.equal(dev.download(out), view.contiguous())


# ---- rms_norm -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_ids.get)
@pytest.mark.parametrize("rows,dim", [(1, 1), (3, 17), (2, 1536)])
def test_rms_norm(dev, dtype, rows, dim):
    x, w = randn((rows, dim), dtype, 11), randn(dim, dtype, 12)
    dx = dev.upload(x)
    out = dev.empty((rows, dim), dtype)
    dev.op("rms_norm", CODE[dtype], 0, CODE[dtype], rows, dim, 1e-6, out, dx, dev.upload(w))
    x64 = x.double()
    want = x64 * w.double() / torch.sqrt((x64 * x64).mean(-1, keepdim=True) + 1e-6)
    check(dev.download(out), want, dtype)
    dev.op("rms_norm", CODE[dtype], 0, CODE[dtype], rows, dim, 1e-6, dx, dx, dev.upload(w))  # in place
    check(dev.download(dx), want, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16], ids=dtype_ids.get)
def test_rms_norm_f32_weight_is_gemmas(dev, dtype):
    """An f32 weight (Gemma's 1 + w, kept in f32): HF's Gemma3RMSNorm, x * r * (1 + w) in f32, rounded once."""
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    x, w = randn((3, 1536), dtype, 13, 3.0), randn(1536, torch.float32, 14, 0.5)
    norm = Gemma3RMSNorm(1536, eps=1e-6)
    norm.weight.data.copy_(w)
    out = dev.empty((3, 1536), dtype)
    dev.op("rms_norm", CODE[dtype], 0, CODE[torch.float32], 3, 1536, 1e-6, out, dev.upload(x), dev.upload(1 + w))
    with torch.no_grad():
        want = norm(x)
    # (the squares are summed in another order than torch's: 1 f32 ulp in the variance, rarely visible)
    assert int((dev.download(out) != want).sum()) <= 3


# ---- numerics = hf: rms_norm, rope, swiglu and geglu_tanh round as HF's op sequence in the dtype does -------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_ids.get)
def test_hf_numerics(dev, dtype):
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    hf = 1  # LLAISYS_NUMERICS_HF
    x, w = randn((3, 67), dtype, 21, 2.0), randn((67,), dtype, 22)
    norm = Qwen2RMSNorm(67, eps=1e-6).to(dtype)
    norm.weight.data.copy_(w)
    for numerics in (hf, 0):  # rms_norm's exact mode rounds where HF does too (the CPU backend's contract)
        out = dev.empty((3, 67), dtype)
        dev.op("rms_norm", CODE[dtype], numerics, CODE[dtype], 3, 67, 1e-6, out, dev.upload(x), dev.upload(w))
        with torch.no_grad():
            assert torch.equal(dev.download(out), norm(x)), f"numerics {numerics}"

    x, pos = randn((5, 3, 128), dtype, 23), torch.tensor([0, 7, 100000, 3, 65535], dtype=torch.int64)
    out = dev.empty((5, 3, 128), dtype)
    table = dev.upload(torch.from_numpy(llaisys.ops.rope_inv_freq(128, 1e6)))
    dev.op("rope", CODE[dtype], hf, 5, 3, 128, 1.0, out, dev.upload(x), dev.upload(pos), table)
    assert torch.equal(dev.download(out), hf_rope(x, pos, 1e6))

    g, u = randn(4097, dtype, 24, 3.0), randn(4097, dtype, 25)
    out = dev.empty((4097,), dtype)
    dev.op("swiglu", CODE[dtype], hf, 4097, out, dev.upload(g), dev.upload(u))
    # expf here and torch's silu exp are both within ~1 f32 ulp: in f16 a rounding boundary is hit ~1 in 1e4
    mismatched = int((dev.download(out) != torch.nn.functional.silu(g) * u).sum())
    assert mismatched <= (0 if dtype == torch.bfloat16 else 2), f"{mismatched} of 4097 differ from HF's"

    dev.op("geglu_tanh", CODE[dtype], hf, 4097, out, dev.upload(g), dev.upload(u))
    # (where torch's f32 1 + tanh(z) cancels, its values are its own: tests/ops/test_numerics_hf.py)
    well_conditioned = g.float() > (-2.5 if dtype == torch.bfloat16 else -2.0)
    want = torch.nn.functional.gelu(g, approximate="tanh") * u
    mismatched = int((dev.download(out) != want)[well_conditioned].sum())
    assert mismatched <= (0 if dtype == torch.bfloat16 else 2), f"geglu_tanh: {mismatched} differ from HF's"


def test_hf_numerics_attention(dev):
    """HF's GPU attention rounding is not implemented in f16 / bf16 (NOT_SUPPORTED, saying so); in f32 the
    hf mode is the exact mode."""
    q, k = randn((1, 2, 16), torch.float32, 26), randn((9, 1, 16), torch.float32, 27)
    outs = []
    for numerics in (0, 1):
        out = dev.empty((1, 2, 16), torch.float32)
        dev.op("self_attention", 0, numerics, 1, 9, 2, 1, 16, 16, 0.25, out, dev.upload(q), dev.upload(k), dev.upload(k))
        outs.append(dev.download(out))
    assert torch.equal(outs[0], outs[1])
    qh, kh = dev.upload(q.bfloat16()), dev.upload(k.bfloat16())
    with pytest.raises(SlotError) as info:
        dev.op("self_attention", 2, 1, 1, 9, 2, 1, 16, 16, 0.25, dev.empty((1, 2, 16), torch.bfloat16), qh, kh, kh)
    assert info.value.status == 4 and "numerics=hf attention" in info.value.message


# ---- rope ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_ids.get)
@pytest.mark.parametrize("seq,heads,d", [(1, 1, 2), (3, 2, 6), (5, 3, 128)])
def test_rope(dev, dtype, seq, heads, d):
    x = randn((seq, heads, d), dtype, 13)
    pos = torch.tensor([0, 7, 100000, 3, 65535][:seq], dtype=torch.int64)
    out = dev.empty((seq, heads, d), dtype)
    dx = dev.upload(x)
    table = dev.upload(torch.from_numpy(llaisys.ops.rope_inv_freq(d, 1e6)))
    dev.op("rope", CODE[dtype], 0, seq, heads, d, 1.0, out, dx, dev.upload(pos), table)
    want = rotate(x.double(), hf_angles(pos, d, 1e6))
    check(dev.download(out), want, dtype, 1e-4 if dtype == torch.float32 else None)
    dev.op("rope", CODE[dtype], 0, seq, heads, d, 1.0, dx, dx, dev.upload(pos), table)  # in place
    check(dev.download(dx), want, dtype, 1e-4 if dtype == torch.float32 else None)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_ids.get)
def test_rope_scaled_table(dev, dtype):
    """A rope-scaling table (any inverse frequencies) and YaRN's cos/sin scale."""
    seq, heads, d = 4, 3, 34
    g = torch.Generator().manual_seed(14)
    inv = (torch.rand(d // 2, generator=g, dtype=torch.float64) * 2.0).float()
    pos = torch.tensor([0, 9, 4097, 31000], dtype=torch.int64)
    x = randn((seq, heads, d), dtype, 15)
    out = dev.empty((seq, heads, d), dtype)
    dev.op("rope", CODE[dtype], 0, seq, heads, d, 1.25, out, dev.upload(x), dev.upload(pos), dev.upload(inv))
    angles = (pos.float()[:, None] * inv[None, :]).double()
    want = rotate(x.double(), angles) * float(np.float32(1.25))
    check(dev.download(out), want, dtype, 1e-4 if dtype == torch.float32 else None)


# ---- self_attention -----------------------------------------------------------------------------------

# (L, S, H, Hkv, d, dv): decode (L * G <= 8) with and without key splits, prefill tiles, dv != d, dv > 128
ATTENTION = [
    (1, 1, 1, 1, 8, 8),
    (1, 300, 4, 2, 16, 16),     # decode, keys split across blocks (combine kernel)
    (2, 9, 6, 2, 8, 12),        # L * G = 6 rows per kv head, dv != d
    (37, 37, 6, 2, 16, 16),     # prefill: 111 rows per kv head, several row tiles, partial key tiles
    (5, 70, 8, 8, 4, 200),      # dv > 128 (the DV_MAX = 256 kernels), long odd cache
]


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_ids.get)
@pytest.mark.parametrize("shape", ATTENTION, ids=lambda s: "L{}_S{}_H{}_Hkv{}_d{}_dv{}".format(*s))
def test_self_attention(dev, dtype, shape):
    L, S, H, Hkv, d, dv = shape
    q, k, v = randn((L, H, d), dtype, 14), randn((S, Hkv, d), dtype, 15), randn((S, Hkv, dv), dtype, 16)
    scale = 1 / math.sqrt(d)
    out = dev.empty((L, H, dv), dtype)
    dev.op("self_attention", CODE[dtype], 0, L, S, H, Hkv, d, dv, scale, out, dev.upload(q), dev.upload(k), dev.upload(v))
    check(dev.download(out), attention_reference(q, k, v, scale), dtype)


@pytest.mark.parametrize("alias", ["q", "v"])
def test_self_attention_output_may_be_q_or_v(dev, alias):
    L = S = 21
    H = Hkv = 2
    d = dv = 8
    q, k = randn((L, H, d), torch.float32, 17), randn((S, Hkv, d), torch.float32, 18)
    v = randn((S, Hkv, dv), torch.float32, 19)
    dq, dk, dv_ = dev.upload(q), dev.upload(k), dev.upload(v)
    out = dq if alias == "q" else dv_
    dev.op("self_attention", 0, 0, L, S, H, Hkv, d, dv, 0.3, out, dq, dk, dv_)
    check(dev.download(out), attention_reference(q, k, v, 0.3), torch.float32)


@pytest.fixture(scope="module")
def small_workspace(host_exec):
    """A second device of the same warp size whose streams have 2 KiB of workspace: attention then splits
    fewer ways and goes through the workspace in chunks of positions (last positions first)."""
    device = HostExecDevice(host_exec.warp, LLAISYS_CUDA_WORKSPACE_BYTES="2048")
    yield device
    device.free_all()
    device.close()


@pytest.mark.parametrize("shape,alias", [((40, 40, 2, 2, 8, 8), "v"), ((1, 300, 4, 2, 16, 16), None),
                                         ((3, 200, 16, 4, 8, 16), None)], ids=["alias_v", "decode", "chunks"])
def test_self_attention_with_a_small_workspace(small_workspace, shape, alias):
    dev = small_workspace
    L, S, H, Hkv, d, dv = shape
    q, k = randn((L, H, d), torch.float32, 22), randn((S, Hkv, d), torch.float32, 23)
    v = randn((S, Hkv, dv), torch.float32, 24)
    dq, dk, d_v = dev.upload(q), dev.upload(k), dev.upload(v)
    out = d_v if alias == "v" else dev.empty((L, H, dv), torch.float32)
    dev.op("self_attention", 0, 0, L, S, H, Hkv, d, dv, 0.4, out, dq, dk, d_v)
    check(dev.download(out), attention_reference(q, k, v, 0.4), torch.float32)


# ---- paged_attention / paged_kv_write -------------------------------------------------------------------

def paged_batch(dev, dtype, lens, H, Hkv, d, dv, block_size, extra_rows=0, seed=30):
    """A batch over shuffled blocks of random caches: (device args after dtype / numerics, q, per-sequence dense
    keys and values, T). lens: (L, S) per sequence; extra_rows past the last sequence belong to none."""
    g = torch.Generator().manual_seed(seed)
    need = [-(-S // block_size) for _, S in lens]
    num_blocks, max_blocks = sum(need) + 2, max(need + [1])
    k_cache, v_cache = randn((num_blocks, block_size, Hkv, d), dtype, seed), randn((num_blocks, block_size, Hkv, dv),
                                                                                   dtype, seed + 1)
    order = torch.randperm(num_blocks, generator=g).tolist()
    tables = torch.zeros((len(lens), max_blocks), dtype=torch.int32)
    dense = []
    for s, (_, S) in enumerate(lens):
        blocks = [order.pop() for _ in range(need[s])]
        tables[s, :len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        rows = [blocks[j // block_size] * block_size + j % block_size for j in range(S)]
        dense.append((k_cache.reshape(-1, Hkv, d)[rows], v_cache.reshape(-1, Hkv, dv)[rows]))
    starts = torch.tensor([0] + [L for L, _ in lens], dtype=torch.int32).cumsum(0).to(torch.int32)
    T = int(starts[-1]) + extra_rows
    q = randn((T, H, d), dtype, seed + 2)
    args = (T, len(lens), H, Hkv, d, dv, num_blocks, block_size, max_blocks)
    buffers = (dev.upload(q), dev.upload(k_cache), dev.upload(v_cache), dev.upload(tables),
               dev.upload(torch.tensor([S for _, S in lens], dtype=torch.int32)), dev.upload(starts))
    return args, buffers, q, dense, starts


def paged_attention(dev, dtype, args, buffers, scale, window=0):
    T, H, dv = args[0], args[2], args[5]
    out = dev.empty((T, H, dv), dtype)
    dev.op("paged_attention", CODE[dtype], 0, *args, window, scale, out, *buffers)
    return dev.download(out)


# (L, S) per sequence: decode rows, a chunk of a prompt, a sequence without rows (padding), keys over several
# tiles of 64, a partial last block; (H, Hkv, d, dv)
PAGED = [
    ([(1, 5), (4, 17), (0, 9), (1, 1)], (4, 2, 16, 16), 4),
    ([(1, 150), (3, 3), (2, 70)], (6, 2, 8, 12), 16),
    ([(2, 33)], (12, 2, 64, 64), 8),  # G = 6 heads of 64 share a kv head
]


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_ids.get)
@pytest.mark.parametrize("case", range(len(PAGED)))
def test_paged_attention_matches_dense_attention(dev, dtype, case):
    lens, (H, Hkv, d, dv), block_size = PAGED[case]
    args, buffers, q, dense, starts = paged_batch(dev, dtype, lens, H, Hkv, d, dv, block_size, extra_rows=2)
    scale = 1 / math.sqrt(d)
    got = paged_attention(dev, dtype, args, buffers, scale)
    for s, (L, _) in enumerate(lens):
        rows = slice(int(starts[s]), int(starts[s + 1]))
        if L:
            check(got[rows], attention_reference(q[rows], *dense[s], scale), dtype)
    assert (got[int(starts[-1]):] == 0).all()  # rows outside every sequence


# sliding windows (query at position p sees keys p - window < j <= p): shorter than a cache block (4), longer
# than a block (16) and shorter than a tile of 64 keys, G = 6 heads per kv head (the longest windows, and one
# longer than every sequence, are the CPU tests': tests/ops/test_paged_attention.py)
WINDOWS = [(0, 3), (1, 40), (2, 7)]  # (PAGED case, window)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_ids.get)
@pytest.mark.parametrize("case,window", WINDOWS)
def test_paged_attention_window_matches_dense_attention(dev, dtype, case, window):
    """Keys before each query's window hold NaN (the caches are filled so): they must not be read at all."""
    lens, (H, Hkv, d, dv), block_size = PAGED[case]
    args, buffers, q, dense, starts = paged_batch(dev, dtype, lens, H, Hkv, d, dv, block_size, extra_rows=2)
    tables = dev.download(buffers[3])
    k_cache, v_cache = dev.download(buffers[1]), dev.download(buffers[2])
    for s, (L, S) in enumerate(lens):  # NaN wherever no query of the sequence looks
        for j in range(max(0, S - L - window + 1)):
            row = (int(tables[s, j // block_size]), j % block_size)
            k_cache[row], v_cache[row] = float("nan"), float("nan")
    buffers = (buffers[0], dev.upload(k_cache), dev.upload(v_cache), *buffers[3:])
    scale = 1 / math.sqrt(d)
    got = paged_attention(dev, dtype, args, buffers, scale, window)
    for s, (L, _) in enumerate(lens):
        rows = slice(int(starts[s]), int(starts[s + 1]))
        if L:
            check(got[rows], attention_reference(q[rows], *dense[s], scale, window), dtype)
    assert (got[int(starts[-1]):] == 0).all()


def test_paged_attention_a_sequence_alone_or_batched_bit_for_bit(dev):
    """A sequence's rows do not depend on the other sequences of the batch nor on where its blocks lie."""
    dt = torch.bfloat16
    lens, (H, Hkv, d, dv), bs = PAGED[1]
    args, buffers, q, dense, starts = paged_batch(dev, dt, lens, H, Hkv, d, dv, bs)
    batched = paged_attention(dev, dt, args, buffers, 0.3)
    i32 = lambda *values: dev.upload(torch.tensor(values, dtype=torch.int32))  # noqa: E731
    for s, (L, S) in enumerate(lens):
        nb = -(-S // bs)
        kc, vc = torch.zeros((nb, bs, Hkv, d), dtype=dt), torch.zeros((nb, bs, Hkv, dv), dtype=dt)
        kc.view(-1, Hkv, d)[:S], vc.view(-1, Hkv, dv)[:S] = dense[s]  # blocks 0, 1, ... in order
        rows = slice(int(starts[s]), int(starts[s + 1]))
        alone = paged_attention(dev, dt, (L, 1, H, Hkv, d, dv, nb, bs, nb),
                                (dev.upload(q[rows]), dev.upload(kc), dev.upload(vc), i32(*range(nb)), i32(S), i32(0, L)),
                                0.3)
        assert torch.equal(alone.view(torch.int16), batched[rows].view(torch.int16)), f"sequence {s}"


@pytest.mark.parametrize("case,named", [("block id", "= 99 is not a block"), ("seq_len", "seq_lens[1] = 40"),
                                        ("query_start", "query_start[3] = 9")])
def test_paged_attention_bad_index_data_is_reported(dev, case, named):
    lens, (H, Hkv, d, dv), bs = PAGED[0]
    args, (dq, dk, dv_, tables, seq_lens, starts), *_ = paged_batch(dev, torch.float32, lens, H, Hkv, d, dv, bs)
    num_seqs, max_blocks = args[1], args[8]
    i32 = lambda t: dev.upload(torch.tensor(t, dtype=torch.int32))  # noqa: E731
    if case == "block id":
        bad = dev.download(tables)
        bad[1, 2] = 99
        tables = i32(bad.tolist())
    elif case == "seq_len":
        seq_lens = i32([5, 40, 9, 1])  # past max_blocks * block_size
    else:
        starts = i32([0, 1, 5, 9, 6])  # not ascending
    out = dev.empty((args[0], H, dv), torch.float32)
    dev.op("paged_attention", 0, 0, *args, 0, 0.25, out, dq, dk, dv_, tables, seq_lens, starts)
    with pytest.raises(SlotError) as info:
        dev.download(out)
    assert info.value.status == 1 and named in info.value.message, info.value.message
    assert num_seqs == 4 and max_blocks == 5


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_ids.get)
def test_paged_kv_write(dev, dtype):
    T, Hkv, d, dv, slots = 5, 2, 8, 12, 24
    k_cache, v_cache = randn((slots, Hkv, d), dtype, 40), randn((slots, Hkv, dv), dtype, 41)
    k, v = randn((T, Hkv, d), dtype, 42), randn((T, Hkv, dv), dtype, 43)
    slot_mapping = torch.tensor([7, -1, 0, 23, 12])  # token 1 is skipped
    dk, dv_ = dev.upload(k_cache), dev.upload(v_cache)
    dev.op("paged_kv_write", CODE[dtype], T, Hkv, d, dv, slots, dk, dv_, dev.upload(k), dev.upload(v),
           dev.upload(slot_mapping))
    want_k, want_v = k_cache.clone(), v_cache.clone()
    for t, slot in enumerate(slot_mapping.tolist()):
        if slot >= 0:
            want_k[slot], want_v[slot] = k[t], v[t]
    assert torch.equal(dev.download(dk), want_k) and torch.equal(dev.download(dv_), want_v)

    # a slot past the cache: reported, and nothing written (not even the good tokens)
    dev.op("paged_kv_write", CODE[dtype], T, Hkv, d, dv, slots, dk, dv_, dev.upload(-k), dev.upload(-v),
           dev.upload(torch.tensor([1, 2, 24, 3, 4])))
    with pytest.raises(SlotError) as info:
        dev.synchronize()
    assert info.value.status == 1 and "slot_mapping[2] = 24 is past the cache's 24 slots" in info.value.message
    assert torch.equal(dev.download(dk), want_k) and torch.equal(dev.download(dv_), want_v)


# ---- sample ----------------------------------------------------------------------------------------------

def draw(dev, logits_dev, dtype, n, temperature, top_k, top_p, seed):
    out = dev.empty((1,), torch.int64, -1)
    dev.op("sample", CODE[dtype], n, out, logits_dev, temperature, top_k, top_p, seed)
    return int(dev.download(out)[0])


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_ids.get)
@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8), (1.0, 7, 0.6),
                                                     (0.0, 0, 1.0), (1.0, 1, 1.0)])
def test_sample_draws_the_reference_token(dev, dtype, temperature, top_k, top_p):
    logits = randn(50, dtype, 20, scale=2.0)
    logits[[3, 30]] = logits[11].item()  # equal logits: order by index
    d_logits = dev.upload(logits)
    for seed in range(8):
        want = reference_token(logits, temperature, top_k, top_p, seed)
        assert draw(dev, d_logits, dtype, 50, temperature, top_k, top_p, seed) == want, f"seed {seed}"


def test_sample_ties_at_the_kth_logit_keep_the_lowest_indices(dev):
    logits = torch.zeros(300)
    logits[[5, 250]] = 2.0
    d_logits = dev.upload(logits)
    allowed = {5, 250} | set(i for i in range(300) if i not in (5, 250))
    allowed = {5, 250} | set(sorted(allowed - {5, 250})[:4])  # top_k = 6: two above, the first four ties
    seen = {draw(dev, d_logits, torch.float32, 300, 50.0, 6, 1.0, s) for s in range(16)}
    assert seen <= allowed and len(seen) > 2


def test_sample_large_vocabulary_path(dev):
    logits = randn(9000, torch.bfloat16, 21, scale=3.0)  # >= 8192: the 1024-thread block
    d_logits = dev.upload(logits)
    for seed, (t, k, p) in enumerate([(1.0, 40, 0.9), (0.8, 0, 0.5)]):
        assert draw(dev, d_logits, torch.bfloat16, 9000, t, k, p, seed) == reference_token(logits, t, k, p, seed)


def test_sample_inf_logits_share_the_mass(dev):
    logits = torch.tensor([0.0, float("inf"), 3.0, float("inf"), -1.0])
    d_logits = dev.upload(logits)
    seen = {draw(dev, d_logits, torch.float32, 5, 1.0, 0, 1.0, s) for s in range(30)}
    assert seen == {1, 3}


@pytest.mark.parametrize("values,message", [([0.0, float("nan"), 1.0], "logits[1] is NaN"),
                                            ([float("-inf")] * 3, "every logit is -inf")])
def test_sample_bad_logits_are_reported(dev, values, message):
    out = dev.empty((1,), torch.int64, -1)
    dev.op("sample", 0, 3, out, dev.upload(torch.tensor(values)), 1.0, 0, 1.0, 0)
    with pytest.raises(SlotError) as info:
        dev.download(out)
    assert info.value.status == 1 and message in info.value.message


# ---- mask_logits --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_ids.get)
@pytest.mark.parametrize("rows,vocab", [(1, 1), (1, 33), (3, 1000)])
def test_mask_logits(dev, dtype, rows, vocab):
    """Banned logits are -inf, allowed ones keep their exact bits; bits past the vocabulary are ignored."""
    g = torch.Generator().manual_seed(vocab)
    words = (vocab + 31) // 32
    keep = torch.rand((rows, words * 32), generator=g) < 0.5
    bitmask = torch.from_numpy(np.packbits(keep.numpy(), axis=1, bitorder="little").view(np.int32).copy())
    x = randn((rows, vocab), dtype, vocab)
    logits = dev.upload(x)
    dev.op("mask_logits", CODE[dtype], rows, vocab, logits, dev.upload(bitmask))
    want = torch.where(keep[:, :vocab], x.double(), torch.tensor(-torch.inf, dtype=torch.float64))
    assert torch.equal(dev.download(logits).double(), want)


# ---- penalize_logits -------------------------------------------------------------------------------------

def penalize(dev, logits, dtype, ids, counts, bias, repetition, frequency, presence):
    d_logits = dev.upload(logits.to(dtype))
    d_bias = None if bias is None else dev.upload(torch.tensor(bias, dtype=torch.float32))
    dev.op("penalize_logits", CODE[dtype], logits.numel(), len(ids), d_logits,
           dev.upload(torch.tensor(ids, dtype=torch.int64)),
           dev.upload(torch.tensor(counts, dtype=torch.int64).reshape(-1, 2)), d_bias, repetition, frequency, presence)
    return dev.download(d_logits)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_ids.get)
@pytest.mark.parametrize("vocab,tokens", [(17, 9), (4097, 700)])  # 700 distinct-ish ids: several per thread
def test_penalize_logits(dev, dtype, vocab, tokens):
    g = torch.Generator().manual_seed(vocab)
    logits = randn((vocab,), dtype, vocab, scale=4.0)
    prompt = torch.randint(0, vocab, (tokens,), generator=g).tolist()
    generated = torch.randint(0, vocab, (tokens // 2,), generator=g).tolist() + prompt[:2] * 3
    ids, counts, bias = entries(prompt, generated, {1: -100.0, 5: 100.0, 6: 0.25})
    got = penalize(dev, logits, dtype, ids, counts, bias, 1.3, 0.7, -0.4)
    check(got, penalty_reference(logits.double(), ids, counts, bias, 1.3, 0.7, -0.4), dtype)
    if dtype == torch.float32:  # the CPU kernel's f32 arithmetic, unfused: HF's processor bit for bit
        from transformers import RepetitionPenaltyLogitsProcessor

        ids, counts, _ = entries(prompt, generated)
        want = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([prompt + generated]), logits[None].clone())[0]
        assert torch.equal(penalize(dev, logits, dtype, ids, counts, None, 1.3, 0.0, 0.0), want)


def test_penalize_logits_with_nothing_listed(dev):
    logits = randn((9,), torch.float32, 3)
    assert torch.equal(penalize(dev, logits, torch.float32, [], [], None, 2.0, 1.0, 1.0), logits)


@pytest.mark.parametrize("ids,counts,message", [
    ([0, 9], [1, 0, 0, 1], "ids[1] = 9 is not a token id in [0, 5)"),
    ([3, 3], [1, 0, 0, 1], "ids[1] = 3 is not above ids[0] = 3"),
    ([1, 2], [1, 0, 0, -1], "counts[1] = (0, -1) is negative"),
])
def test_penalize_logits_bad_entries_write_nothing_and_are_reported(dev, ids, counts, message):
    logits = torch.arange(5, dtype=torch.float32)
    d_logits = dev.upload(logits)
    dev.op("penalize_logits", 0, 5, 2, d_logits, dev.upload(torch.tensor(ids)), dev.upload(torch.tensor(counts)),
           None, 2.0, 1.0, 1.0)
    with pytest.raises(SlotError) as info:
        dev.download(d_logits)
    assert info.value.status == 1 and message in info.value.message, info.value.message
    assert torch.equal(dev.download(d_logits), logits)


# ---- logprobs ------------------------------------------------------------------------------------------

def logprobs(dev, logits, dtype, chosen, temperature, k):
    top_ids, values = dev.empty((max(k, 1),), torch.int64, -1), dev.empty((k + 1,), torch.float32)
    dev.op("logprobs", CODE[dtype], logits.numel(), dev.upload(logits.to(dtype)), chosen, temperature, k,
           top_ids if k else None, values)
    got = dev.download(values).double()
    return float(got[0]), dev.download(top_ids)[:k].tolist(), got[1:].tolist()


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_ids.get)
@pytest.mark.parametrize("n,k,temperature", [(1, 1, 1.0), (9, 0, 0.0), (4099, 20, 0.7)])
def test_logprobs(dev, dtype, n, k, temperature):
    logits = randn((n,), dtype, n, scale=3.0)
    if n > 8:
        logits[3] = logits[n - 2] = logits[5] = logits.max()  # ties: the lower id first
    got = logprobs(dev, logits, dtype, n // 2, temperature, k)
    want = logprobs_reference(logits, n // 2, temperature, k)
    assert got[0] == pytest.approx(want[0], abs=1e-4)
    assert got[1] == want[1]
    assert got[2] == pytest.approx(want[2], abs=1e-4)


@pytest.mark.parametrize("values,message", [
    ([0.0, float("nan"), 1.0], "logits[1] is NaN"),
    ([0.0, float("inf")], "logits[1] is +inf"),
    ([-float("inf")] * 3, "every logit is -inf"),
])
def test_logprobs_bad_logits_are_reported(dev, values, message):
    out = dev.empty((2,), torch.float32)
    dev.op("logprobs", 0, len(values), dev.upload(torch.tensor(values)), 0, 1.0, 1, dev.empty((1,), torch.int64, -1),
           out)
    with pytest.raises(SlotError) as info:
        dev.download(out)
    assert info.value.status == 1 and message in info.value.message
