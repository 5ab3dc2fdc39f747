"""The decoder's weights: which checkpoint tensors it needs, checked, then placed on the device.

Everything is checked (presence, shape, dtype) before a byte is converted or copied, so a
bad checkpoint fails with nothing half-loaded. A tensor stored in the compute dtype is
used straight from the memory-mapped file on CPU (zero copy); any other is converted
once on the host (numpy / ml_dtypes) and copied to the device. With ``quantize="int8"`` or ``"int4"`` the
linears' weights (LINEARS) are quantized instead (quantize.py), each straight from the file (int4: the lm_head
in q8_0), and so are the experts' matrices (EXPERTS; in int8 for both: there is no 4-bit expert kernel).

Gemma's RMSNorms multiply by 1 + w (``config.norm_offset``): the norm weights (NORMS) are then loaded as
f32(w) + 1 in float32, whatever the model dtype, which is what HF computes (``1.0 + self.weight.float()``):
the rms_norm op takes an f32 weight for f16 / bf16 activations as Gemma's norm (rounded once), so f32 models
are bit-exact and bf16 ones round where HF does. (Folding 1 + w into a bf16 weight would move it by up to
half a bf16 ulp of 1 + w, 2^-9, more than the activations' rounding.)
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

import numpy as np

import llaisys

from ..errors import ModelLoadError
from ..families.config import ModelConfig
from ..parallel import shards
from ..parallel.layout import DROP
from .host_memory import bytes_of
from .progress import Progress
from .quantize import BlockWeight, Int8Experts, Int8Weight, int8_experts, linear_mode, quantized_weight
from .safetensors import Checkpoint, TensorInfo

FLOAT_WEIGHTS = (llaisys.float32, llaisys.float16, llaisys.bfloat16)
# the weights quantize="int8" stores in int8: every matrix a linear multiplies by (embeddings, norms and
# biases stay in the model dtype)
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")
# the RMSNorm weights (of a layer, and the final "norm")
NORMS = ("input_norm", "mlp_norm", "attn_out_norm", "mlp_out_norm", "q_norm", "k_norm", "norm")
# ... and a sparse layer's stacked expert matrices (the router stays in the model dtype: quantize.py)
EXPERTS = ("experts_gate", "experts_up", "experts_down")

# a linear's weight: in the model dtype, int8, or blocks (quantize.py: int4, and a GGUF file's quantized tensors)
Linear = llaisys.Tensor | Int8Weight | BlockWeight
Experts = llaisys.Tensor | Int8Experts  # stacked expert matrices: in the model dtype, or int8


@dataclasses.dataclass
class ExpertWeights:
    """A mixture-of-experts MLP: the router and every expert's matrices, stacked (expert e at [e])."""
    router: llaisys.Tensor  # [E, hidden]
    gate: Experts  # [E, moe_intermediate, hidden]
    up: Experts  # [E, moe_intermediate, hidden]
    down: Experts  # [E, hidden, moe_intermediate]


@dataclasses.dataclass
class LayerWeights:
    input_norm: llaisys.Tensor  # of the attention's input
    q_proj: Linear
    k_proj: Linear
    v_proj: Linear
    o_proj: Linear
    mlp_norm: llaisys.Tensor  # of the MLP's input (HF: post_attention_layernorm; Gemma: pre_feedforward_layernorm)
    gate_proj: Linear | None = None  # (None in a mixture-of-experts layer: its MLP is `experts`)
    up_proj: Linear | None = None
    down_proj: Linear | None = None
    experts: ExpertWeights | None = None
    q_norm: llaisys.Tensor | None = None  # Qwen3, Gemma 3: RMSNorm weights [head_dim] of each q head, each k head
    k_norm: llaisys.Tensor | None = None
    attn_out_norm: llaisys.Tensor | None = None  # Gemma: of the attention's output (post_attention_layernorm)
    mlp_out_norm: llaisys.Tensor | None = None  # Gemma: of the MLP's output (post_feedforward_layernorm)
    q_bias: llaisys.Tensor | None = None
    k_bias: llaisys.Tensor | None = None
    v_bias: llaisys.Tensor | None = None
    o_bias: llaisys.Tensor | None = None
    gate_bias: llaisys.Tensor | None = None
    up_bias: llaisys.Tensor | None = None
    down_bias: llaisys.Tensor | None = None


