"""rope (half-split / rotate_half layout), against float64 references and HF transformers' Qwen2 rope.

The op takes its inverse frequencies as an f32 table (``rope_inv_freq(d, theta)`` is the plain one; rope
scaling makes others) and a cos/sin scale (YaRN's attention factor). Two references: `exact` uses
float64 angles; `hf_angle` rotates in float64 by the f32 angle that HF computes (inv_freq =
1 / theta^(2j/d) and pos * inv_freq rounded to f32), which the kernel follows.
Against `hf_angle` every dtype must meet the DESIGN §6 tolerance; against `exact` the f32 angle
error shows (~pos * 1e-7 rad), so positions below 64 use the rope tolerances (f32 1e-4) and
positions near 1e5 use 2e-2, as DESIGN §6 says.
"""


import numpy as np
import pytest
import torch

import llaisys
from helpers import FLOAT_DTYPES, TORCH_DTYPES, assert_close, from_torch, nan_filled, random, rope_table, to_torch
from helpers.references.rope import hf_angles, rotate
from helpers.simd_paths import LEVELS, run_under_simd, skip_unless_level_available

EXACT_TOL = {llaisys.float32: 1e-4, llaisys.float16: 1e-3, llaisys.bfloat16: 1e-2}  # small positions
# (seq, heads, head_dim): odd sizes (half = 1, 3, 17, 2049 exercise the vector tails) and Qwen2 heads
SHAPES = [(1, 1, 2), (3, 1, 6), (17, 3, 34), (3, 1, 4098), (1, 12, 128), (1, 2, 128), (33, 2, 128), (5, 4, 64)]


