"""numerics="hf": the ops round where HF transformers' Qwen2 forward rounds (its default, sdpa, on the CPU).

The reference is torch running HF's own op sequence in the model dtype (the modules and functions HF's
modeling_qwen2 calls), so the comparison is bit for bit where torch's op is deterministic:
* rope: HF's Qwen2RotaryEmbedding (cos/sin in f32, rounded to the dtype) and apply_rotary_pos_emb;
* swiglu: F.silu(gate) * up (silu in f32, rounded, then the product, rounded); geglu_tanh likewise with
  F.gelu(gate, approximate="tanh") (Gemma's MLP);
* rms_norm: Qwen2RMSNorm (the exact mode already rounds there, so both modes must match it);
* self_attention: F.scaled_dot_product_attention, which runs torch's CPU flash-attention kernel: P
  rounded to the dtype against the running max of 512-key blocks. torch computes exp with a ~20-bit
  approximation on whole vectors of 16 keys, so beyond 15 keys an output may move by an ulp; there the
  reference is that kernel written out in torch with an accurate exp (flash_emulation).
In float32 the hf mode is the exact mode, bit for bit.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import llaisys
from helpers import TORCH_DTYPES, from_torch, nan_filled, rope_table, to_torch
from helpers.references.numerics_hf import hf_rope

HALF_DTYPES = [llaisys.float16, llaisys.bfloat16]
MANTISSA_BITS = {llaisys.float16: 10, llaisys.bfloat16: 7}


def ulps(got: torch.Tensor, want: torch.Tensor, dtype) -> torch.Tensor:
    """|got - want| in ulps of the dtype at want's magnitude (f64 math on dtype values)."""
    got, want = got.to(torch.float64), want.to(torch.float64)
    exponent = torch.floor(torch.log2(want.abs().clamp_min(2.0 ** -14)))
    return (got - want).abs() / 2.0 ** (exponent - MANTISSA_BITS[dtype])


def assert_identical(got: llaisys.Tensor, want: torch.Tensor, what: str):
    g, w = to_torch(got), want.to(TORCH_DTYPES[got.dtype])
    assert g.shape == w.shape
    same = (g == w) | (torch.isnan(g) & torch.isnan(w))
    if not bool(same.all()):
        idx = tuple(int(i) for i in (~same).nonzero()[0])
        raise AssertionError(f"{what}: {int((~same).sum())} of {same.numel()} elements differ from HF's; first at "
                             f"{idx}: {g[idx].item()} vs {w[idx].item()}")


def rand(shape, dtype, gen, scale=1.0):
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(TORCH_DTYPES[dtype])


# ---- rope ---------------------------------------------------------------------------------------------


ROPE_CASES = [  # (seq, heads, head_dim, theta, largest position)
    (1, 1, 2, 1e4, 64), (3, 1, 6, 1e4, 64), (17, 3, 34, 1e6, 4096), (33, 2, 128, 1e6, 32768),
    (5, 12, 128, 1e6, 100), (7, 4, 64, 1e4, 100000), (3, 1, 4098, 1e4, 64),
]


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("case", ROPE_CASES, ids=lambda c: "x".join(map(str, c[:3])) + f"-t{c[3]:g}-p{c[4]}")
def test_rope_hf_matches_hf(device, case, dtype):
    seq, heads, d, theta, top = case
    gen = torch.Generator().manual_seed(seq * 31 + d)
    x = rand((seq, heads, d), dtype, gen)
    pos = torch.randint(0, top, (seq,), generator=gen)
    out = nan_filled((seq, heads, d), dtype, device)
    llaisys.ops.rope(out, from_torch(x, device), from_torch(pos, device), rope_table(d, theta, device),
                     numerics="hf")
    assert_identical(out, hf_rope(x, pos, theta), "rope")