@dataclasses.dataclass
class Weights:
    embed_tokens: llaisys.Tensor | BlockWeight  # blocks: a GGUF file's quantized table, decoded per row read
    layers: list[LayerWeights]
    norm: llaisys.Tensor
    lm_head: Linear  # the embedding itself when tie_word_embeddings (its own int8 copy when quantized; the same
    # blocks when the embedding is a GGUF file's quantized table)


_LAYER = re.compile(r"model\.layers\.(\d+)\.")


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


def plan(config: ModelConfig) -> tuple[dict[str, tuple], list[dict[str, tuple]]]:
    """{field: (checkpoint name, shape)} for the top-level weights and for each layer; a field that is rows
    [start, stop) of a fused checkpoint tensor (Phi-3's qkv_proj, gate_up_proj) is (name, shape, (start, stop)),
    with the fused tensor's shape: the decoder reads the rows as a matrix of their own (a view, no copy)."""
    c = config
    top = {"embed_tokens": ("model.embed_tokens.weight", (c.vocab_size, c.hidden_size)),
           "norm": ("model.norm.weight", (c.hidden_size,))}
    if not c.tie_word_embeddings:
        top["lm_head"] = ("lm_head.weight", (c.vocab_size, c.hidden_size))
    layers = []
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        layer = {
            "input_norm": (p + "input_layernorm.weight", (c.hidden_size,)),
            "q_proj": (p + "self_attn.q_proj.weight", (c.q_size, c.hidden_size)),
            "k_proj": (p + "self_attn.k_proj.weight", (c.kv_size, c.hidden_size)),
            "v_proj": (p + "self_attn.v_proj.weight", (c.kv_size, c.hidden_size)),
            "o_proj": (p + "self_attn.o_proj.weight", (c.hidden_size, c.q_size)),
            "mlp_norm": (p + "post_attention_layernorm.weight", (c.hidden_size,)),
            "gate_proj": (p + "mlp.gate_proj.weight", (c.intermediate_size, c.hidden_size)),
            "up_proj": (p + "mlp.up_proj.weight", (c.intermediate_size, c.hidden_size)),
            "down_proj": (p + "mlp.down_proj.weight", (c.hidden_size, c.intermediate_size)),
        }
        if c.sandwich_norms:  # Gemma: a norm after the attention and after the MLP too
            layer["mlp_norm"] = (p + "pre_feedforward_layernorm.weight", (c.hidden_size,))
            layer["attn_out_norm"] = (p + "post_attention_layernorm.weight", (c.hidden_size,))
            layer["mlp_out_norm"] = (p + "post_feedforward_layernorm.weight", (c.hidden_size,))
        if i in c.sparse_layers:
            for name in ("gate_proj", "up_proj", "down_proj"):
                del layer[name]
            layer.update(expert_plan(c, p))
        if c.qkv_bias:
            layer["q_bias"] = (p + "self_attn.q_proj.bias", (c.q_size,))
            layer["k_bias"] = (p + "self_attn.k_proj.bias", (c.kv_size,))
            layer["v_bias"] = (p + "self_attn.v_proj.bias", (c.kv_size,))
        if c.o_bias:
            layer["o_bias"] = (p + "self_attn.o_proj.bias", (c.hidden_size,))
        if c.mlp_bias:
            layer["gate_bias"] = (p + "mlp.gate_proj.bias", (c.intermediate_size,))
            layer["up_bias"] = (p + "mlp.up_proj.bias", (c.intermediate_size,))
            layer["down_bias"] = (p + "mlp.down_proj.bias", (c.hidden_size,))
        if c.qk_norm:
            layer["q_norm"] = (p + "self_attn.q_norm.weight", (c.head_dim,))
            layer["k_norm"] = (p + "self_attn.k_norm.weight", (c.head_dim,))
        if c.fused_projections:
            _fuse(layer, p, c)
        layers.append(layer)
    return top, layers


