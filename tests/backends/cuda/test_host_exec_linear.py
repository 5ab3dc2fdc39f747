"""The CUDA linears (ops/linear_tc.cuh, ops/linear_i8.cu), run on CPU threads at warp 32 and 64 (host execution).

The tensor-core linear (f16 / bf16 at warp 32, the NVIDIA configuration; CoreX's warp 64 takes the SIMT kernel):
its outputs against float64, and bit for bit against a numpy model of its documented reduction (THE REDUCTION
in linear_tc.cuh) under host execution's mma_sync (exact products summed in double, rounded to f32 once), which
shows that both kernels (rows_kernel, tile_kernel) compute exactly that reduction, so that every row is the same
bits whatever M is. Whether a GPU's tensor cores round as host execution does is not shown here (they do not):
tools/gpu_check.sh compares rows across M bit for bit on the GPU.

linear_i8: the int8 weight blocks and the on-the-fly quantization of x, bit for bit against the CPU kernel
(its AVX2 / AVX-512 builds, whose arithmetic the CUDA one follows) and within the exact-arithmetic bound of
tests/ops/test_linear_i8.py, on the tails of N, K and M, with the workspace too small for one pass.
"""

import numpy as np
import pytest
import torch
from host_exec.device import HostExecDevice

import llaisys
from helpers import from_torch, to_torch
from helpers.host_exec_ops import CODE, DTYPES, check, dtype_ids, randn
from helpers.references.int8 import quantize_weight, quantize_x
from helpers.simd_paths import cpu_simd_level

pytestmark = pytest.mark.slow
HALF_DTYPES = [torch.float16, torch.bfloat16]


