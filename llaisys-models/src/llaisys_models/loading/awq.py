"""AWQ checkpoints in AutoAWQ's GEMM layout, unpacked into the integer matrices ``linear_gq`` runs.

An AWQ linear of N outputs and K inputs (4 bits, groups of ``group_size`` inputs, G = K / group_size) is stored
as (AutoAWQ's awq/modules/linear/gemm.py, ``WQLinear_GEMM``):

    qweight  int32 [K, N / 8]    the codes, packed along N: word [k, c] holds 8 outputs of column block c, nibble
                                 i (bits [4i, 4i + 4)) holding output 8c + order[i], order = [0, 2, 4, 6, 1, 3, 5, 7]
    qzeros   int32 [G, N / 8]    the zero points, packed the same way
    scales   float16 [G, N]

and w[n, k] = scales[g, n] * (q[k, n] - zero[g, n]) with g = k // group_size: no "- 1" on the zeros, no g_idx,
no act-order. ``WQLinear_GEMM.from_linear`` packs with ``order_map = [0, 2, 4, 6, 1, 3, 5, 7]``,
``qweight[:, col] |= intweight[:, col * 8 + order_map[i]] << (i * 4)``, and asserts ``in_features %
group_size == 0`` and ``out_features % 8 == 0``; its ``dequantize_gemm`` (awq/utils/packing_utils.py) undoes the
order with ``AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]`` after shifting by ``range(0, 32, 4)``.

``quantization_config`` (transformers' AwqConfig): ``quant_method`` "awq", ``bits`` (AutoAWQ's own file: ``w_bit``)
4, ``group_size`` (``q_group_size``), ``zero_point`` true, ``version`` "gemm" (GEMV and GEMV_FAST pack otherwise:
refused), ``modules_to_not_convert`` (substrings of module names kept in float; transformers adds the lm_head,
which AutoAWQ never quantizes).
"""

from __future__ import annotations

import numpy as np

from .gptq import Unpacked, unpack_rows

BITS = 4
ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of a word holds output 8c + ORDER[i]
REVERSE = tuple(ORDER.index(j) for j in range(8))  # output 8c + j is nibble REVERSE[j]: (0, 4, 1, 5, 2, 6, 3, 7)


def in_order(packed: np.ndarray) -> np.ndarray:
    """int32 [R, N / 8] of AWQ words -> uint8 [R, N], the outputs in their own order."""
    nibbles = unpack_rows(packed, BITS)  # [R, N]: 8c + i is nibble i of word c
    r, n = nibbles.shape
    return np.ascontiguousarray(nibbles.reshape(r, n // 8, 8)[:, :, REVERSE]).reshape(r, n)


def unpack(qweight: np.ndarray, qzeros: np.ndarray, scales: np.ndarray, group_size: int) -> Unpacked:
    """The checked tensors of one AWQ GEMM linear (quantized_checkpoint.py checks shapes and dtypes) as
    ``Unpacked``: q [N, K] (transposed from [K, N]), zeros and scales [N, G]."""
    q = np.ascontiguousarray(in_order(qweight).T)
    zeros = np.ascontiguousarray(in_order(qzeros).T).astype(np.uint16)
    return Unpacked(q, zeros, np.ascontiguousarray(scales.T), BITS, group_size)