class Stack(tuple):
    """The checkpoint names of the matrices one stacked weight holds (an expert each), in order."""


# a sparse layer's experts as HF checkpoints store them: {stacked field: (this layer's name of expert e's matrix)}
_EXPERT_NAMES = {
    "mixtral": ("block_sparse_moe.gate.weight",
                {"gate": "block_sparse_moe.experts.{}.w1.weight", "up": "block_sparse_moe.experts.{}.w3.weight",
                 "down": "block_sparse_moe.experts.{}.w2.weight"}),
    "qwen3_moe": ("mlp.gate.weight",
                  {"gate": "mlp.experts.{}.gate_proj.weight", "up": "mlp.experts.{}.up_proj.weight",
                   "down": "mlp.experts.{}.down_proj.weight"}),
}


def expert_plan(c: ModelConfig, prefix: str) -> dict[str, tuple]:
    """{field: (checkpoint name or Stack of names, shape)} of a sparse layer's router and experts."""
    router, experts = _EXPERT_NAMES[c.model_type]
    e, inter, hidden = c.num_experts, c.moe_intermediate_size, c.hidden_size
    shapes = {"gate": (inter, hidden), "up": (inter, hidden), "down": (hidden, inter)}
    plan = {"router": (prefix + router, (e, hidden))}
    for field, name in experts.items():
        plan["experts_" + field] = (Stack(prefix + name.format(i) for i in range(e)), (e, *shapes[field]))
    return plan


def _specs(groups: list[dict]) -> list[tuple[str, tuple]]:
    """(checkpoint name, shape) of every tensor the plan names (each matrix of a Stack on its own)."""
    specs = []
    for name, shape, *_ in [spec for group in groups for spec in group.values()]:
        specs += [(n, shape[1:]) for n in name] if isinstance(name, Stack) else [(name, shape)]
    return specs


def materialize_stack(infos: list[TensorInfo], dtype: llaisys.DType, device: llaisys.Device) -> llaisys.Tensor:
    """The matrices of ``infos`` (all of one shape) stacked into one [len(infos), ...] tensor on ``device``."""
    stacked = llaisys.empty((len(infos), *infos[0].shape), dtype, device)
    for i, info in enumerate(infos):
        llaisys.ops.rearrange(stacked.slice(0, i, i + 1).view(*info.shape), materialize(info, dtype, device))
    return stacked


def layer_weights(fields: dict) -> LayerWeights:
    """A layer from its plan's fields (a sparse layer's router and experts_* fields become its ExpertWeights)."""
    if "router" in fields:
        fields = dict(fields)
        fields["experts"] = ExpertWeights(fields.pop("router"),
                                          *(fields.pop("experts_" + f) for f in ("gate", "up", "down")))
    return LayerWeights(**fields)


def _fuse(layer: dict, prefix: str, c: ModelConfig) -> None:
    """Phi-3's fused projections: q, k, v are rows of self_attn.qkv_proj, gate and up of mlp.gate_up_proj."""
    qkv = (prefix + "self_attn.qkv_proj.weight", (c.q_size + 2 * c.kv_size, c.hidden_size))
    gate_up = (prefix + "mlp.gate_up_proj.weight", (2 * c.intermediate_size, c.hidden_size))
    q, kv, inter = c.q_size, c.kv_size, c.intermediate_size
    layer["q_proj"], layer["k_proj"], layer["v_proj"] = (*qkv, (0, q)), (*qkv, (q, q + kv)), (*qkv, (q + kv, q + 2 * kv))
    layer["gate_proj"], layer["up_proj"] = (*gate_up, (0, inter)), (*gate_up, (inter, 2 * inter))