def exact_angles(pos, head_dim, theta):
    j = torch.arange(head_dim // 2, dtype=torch.float64)
    return pos.to(torch.float64)[:, None] / theta ** (2 * j / head_dim)


def run_rope(x, pos, theta, dtype, device, out=None):
    pos_t = from_torch(pos, device)
    out = nan_filled(tuple(x.shape), dtype, device) if out is None else out
    llaisys.ops.rope(out, x, pos_t, rope_table(x.shape[2], theta, device))
    return out


def check_rope(shape, dtype, pos, theta=1e6, device="cpu", seed=0, scale=1.0, exact_tol=None):
    seq, heads, d = shape
    g = torch.Generator().manual_seed(seed)
    x, rx = random(shape, dtype, device, g, scale=scale)
    out = run_rope(x, pos, theta, dtype, device)
    assert_close(out, rotate(rx, hf_angles(pos, d, theta)))
    if exact_tol is not None:
        assert_close(out, rotate(rx, exact_angles(pos, d, theta)), exact_tol)


def check_small_shapes():
    for dtype in FLOAT_DTYPES:
        for i, shape in enumerate(SHAPES):
            g = torch.Generator().manual_seed(i)
            pos = torch.randint(0, 64, (shape[0],), generator=g)
            check_rope(shape, dtype, pos, seed=i, exact_tol=EXACT_TOL[dtype])
        check_rope((16, 2, 128), dtype, torch.arange(100000, 100016), seed=1, scale=0.5, exact_tol=2e-2)
        check_rope((4, 1, 64), dtype, torch.tensor([0, 1_700_000, 3_000_000, 40_000_000]), theta=1e4, seed=2)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_rope_small_positions(device, shape, dtype):
    g = torch.Generator().manual_seed(shape[0] * 7 + shape[2])
    pos = torch.randint(0, 64, (shape[0],), generator=g)
    check_rope(shape, dtype, pos, theta=1e4 if shape[2] < 64 else 1e6, device=device, seed=shape[2],
               exact_tol=EXACT_TOL[dtype])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("heads", [12, 2])
def test_rope_qwen2_prefill(device, heads, dtype):
    check_rope((512, heads, 128), dtype, torch.arange(512), theta=1e6, device=device, seed=heads)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_rope_positions_near_1e5(device, dtype):
    pos = torch.arange(100000, 100064)
    check_rope((64, 4, 128), dtype, pos, theta=1e6, device=device, seed=4, scale=0.5, exact_tol=2e-2)


@pytest.mark.parametrize("dtype", [llaisys.float32, llaisys.bfloat16], ids=lambda d: d.name)
def test_rope_huge_and_negative_positions(device, dtype):
    """Angles beyond the fast range reduction (|a| >= 1.6e6) and negative positions."""
    pos = torch.tensor([0, -1, -37, 1_599_999, 1_600_001, 3_000_000, 40_000_000, (1 << 40) + 3])
    check_rope((8, 2, 64), dtype, pos, theta=1e4, device=device, seed=5)


def test_rope_tables_are_not_stale(device):
    """The kernel reuses the cos/sin table when (theta, head_dim, positions) repeat: every change shows."""
    g = torch.Generator().manual_seed(9)
    x, rx = random((6, 2, 16), llaisys.float32, device, g)
    calls = [(torch.arange(6), 1e4), (torch.arange(6), 1e4), (torch.arange(6) + 1, 1e4),
             (torch.arange(6) + 1, 1e6), (torch.arange(6), 1e4)]
    for pos, theta in calls:
        assert_close(run_rope(x, pos, theta, llaisys.float32, device), rotate(rx, hf_angles(pos, 16, theta)))
    # a different head dim with the same positions
    x32, rx32 = random((6, 1, 32), llaisys.float32, device, g)
    assert_close(run_rope(x32, torch.arange(6), 1e4, llaisys.float32, device),
                 rotate(rx32, hf_angles(torch.arange(6), 32, 1e4)))
    # the same position tensor (same address) rewritten in place
    pos_t, table = from_torch(torch.arange(6), device), rope_table(16, 1e4, device)
    out = nan_filled((6, 2, 16), llaisys.float32, device)
    llaisys.ops.rope(out, x, pos_t, table)
    pos_t.load(np.arange(6, dtype=np.int64) * 5)
    llaisys.ops.rope(out, x, pos_t, table)
    assert_close(out, rotate(rx, hf_angles(torch.arange(6) * 5, 16, 1e4)))
    # the same table tensor rewritten in place, and a new scale
    table.load(llaisys.ops.rope_inv_freq(16, 1e6))
    llaisys.ops.rope(out, x, pos_t, table)
    assert_close(out, rotate(rx, hf_angles(torch.arange(6) * 5, 16, 1e6)))
    llaisys.ops.rope(out, x, pos_t, table, 0.5)
    assert_close(out, rotate(rx, hf_angles(torch.arange(6) * 5, 16, 1e6)) * 0.5)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_rope_in_place(device, dtype):
    g = torch.Generator().manual_seed(10)
    x, rx = random((5, 3, 40), dtype, device, g)
    pos = torch.arange(5) * 3
    llaisys.ops.rope(x, x, from_torch(pos, device), rope_table(40, 1e4, device))
    assert_close(x, rotate(rx, hf_angles(pos, 40, 1e4)))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_rope_matches_hf_qwen2(device, dtype):
    """Against transformers' Qwen2RotaryEmbedding + apply_rotary_pos_emb in the model dtype."""
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding, apply_rotary_pos_emb
    config = Qwen2Config(hidden_size=1536, num_attention_heads=12, num_key_value_heads=2, rope_theta=1e6)
    tdt = TORCH_DTYPES[dtype]
    g = torch.Generator().manual_seed(11)
    for pos in (torch.arange(256), torch.arange(100000, 100128)):
        x = torch.randn(len(pos), 12, 128, generator=g).to(tdt)
        cos, sin = Qwen2RotaryEmbedding(config)(x, pos[None])
        q = x.transpose(0, 1)[None]  # [1, heads, seq, d]
        want, _ = apply_rotary_pos_emb(q, q, cos, sin)
        want = want[0].transpose(0, 1).to(torch.float64)
        got = to_torch(run_rope(from_torch(x, device), pos, 1e6, dtype, device)).to(torch.float64)
        diff = (got - want).abs()
        if dtype == llaisys.float32:
            # HF's Sleef cos/sin/pow differ from ours by <= 1 ulp; at 1e5 that moves an angle by < 1e-5 rad
            assert diff.max() <= 1e-4, f"f32 differs from HF by {diff.max():.3g} at positions from {int(pos[0])}"
            exact = rotate(x.double(), exact_angles(pos, 128, 1e6))
            if pos[0] > 0:  # shows that the comparison would catch exact (f64) angles
                assert (exact - want).abs().max() > 1e-3
        else:
            # HF also rounds cos/sin and both products to the dtype (tools/hf_rounding.py): a few ulp apart
            ulp = {llaisys.float16: 2.0 ** -10, llaisys.bfloat16: 2.0 ** -7}[dtype]
            assert (diff <= 4 * ulp * want.abs() + 4 * ulp).all(), f"max diff {diff.max():.3g} vs HF"


@pytest.mark.parametrize("level", LEVELS)
def test_rope_on_every_simd_path(device, level):
    skip_unless_level_available(device, level)
    run_under_simd(__name__, level, "t.check_small_shapes()")


def test_rope_rejects_bad_arguments(device):
    f32 = lambda *s: llaisys.empty(s, llaisys.float32, device)  # noqa: E731
    pos, t = from_torch(torch.arange(4), device), rope_table(8, 1e4, device)
    with pytest.raises(ValueError, match=r"head dim.*even"):
        llaisys.ops.rope(f32(4, 2, 7), f32(4, 2, 7), pos, t)
    with pytest.raises(ValueError, match=r"\bpos_ids\b.*dtype int32"):
        llaisys.ops.rope(f32(4, 2, 8), f32(4, 2, 8), llaisys.empty((4,), llaisys.int32, device), t)
    with pytest.raises(ValueError, match=r"\bpos_ids\b.*shape"):
        llaisys.ops.rope(f32(4, 2, 8), f32(4, 2, 8), from_torch(torch.arange(5), device), t)
    with pytest.raises(ValueError, match=r"\btheta\b.*shape"):
        llaisys.ops.rope(f32(4, 2, 8), f32(4, 2, 8), pos, f32(8))
    with pytest.raises(ValueError, match=r"\btheta\b.*dtype"):
        llaisys.ops.rope(f32(4, 2, 8), f32(4, 2, 8), pos, llaisys.empty((4,), llaisys.bfloat16, device))
    with pytest.raises(ValueError, match=r"\btheta\b.*number.*llaisys.Tensor.*got str"):
        llaisys.ops.rope(f32(4, 2, 8), f32(4, 2, 8), pos, "1e4")
    for theta in (True, 0.0, -1e4, float("nan"), float("inf")):  # a base must be a finite number > 0
        with pytest.raises(ValueError, match=r"\btheta\b"):
            llaisys.ops.rope(f32(4, 2, 8), f32(4, 2, 8), pos, theta)
    with pytest.raises(ValueError, match=r"head dim.*even"):
        llaisys.ops.rope(f32(4, 2, 7), f32(4, 2, 7), pos, 1e4)
    with pytest.raises(ValueError, match=r"\bx\b.*llaisys.Tensor"):
        llaisys.ops.rope(f32(4, 2, 8), np.zeros((4, 2, 8), np.float32), pos, 1e4)
    for scale in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match=r"\bscale\b"):
            llaisys.ops.rope(f32(4, 2, 8), f32(4, 2, 8), pos, t, scale)
    with pytest.raises(ValueError, match=r"\bx\b.*3-d"):
        llaisys.ops.rope(f32(4, 16), f32(4, 16), pos, t)
    with pytest.raises(ValueError, match=r"\bout\b.*shape"):
        llaisys.ops.rope(f32(4, 2, 6), f32(4, 2, 8), pos, t)
    with pytest.raises(ValueError, match=r"\bx\b.*contiguous"):
        llaisys.ops.rope(f32(4, 2, 8), f32(2, 4, 8).permute(1, 0, 2), pos, t)
    with pytest.raises(ValueError, match=r"\btheta\b"):
        llaisys.ops.rope_inv_freq(8, 0.0)
    with pytest.raises(ValueError, match=r"\bhead_dim\b.*even"):
        llaisys.ops.rope_inv_freq(7, 1e4)


