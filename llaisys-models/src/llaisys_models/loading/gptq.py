"""GPTQ checkpoints as AutoGPTQ and GPTQModel publish them, unpacked into the integer matrices ``linear_gq`` runs.

A GPTQ linear of N outputs and K inputs, ``bits`` per weight, in groups of ``group_size`` inputs (G = K /
group_size groups; group_size -1: one group, the whole row), is stored as four tensors beside where the float
``weight`` would be (``<module>.qweight`` ...):

    qweight  int32 [K * bits / 32, N]   the codes, packed along K: word [i, n] holds k = i * 32/bits + j at bits
                                        [j * bits, (j + 1) * bits), lowest first
    qzeros   int32 [G, N * bits / 32]   the zero points, packed along N the same way: word [g, i] holds n = i *
                                        32/bits + j
    scales   float16 [G, N]
    g_idx    int32 [K]                  the group of each input column (k // group_size unless desc_act)

and w[n, k] = scales[g, n] * (q[k, n] - zero[g, n]) with g = g_idx[k]. The sources of these facts:

- AutoGPTQ's ``QuantLinear`` (auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py) registers exactly these buffers:
  qweight ``(infeatures // 32 * bits, outfeatures)``, qzeros ``(ceil(infeatures / group_size), outfeatures // 32 *
  bits)``, scales ``(..., outfeatures)`` float16, g_idx ``[i // group_size for i in range(infeatures)]`` int32; its
  ``pack`` ORs ``intweight[j] << (bits * (j - i))`` into each qweight row and, before packing the zeros, does
  ``zeros -= 1``; its forward unpacks with shifts ``range(0, 32, bits)``, masks with 2^bits - 1 and adds 1 back to
  the zeros. That "- 1" is the v1 format (``checkpoint_format`` "gptq", the default).
- GPTQModel (gptqmodel/quantization/config.py) names the formats ``FORMAT.GPTQ = "gptq"`` and ``FORMAT.GPTQ_V2 =
  "gptq_v2"`` ("v2 format fixed sym = False quantization": the zeros stored as they are), read from the JSON field
  ``checkpoint_format`` (``format`` in its code; ``is_marlin_format`` for the older Marlin layout), and a
  ``pack_dtype`` field (int32 unless told).
- llama.cpp's convert_hf_to_gguf.py ``dequant_gptq`` (after GPTQModel's qlinear ``dequantize_weight``) decodes:
  zeros = (qzeros >> range(0, 32, bits)) & maxq, weight likewise along K, ``zeros += 1`` only when
  ``checkpoint_format`` is "gptq", then ``(scales[g_idx] * (weight - zeros[g_idx])).T``.
- vLLM's gptq_utils.py ``get_dynamic_override``: ``dynamic`` maps regular expressions of module names (``re.match``
  from the start, in the dict's order, the first match deciding) to overrides of bits / group_size / desc_act / sym;
  a key starting "-:" excludes the modules it matches from quantization (they stay float: ``<module>.weight``), "+:"
  or no prefix overrides. ``modules_in_block_to_quantize`` (transformers' GPTQConfig) lists the modules that are
  quantized by substring; ``lm_head`` (a GPTQModel field) says whether the lm_head is.

``sym`` changes nothing here: a symmetric checkpoint stores its zero points (2^(bits-1)) like any other.

desc_act (act-order): the columns were quantized in the order of decreasing Hessian diagonal, so g_idx assigns
groups out of order, each group still holding group_size columns. A load sorts the columns by g_idx once (a stable
argsort, ``perm``): column j of the stored matrix is input perm[j], and the groups are contiguous again. The op then
reads x[m, perm[j]] for column j (``linear_gq``'s ``perm``); a g_idx that is already k // group_size needs none.
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np

from ..errors import ModelLoadError

BITS = (4, 8)  # what llaisys runs (GPTQ also has 2 and 3; 3 packs across words)
WORD_BITS = 32


def per_word(bits: int) -> int:
    return WORD_BITS // bits


def _bytes(packed: np.ndarray) -> np.ndarray:
    """The little-endian bytes of int32 words [R, C] as uint8 [R, C, 4] (byte j holds bits [8j, 8j + 8))."""
    if sys.byteorder != "little":  # safetensors stores little-endian words; a view reads them as this host's
        packed = packed.astype("<i4")
    return np.ascontiguousarray(packed).view(np.uint8).reshape(*packed.shape, 4)


def _codes(words: np.ndarray, bits: int) -> np.ndarray:
    """uint8 [A, B, 4] (the bytes of words, lowest first) -> the codes uint8 [A, B * 32/bits], lowest bits first."""
    a, b = words.shape[:2]
    if bits == 8:
        return np.ascontiguousarray(words).reshape(a, b * 4)
    out = np.empty((a, b, 4, 2), np.uint8)
    np.bitwise_and(words, 15, out=out[..., 0])
    np.right_shift(words, 4, out=out[..., 1])
    return out.reshape(a, b * 8)


def unpack_rows(packed: np.ndarray, bits: int) -> np.ndarray:
    """int32 words [R, C], each holding 32/bits codes along a row, lowest bits first -> uint8 [R, C * 32/bits]
    (qzeros; AWQ's qweight before its order is undone)."""
    return _codes(_bytes(packed), bits)


def unpack_columns(packed: np.ndarray, bits: int) -> np.ndarray:
    """int32 words [R, C], each holding 32/bits codes of a column, lowest bits first -> uint8 [C, R * 32/bits]:
    the codes transposed (GPTQ's qweight [K * bits / 32, N] -> q [N, K])."""
    return _codes(_bytes(packed).transpose(1, 0, 2), bits)  # [C, R, 4]


@dataclasses.dataclass
class Unpacked:
    """A grouped-quantized linear [N, K] as ``linear_gq`` takes it: w[n, perm[j]] = (q[n, j] - zeros[n, j // gs]) *
    scales[n, j // gs] (perm None: the identity), gs = group_size (K for one group)."""

    q: np.ndarray  # uint8 [N, K], in [0, 2^bits)
    zeros: np.ndarray  # uint16 [N, G] (a v1 checkpoint's may be 2^bits: its stored 2^bits - 1, plus one)
    scales: np.ndarray  # float16 [N, G]
    bits: int
    group_size: int  # > 0, dividing K
    perm: np.ndarray | None = None  # int32 [K]: column j holds input perm[j]

    @property
    def shape(self) -> tuple[int, int]:
        n, k = self.q.shape
        return n, k

    def rows(self, start: int, stop: int) -> Unpacked:
        """Outputs [start, stop) (a part of a fused matrix: Phi-3's qkv_proj), sharing perm."""
        return Unpacked(self.q[start:stop], self.zeros[start:stop], self.scales[start:stop], self.bits,
                        self.group_size, self.perm)

    def dequantized(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """The float32 weight [stop - start, K] of outputs [start, stop), inputs in their own order: exact (a float16
        scale times an integer of at most 9 bits needs at most 20 significant bits)."""
        q, z, s = self.q[start:stop], self.zeros[start:stop], self.scales[start:stop]
        n, k = q.shape
        g = np.arange(k) // self.group_size
        w = (q.astype(np.float32) - z[:, g].astype(np.float32)) * s[:, g].astype(np.float32)
        if self.perm is None:
            return w
        out = np.empty_like(w)
        out[:, self.perm] = w
        return out


def codes(qweight: np.ndarray, bits: int) -> np.ndarray:
    """q uint8 [N, K] of GPTQ's qweight int32 [K * bits / 32, N]."""
    return unpack_columns(qweight, bits)


def zero_points(qzeros: np.ndarray, bits: int, v1: bool) -> np.ndarray:
    """zeros [N, G] of GPTQ's qzeros int32 [G, N * bits / 32]: the stored values, plus one for v1 (checkpoint_format
    "gptq"), as uint16 (a v1 zero may be 2^bits)."""
    zeros = unpack_rows(qzeros, bits).T.astype(np.uint16)
    if v1:
        zeros += 1
    return np.ascontiguousarray(zeros)


def groups(g_idx: np.ndarray | None, k: int, group_size: int, num_groups: int, name: str) -> np.ndarray | None:
    """The column order that makes g_idx's groups contiguous (a stable argsort), or None where they already are
    (no g_idx, or g_idx = k // group_size); raises naming the tensor for a group index out of range or a group of
    other than group_size columns."""
    if g_idx is None:
        return None
    g = np.asarray(g_idx).astype(np.int64)
    bad = np.nonzero((g < 0) | (g >= num_groups))[0]
    if bad.size:
        col = int(bad[0])
        raise ModelLoadError(f"tensor {name!r} holds {int(g[col])} at column {col}, outside the {num_groups} group"
                             f"{'s' * (num_groups != 1)} [0, {num_groups}) of its scales")
    counts = np.bincount(g, minlength=num_groups)
    uneven = np.nonzero(counts != group_size)[0]
    if uneven.size:
        group = int(uneven[0])
        raise ModelLoadError(f"tensor {name!r} puts {int(counts[group])} columns in group {group}; each of the "
                             f"{num_groups} groups must hold group_size = {group_size} columns")
    if np.array_equal(g, np.arange(k) // group_size):
        return None
    return np.argsort(g, kind="stable").astype(np.int32)


def unpack(qweight: np.ndarray, qzeros: np.ndarray, scales: np.ndarray, perm: np.ndarray | None, bits: int,
           group_size: int, v1: bool) -> Unpacked:
    """The checked tensors of one GPTQ linear (shapes, dtypes and g_idx: quantized_checkpoint.py) as ``Unpacked``:
    the codes transposed to [N, K] (and their columns sorted by group where ``perm``), zeros and scales [N, G]."""
    q = codes(qweight, bits)
    if perm is not None:
        q = np.ascontiguousarray(q[:, perm])
    return Unpacked(q, zero_points(qzeros, bits, v1), np.ascontiguousarray(scales.T), bits, group_size, perm)
