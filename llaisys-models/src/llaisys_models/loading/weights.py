"""The decoder's weights: which checkpoint tensors it needs, checked, then placed on the device.

Everything is checked (presence, shape, dtype) before a byte is converted or copied, so a
bad checkpoint fails with nothing half-loaded. A tensor stored in the compute dtype is
used straight from the memory-mapped file on CPU (zero copy); any other is converted
once on the host (numpy / ml_dtypes) and copied to the device. With ``quantize="int8"`` or ``"int4"`` the
linears' weights (LINEARS) are quantized instead (quantize.py), each straight from the file (int4: the lm_head
in q8_0), and so are the experts' matrices (EXPERTS; in int8 for both: there is no 4-bit expert kernel). A GPTQ /
AWQ checkpoint's quantized linears are read by quantized_checkpoint.py, as ``GQWeight``s.

Which tensors, under which names, is the family's declaration (``plan``: its ``tensors``, ``fused`` and
``experts``, families/family.py); the shapes are the config's.

Gemma's and OLMo 2's RMSNorms multiply by their weight in f32 (``config.norms_in_f32``; Gemma's by 1 + w,
``config.norm_offset``): the norm weights (NORMS) are then loaded as f32(w) + offset in float32, whatever the
model dtype, which is what HF computes (``1.0 + self.weight.float()``): the rms_norm op takes an f32 weight
for f16 / bf16 activations as such a norm (rounded once), so f32 models are bit-exact and bf16 ones round
where HF does. (Folding 1 + w into a bf16 weight would move it by up to half a bf16 ulp of 1 + w, 2^-9, more
than the activations' rounding.)
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection

import numpy as np

import llaisys

from ..errors import ModelLoadError
from ..families.config import ModelConfig
from ..families.family import HF_LAYER, HF_TOP, Family
from ..families.weights import (
    BlockWeight,
    Experts,
    GQWeight,
    Int8Experts,
    Int8Weight,
    LayerWeights,
    Linear,
    Weight,
    Weights,
    layer_weights,
)
from ..parallel import shards
from ..parallel.layout import DROP, Layout, Part
from .host_memory import bytes_of
from .progress import Progress
from .quantize import int8_experts, linear_mode, quantized_weight
from .quantized_checkpoint import QuantizedCheckpoint
from .safetensors import Checkpoint, TensorInfo

FLOAT_WEIGHTS = (llaisys.float32, llaisys.float16, llaisys.bfloat16)
# the weights quantize="int8" stores in int8: every matrix a linear multiplies by (embeddings, norms and
# biases stay in the model dtype)
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "q_a_proj", "q_b_proj",
           "kv_a_proj", "kv_rope_proj", "shared_gate", "shared_up", "shared_down", "lm_head")  # (lm_head last)
# (DeepSeek's kv_b_proj stays in the model dtype: each head's W_uk and W_uv are derived from it at load)
# the RMSNorm weights (of a layer, and the final "norm")
NORMS = ("input_norm", "mlp_norm", "attn_out_norm", "mlp_out_norm", "q_norm", "k_norm", "norm", "q_a_norm",
         "kv_a_norm")
F32_WEIGHTS = ("router_bias",)  # read as float32 whatever the model dtype (the router op adds it in f32)
# ... and a sparse layer's stacked expert matrices (the router stays in the model dtype: quantize.py)
EXPERTS = ("experts_gate", "experts_up", "experts_down")

_LAYER = re.compile(re.escape(HF_LAYER.split("{}")[0]) + r"(\d+)\.")  # a layer's name: model.layers.{i}.


def check_layer_count(checkpoint: Checkpoint, config: ModelConfig) -> None:
    """config.json's layer count against the layers the checkpoint holds, before anything per layer is
    built (a corrupt count such as 10**9 would otherwise cost minutes and then memory)."""
    present = {int(m.group(1)) for name in checkpoint.infos if (m := _LAYER.match(name))}
    layers = config.num_hidden_layers
    if layers > len(present) or any(i not in present for i in range(layers)):
        have = f"layers 0..{max(present)}" if present else "no decoder layers"
        missing = next(i for i in range(layers) if i not in present)
        raise ModelLoadError(f"{checkpoint.directory / 'config.json'} says num_hidden_layers = {layers}, but the "
                             f"checkpoint has {have} ({len(present)} layers; layer {missing} is missing)")


DENSE_MLP = ("gate_proj", "up_proj", "down_proj", "gate_bias", "up_bias", "down_bias")  # (a sparse layer has none)
SPARSE_ONLY = ("shared_gate", "shared_up", "shared_down", "router_bias")  # (DeepSeek: a dense layer has none)


def shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The shape of each weight a layer may have (a ``LayerWeights`` field), as the config sizes it."""
    h, q, kv, inter, d = c.hidden_size, c.q_size, c.kv_size, c.intermediate_size, c.head_dim
    norm = (h,)
    return {
        "input_norm": norm, "mlp_norm": norm, "attn_out_norm": norm, "mlp_out_norm": norm,
        "q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q),
        "gate_proj": (inter, h), "up_proj": (inter, h), "down_proj": (h, inter),
        "q_bias": (q,), "k_bias": (kv,), "v_bias": (kv,), "o_bias": (h,),
        "gate_bias": (inter,), "up_bias": (inter,), "down_bias": (h,),
        "q_norm": (q,) if c.qk_norm_all_heads else (d,), "k_norm": (kv,) if c.qk_norm_all_heads else (d,),
        **_latent_shapes(c),
    }