def check(checkpoint: Checkpoint, top: dict, layers: list[dict]) -> dict[str, TensorInfo]:
    """Every needed tensor exists with its shape and a floating dtype; returns name -> info."""
    infos = {}
    for name, shape in _specs([top, *layers]):
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
    info = checkpoint.info("model.embed_tokens.weight")
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
    experts = int8_experts([_row_reader(info) for info in infos], infos[0].shape, device, [i.name for i in infos])
    for info in infos:
        info.file.release_pages(info.offset, info.nbytes)
    return experts


def _part_bytes(info: TensorInfo, spec: tuple) -> int:
    """The bytes of the rows ``spec`` takes of its tensor (all of them but for a part of a fused one)."""
    if len(spec) < 3:
        return info.nbytes
    start, stop = spec[2]
    return info.nbytes * (stop - start) // max(info.shape[0], 1)


def load_weights(checkpoint: Checkpoint, config: ModelConfig, dtype: llaisys.DType, device: llaisys.Device,
                 progress: bool | None = None, quantize: str | None = None, layout=None) -> Weights:
    """The weights ``config`` names, checked, then placed on ``device`` in ``dtype`` (the linears in int8 with
    ``quantize``). ``layout`` (tensor_parallel.Layout): only this rank's part of each weight (the checkpoint
    must then be mapped: each part is read from the mapping)."""
    check_layer_count(checkpoint, config)
    top, layers = plan(config)
    infos = check(checkpoint, top, layers)
    tied_copy = quantize is not None and "lm_head" not in top  # the embedding read a second time, quantized
    total = sum(i.nbytes for i in infos.values()) + (infos[top["embed_tokens"][0]].nbytes if tied_copy else 0)
    if layout is not None and layout.world > 1:
        total //= layout.world
    cache: dict[str, llaisys.Tensor] = {}
    with Progress(total, f"loading {checkpoint.directory.name}", enabled=progress) as bar:
        def get(spec):
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

        def get_linear(spec, mode):
            if mode is None:
                return get(spec)
            weight = quantized(infos[spec[0]], device, spec[2] if len(spec) == 3 else None, mode)
            bar.update(_part_bytes(infos[spec[0]], spec))
            return weight

        def get_norm(spec):  # Gemma: 1 + w in f32 (see the top)
            info = infos[spec[0]]
            weight = info.file.array(info).astype(np.float32) + np.float32(config.norm_offset)
            bar.update(info.nbytes)
            return llaisys.from_numpy(weight, device)

        def getter(field):
            if field in LINEARS:
                return lambda spec: get_linear(spec, linear_mode(quantize, field))
            if field in EXPERTS:
                return get_experts
            return get_norm if field in NORMS and config.norm_offset else get

        def get_experts(spec):
            if quantize is None:
                return get(spec)
            infos_of_stack = [infos[name] for name in spec[0]]
            experts = quantized_experts(infos_of_stack, device)
            bar.update(sum(info.nbytes for info in infos_of_stack))
            return experts

        def get_field(field, spec):
            part = layout.part(field, config) if layout is not None else None
            if part is None:
                return getter(field)(spec)
            if part == DROP:
                return None
            return get_part(field, spec, part)

        def get_part(field, spec, part):
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

        def get_layer(layer):
            return layer_weights({field: get_field(field, spec) for field, spec in layer.items()})

        embed = get(top["embed_tokens"])
        layer_list = [get_layer(layer) for layer in layers]
        norm = getter("norm")(top["norm"])
        lm_head = get_field("lm_head", top.get("lm_head", top["embed_tokens"]))
    return Weights(embed_tokens=embed, layers=layer_list, norm=norm, lm_head=lm_head)