# ---- swiglu -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("n", [1, 17, 4097, 8960 * 3])
def test_swiglu_hf_matches_hf(device, n, dtype):
    gen = torch.Generator().manual_seed(n)
    gate, up = rand((n,), dtype, gen, 3.0), rand((n,), dtype, gen)
    out = nan_filled((n,), dtype, device)
    llaisys.ops.swiglu(out, from_torch(gate, device), from_torch(up, device), numerics="hf")
    want = F.silu(gate) * up  # HF's Qwen2MLP: act_fn(gate_proj(x)) * up_proj(x)
    got = to_torch(out)
    # silu's f32 exp: torch's (Sleef) and llaisys' (vexp) both within ~2 f32 ulp; after rounding to bf16 they
    # agree, in f16 a rounding boundary is hit once in ~1e4 (then 1 ulp of silu)
    mismatched = got != want
    assert int(mismatched.sum()) <= (0 if dtype == llaisys.bfloat16 else max(1, n // 2000)), (
        f"{int(mismatched.sum())} of {n} differ from HF's")
    if bool(mismatched.any()):
        assert float(ulps(got[mismatched], want[mismatched], dtype).max()) <= 1.0


# ---- rms_norm -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (7, 1536), (2, 4097)], ids=lambda s: "x".join(map(str, s)))
def test_rms_norm_hf_matches_hf(device, shape, dtype):
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    gen = torch.Generator().manual_seed(shape[1])
    x, w = rand(shape, dtype, gen, 2.0), rand(shape[-1:], dtype, gen)
    norm = Qwen2RMSNorm(shape[-1], eps=1e-6).to(TORCH_DTYPES[dtype])
    norm.weight.data.copy_(w)
    with torch.no_grad():
        want = norm(x)
    for numerics in ("hf", "exact"):
        out = nan_filled(shape, dtype, device)
        llaisys.ops.rms_norm(out, from_torch(x, device), from_torch(w, device), 1e-6, numerics=numerics)
        got = to_torch(out)
        # the f32 mean of squares is summed in another order than torch's: 1 f32 ulp, rarely visible
        assert int((got != want).sum()) <= max(1, got.numel() // 1000), f"{numerics}: differs from HF's"


# ---- geglu_tanh ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("n", [17, 4097, 8960 * 3])
def test_geglu_tanh_hf_matches_hf(device, n, dtype):
    """HF's Gemma3MLP: act_fn(gate_proj(x)) * up_proj(x), gelu_pytorch_tanh rounded to the dtype before the
    product. torch computes x / 2 * (1 + tanh(z)) in f32, which cancels for negative gates (1 + tanh(z) is
    ~1e-3 at -2.5, from a tanh good to 1 f32 ulp of 1): those values are off the function by what the dtype
    resolves from -2.5 on in bf16, -2 in f16, and no other tanh reproduces them; llaisys computes the function
    itself. Above, the rounding is HF's."""
    gen = torch.Generator().manual_seed(n)
    gate, up = rand((n,), dtype, gen, 3.0), rand((n,), dtype, gen)
    got = {}
    for numerics in ("hf", "exact"):
        out = nan_filled((n,), dtype, device)
        llaisys.ops.geglu_tanh(out, from_torch(gate, device), from_torch(up, device), numerics=numerics)
        got[numerics] = to_torch(out)
    want = F.gelu(gate, approximate="tanh") * up
    well_conditioned = gate.float() > (-2.5 if dtype == llaisys.bfloat16 else -2.0)
    mismatched = int((got["hf"] != want)[well_conditioned].sum())
    assert mismatched <= (0 if dtype == llaisys.bfloat16 else max(1, n // 2000)), (
        f"{mismatched} of {int(well_conditioned.sum())} differ from HF's")
    if n > 1000:
        assert int((got["exact"] != want).sum()) > 3 * int((got["hf"] != want).sum()), "hf rounds as exact does?"


# ---- self_attention -----------------------------------------------------------------------------------

def visible_keys(L: int, S: int, window: int = 0) -> torch.Tensor:
    """[L, S]: query i (at position p = i + S - L) sees key j iff j <= p, and j > p - window with a window
    (HF's masking_utils: causal_mask_function and sliding_window_overlay)."""
    position, key = torch.arange(L)[:, None] + S - L, torch.arange(S)[None]
    return (key <= position) & (key > position - window) if window else key <= position


def sdpa(q, k, v, scale, window=0):
    """HF's sdpa_attention_forward on the CPU: q [L, H, d], k/v [S, Hkv, d]. As HF's generate calls it: a
    prefill from position 0 is_causal, a one-query decode step without a mask, and queries after a cached
    prefix (1 < L < S) with a boolean mask (query i sees key j iff j <= i + S - L); with a sliding window
    shorter than the keys always with its mask (masking_utils._ignore_causal_mask_sdpa)."""
    L, S = q.shape[0], k.shape[0]
    mask = None
    if 1 < L < S or 0 < window <= S:
        mask = visible_keys(L, S, window)
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                         attn_mask=mask, is_causal=mask is None and L == S and L > 1, scale=scale,
                                         enable_gqa=True)
    return out[0].transpose(0, 1).contiguous()


def flash_emulation(q, k, v, scale, block=512, window=0):
    """torch's CPU flash-attention kernel (what sdpa runs) written out with an accurate exp: f32 scores times
    the scale, keys in blocks of `block` from key 0, p = exp(s - running max), the row sum of the unrounded
    p, P = p rounded to the dtype, acc = acc * exp(m_old - m_new) + P V, out = acc * (1 / sum) rounded. A
    block a row sees no key of yet (before its window) adds nothing."""
    (L, H, _), (S, Hkv, _) = q.shape, k.shape
    rounded = lambda t: t.to(q.dtype).to(torch.float64)  # noqa: E731
    qf = q.double().transpose(0, 1)  # [H, L, d]
    kf, vf = (t.double().repeat_interleave(H // Hkv, 1).transpose(0, 1) for t in (k, v))  # [H, S, d]
    scores = torch.where(visible_keys(L, S, window), (qf @ kf.transpose(1, 2)).float() * scale, float("-inf"))
    acc = torch.zeros(H, L, vf.shape[-1])
    top, total = torch.full((H, L, 1), float("-inf")), torch.zeros(H, L, 1)
    for n in range(0, S, block):
        new_top = torch.maximum(top, scores[..., n:n + block].amax(-1, keepdim=True))
        safe = torch.where(new_top == float("-inf"), 0.0, new_top)  # (no inf - inf for a row that saw no key)
        p, rescale = torch.exp(scores[..., n:n + block] - safe), torch.exp(top - safe)
        total = p.sum(-1, keepdim=True) + rescale * total
        acc = acc * rescale + (rounded(p) @ vf[:, n:n + block]).float()
        top = new_top
    return (acc * (1 / total)).to(q.dtype).transpose(0, 1)


ATTENTION_CASES = [  # (L, S, H, Hkv, d): prefill (L == S), decode (L == 1), queries after a cached prefix
    (1, 1, 1, 1, 16), (1, 7, 2, 2, 64), (5, 5, 4, 2, 32), (15, 15, 12, 2, 128), (1, 15, 6, 1, 128), (3, 11, 4, 2, 64),
    (1, 200, 2, 2, 64), (1, 700, 12, 2, 128), (1, 1300, 4, 4, 64), (40, 40, 6, 2, 64), (600, 600, 2, 1, 32),
    (24, 560, 6, 2, 64),  # S > 512: several key blocks
]
# share of outputs that may differ from the emulation: llaisys' exp is not torch's (~2 f32 ulp either way),
# which moves a rounded P now and then; f16 (3 more mantissa bits) sees that ~8x as often (measured: <= 0.03%
# in bf16, <= 0.8% in f16 on these cases; the exact mode differs in 11-32%)
EMULATION_DIFFER = {llaisys.bfloat16: 0.002, llaisys.float16: 0.015}
# floats in one of torch's CPU vectors, which its exp approximates a vector at a time: 16 with AVX-512, 8 on a
# machine (or ATEN_CPU_CAPABILITY) of AVX2 only; the scalar build computes every exp with std::exp
TORCH_VECTOR_FLOATS = {"AVX2": 8}.get(torch.backends.cpu.get_cpu_capability(), 16)


def differ(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a != b).double().mean())


def run_attention(q, k, v, scale, device, numerics):
    L, H, d = q.shape
    out = nan_filled((L, H, v.shape[2]), q.dtype, device)
    llaisys.ops.self_attention(out, q, k, v, scale, numerics=numerics)
    return to_torch(out)


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("case", ATTENTION_CASES, ids=lambda c: "L{}-S{}-H{}-Hkv{}-d{}".format(*c))
def test_self_attention_hf_matches_sdpa(device, case, dtype):
    L, S, H, Hkv, d = case
    gen = torch.Generator().manual_seed(L * 7 + S)
    # scores of a few units, as in trained models: P takes many values, so its rounding matters
    q, k, v = rand((L, H, d), dtype, gen, 2.0), rand((S, Hkv, d), dtype, gen), rand((S, Hkv, d), dtype, gen)
    scale = d ** -0.5
    args = (from_torch(q, device), from_torch(k, device), from_torch(v, device), scale, device)
    try:
        got = run_attention(*args, "hf")
    except llaisys.errors.NotSupportedError as e:
        # a backend may decline the hf mode of f16 / bf16 attention (CUDA: where HF's GPU kernels round is not
        # measured yet); the CPU backend implements it
        if device.type == "cpu":
            raise
        pytest.skip(str(e))
    want = sdpa(q, k, v, scale)
    if S < TORCH_VECTOR_FLOATS:  # torch takes std::exp for a tail shorter than one of its vectors: bit for bit
        differs = got != want
        assert not bool(differs.any()), f"{int(differs.sum())} of {differs.numel()} outputs differ from sdpa's"
        return
    # beyond, torch's exp is a ~20-bit approximation that no accurate exp reproduces: llaisys must be the
    # emulation (all but a few outputs), and differ from sdpa no more than the emulation itself does
    emulated = flash_emulation(q, k, v, scale)
    assert differ(got, emulated) <= EMULATION_DIFFER[dtype], (
        f"{differ(got, emulated):.2%} of the outputs differ from the emulation of torch's flash attention")
    assert differ(got, want) <= differ(emulated, want) + EMULATION_DIFFER[dtype], (
        f"{differ(got, want):.2%} of the outputs differ from sdpa's, the emulation's {differ(emulated, want):.2%}")
    exact = run_attention(*args, "exact")
    assert differ(exact, emulated) > 10 * EMULATION_DIFFER[dtype], "the exact mode rounds as HF does? (test blind)"
    if S > 512:  # the blocks are torch's 512 keys, not llaisys' own 64
        assert differ(flash_emulation(q, k, v, scale, block=64), got) > 10 * EMULATION_DIFFER[dtype]


WINDOW_CASES = [  # (L, S, H, Hkv, d, window): windows across a 512-key block's bound, whole blocks before them
    (1, 1300, 12, 2, 128, 600), (24, 1100, 6, 2, 64, 300), (700, 700, 2, 1, 32, 100), (1, 40, 2, 2, 64, 16),
]


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("case", WINDOW_CASES, ids=lambda c: "L{}-S{}-H{}-Hkv{}-d{}-w{}".format(*c))
def test_paged_attention_window_hf_matches_sdpa(device, case, dtype):
    """paged_attention's hf mode with a sliding window rounds as HF's sdpa with its sliding-window mask."""
    L, S, H, Hkv, d, window = case
    if device.type != "cpu":
        pytest.skip("numerics='hf' attention in f16 / bf16 is implemented on the CPU only")
    gen = torch.Generator().manual_seed(L * 7 + S)
    q, k, v = rand((L, H, d), dtype, gen, 2.0), rand((S, Hkv, d), dtype, gen), rand((S, Hkv, d), dtype, gen)
    scale = d ** -0.5
    out = nan_filled((L, H, d), dtype, device)
    i32 = lambda values: from_torch(torch.tensor(values, dtype=torch.int32), device)  # noqa: E731
    # a cache of blocks of one position, in order
    llaisys.ops.paged_attention(out, from_torch(q, device), from_torch(k[:, None], device),
                                from_torch(v[:, None], device), i32([list(range(S))]), i32([S]), i32([0, L]),
                                scale, "hf", window)
    got, emulated = to_torch(out), flash_emulation(q, k, v, scale, window=window)
    assert differ(got, emulated) <= EMULATION_DIFFER[dtype], (
        f"{differ(got, emulated):.2%} of the outputs differ from the emulation of torch's flash attention")
    want = sdpa(q, k, v, scale, window)
    assert differ(got, want) <= differ(emulated, want) + EMULATION_DIFFER[dtype], (
        f"{differ(got, want):.2%} of the outputs differ from sdpa's, the emulation's {differ(emulated, want):.2%}")
    assert differ(flash_emulation(q, k, v, scale), emulated) > 0.5, "the window changes nothing? (test blind)"


# ---- float32: the hf mode is the exact mode ---------------------------------------------------------------

def test_f32_hf_is_exact(device):
    gen = torch.Generator().manual_seed(0)
    f32 = llaisys.float32

    def both(op, shape, *inputs):
        outs = []
        for numerics in ("exact", "hf"):
            out = nan_filled(shape, f32, device)
            op(out, *inputs, numerics=numerics)
            outs.append(to_torch(out))
        assert torch.equal(outs[0], outs[1]), f"{op.__name__}: f32 hf differs from exact"

    x = from_torch(rand((9, 4, 64), f32, gen), device)
    both(llaisys.ops.rope, (9, 4, 64), x, from_torch(torch.arange(9), device), rope_table(64, 1e6, device))
    g, u = from_torch(rand((1000,), f32, gen), device), from_torch(rand((1000,), f32, gen), device)
    both(llaisys.ops.swiglu, (1000,), g, u)
    both(llaisys.ops.geglu_tanh, (1000,), g, u)
    q, k = from_torch(rand((1, 4, 64), f32, gen), device), from_torch(rand((700, 2, 64), f32, gen), device)
    both(llaisys.ops.self_attention, (1, 4, 64), q, k, k, 0.125)


def test_numerics_argument_is_checked(device):
    x = llaisys.zeros((2, 1, 4), llaisys.bfloat16, device)
    pos = from_torch(torch.arange(2), device)
    with pytest.raises(llaisys.LlaisysError, match="numerics must be 'exact' or 'hf', got 'HF-ish'"):
        llaisys.ops.rope(x, x, pos, rope_table(4, 1e4, device), numerics="HF-ish")