def _latent_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The shapes of DeepSeek's latent attention weights and shared experts (none without MLA)."""
    m = c.mla
    if m is None:
        return {}
    h, heads, dc, dr = c.hidden_size, c.num_attention_heads, m.kv_lora_rank, m.qk_rope_head_dim
    q = heads * (m.qk_nope_head_dim + dr)
    shared, experts = c.shared_expert_size, c.num_experts
    return {"q_proj": (q, h), "q_a_proj": (m.q_lora_rank, h), "q_a_norm": (m.q_lora_rank,),
            "q_b_proj": (q, m.q_lora_rank), "kv_a_proj": (dc, h), "kv_rope_proj": (dr, h), "kv_a_norm": (dc,),
            "kv_b_proj": (heads * (m.qk_nope_head_dim + m.v_head_dim), dc), "o_proj": (h, heads * m.v_head_dim),
            "shared_gate": (shared, h), "shared_up": (shared, h), "shared_down": (h, shared),
            "router_bias": (experts,)}


def has(field: str, c: ModelConfig) -> bool:
    """Whether a layer of ``c`` has the weight ``field``, of those its family names: the config says which
    biases, q/k norms and output norms it has (Llama: attention_bias)."""
    if field in ("q_bias", "k_bias", "v_bias"):
        return c.qkv_bias
    if field == "o_bias":
        return c.o_bias
    if field in ("gate_bias", "up_bias", "down_bias"):
        return c.mlp_bias
    if field in ("q_norm", "k_norm"):
        return c.qk_norm
    if field in ("attn_out_norm", "mlp_out_norm"):
        return c.sandwich_norms
    if c.mla is not None and field in ("q_proj", "q_a_proj", "q_a_norm", "q_b_proj"):  # q low-rank, or not
        return (field == "q_proj") == (c.mla.q_lora_rank == 0)
    if field in ("shared_gate", "shared_up", "shared_down"):
        return c.shared_expert_size > 0
    if field == "router_bias":
        return c.routing is not None and c.routing.corrected
    return True


def plan(config: ModelConfig, family: Family) -> tuple[dict[str, tuple], list[dict[str, tuple]]]:
    """{field: (checkpoint name, shape)} for the top-level weights and for each layer: the weights ``family``
    names that the config says a layer has (``has``), named as the family declares them; a field that is rows
    [start, stop) of a fused checkpoint tensor (Phi-3's qkv_proj, gate_up_proj) is (name, shape, (start, stop)),
    with the fused tensor's shape: the decoder reads the rows as a matrix of their own (a view, no copy); a
    sparse layer's experts are (Stack of names, stacked shape)."""
    c = config
    top = {"embed_tokens": (HF_TOP["embed_tokens"], (c.vocab_size, c.hidden_size)),
           "norm": (HF_TOP["norm"], (c.hidden_size,))}
    if not c.tie_word_embeddings:
        top["lm_head"] = (HF_TOP["lm_head"], (c.vocab_size, c.hidden_size))
    sizes = shapes(c)
    fused = {field: (name, fields) for name, fields in family.fused.items() for field in fields
             if c.fused_projections}
    layers = []
    for i in range(c.num_hidden_layers):
        p = HF_LAYER.format(i)
        sparse = i in c.sparse_layers
        layer = {}
        for field, name in {**family.tensors, **{f: n for f, (n, _) in fused.items()}}.items():
            if not has(field, c) or (sparse and field in DENSE_MLP) or (not sparse and field in SPARSE_ONLY):
                continue
            if field in fused:
                layer[field] = _rows(p + name, fused[field][1], field, sizes)
            else:
                layer[field] = (p + name, sizes[field])
        if sparse:
            layer.update(expert_plan(c, family, p))
        layers.append(layer)
    return top, layers


