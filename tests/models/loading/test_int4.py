"""quantize="int4": the q4_0 quantizer against its formula written out here, what a load stores, and the refusal
on a device without the kernel. (How far int4 moves a model: tests/demo's addition accuracy, README's numbers
from benchmarks/quant_quality.py.)"""

from __future__ import annotations

import numpy as np
import pytest

import llaisys
import llaisys_models
from helpers.quant_matrices import BF16, DTYPES, random_matrix
from llaisys_models import ModelLoadError
from llaisys_models.loading import quantize as quantization
from llaisys_models.loading.quantize import BlockWeight
from llaisys_models.loading.weights import LINEARS


def reference(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes [N, K], d [N, G]) by the formula, one group at a time: m = the value of largest magnitude, d = m /
    -8 rounded to f16, u = round-half-even(w / d) + 8 clipped to [0, 15] (d = 0: u = 8)."""
    n, k = w.shape
    codes = np.zeros((n, k), np.uint8)
    d = np.zeros((n, -(-k // 32)), np.float16)
    for row in range(n):
        for group in range(d.shape[1]):
            values = w[row, 32 * group:32 * (group + 1)].astype(np.float32)
            m = values[np.argmax(np.abs(values))]
            d[row, group] = np.float16(m / np.float32(-8))
            scale = np.float32(d[row, group])
            codes[row, 32 * group:32 * (group + 1)] = 8 if scale == 0 else np.clip(np.rint(values / scale) + 8, 0, 15)
    return codes, d


def quantize_int4(w: np.ndarray):
    chunks = list(quantization.quantized_chunks(lambda s, e: w[s:e], w.shape, "w", quantization.quantize_rows_int4))
    return np.concatenate([c[2] for c in chunks]), np.concatenate([c[3] for c in chunks])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (5, 32), (7, 33), (2, 95), (40, 200)], ids=str)
def test_matches_the_formula(shape, dtype):
    w = random_matrix(shape, DTYPES[dtype], seed=shape[0] * 1000 + shape[1])
    codes, d = quantize_int4(w)
    want_codes, want_d = reference(w)
    np.testing.assert_array_equal(d.view(np.uint16), want_d.view(np.uint16))
    np.testing.assert_array_equal(codes, want_codes)


def test_every_value_comes_back_within_half_a_step():
    """|w - d (u - 8)| <= |d| / 2 (up to d's f16 rounding), except values of the other sign than the largest
    magnitude's beyond 7.5 |d|: they clip at u = 15, within |d|."""
    w = random_matrix((33, 257), BF16, seed=7).astype(np.float32)
    codes, d = quantize_int4(w)
    per_k = np.repeat(d.astype(np.float64), 32, axis=1)[:, :w.shape[1]]
    step = np.abs(per_k)
    error = np.abs(w - llaisys.ops.dequantize_quant("q4_0", codes, d))
    clipped = (codes == 15) & (w / np.where(per_k == 0, 1, per_k) > 7.5)
    assert clipped.any() and (error[clipped] <= step[clipped]).all()
    assert (error[~clipped] <= step[~clipped] / 2 * (1 + 2 ** -10)).all(), f"worst {np.max(error / step):.3f} steps"
    w[0, :32] = np.linspace(-1, 1, 32)  # both extremes: the +1 clips to 7 steps of 1/8
    codes, d = quantize_int4(w)
    assert d[0, 0] == np.float16(0.125) and codes[0, 0] == 0 and codes[0, 31] == 15
    assert abs(llaisys.ops.dequantize_quant("q4_0", codes, d)[0, 31] - 1) == 0.125


def test_q8_0_scales_are_amax_over_127_rounded_up_to_f16():
    """The lm_head's q8_0 (quantize="int4"): d = max|w| / 127 rounded up to a float16, q = round-half-even(w / d)
    in [-127, 127] without clipping: every value within half a step."""
    w = random_matrix((9, 100), BF16, seed=3).astype(np.float32)
    chunks = list(quantization.quantized_chunks(lambda s, e: w[s:e], w.shape, "w", quantization.quantize_rows_q8_0))
    q, d = np.concatenate([c[2] for c in chunks]), np.concatenate([c[3] for c in chunks])
    amax = np.abs(np.pad(w, ((0, 0), (0, 28)))).reshape(9, -1, 32).max(-1)
    exact = amax.astype(np.float64) / 127
    assert (d.astype(np.float64) >= exact).all()
    assert (np.nextafter(d, np.float16(0)).astype(np.float64) < exact).all()  # the smallest f16 above
    step = np.repeat(d.astype(np.float32), 32, axis=1)[:, :100]
    assert np.abs(q).max() <= 127 and np.all(np.abs(q * step - w) <= step / 2)


def test_zero_groups_and_refusals():
    w = np.zeros((2, 64), np.float32)
    w[1, 40] = 3.0
    codes, d = quantize_int4(w)
    assert (d[0] == 0).all() and (codes[0] == 8).all() and d[1, 0] == 0 and d[1, 1] == np.float16(-0.375)
    for bad, what in ((np.nan, "inf or NaN"), (1e6, "beyond 8 x the largest float16")):
        w[1, 3] = bad
        with pytest.raises(ModelLoadError, match=what):
            quantize_int4(w)


def test_a_load_stores_q4_0_blocks_and_a_q8_0_lm_head(tiny_models, device):
    from helpers import skip_without_kernels

    skip_without_kernels(device, ["linear_q"], "quantize='int4'")
    model = llaisys_models.load(tiny_models.path("llama_f32_tied"), device=device, quantize="int4")
    w = model.weights
    assert model.quantize == "int4" and model.weight_formats == ("q4_0", "q8_0")
    assert isinstance(w.lm_head, BlockWeight) and w.lm_head.fmt == "q8_0" and w.embed_tokens.dtype == model.dtype
    # the tied lm_head: the embedding's values in q8_0, each within half a step (scales rounded up: no clipping)
    q, d = llaisys.ops.unpack_quant("q8_0", w.lm_head.weight.numpy(), w.lm_head.scales.numpy(), *w.lm_head.shape)
    step = np.repeat(d.astype(np.float32), 32, axis=1)[:, :q.shape[1]]
    assert np.all(np.abs(q * step - w.embed_tokens.numpy().astype(np.float32)) <= step / 2)
    for layer in w.layers:
        present = [field for field in LINEARS[:-1] if getattr(layer, field) is not None]
        assert present == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]  # (Llama's)
        for field in present:
            weight = getattr(layer, field)
            assert isinstance(weight, BlockWeight) and weight.fmt == "q4_0", field
    # the blocks of one matrix are the quantizer's codes and scales
    down = w.layers[1].down_proj
    info = model.checkpoint.info("model.layers.1.mlp.down_proj.weight")
    want = quantize_int4(info.file.array(info))
    got = llaisys.ops.unpack_quant("q4_0", down.weight.numpy(), down.scales.numpy(), *down.shape)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1].view(np.uint16), want[1].view(np.uint16))


def test_a_device_without_linear_q_is_refused_naming_it(tiny_models, monkeypatch):
    registry = llaisys.plugins.registry()
    cpu = registry.backend("cpu")
    real = cpu.kernel
    monkeypatch.setattr(cpu, "kernel", lambda op: None if op == "linear_q" else real(op))
    monkeypatch.setattr(registry, "_kernels", {})
    with pytest.raises(llaisys.BackendUnavailableError, match="quantize='int4' needs the linear_q kernel"):
        llaisys_models.load(tiny_models.path("f32_gqa2_hd32"), device="cpu", quantize="int4")