def tensor_core_reference(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """THE REDUCTION of linear_tc.cuh with host execution's mma_sync: 16-wide k-tiles (zero padded), at most 8
    slices of consecutive tiles, each a chain of mma (D = f32(double(sum of 16 products, k in order) + C)) from
    0; the slices added in order in f32, then the bias, then one rounding to the dtype."""
    M, K = x.shape
    tiles = -(-K // 16)
    slices = min(8, tiles)
    xp, wp = np.zeros((M, tiles * 16)), np.zeros((w.shape[0], tiles * 16))
    xp[:, :K], wp[:, :K] = x.double().numpy(), w.double().numpy()
    total = np.zeros((M, w.shape[0]), np.float32)
    for s in range(slices):
        acc = np.zeros_like(total)
        for t in range(tiles * s // slices, tiles * (s + 1) // slices):
            products = np.zeros(total.shape)
            for k in range(t * 16, t * 16 + 16):
                products += np.outer(xp[:, k], wp[:, k])
            acc = (products + acc.astype(np.float64)).astype(np.float32)
        total = total + acc  # f32 + f32: one f32 rounding
    if bias is not None:
        total = total + bias.float().numpy()
    return torch.from_numpy(total).to(x.dtype)


# (M, N, K): rows_kernel (M <= 32: one or two tiles of 16 rows) and tile_kernel (M > 32, partial 64 x 64 tiles);
# K with one slice (K <= 16), fewer tiles than slices (K = 40: 3), uneven slices (264: 17 tiles), a short last
# tile (263), and a K that is not a multiple of 8 (every row load element by element).
SHAPES = [(1, 3, 5), (7, 33, 40), (17, 20, 263), (40, 70, 264), (70, 17, 130)]


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=dtype_ids.get)
@pytest.mark.parametrize("M,N,K", SHAPES)
def test_linear_f16_bf16(dev, dtype, M, N, K):
    if dev.warp != 32:
        pytest.skip("no tensor cores in the CoreX configuration: its SIMT kernel is checked by test_host_exec_ops.py")
    x, w, b = randn((M, K), dtype, 80 + M), randn((N, K), dtype, 81 + N), randn(N, dtype, 82)
    out = dev.empty((M, N), dtype)
    dev.op("linear", CODE[dtype], M, N, K, out, dev.upload(x), dev.upload(w), dev.upload(b))
    got = dev.download(out)
    check(got, x.double() @ w.double().T + b.double(), dtype)
    want = tensor_core_reference(x, w, b)  # the NVIDIA configuration: tensor cores, exactly the documented reduction
    assert torch.equal(got, want), f"{int((got != want).sum())} of {got.numel()} differ from THE REDUCTION"


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=dtype_ids.get)
def test_linear_rows_are_the_same_bits_for_every_M(dev, dtype):
    """Rows computed in batches of every size (both tensor-core kernels, every tile position) and from a
    misaligned copy of x are the same bits as the rows computed all at once."""
    if dev.warp != 32:
        pytest.skip("no tensor cores in the CoreX configuration: its SIMT kernel is checked by test_host_exec_ops.py")
    M, N, K = 70, 19, 136
    x, w, b = randn((M, K), dtype, 83), randn((N, K), dtype, 84), randn(N, dtype, 85)
    dw, db = dev.upload(w), dev.upload(b)

    def rows(xs, offset=0):
        out = dev.empty((xs.shape[0], N), dtype)
        if offset:  # row i of x starts at element offset + i K: no row is 16-byte aligned
            shifted = torch.cat([torch.zeros(offset, dtype=dtype), xs.flatten()])
            dx = dev.upload(shifted).offset(offset, tuple(xs.shape))
        else:
            dx = dev.upload(xs)
        dev.op("linear", CODE[dtype], xs.shape[0], N, K, out, dx, dw, db)
        return dev.download(out)

    everything = rows(x)
    for start, m in ((0, 1), (69, 1), (5, 7), (30, 17), (3, 33), (37, 33)):
        assert torch.equal(rows(x[start:start + m]), everything[start:start + m]), (start, m)
    assert torch.equal(rows(x[:40], offset=1), everything[:40])


@pytest.fixture(scope="module")
def warp32_devices():
    """Warp-32 devices: the default one (tensor cores), then two that must take the SIMT kernel for f16 / bf16:
    asked to (LLAISYS_CUDA_LINEAR_SIMT=1), and one whose kernels run code built for sm_75
    (LLAISYS_HOST_EXEC_BINARY=75: their binaryVersion and ptxVersion, as an older build's code or PTX compiled
    by the driver would report), which has no bf16 tensor-core instructions."""
    devices = [HostExecDevice(32), HostExecDevice(32, LLAISYS_CUDA_LINEAR_SIMT="1"),
               HostExecDevice(32, LLAISYS_HOST_EXEC_BINARY="75")]
    yield devices
    for device in devices:
        device.free_all()
        device.close()


def test_linear_takes_the_simt_kernel_without_tensor_cores(warp32_devices):
    """One output whose two arithmetics cannot agree: products +2^16 and -2^16 in different SIMT lanes, each
    beside three products of 2^-9 that an f32 sum of 2^16 loses (its ulp is 2^-7); the tensor-core reduction
    sums a 16-wide tile exactly (here: in double), so it keeps them: 6 * 2^-9 against the SIMT kernel's 0."""
    x = torch.zeros(1, 16, dtype=torch.float16)
    w = torch.zeros(1, 16, dtype=torch.float16)
    x[0, [0, 8]], w[0, [0, 8]] = torch.tensor([256.0, -256.0], dtype=torch.float16), 256.0
    x[0, [1, 2, 3, 9, 10, 11]], w[0, [1, 2, 3, 9, 10, 11]] = 2.0 ** -4, 2.0 ** -5
    got = []
    for dev in warp32_devices:
        out = dev.empty((1, 1), torch.float16)
        dev.op("linear", CODE[torch.float16], 1, 1, 16, out, dev.upload(x), dev.upload(w), None)
        got.append(float(dev.download(out)[0, 0]))
    assert got == [6 * 2.0 ** -9, 0.0, 0.0], got
    assert float(tensor_core_reference(x, w, None)[0, 0]) == 6 * 2.0 ** -9


# ---- linear_i8 ----------------------------------------------------------------------------------------------

def int8_case(M, N, K, dtype, seed):
    """Random x (a few large values, as activations have) and w quantized by the contract's quantizer."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((M, K))
    x[rng.random((M, K)) < 0.02] *= 8
    w = (rng.standard_normal((N, K)) * max(K, 1) ** -0.5).astype(np.float32)
    q, scales = quantize_weight(w)
    blocks, block_scales = llaisys.ops.pack_int8(q, scales)
    bias = torch.from_numpy(rng.standard_normal(N)).to(dtype)
    return torch.from_numpy(x).to(dtype), q, scales, blocks, block_scales, bias


def cpu_linear_i8(x, blocks, block_scales, bias, N):
    """The CPU backend's linear_i8 on the same inputs."""
    cpu = llaisys.Device("cpu")
    out = llaisys.empty((x.shape[0], N), from_torch(x[:0], cpu).dtype, cpu)
    llaisys.ops.linear_i8(out, from_torch(x, cpu), llaisys.from_numpy(blocks), llaisys.from_numpy(block_scales),
                          None if bias is None else from_torch(bias, cpu))
    return to_torch(out)


def run_linear_i8(dev, x, blocks, block_scales, bias, N):
    M, K = x.shape
    out = dev.empty((M, N), x.dtype)
    dev.op("linear_i8", CODE[x.dtype], M, N, K, out, dev.upload(x), dev.upload(torch.from_numpy(blocks)),
           dev.upload(torch.from_numpy(block_scales.view(np.int16)).view(torch.bfloat16)),
           None if bias is None else dev.upload(bias))
    return dev.download(out)


def exact_int8_reference(x, q, scales, bias):
    """The contract's arithmetic in float64 (quantized x, exact group dots, scaled and summed, no f32 rounding),
    and the bound of its f32 evaluation (tests/ops/test_linear_i8.py: (G + 3) f32 roundings of the sum of
    |terms|, twice, then the dtype's rounding)."""
    M, K = x.shape
    G = -(-K // 32)
    xq, sx = quantize_x(x.float().numpy())
    qp = np.zeros((q.shape[0], G * 32), np.int64)
    qp[:, :K] = q
    dots = np.einsum("mgi,ngi->mng", xq, qp.reshape(-1, G, 32))
    terms = dots * scales.astype(np.float64)[None] * sx.astype(np.float64)[:, None, :]
    b = 0 if bias is None else bias.double().numpy()
    exact = terms.sum(-1) + b
    eps = {torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}[x.dtype]
    bound = 2 * (G + 3) * 2.0 ** -24 * (np.abs(terms).sum(-1) + np.abs(b)) + eps * np.abs(exact)
    return torch.from_numpy(exact), torch.from_numpy(bound)


def cpu_matches_the_cuda_arithmetic() -> bool:
    """The CPU kernel's AVX2 / AVX-512 builds run the FMA chain the CUDA kernel runs; its portable build does not."""
    return cpu_simd_level() != "portable"


# (M, N, K): M = 1, 2, 3..4, 5..8 rows per block and more (several row tiles), N and K tails (a short last
# group, a partial block of rows), K = 0, and the Qwen2-1.5B K's with several chunks of parked groups (M = 1:
# 256 groups per chunk, K = 8960 is 280).
I8_SHAPES = [(1, 17, 33), (2, 5, 100), (3, 33, 64), (7, 16, 1), (9, 40, 300), (1, 20, 8960), (5, 3, 0)]


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_ids.get)
@pytest.mark.parametrize("M,N,K", I8_SHAPES)
def test_linear_i8_matches_the_cpu_kernel(dev, dtype, M, N, K):
    x, q, scales, blocks, block_scales, bias = int8_case(M, N, K, dtype, seed=M * 100 + K)
    got = run_linear_i8(dev, x, blocks, block_scales, bias, N)
    if K:
        exact, bound = exact_int8_reference(x, q, scales, bias)
        assert ((got.double() - exact).abs() <= bound).all(), "off the exact int8 arithmetic"
    else:
        assert torch.equal(got, bias[None].expand(M, N)), "K = 0: out = bias"
    if not cpu_matches_the_cuda_arithmetic():
        pytest.skip("the CPU backend runs its portable kernel here (no FMA): bits not comparable")
    want = cpu_linear_i8(x, blocks, block_scales, bias, N)
    assert torch.equal(got.view(torch.int16) if dtype != torch.float32 else got,
                       want.view(torch.int16) if dtype != torch.float32 else want), \
        f"{int((got != want).sum())} of {got.numel()} differ from the CPU kernel"


def test_linear_i8_nan_and_zero_groups(dev):
    """A group holding NaN makes its row NaN (the CPU's rule); an all-zero row gives the bias exactly."""
    x, q, scales, blocks, block_scales, bias = int8_case(3, 20, 70, torch.float32, seed=7)
    x[1, 40] = float("nan")
    x[2] = 0.0
    got = run_linear_i8(dev, x, blocks, block_scales, bias, 20)
    assert torch.isnan(got[1]).all() and torch.isfinite(got[[0, 2]]).all()
    assert torch.equal(got[2], bias)


@pytest.fixture(scope="module")
def small_workspace_i8(host_exec):
    """A device whose streams have 4 KiB of workspace: 53 rows of K = 64 (72 bytes each) per pass, so 90 rows take
    two passes."""
    device = HostExecDevice(host_exec.warp, LLAISYS_CUDA_WORKSPACE_BYTES="4096")
    yield device
    device.free_all()
    device.close()


def test_linear_i8_rows_are_the_same_bits_in_every_pass_and_batch(dev, small_workspace_i8):
    x, q, scales, blocks, block_scales, bias = int8_case(90, 21, 64, torch.bfloat16, seed=9)
    everything = run_linear_i8(dev, x, blocks, block_scales, bias, 21)
    assert torch.equal(run_linear_i8(small_workspace_i8, x, blocks, block_scales, bias, 21), everything)
    for start, m in ((0, 1), (89, 1), (3, 2), (10, 4), (20, 7), (33, 9)):
        assert torch.equal(run_linear_i8(dev, x[start:start + m], blocks, block_scales, bias, 21),
                           everything[start:start + m]), (start, m)