def _rows(name: str, fields: tuple[str, ...], field: str, sizes: dict[str, tuple[int, ...]]) -> tuple:
    """(name, the fused tensor's shape, (start, stop)): ``field``'s rows of the tensor that stacks ``fields``."""
    start = sum(sizes[f][0] for f in fields[:fields.index(field)])
    rows = sum(sizes[f][0] for f in fields)
    return name, (rows, *sizes[field][1:]), (start, start + sizes[field][0])


class Stack(tuple):
    """The checkpoint names of the matrices one stacked weight holds (an expert each), in order."""


def expert_plan(c: ModelConfig, family: Family, prefix: str) -> dict[str, tuple]:
    """{field: (checkpoint name or Stack of names, shape)} of a sparse layer's router and experts."""
    names = family.experts
    if names is None:
        raise ModelLoadError(f"internal: {c.architecture} has sparse layers but its family names no experts")
    e, inter, hidden = c.num_experts, c.moe_intermediate_size, c.hidden_size
    shapes = {"gate": (inter, hidden), "up": (inter, hidden), "down": (hidden, inter)}
    plan: dict[str, tuple] = {"router": (prefix + names.router, (e, hidden))}
    for field in ("gate", "up", "down"):
        name = getattr(names, field)
        plan["experts_" + field] = (Stack(prefix + name.format(i) for i in range(e)), (e, *shapes[field]))
    return plan


def _specs(groups: list[dict], skip: Collection[str] = ()) -> list[tuple[str, tuple]]:
    """(checkpoint name, shape) of every tensor the plan names (each matrix of a Stack on its own), but those in
    ``skip``."""
    specs = []
    for name, shape, *_ in [spec for group in groups for spec in group.values()]:
        specs += [(n, shape[1:]) for n in name] if isinstance(name, Stack) else [(name, shape)] * (name not in skip)
    return specs


def materialize_stack(infos: list[TensorInfo], dtype: llaisys.DType, device: llaisys.Device) -> llaisys.Tensor:
    """The matrices of ``infos`` (all of one shape) stacked into one [len(infos), ...] tensor on ``device``."""
    stacked = llaisys.empty((len(infos), *infos[0].shape), dtype, device)
    for i, info in enumerate(infos):
        llaisys.ops.rearrange(stacked.slice(0, i, i + 1).view(*info.shape), materialize(info, dtype, device))
    return stacked


def check(checkpoint: Checkpoint, top: dict, layers: list[dict], skip: Collection[str] = ()) -> dict[str, TensorInfo]:
    """Every needed tensor (but the quantized linears ``skip`` names) exists with its shape and a floating dtype;
    returns name -> info."""
    infos = {}
    for name, shape in _specs([top, *layers], skip):
        info = checkpoint.info(name)
        if info.shape != shape:
            raise ModelLoadError(f"tensor {name!r} in {info.file.path.name} has shape {info.shape}, but "
                                 f"config.json implies {shape}")
        if info.dtype not in FLOAT_WEIGHTS:
            raise ModelLoadError(f"tensor {name!r} in {info.file.path.name} has dtype {info.dtype_name}; "
                                 f"weights must be F32, F16 or BF16")
        infos[name] = info
    return infos


def default_dtype(checkpoint: Checkpoint, config: ModelConfig) -> llaisys.DType:
    """The dtype the weights are stored in (that of the embedding), so CPU loads need no copy."""
    info = checkpoint.info(HF_TOP["embed_tokens"])
    if info.dtype in FLOAT_WEIGHTS:
        return info.dtype
    return llaisys.bfloat16


def materialize(info: TensorInfo, dtype: llaisys.DType, device: llaisys.Device) -> llaisys.Tensor:
    """The checkpoint tensor as ``dtype`` on ``device``: no copy when it already is both and mapped; read
    from the file straight into the weight's own buffer when it is both and not mapped (on the CPU that
    buffer is the backend's: large ones sit on huge pages, which decoding streams ~10% faster)."""
    if info.dtype == dtype and info.file.mapping is None and device.type == "cpu":
        tensor = llaisys.empty(info.shape, dtype, device)
        info.file.read_into(info, bytes_of(tensor))
        return tensor
    if info.dtype == dtype and info.file.mapping is not None:
        mapped = info.file.tensor(info.name)
        if mapped.device == device:
            return mapped  # zero copy: the weight lives in the mapping
        tensor = mapped.to(device)
    else:
        host = info.file.array(info)  # a view of the mapping, or the bytes just read
        tensor = llaisys.from_numpy(host if info.dtype == dtype else host.astype(dtype.numpy), device)
    info.file.release_pages(info.offset, info.nbytes)  # copied: the mapped pages need not stay resident
    return tensor