def course_rope(y: torch.Tensor, x: torch.Tensor, pos_ids: torch.Tensor, theta: float) -> None:
    """The course's reference (test/ops/rope.py of the upstream llaisys assignment), as it writes it: angles
    pos / theta^(2i/d) in f32, the result written into y."""
    seq_len, n_heads, head_dim = y.shape
    x_a, x_b = x[..., : head_dim // 2], x[..., head_dim // 2:]
    positions = pos_ids.to(torch.float32).unsqueeze(1)
    i = torch.arange(0, head_dim // 2, dtype=torch.float32)
    freqs = positions / (theta ** (2 * i / head_dim))
    sin, cos = freqs.sin().unsqueeze(1), freqs.cos().unsqueeze(1)
    y[..., : head_dim // 2] = x_a * cos - x_b * sin
    y[..., head_dim // 2:] = x_b * cos + x_a * sin


@pytest.mark.parametrize("shape, start_end", [((2, 1, 4), (0, 2)), ((512, 4, 4096), (512, 1024))])
@pytest.mark.parametrize("dtype, atol, rtol", [(llaisys.float32, 1e-3, 1e-4), (llaisys.float16, 1e-3, 1e-3),
                                               (llaisys.bfloat16, 1e-2, 1e-2)], ids=["f32", "f16", "bf16"])
def test_rope_takes_the_course_theta(device, shape, start_end, dtype, atol, rtol):
    """``rope(out, x, pos_ids, theta)`` with a float theta, exactly as the course's test calls it, against the
    course's own reference, shapes and tolerances (its f32 atol is 1e-3: at positions near 1024 an f32 angle,
    the course's or HF's, is ~1e-4 rad from the exact one); another base gets that base's table."""
    g = torch.Generator().manual_seed(12)
    x = torch.rand(shape, generator=g).to(TORCH_DTYPES[dtype])
    pos_ids = torch.arange(*start_end, dtype=torch.int64)
    x_, pos_ids_ = from_torch(x, device), from_torch(pos_ids, device)
    for theta in (10000.0, 1e6, 10000):
        y = torch.empty_like(x)
        course_rope(y, x, pos_ids, theta)
        y_ = nan_filled(shape, dtype, device)
        llaisys.ops.rope(y_, x_, pos_ids_, theta)
        assert torch.allclose(to_torch(y_), y, atol=atol, rtol=rtol), f"theta {theta}"


def test_rope_inv_freq_is_hf_default_table():
    """The plain table equals HF's default inv_freq (within 1 f32 ulp: torch's Sleef powf), for the theta /
    head_dim pairs of the families llaisys runs."""
    import transformers.modeling_rope_utils  # noqa: F401 (HF's default rope is inlined per model)
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding
    for d, theta in [(64, 1e4), (128, 1e6), (128, 5e5), (96, 1e4), (256, 1e6), (32, 10000.0)]:
        config = Qwen2Config(hidden_size=d * 2, num_attention_heads=2, head_dim=d, rope_theta=theta)
        hf = Qwen2RotaryEmbedding(config).inv_freq.numpy()
        ours = llaisys.ops.rope_inv_freq(d, theta)
        assert ours.dtype == np.float32 and ours.shape == (d // 2,)
        ulps = np.abs(ours.view(np.int32) - hf.view(np.int32))
        assert ulps.max() <= 1 and (ulps == 0).mean() >= 0.9, f"d={d} theta={theta}: {ulps}"


SCALED = [(3, 2, 16), (17, 3, 34), (5, 4, 128)]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("shape", SCALED, ids=lambda s: "x".join(map(str, s)))
def test_rope_any_table_and_scale(device, shape, dtype):
    """A rope-scaling table (any positive inverse frequencies) and a cos/sin scale, against float64 torch
    turning by the f32 angle f32(p) * inv_freq[j] (HF: position_ids.float() @ inv_freq) with cos, sin scaled."""
    seq, heads, d = shape
    g = torch.Generator().manual_seed(seq * 13 + d)
    inv = (torch.rand(d // 2, generator=g, dtype=torch.float64) * 2.0).float()  # in [0, 2)
    inv[0], inv[-1] = 1.0, 1e-5  # the extremes of real tables
    pos = torch.randint(0, 40000, (seq,), generator=g)
    x, rx = random(shape, dtype, device, g)
    for scale in (1.0, 1.0693147, 0.75):
        out = nan_filled(shape, dtype, device)
        llaisys.ops.rope(out, x, from_torch(pos, device), from_torch(inv, device), scale)
        angles = (pos.float()[:, None] * inv[None, :]).double()
        c = (angles.cos().float() * np.float32(scale)).double()[:, None, :]
        s = (angles.sin().float() * np.float32(scale)).double()[:, None, :]
        half = d // 2
        x1, x2 = rx[..., :half], rx[..., half:]
        assert_close(out, torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), -1))
