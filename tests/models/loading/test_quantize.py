"""The int8 quantizer (llaisys_models.loading.quantize) against the contract's formula written out here in plain numpy:
per row and group of 32 along K, scale = max |w| / 127 rounded up to a bfloat16, q = round-half-even(w / scale)
clipped to [-127, 127]; scales [N, G]; and the blocks the linears store (llaisys.ops.pack_int8)."""

from __future__ import annotations

import numpy as np
import pytest

import llaisys
from helpers.quant_matrices import BF16, DTYPES, random_matrix
from llaisys_models import ModelLoadError
from llaisys_models.loading import quantize as quantization

SHAPES = [(1, 1), (3, 17), (5, 32), (7, 33), (4, 64), (2, 95), (9, 128), (2, 4097), (40, 200)]


def reference(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(q [N, K], scales [N, G]) by the contract, one group at a time in the simplest terms."""
    n, k = w.shape
    g = -(-k // 32)
    q = np.zeros((n, k), np.int8)
    scales = np.zeros((n, g), BF16)
    for row in range(n):
        for group in range(g):
            values = w[row, 32 * group:32 * (group + 1)].astype(np.float32)
            amax = np.abs(values).max()
            # amax / 127 rounded UP to a bfloat16: the nearest bf16 of the exact quotient (float64 holds it
            # closely enough to decide), moved one bf16 step up when that fell below
            exact = np.float64(amax) / 127
            scale = np.array(exact).astype(BF16)
            if np.float64(scale) < exact:
                scale = np.nextafter(scale, np.array(np.inf, BF16))
            scales[row, group] = scale
            if scale != 0:
                q[row, 32 * group:32 * (group + 1)] = np.clip(np.rint(values / np.float32(scale)), -127, 127)
    return q, scales


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_the_contract_formula(shape, dtype):
    w = random_matrix(shape, DTYPES[dtype], seed=shape[0] * 1000 + shape[1])
    q, scales = quantization.quantize(w)
    want_q, want_scales = reference(w)
    assert q.dtype == np.int8 and q.shape == shape
    assert scales.dtype == BF16 and scales.shape == (shape[0], -(-shape[1] // 32))
    np.testing.assert_array_equal(scales.view(np.uint16), want_scales.view(np.uint16))
    np.testing.assert_array_equal(q, want_q)


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_value_comes_back_within_half_a_step(dtype):
    w = random_matrix((33, 257), DTYPES[dtype], seed=7)
    q, scales = quantization.quantize(w)
    step = np.repeat(scales.astype(np.float64), 32, axis=1)[:, :w.shape[1]]  # [N, K]: each element's scale
    error = np.abs(w.astype(np.float64) - step * q)
    assert (error <= step / 2).all(), f"worst error {np.max(error / step):.3f} steps"
    assert np.abs(q).max() <= 127 and q.min() >= -127


def test_the_largest_value_of_each_group_maps_to_126_or_127():
    # the scale is amax / 127 rounded UP to a bf16 (8 significant bits): up to 2^-7 above it, so amax / scale
    # lies in [127 / (1 + 2^-7), 127] = [126.01, 127] and rounds to 126 or 127; exactly 127 when amax / 127
    # is a bf16 already
    w = random_matrix((16, 100), np.float32, seed=3)  # groups of 32, 32, 32 and a short one of 4
    w[0, :32] *= 127 * 2.0 ** -3 / np.abs(w[0, :32]).max()  # amax 127/8: scale exactly 1/8
    q, _ = quantization.quantize(w)
    for row in range(16):
        for start in range(0, 100, 32):
            group, ints = w[row, start:start + 32], q[row, start:start + 32]
            i = int(np.argmax(np.abs(group)))
            assert abs(int(ints[i])) == np.abs(ints).max() and abs(int(ints[i])) in (126, 127), (row, start)
            assert np.sign(ints[i]) == np.sign(group[i])
    assert np.abs(q[0, :32]).max() == 127


def test_scales_are_amax_over_127_rounded_up_to_bf16():
    w = random_matrix((64, 64), np.float32, seed=11)
    _, scales = quantization.quantize(w)
    amax = np.abs(w.astype(np.float64)).reshape(64, 2, 32).max(axis=2)  # [N, G]
    s = scales.astype(np.float64)
    below = np.nextafter(scales, np.zeros_like(scales)).astype(np.float64)  # the bf16 just under each scale
    assert (s >= amax / 127).all() and (below < amax / 127).all()


def test_zero_groups_get_scale_zero():
    w = random_matrix((4, 96), np.float32, seed=5)
    w[1] = 0  # a zero row
    w[2, 32:64] = 0  # a zero group between others
    w[3, 64:] = -0.0
    q, scales = quantization.quantize(w)
    assert (scales[1] == 0).all() and (q[1] == 0).all()
    assert scales[2, 1] == 0 and (q[2, 32:64] == 0).all() and scales[2, 0] > 0 and scales[2, 2] > 0
    assert scales[3, 2] == 0 and (q[3, 64:] == 0).all()
    q, scales = quantization.quantize(np.zeros((3, 5), BF16))
    assert (q == 0).all() and (scales.astype(np.float32) == 0).all()


def test_a_short_last_group_has_its_own_scale():
    w = np.full((2, 33), 127 * 2.0 ** -8, np.float32)  # scale exactly 2^-8: q 127
    w[:, 32] = [8.0, -3.0]  # alone in the last group
    q, scales = quantization.quantize(w)
    assert (scales[:, 0].astype(np.float64) == 2.0 ** -8).all() and (q[:, :32] == 127).all()
    # 8 / 127 = 0.06299 and 3 / 127 = 0.02362, each rounded up to the next bf16 (steps of 2^-11 and 2^-13
    # there): 0.06348 and 0.02368, so 8 maps to 126.03 -> 126 and -3 to -126.69 -> -127
    assert scales[:, 1].astype(np.float64).tolist() == [2 ** -4 + 2 * 2 ** -11, 2 ** -6 + 66 * 2 ** -13]
    np.testing.assert_array_equal(q[:, 32], [126, -127])


def test_ties_round_half_to_even():
    # a group whose amax is 127 has scale exactly 1: w / scale is w, so .5 values are ties
    w = np.zeros((1, 32), np.float32)
    w[0, :10] = [127, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, 126.5, -126.5]
    q, scales = quantization.quantize(w)
    assert float(scales[0, 0]) == 1.0
    np.testing.assert_array_equal(q[0, :10], [127, 0, 2, 2, 0, -2, -2, 4, 126, -126])


def test_bf16_round_up():
    rng = np.random.default_rng(0)
    x = np.concatenate([np.exp(rng.uniform(-90, 80, 10000)), [0.0, 1.0, 1.5, 2.0 ** -130, 2.0 ** -149, 3e38]])
    x = x.astype(np.float32)
    up = quantization.bf16_round_up(x)
    assert up.dtype == BF16
    assert (up.astype(np.float32) >= x).all()
    below = np.nextafter(up, np.zeros_like(up)).astype(np.float32)
    assert ((below < x) | (up.astype(np.float32) == 0)).all()
    exact = x.astype(BF16).astype(np.float32) == x  # values that are bf16 already stay
    np.testing.assert_array_equal(up.astype(np.float32)[exact], x[exact])


def test_chunks_of_rows_give_the_same_result(monkeypatch):
    w = random_matrix((37, 70), BF16, seed=9)
    whole = quantization.quantize(w)
    monkeypatch.setattr(quantization, "CHUNK_VALUES", 3 * 70)  # one block of 16 rows a chunk, a short last one
    chunked = quantization.quantize(w)
    np.testing.assert_array_equal(whole[0], chunked[0])
    np.testing.assert_array_equal(whole[1].view(np.uint16), chunked[1].view(np.uint16))


@pytest.mark.parametrize("shape", [(1, 5), (16, 64), (37, 70), (50, 129)], ids=str)
def test_a_linear_weight_is_the_blocks_of_q_and_scales(monkeypatch, shape):
    """int8_weight (what a load stores) holds pack_int8 of quantize's (q, scales), also when quantized a chunk
    at a time, and unpacks back to them."""
    w = random_matrix(shape, BF16, seed=shape[0])
    q, scales = quantization.quantize(w)
    want_blocks, want_scales = llaisys.ops.pack_int8(q, scales)
    for chunk_values in (quantization.CHUNK_VALUES, 3 * shape[1]):
        monkeypatch.setattr(quantization, "CHUNK_VALUES", chunk_values)
        stored = quantization.int8_weight(lambda start, end: w[start:end], shape, llaisys.as_device("cpu"))
        assert stored.shape == shape
        np.testing.assert_array_equal(stored.weight.numpy(), want_blocks)
        np.testing.assert_array_equal(stored.scales.numpy().view(np.uint16), want_scales.view(np.uint16))
    back_q, back_scales = llaisys.ops.unpack_int8(stored.weight.numpy(), stored.scales.numpy(), *shape)
    np.testing.assert_array_equal(back_q, q)
    np.testing.assert_array_equal(back_scales.view(np.uint16), scales.view(np.uint16))


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_inf_or_nan_is_refused_naming_the_tensor(bad):
    w = np.ones((4, 40), np.float32)
    w[2, 35] = bad
    with pytest.raises(ModelLoadError, match=r"tensor 'model.layers.0.mlp.up_proj.weight' holds inf or NaN \(row 2\)"):
        quantization.quantize(w, "model.layers.0.mlp.up_proj.weight")


@pytest.mark.parametrize("value", ["int3", "INT9", "", 8, True])
def test_unknown_quantize_values_are_refused(value):
    with pytest.raises(ModelLoadError, match="quantize must be None, 'int8' or 'int4', got"):
        quantization.resolve(value)
    assert quantization.resolve(None) is None and quantization.resolve("INT8") == "int8"
    assert quantization.resolve("int4") == "int4"