def _row_reader(info: TensorInfo, first: int = 0) -> Callable[[int, int], np.ndarray]:
    """``read(start, end)``: rows [first + start, first + end) of the checkpoint matrix as stored (a view of the
    mapping, or the bytes just read), the mapped pages of the rows before dropped from the resident set (the
    rows are read in order, so those are done with)."""
    row_bytes = info.nbytes // max(info.shape[0], 1)
    source = None

    def read(start: int, end: int) -> np.ndarray:
        nonlocal source
        if source is None:
            source = info.file.array(info)
        if first + start:  # the rows before are quantized: their pages need not stay resident
            info.file.release_pages(info.offset, (first + start) * row_bytes)
        return source[first + start:first + end]

    return read


def quantized(info: TensorInfo, device: llaisys.Device, rows: tuple[int, int] | None = None,
              quantize: str = "int8") -> Int8Weight | BlockWeight:
    """The checkpoint matrix (or its rows [start, stop): a part of a fused one) in int8, int4 or q8_0
    (``quantize``) on ``device``, quantized from its stored values a chunk of rows at a time; its mapped pages
    are dropped from the resident set as soon as they are read."""
    first, stop = rows or (0, info.shape[0])
    weight = quantized_weight(quantize, _row_reader(info, first), (stop - first, info.shape[1]), device, info.name)
    info.file.release_pages(info.offset, stop * (info.nbytes // max(info.shape[0], 1)))
    return weight


def quantized_experts(infos: list[TensorInfo], device: llaisys.Device) -> Int8Experts:
    """The experts' checkpoint matrices (all of one shape) as stacked int8 experts on ``device``, quantized
    expert by expert from their stored values (each one's pages dropped as it is read)."""
    n, k = infos[0].shape  # (each expert a matrix: check() matched their shapes to the plan's)
    experts = int8_experts([_row_reader(info) for info in infos], (n, k), device, [i.name for i in infos])
    for info in infos:
        info.file.release_pages(info.offset, info.nbytes)
    return experts


def _part_bytes(info: TensorInfo, spec: tuple) -> int:
    """The bytes of the rows ``spec`` takes of its tensor (all of them but for a part of a fused one)."""
    if len(spec) < 3:
        return info.nbytes
    start, stop = spec[2]
    return info.nbytes * (stop - start) // max(info.shape[0], 1)


def load_weights(checkpoint: Checkpoint, config: ModelConfig, family: Family, dtype: llaisys.DType,
                 device: llaisys.Device, progress: bool | None = None, quantize: str | None = None,
                 layout: Layout | None = None, published: QuantizedCheckpoint | None = None,
                 dequantize: bool = False) -> Weights:
    """The weights ``config`` sizes and ``family`` names, checked, then placed on ``device`` in ``dtype`` (the
    linears in int8 with ``quantize``). ``layout`` (parallel.layout.Layout): only this rank's part of each weight
    (the checkpoint must then be mapped: each part is read from the mapping). ``published``: a GPTQ / AWQ
    checkpoint's config (quantized_checkpoint.py): the linears it quantizes stay in their groups (``dequantize``:
    decoded into ``dtype``)."""
    check_layer_count(checkpoint, config)
    top, layers = plan(config, family)
    gq = {} if published is None else published.linears(
        checkpoint, [spec for group in (top, *layers) for field, spec in group.items() if field in LINEARS],
        kept=not dequantize)
    infos = check(checkpoint, top, layers, skip=gq)
    tied_copy = quantize is not None and "lm_head" not in top  # the embedding read a second time, quantized
    total = sum(i.nbytes for i in infos.values()) + (infos[top["embed_tokens"][0]].nbytes if tied_copy else 0)
    total += sum(linear.nbytes for linear in gq.values())
    if layout is not None and layout.world > 1:
        total //= layout.world
    cache: dict[str, llaisys.Tensor] = {}
    with Progress(total, f"loading {checkpoint.directory.name}", enabled=progress) as bar:
        def get(spec: tuple) -> llaisys.Tensor:
            name = spec[0]
            if isinstance(name, Stack):
                stacked = materialize_stack([infos[n] for n in name], dtype, device)
                bar.update(sum(infos[n].nbytes for n in name))
                return stacked
            if name not in cache:
                cache[name] = materialize(infos[name], dtype, device)
                bar.update(infos[name].nbytes)
            if len(spec) == 3:  # rows of a fused tensor: a view
                return cache[name].slice(0, *spec[2])
            return cache[name]

        def get_linear(spec: tuple, mode: str | None) -> Linear:
            if spec[0] in gq:  # a GPTQ / AWQ linear: kept in its groups
                linear = gq[spec[0]]
                kept = linear.weight(device, dtype, spec[2] if len(spec) == 3 else None, dequantize)
                bar.update(linear.nbytes * (spec[2][1] - spec[2][0]) // spec[1][0] if len(spec) == 3 else linear.nbytes)
                return kept
            if mode is None:
                return get(spec)
            weight = quantized(infos[spec[0]], device, spec[2] if len(spec) == 3 else None, mode)
            bar.update(_part_bytes(infos[spec[0]], spec))
            return weight

        def get_norm(spec: tuple) -> llaisys.Tensor:  # Gemma, OLMo 2: w + norm_offset in f32 (see the top)
            info = infos[spec[0]]
            weight = info.file.array(info).astype(np.float32) + np.float32(config.norm_offset)
            bar.update(info.nbytes)
            return llaisys.from_numpy(weight, device)

        def getter(field: str) -> Callable[[tuple], Weight]:
            if field in LINEARS:
                return lambda spec: get_linear(spec, linear_mode(quantize, field))
            if field in EXPERTS:
                return get_experts
            if field in F32_WEIGHTS:
                return lambda spec: materialize(infos[spec[0]], llaisys.float32, device)
            return get_norm if field in NORMS and config.norms_in_f32 else get

        def get_experts(spec: tuple) -> Experts:
            if quantize is None:
                return get(spec)
            infos_of_stack = [infos[name] for name in spec[0]]
            experts = quantized_experts(infos_of_stack, device)
            bar.update(sum(info.nbytes for info in infos_of_stack))
            return experts

        def get_field(field: str, spec: tuple) -> Weight | None:
            part = layout.part(field, config) if layout is not None else None
            if part is None:
                return getter(field)(spec)
            if part == DROP:
                return None
            assert isinstance(part, Part)  # (Layout.part: a Part, DROP or None)
            return get_part(field, spec, part)

        def get_part(field: str, spec: tuple, part: Part) -> Weight:
            assert layout is not None  # (the part is the layout's)
            if isinstance(spec[0], Stack):  # a sparse layer's experts: the same part of each one's matrix
                stack = [infos[name] for name in spec[0]]
                experts = shards.build_experts([_row_reader(info) for info in stack], spec[1][1:], part, dtype,
                                               device, quantize, list(spec[0]))
                for info in stack:
                    info.file.release_pages(info.offset, info.nbytes)
                bar.update(sum(info.nbytes for info in stack) // layout.world)
                return experts
            info = infos[spec[0]]
            first, stop = spec[2] if len(spec) == 3 else (0, info.shape[0])  # (a part of a fused tensor)
            whole = not (quantize and field in LINEARS) and part.dim == 0 and part.rows in (None, part.stop - part.start)
            if whole and len(spec) < 3 and spec[0] in cache:  # a tied lm_head's rows: a view of the embedding
                return cache[spec[0]].slice(0, part.start, part.stop)
            source = info.file.array(info)
            mode = linear_mode(quantize, field) if field in LINEARS else None
            weight = shards.build(lambda a, b: source[first + a:first + b], (stop - first, *info.shape[1:]), part,
                                  dtype, device, mode, info.name)
            info.file.release_pages(info.offset, info.nbytes)
            bar.update(_part_bytes(info, spec) // layout.world)
            return weight

        def get_layer(layer: dict[str, tuple]) -> LayerWeights:
            return layer_weights({field: get_field(field, spec) for field, spec in layer.items()})

        embed = get(top["embed_tokens"])
        layer_list = [get_layer(layer) for layer in layers]
        norm = getter("norm")(top["norm"])
        lm_head = get_field("lm_head", top.get("lm_head", top["embed_tokens"]))
    # (the final norm is a tensor, in the model dtype or float32; the lm_head a linear: every rank holds its rows)
    assert isinstance(norm, llaisys.Tensor) and isinstance(lm_head, (llaisys.Tensor, Int8Weight, BlockWeight, GQWeight))
    return Weights(embed_tokens=embed, layers=layer_list, norm=norm, lm_head=lm_head)
