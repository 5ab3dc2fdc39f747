"""The decoder's weights from a GGUF file: named as llama.cpp names them, checked, converted, placed.

The plan (which weights, their shapes) is the HuggingFace loader's; only the names differ
(``blk.{i}.attn_q.weight`` for ``model.layers.{i}.self_attn.q_proj.weight``): llama.cpp's, as the family's GGUF
rules give them (families/family.py: LLAMA_CPP_TENSORS, and its fused tensors). Every tensor
is checked (presence, shape, a type llaisys decodes) before any is read. Each is then converted
straight into the buffer that becomes the weight, one tensor (or chunk of rows) at a time, and its
mapped pages are dropped, so the load peaks at the converted weights plus one chunk's stored bytes.

What each tensor becomes (``kind_of``), by default ("as stored", where the device has the kernels):
- Q8_0, Q4_0, Q4_1, Q4_K, Q6_K matrices (the linears, the lm_head and the token embedding) stay in their
  blocks (gguf/blocks.py: llaisys' formats of the same names hold exactly the stored values), and so do a
  mixture's stacked experts of those types (BlockExperts, run by moe_linear_q: the file's bytes, not several
  times them) where the device has moe_linear_q;
- Q5_0, Q5_1, Q5_K linears become int8 (decoded to float32, then quantized as ``quantize="int8"`` does:
  not exact; docs/quantization.md gives the error), the rest (F32 / F16 / BF16, Q2_K, Q3_K, Q5_* tables, norms, biases)
  is decoded into the compute dtype.
``dequantize=True`` decodes everything into the compute dtype (the values exactly in float32: what HF
transformers computes with); ``quantize="int8"`` / ``"int4"`` requantize the linears (int4 keeps the 4-bit
blocks as they are, and the lm_head at 6 bits or more: its blocks, or q8_0).

llama.cpp's converter reorders the rows of Llama-architecture Q and K projections (within each
head, rows go from HF's half-split rotary layout to ggml's interleaved pairs: the family's GGUF rules
say ``permuted_qk``); the loader reads those rows back in HF order. Qwen2 files are written unpermuted.
Gemma 3's norms are stored as 1 + w (the converter adds the 1), which is what the model wants, in float32
(``config.norms_in_f32``, as OLMo 2's: weights.py).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable

import numpy as np
from gguf import GGML_QUANT_SIZES

import llaisys

from ...errors import ModelLoadError
from ...families.config import ModelConfig
from ...families.family import GGUF_TOP, Family
from ...families.weights import BlockExperts, BlockWeight, Int8Experts, Int8Weight, Weight, Weights, layer_weights
from ...parallel import shards
from ...parallel.layout import DROP, Layout, Part
from ..host_memory import host_buffer
from ..progress import Progress
from ..quantize import (
    BLOCK_KERNELS,
    Arena,
    block_buffers,
    block_bytes,
    experts_block_buffers,
    experts_block_bytes,
    int8_experts,
    linear_mode,
    quantized_weight,
)
from ..weights import EXPERTS, F32_WEIGHTS, LINEARS, NORMS, plan
from . import blocks, quants
from .reader import GGUFFile

PERMUTED = {"q_proj": "q", "q_bias": "q", "k_proj": "kv", "k_bias": "kv"}  # llama.cpp's Llama Q/K reordering
_LAYER = re.compile(r"blk\.([0-9]+)\.")


def check_layer_count(f: GGUFFile, layers: int) -> None:
    """The metadata's layer count against the layers the file holds tensors for, before anything per layer is
    built (a corrupt count would otherwise cost time and memory in proportion to it)."""
    present = {int(m.group(1)) for name in f.tensors if (m := _LAYER.match(name))}
    missing = next((i for i in range(layers) if i not in present), None)  # stops by len(present)
    if missing is not None:
        have = f"layers 0..{max(present)}" if present else "no decoder layers"
        raise ModelLoadError(f"{f.path}: the metadata says {layers} layers (block_count), but the file holds tensors "
                             f"of {have} ({len(present)} layers; layer {missing} is missing)")


def tensor_plan(f: GGUFFile, config: ModelConfig, family: Family) -> tuple[dict[str, tuple], list[dict[str, tuple]]]:
    """{field: (GGUF name, shape)} for the top-level weights and for each layer (the HF plan, named as the
    family's GGUF rules name them), once every one of them is checked to be in the file, with its shape and a
    type llaisys can decode."""
    check_layer_count(f, config.num_hidden_layers)
    top, layers = plan(config, family)
    rules = family.gguf
    if rules is None:
        raise ModelLoadError(f"internal: {config.architecture} has no GGUF rules")
    fused = {field: name for name, fields in rules.fused.items() for field in fields}
    top = {field: (GGUF_TOP[field], shape) for field, (_, shape) in top.items()}
    layers = [{field: (f"blk.{i}.{(fused if len(spec) == 3 else rules.tensors)[field]}", *spec[1:])
               for field, spec in layer.items()} for i, layer in enumerate(layers)]
    for i, layer in enumerate(layers):  # a weight the file holds as parts (GGUF.assembled), where it lacks the whole
        for field, assembled in rules.assembled.items():
            names = [f"blk.{i}.{part}" for part in assembled.parts]
            if field in layer and layer[field][0] not in f.tensors and all(name in f.tensors for name in names):
                layer[field] = (Parts(zip(names, assembled.shapes(config))), layer[field][1])
    supported = ", ".join(t.name for t in quants.SUPPORTED)
    for name, shape in stored([top, *layers]):
        info = f.tensors.get(name)
        if info is None:
            dense = name.endswith(".ffn_gate_inp.weight") and name.replace("_inp", "") in f.tensors
            hint = " (that layer's MLP is dense, but llama.cpp runs every layer of this architecture as a mixture " \
                   "of experts)" if dense else ""
            raise ModelLoadError(f"{f.path}: tensor {name!r} is missing{hint}")
        if info.shape != shape:
            raise ModelLoadError(f"{f.path}: tensor {name!r} has shape {info.shape}, but the metadata implies {shape}")
        if info.type not in quants.SUPPORTED:
            raise ModelLoadError(f"{f.path}: tensor {name!r} is stored as {info.type.name}, which llaisys cannot "
                                 f"dequantize (supported: {supported})")
    return top, layers


def default_dtype(f: GGUFFile, top: dict, layers: list[dict]) -> llaisys.DType:
    """The dtype the matrices are stored in when they are floats of one type; float32 for quantized files.

    float32 holds every dequantized weight exactly and computes with f32 activations, as llama.cpp does
    with these files: bf16 rounds both (8 mantissa bits), which is enough to turn a near-tie at the first
    step of SmolLM2-135M-Instruct Q4_1's "What is the capital of France?" into a wrong answer. It costs
    4 bytes per weight in memory (and per weight read in a decode step); dtype=bfloat16 halves that,
    quantize="int8" takes about a quarter."""
    Q = quants.Q
    types = {f.tensors[name].type for name, shape in stored([top, *layers]) if len(shape) >= 2}
    if types <= {Q.F32}:
        return llaisys.float32
    if types <= {Q.F32, Q.F16}:
        return llaisys.float16
    if types <= {Q.F32, Q.BF16}:
        return llaisys.bfloat16
    return llaisys.float32


class Parts(tuple):
    """The stored tensors, (name, shape) each, that one weight is assembled from (GGUF.assembled), in order."""


def stored(groups: list[dict]) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every tensor of the file a plan reads (each of a weight's Parts on its own)."""
    specs: list[tuple[str, tuple[int, ...]]] = []
    for spec in [spec for group in groups for spec in group.values()]:
        specs += list(spec[0]) if isinstance(spec[0], Parts) else [(spec[0], spec[1])]
    return specs


def assembled(f: GGUFFile, join: Callable[[ModelConfig, list[np.ndarray]], np.ndarray], parts: Parts,
              shape: tuple[int, ...], config: ModelConfig, dtype: llaisys.DType, device: llaisys.Device) -> llaisys.Tensor:
    """A weight of the file's ``parts`` (each decoded to float32), put together by ``join`` and converted to
    ``dtype`` on ``device``."""
    values = []
    for name, part_shape in parts:
        info = f.tensors[name]
        values.append(quants.dequantize(f.raw(name), info.type, np.empty((info.rows, part_shape[-1]), np.float32))
                      .reshape(part_shape))
        f.release(name)
    weight = join(config, values)
    if weight.shape != shape:
        raise ModelLoadError(f"internal: {', '.join(name for name, _ in parts)} make {weight.shape}, not {shape}")
    out = np.empty(shape, dtype.numpy)
    np.copyto(out, weight, casting="unsafe")
    return llaisys.from_numpy(out, device)


def llama_row_order(rows: int, heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K permutation: HF row (head, half, j) is stored at (head, j, half).

    Within each head of ``d`` rows, HF keeps the rotary pairs half-split (j, j + d/2), llama.cpp
    interleaves them (2j, 2j + 1). Returns the stored row of every HF row.
    """
    if rows % (2 * heads):
        raise ModelLoadError(f"cannot undo the Q/K permutation: {rows} rows are not {heads} heads of even size")
    return np.arange(rows).reshape(heads, rows // heads // 2, 2).transpose(0, 2, 1).reshape(-1)


def materialize(f: GGUFFile, name: str, shape: tuple[int, ...], dtype: llaisys.DType, device: llaisys.Device,
                rows: np.ndarray | slice | None = None) -> llaisys.Tensor:
    """One tensor of the file as ``dtype`` on ``device``, rows reordered by ``rows`` if given (a slice: the
    rows of a part of a fused tensor).

    A tensor (or part) already stored in ``dtype`` and order is used in place on the CPU (zero copy). Any
    other is decoded into a fresh buffer, which on the CPU becomes the weight itself.
    """
    info = f.tensors[name]
    on_cpu = device.type == "cpu"
    first = rows.start if isinstance(rows, slice) else 0
    if on_cpu and not isinstance(rows, np.ndarray) and quants.FLOATS.get(info.type) == dtype:
        return llaisys.from_buffer(f.mapping, dtype, shape, offset=info.offset + first * info.row_bytes)
    raw = f.raw(name)
    if isinstance(rows, slice):
        raw, rows = raw[rows], None
    if len(shape) == 1 and rows is not None:  # a permuted bias: its values are the rows
        if info.type not in quants.FLOATS:
            raise ModelLoadError(f"{f.path}: tensor {name!r} is a {info.type.name} vector; only float vectors can be "
                                 f"reordered")
        raw = raw.reshape(shape[0], -1)
    host = host_buffer(math.prod(shape) * dtype.itemsize)
    quants.dequantize(raw, info.type, host.view(dtype.numpy).reshape(raw.shape[0], -1), rows)
    f.release(name)
    if on_cpu:
        return llaisys.from_buffer(host, dtype, shape)
    return llaisys.from_numpy(host.view(dtype.numpy).reshape(shape), device)


def quantized(f: GGUFFile, name: str, shape: tuple[int, int], device: llaisys.Device,
              rows: np.ndarray | slice | None = None, quantize: str = "int8") -> Int8Weight | BlockWeight:
    """One matrix of the file in int8, int4 (q4_0) or q8_0 on ``device``, rows reordered by ``rows`` if given:
    decoded to float32 a chunk of rows at a time and quantized from there.

    Q8_0 (and Q4_0, Q5_0) are already int8 per group of 32 with an f16 scale ``d``; their decoded values
    ``d * q`` are exact float32 values, so int8 re-expresses each group's scale as the next bfloat16 up and
    requantizes its integers against it: the error added is what that scale rounding changes.
    """
    weight = quantized_weight(quantize, row_reader(f, name, shape, rows), shape, device, name)
    f.release(name)
    return weight


CHUNK_BYTES = 8 << 20  # stored bytes converted per step of block_weight (their pages are then dropped)


def block_weight(f: GGUFFile, name: str, shape: tuple[int, int], device: llaisys.Device,
                 rows: np.ndarray | slice | None = None, arena: Arena | None = None,
                 columns: tuple[int, int] | None = None) -> BlockWeight:
    """One matrix of the file kept in its blocks (gguf/blocks.py: the llaisys format of its type) on ``device``
    (from ``arena`` if given), its rows those ``rows`` picks (a slice: rows of a fused tensor, or a rank's; an
    array: reordered) of ``shape[0]``, its values ``columns`` [start, stop) of each row if given (whole blocks:
    ``splits_blocks``); converted a chunk of rows at a time, each chunk's mapped pages dropped as soon as it is
    done."""
    info = f.tensors[name]
    fmt, raw, first = blocks.FORMATS[info.type], f.raw(name), 0
    if isinstance(rows, slice):  # a part of a fused tensor, or a rank's rows
        raw, first, rows = raw[rows], rows.start, None
    if columns is not None:
        raw = raw[:, column_bytes(info.type, *columns)]
    buffers = block_buffers(fmt, shape, device, arena)
    weight, scales = buffers.arrays
    n = shape[0]
    step = max(1, CHUNK_BYTES // max(info.row_bytes, 1) // 16) * 16
    for start in range(0, n, step):
        end = min(n, start + step)
        if rows is None:
            f.populate(name, (first + start, first + end))
        part = raw[start:end] if rows is None else raw[rows[start:end]]
        b0, b1 = start // 16, -(-end // 16)
        blocks.convert_rows(np.ascontiguousarray(part), info.type, weight[b0:b1], scales[b0:b1])
        if rows is None:
            f.release(name, (first + start, first + end))
    f.release(name)
    placed_weight, placed_scales = buffers.placed()
    return BlockWeight(placed_weight, placed_scales, fmt, shape)


INT8_TYPES = (quants.Q.Q5_0, quants.Q.Q5_1, quants.Q.Q5_K)  # no llaisys format yet: their linears go to int8
FOUR_BIT = (quants.Q.Q4_0, quants.Q.Q4_1, quants.Q.Q4_K)


def kind_of(field: str, qtype: quants.Q, quantize: str | None, dequantize: bool, blocks_ok: bool,
            expert_blocks_ok: bool = False) -> str:
    """What the tensor of ``field`` stored as ``qtype`` becomes: "blocks", "int8", "int4", "q8_0" or "float" (this
    module's docstring); ``blocks_ok``: the device has the block kernels, ``expert_blocks_ok``: moe_linear_q."""
    kept = blocks_ok and qtype in blocks.FORMATS
    if field in EXPERTS:  # (quantize: int8 experts; else float)
        return "blocks" if expert_blocks_ok and qtype in blocks.FORMATS and not dequantize and quantize is None \
            else "float"
    if field == "embed_tokens":
        return "blocks" if kept and not dequantize else "float"
    if field not in LINEARS:
        return "float"
    if quantize == "int8":
        return "int8"
    if quantize == "int4":
        if field == "lm_head":
            return "blocks" if kept else "q8_0"
        return "blocks" if kept and qtype in FOUR_BIT else "int4"
    if dequantize or not blocks_ok:
        return "float"
    return "blocks" if kept else "int8" if qtype in INT8_TYPES else "float"


def quantized_experts(f: GGUFFile, name: str, shape: tuple[int, int, int], device: llaisys.Device) -> Int8Experts:
    """A stacked expert tensor [E, N, K] of the file as int8 experts (``quantize="int8"``) on ``device``: each
    expert's rows decoded to float32 a chunk at a time and quantized from there, expert by expert, the mapped
    pages of the experts before dropped (so a load holds the int8 result and about one expert's pages)."""
    experts, n, k = shape
    weight = int8_experts(expert_readers(f, name, shape), (n, k), device,
                          [f"{name} (expert {e})" for e in range(experts)])
    f.release(name)
    return weight


def expert_readers(f: GGUFFile, name: str, shape: tuple[int, int, int]) -> list[shards.Reader]:
    """Of a stacked expert tensor [E, N, K] of the file, a reader per expert of its rows decoded to float32 (expert
    e's: rows e N .. e N + N - 1 of the stored tensor); the mapped pages of the experts before e are dropped when
    e's first rows are read (the experts are read in order)."""
    qtype, raw = f.tensors[name].type, f.raw(name)
    _, n, k = shape

    def reader(e: int) -> shards.Reader:
        def read(start: int, end: int) -> np.ndarray:
            if start == 0 and e:  # the experts before are converted: their pages need not stay resident
                f.release(name, (0, e * n))
            return quants.dequantize(raw[e * n + start:e * n + end], qtype, np.empty((end - start, k), np.float32))
        return read

    return [reader(e) for e in range(shape[0])]


def block_experts(f: GGUFFile, name: str, shape: tuple[int, int, int], device: llaisys.Device,
                  arena: Arena | None = None, part: Part | None = None) -> BlockExperts:
    """A stacked expert tensor [E, N, K] of the file kept in its blocks (gguf/blocks.py) on ``device`` (from
    ``arena`` if given): expert e's rows (rows e N .. e N + N - 1 of the stored tensor) converted into slot [e] a
    chunk of rows at a time, each chunk's mapped pages dropped as soon as it is done. ``part`` (a rank's of each
    expert's matrix, parallel/layout.py): only those rows, or those columns (``splits_blocks`` is False for it:
    whole blocks of every row)."""
    info = f.tensors[name]
    fmt, raw = blocks.FORMATS[info.type], f.raw(name)
    experts, n, k = shape
    rows_of, cols = (0, n), slice(None)  # of each expert's stored matrix
    if part is not None and part.dim == 0:
        rows_of = (part.start, part.stop)
    elif part is not None:
        cols = column_bytes(info.type, part.start, part.stop)
    kept_shape = (experts, *_matrix(part.shape((n, k)))) if part is not None else (experts, n, k)
    buffers = experts_block_buffers(fmt, kept_shape, device, arena)
    weight, scales = buffers.arrays  # [E, NB, ...]
    rows = kept_shape[1]
    step = max(1, CHUNK_BYTES // max(info.row_bytes, 1) // 16) * 16  # (whole blocks of 16 rows)
    for e in range(experts):
        for start in range(0, rows, step):
            end = min(rows, start + step)
            stored = (e * n + rows_of[0] + start, e * n + rows_of[0] + end)
            f.populate(name, stored)
            b0, b1 = start // 16, -(-end // 16)
            chunk = raw[stored[0]:stored[1]] if part is None or part.dim == 0 else \
                np.ascontiguousarray(raw[stored[0]:stored[1], cols])
            blocks.convert_rows(chunk, info.type, weight[e, b0:b1], scales[e, b0:b1])
            f.release(name, stored)
    f.release(name)
    placed_weight, placed_scales = buffers.placed()
    return BlockExperts(placed_weight, placed_scales, fmt, kept_shape)


def column_bytes(qtype: quants.Q, start: int, stop: int) -> slice:
    """The bytes of each stored row that hold its values [start, stop), both on block boundaries (splits_blocks)."""
    block, type_size = GGML_QUANT_SIZES[qtype]
    return slice(start // block * type_size, stop // block * type_size)


def splits_blocks(part: Part, qtype: quants.Q) -> bool:
    """Whether ``part`` of a matrix stored as ``qtype`` cuts through its blocks: a part of the columns that does not
    start and end on a block (of 32 or 256 values; rows are never cut)."""
    block, _ = GGML_QUANT_SIZES[qtype]
    return part.dim == 1 and (part.start % block != 0 or part.stop % block != 0)


def expert_layout(f: GGUFFile, config: ModelConfig, layers: list[dict], layout: Layout, device: llaisys.Device,
                  quantize: str | None, dequantize: bool) -> Layout:
    """``layout`` splitting a mixture's experts into whole blocks of their down matrices (Layout.expert_granule)
    where they stay in their blocks and every rank can have one: its parts then keep the file's blocks (a part
    of down's columns that cut a block would be decoded)."""
    downs = [f.tensors[layer["experts_down"][0]].type for layer in layers if "experts_down" in layer]
    expert_blocks_ok = llaisys.ops.implemented("moe_linear_q", device)
    if not downs or any(kind_of("experts_down", qtype, quantize, dequantize, True, expert_blocks_ok) != "blocks"
                        for qtype in downs):
        return layout
    granule = max(GGML_QUANT_SIZES[qtype][0] for qtype in downs)  # (32 or 256: the larger a multiple of the other)
    if config.moe_intermediate_size % granule or config.moe_intermediate_size // granule < layout.world:
        return layout
    return dataclasses.replace(layout, expert_granule=granule)


def _part_shape(spec: tuple) -> tuple[int, ...]:
    """The shape of the weight a plan entry makes: its tensor's, or that of its rows of a fused tensor."""
    if len(spec) < 3:
        return spec[1]
    (start, stop), shape = spec[2], spec[1]
    return (stop - start, *shape[1:])


def _matrix(shape: tuple[int, ...]) -> tuple[int, int]:
    """``shape`` as an [N, K] matrix's (a linear, an lm_head, an embedding table: what may be kept in blocks or
    quantized)."""
    n, k = shape
    return n, k


def _stack(shape: tuple[int, ...]) -> tuple[int, int, int]:
    """``shape`` as stacked experts' [E, N, K]."""
    e, n, k = shape
    return e, n, k


def row_reader(f: GGUFFile, name: str, shape: tuple[int, ...], rows: np.ndarray | slice | None) -> shards.Reader:
    """Rows [start, stop) of a weight of ``shape`` (rows reordered or cut by ``rows``) decoded to float32, a
    chunk at a time (a vector: its elements, decoded once)."""
    qtype, raw = f.tensors[name].type, f.raw(name)
    if isinstance(rows, slice):  # a part of a fused tensor
        raw, rows = raw[rows], None
    if len(shape) == 1:
        if rows is not None:  # a permuted bias: its values are the rows
            values = quants.dequantize(raw.reshape(shape[0], -1), qtype, np.empty((shape[0], 1), np.float32), rows)
        else:
            values = quants.dequantize(raw, qtype, np.empty((1, shape[0]), np.float32))
        values = values.reshape(-1)
        return lambda start, stop: values[start:stop]
    return lambda start, stop: quants.dequantize(raw[start:stop] if rows is None else raw[rows[start:stop]], qtype,
                                                 np.empty((stop - start, shape[1]), np.float32))


def load_weights(f: GGUFFile, config: ModelConfig, family: Family, top: dict, layers: list[dict],
                 dtype: llaisys.DType, device: llaisys.Device, progress: bool | None = None,
                 quantize: str | None = None, dequantize: bool = False, layout: Layout | None = None) -> Weights:
    """The weights of ``tensor_plan``'s plan on ``device``, each as ``kind_of`` says: kept in its blocks,
    quantized, or decoded into ``dtype``; with ``layout`` (parallel.layout.Layout), only this rank's part of
    each: in its blocks where the part cuts none (kept_part), else decoded, then cut."""
    heads = {"q": config.num_attention_heads, "kv": config.num_key_value_heads}
    permuted = family.gguf is not None and family.gguf.permuted_qk
    blocks_ok = all(llaisys.ops.implemented(op, device) for op in BLOCK_KERNELS)
    expert_blocks_ok = llaisys.ops.implemented("moe_linear_q", device)
    i8_ok = llaisys.ops.implemented("linear_i8", device)

    def kind(field: str, spec: tuple) -> str:
        if isinstance(spec[0], Parts):  # (decoded and put together)
            return "float"
        return kind_of(field, f.tensors[spec[0]].type, quantize, dequantize, blocks_ok, expert_blocks_ok)

    def part_of(field: str) -> Part | str | None:
        return layout.part(field, config) if layout is not None else None

    def kept_part(field: str, spec: tuple) -> bool:
        """A rank's part of a matrix (or of each stacked expert) kept in its blocks: where it cuts none, and for
        a matrix neither a fused tensor's rows nor the vocabulary's padded last share (those are cut from the
        decoded rows)."""
        part = part_of(field)
        if not isinstance(part, Part) or kind(field, spec) != "blocks" or splits_blocks(part, f.tensors[spec[0]].type):
            return False
        return field in EXPERTS or (len(spec) < 3 and part.rows in (None, part.stop - part.start))

    def kept_bytes(field: str, spec: tuple) -> int:
        fmt, shape = blocks.FORMATS[f.tensors[spec[0]].type], _part_shape(spec)
        part = part_of(field)
        if field in EXPERTS:
            e, n, k = _stack(shape)
            return experts_block_bytes(fmt, (e, *_matrix(part.shape((n, k)))) if isinstance(part, Part) else (e, n, k))
        return block_bytes(fmt, _matrix(part.shape(shape) if isinstance(part, Part) else shape))

    # On the CPU the blocks of every matrix kept as stored come from one arena (Arena: one huge-page rounding)
    entries = [(field, spec) for group in [top, *layers] for field, spec in group.items()]
    split = layout is not None and layout.world > 1
    if split and "lm_head" not in top:  # a tied lm_head: each rank's rows of the embedding, loaded apart
        entries.append(("lm_head", top["embed_tokens"]))
    kept = [kept_bytes(field, spec) for field, spec in entries
            if kind(field, spec) == "blocks" and (part_of(field) is None or kept_part(field, spec))]
    arena = None
    if device.type == "cpu" and kept:
        arena = Arena(sum(kept), device)
    total = sum(math.prod(_part_shape(spec)) for group in [top, *layers] for spec in group.values()) * dtype.itemsize
    if layout is not None and layout.world > 1:
        total //= layout.world
    with Progress(total, f"loading {f.path.name}", enabled=progress) as bar:
        def get(field: str, spec: tuple) -> Weight | None:
            name, shape = spec[0], _part_shape(spec)
            rows: np.ndarray | slice | None = None
            if len(spec) == 3:  # rows of a fused tensor (Phi-3)
                rows = slice(*spec[2])
            elif permuted and field in PERMUTED:
                rows = llama_row_order(shape[0], heads[PERMUTED[field]])
            part = part_of(field)
            if part == DROP:
                return None
            if isinstance(name, Parts):  # (a weight of several stored tensors: whole on every rank)
                assert family.gguf is not None and not isinstance(part, Part)
                whole = assembled(f, family.gguf.assembled[field].join, name, shape, config, dtype, device)
                bar.update(math.prod(shape) * dtype.itemsize)
                return whole
            if kept_part(field, spec) and field in EXPERTS:  # a rank's rows or columns of each expert, in blocks
                assert isinstance(part, Part)
                kept = block_experts(f, name, _stack(shape), device, arena, part)
                bar.update(math.prod(kept.shape) * dtype.itemsize)
                return kept
            if kept_part(field, spec):  # a rank's rows or columns of a matrix, in its blocks
                assert isinstance(part, Part)
                if part.dim == 0:
                    picked: np.ndarray | slice = slice(part.start, part.stop) if rows is None else \
                        np.asarray(rows)[part.start:part.stop]
                    matrix = block_weight(f, name, _matrix(part.shape(shape)), device, picked, arena)
                else:
                    matrix = block_weight(f, name, _matrix(part.shape(shape)), device, rows, arena,
                                          (part.start, part.stop))
                bar.update(math.prod(matrix.shape) * dtype.itemsize)
                return matrix
            if isinstance(part, Part) and field in EXPERTS:  # the same part of each expert's matrix, decoded
                e, n, k = _stack(shape)
                stack = shards.build_experts(expert_readers(f, name, (e, n, k)), (n, k), part, dtype, device,
                                             quantize, [f"{name}[{i}]" for i in range(e)])
                f.release(name)
                bar.update(e * math.prod(part.shape((n, k))) * dtype.itemsize)
                return stack
            if isinstance(part, Part):  # (else None: the whole tensor)
                mode = linear_mode(quantize, field) if field in LINEARS else None
                piece = shards.build(row_reader(f, name, shape, rows), shape, part, dtype, device, mode, name)
                f.release(name)
                bar.update(math.prod(part.shape(shape)) * dtype.itemsize)
                return piece
            how = kind(field, spec)
            if how == "int8" and not i8_ok:
                how = "float"
            tensor: Weight
            if how == "blocks" and field in EXPERTS:
                tensor = block_experts(f, name, _stack(shape), device, arena)
            elif how == "blocks":
                tensor = block_weight(f, name, _matrix(shape), device, rows, arena)
            elif how in ("int8", "int4", "q8_0"):
                tensor = quantized(f, name, _matrix(shape), device, rows, how)
            elif field in NORMS and config.norms_in_f32 or field in F32_WEIGHTS:  # Gemma (1 + w as the file holds
                tensor = materialize(f, name, shape, llaisys.float32, device, rows)  # it), OLMo 2; the router's bias
            elif quantize is not None and field in EXPERTS:  # (int8 for int4 too: quantize.py)
                tensor = quantized_experts(f, name, _stack(shape), device)
            else:
                tensor = materialize(f, name, shape, dtype, device, rows)
            bar.update(math.prod(shape) * dtype.itemsize)
            return tensor

        embed = get("embed_tokens", top["embed_tokens"])
        layer_list = [layer_weights({field: get(field, spec) for field, spec in layer.items()}) for layer in layers]
        norm = get("norm", top["norm"])
        if "lm_head" in top:
            lm_head = get("lm_head", top["lm_head"])
        else:  # tied: the embedding itself (a tensor, or its blocks), or its own quantized copy (or this rank's rows)
            same = kind("lm_head", top["embed_tokens"]) == kind("embed_tokens", top["embed_tokens"])
            lm_head = embed if same and not split else get("lm_head", top["embed_tokens"])
    # (the embedding a table, the final norm a tensor, the lm_head a linear: none is dropped on any rank)
    assert isinstance(embed, (llaisys.Tensor, BlockWeight)) and isinstance(norm, llaisys.Tensor)
    assert isinstance(lm_head, (llaisys.Tensor, Int8Weight, BlockWeight))
    return Weights(embed_tokens=embed, layers=layer_list, norm=norm, lm_head=lm_head)
