"""Checkpoints published already quantized, GPTQ (gptq.py) and AWQ (awq.py), kept in their 4 or 8 bits.

    model = llaisys_models.load("path/to/Qwen2.5-1.5B-Instruct-GPTQ-Int4")

What a directory says (``read``): config.json's ``quantization_config`` (transformers writes it), else
``quantize_config.json`` (AutoGPTQ, GPTQModel), else ``quant_config.json`` (AutoAWQ's own), with
``quant_method`` "gptq" or "awq" (a file without one is read as its tool writes it: GPTQ, or AWQ for ``w_bit``).
Which linears are quantized, and how, is ``QuantizedCheckpoint.linear(module)``: GPTQ's ``dynamic`` overrides
and exclusions, ``modules_in_block_to_quantize`` and ``lm_head``; AWQ's ``modules_to_not_convert`` (gptq.py and
awq.py cite where each convention comes from). The rest of the checkpoint (embeddings, norms, biases: Qwen2's
q/k/v biases, the modules kept in float) loads as from any directory.

Each quantized linear is checked from the headers before anything is built (``checked``: its tensors present, of
the dtypes and shapes its bits and group size make, g_idx in range with whole groups, zero points that fit), then
unpacked from the mapped file into q uint8 [N, K], zeros uint8 [N, G], scales float16 [N, G] (and desc_act's
``perm``) and packed by ``llaisys.ops.quant.pack_gq`` into a ``GQWeight`` that ``llaisys.ops.linear_gq`` runs with
unrounded activations: the model computes what the exactly dequantized model computes. Nothing is widened to
floats: a linear at a time is unpacked beside the packed weights, and its mapped pages are dropped as it is read,
so a load's memory is about the checkpoint's size. ``dequantize=True`` decodes the linears into the compute dtype
instead (exactly, in float32), for a device without ``linear_gq``.

Refused, each with one line: ``quantize=`` on such a checkpoint (it is quantized already), tensor parallelism, a
mixture of experts (no grouped-quant expert kernel), bits other than 4 / 8 (AWQ: 4), formats other than GPTQ's
v1 / v2 and AWQ's GEMM, and any tensor whose shape, dtype or values do not fit its config.

``dequantized_state(directory)``: the exactly dequantized float weights as an HF state dict, from which
cli/parity.py's ``quantized_hf_model`` makes the reference of ``llaisys infer --test`` and the tests
(transformers cannot load GPTQ without optimum, nor AWQ without autoawq).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

import llaisys

from ..errors import ModelLoadError, shown
from ..families.weights import GQWeight
from . import awq, gptq
from .files import read_json_object
from .quantize import BlockBuffers
from .safetensors import Checkpoint, TensorInfo

CONFIG_FILES = ("quantize_config.json", "quant_config.json")  # beside config.json, when it has no quantization_config
METHODS = ("gptq", "awq")
GPTQ_FORMATS = ("gptq", "gptq_v2")  # v1 (zeros stored minus one), v2 (as they are)
KERNELS = ("linear_gq",)


@dataclasses.dataclass(frozen=True)
class LinearQuant:
    """How one linear is stored."""

    method: str  # "gptq" or "awq"
    bits: int
    group_size: int  # -1: one group, the whole row
    desc_act: bool = False  # GPTQ act-order (g_idx says the groups either way)
    v1: bool = False  # GPTQ checkpoint_format "gptq": zeros stored minus one


@dataclasses.dataclass(frozen=True)
class QuantizedCheckpoint:
    """A directory's quantization config, read and checked (``read``)."""

    source: str  # where it was read, for errors: "config.json's quantization_config", "quantize_config.json"
    base: LinearQuant
    lm_head: bool = False  # GPTQ: the lm_head is quantized too
    dynamic: tuple[tuple[bool, re.Pattern[str], Mapping[str, Any]], ...] = ()  # GPTQ: (excluded, pattern, overrides)
    in_block: tuple[str, ...] = ()  # GPTQ modules_in_block_to_quantize (substrings; empty: every linear)
    not_converted: tuple[str, ...] = ()  # AWQ modules_to_not_convert (substrings)

    @property
    def method(self) -> str:
        return self.base.method

    def describe(self) -> str:
        b = self.base
        group = "one group per row" if b.group_size == -1 else f"groups of {b.group_size}"
        form = (" v1" if b.v1 else " v2") if b.method == "gptq" else " GEMM"
        return f"{b.method.upper()}{form} {b.bits}-bit, {group}{', act-order' if b.desc_act else ''}"

    def linear(self, module: str) -> LinearQuant | None:
        """How ``module`` (an HF module name: "model.layers.0.self_attn.q_proj", "lm_head") is stored: None for a
        float one (``<module>.weight``)."""
        if self.method == "awq":
            if module == "lm_head" or any(key in module for key in self.not_converted):
                return None
            return self.base
        if module == "lm_head" and not self.lm_head:
            return None
        if module != "lm_head" and self.in_block and not any(key in module for key in self.in_block):
            return None
        for excluded, pattern, overrides in self.dynamic:  # the first match decides (vLLM's get_dynamic_override)
            if pattern.match(module):
                return None if excluded else dataclasses.replace(self.base, **overrides)
        return self.base

    def refuse(self, directory: Path, *, quantize: str | None, tensor_parallel: bool, experts: bool) -> None:
        """One line for what cannot be done with such a checkpoint."""
        what = f"{directory} is a {self.describe()} checkpoint ({self.source})"
        if quantize is not None:
            raise ModelLoadError(f"{what}, quantized already: quantize={quantize!r} would quantize it again; load it "
                                 f"without quantize (its linears stay in their {self.base.bits} bits)")
        if experts:
            raise ModelLoadError(f"{what} of a mixture of experts, whose experts llaisys cannot run grouped-quantized "
                                 f"(there is no GPTQ / AWQ expert kernel)")
        if tensor_parallel:
            raise ModelLoadError(f"{what}: tensor parallelism does not split GPTQ / AWQ linears yet; load it on one "
                                 f"device")

    def linears(self, checkpoint: Checkpoint, specs: Iterable[tuple], kept: bool = True) -> dict[str, GQLinear]:
        """{weight name: the checked GQLinear} of the plan's linear ``specs`` ((name, shape[, rows])) that this
        config quantizes (``kept``: to run in their groups, whose layout ``linear_gq`` must take)."""
        found = {}
        for name, shape, *_ in specs:
            module = name.removesuffix(".weight")
            how = self.linear(module)
            if how is not None and name not in found:
                found[name] = checked(checkpoint, module, shape, how, self.source, kept)
        return found


# -- reading the config --------------------------------------------------------------------------------------


def read(directory: Path, raw: Mapping[str, Any] | None = None) -> QuantizedCheckpoint | None:
    """The quantization config of the model directory ``directory`` (``raw``: its config.json, when read
    already); None for a float checkpoint."""
    directory = Path(directory)
    if raw is None:
        raw = read_json_object(directory / "config.json")
    config = raw.get("quantization_config")
    source, name = "config.json's quantization_config", "config.json"
    if config is None:
        for file in CONFIG_FILES:
            if (directory / file).is_file():
                config, source, name = read_json_object(directory / file), file, file
                break
        else:
            return None
    where = f"{directory / name}"
    if not isinstance(config, dict):
        raise ModelLoadError(f"{where}: quantization_config must be an object, got {shown(config)}")
    method = config.get("quant_method")
    if method is None:  # AutoGPTQ's quantize_config.json and AutoAWQ's quant_config.json may not say
        method = "awq" if "w_bit" in config or "version" in config and "desc_act" not in config else "gptq"
    if not isinstance(method, str) or method.lower() not in METHODS:
        raise ModelLoadError(f"{where}: quant_method {shown(method)} is not one llaisys reads (it reads "
                             f"{' and '.join(METHODS)} checkpoints; --quantize int8 / int4 quantizes a float one at load)")
    fields = _Fields(config, where)
    if method.lower() == "awq":
        return _awq(fields, source)
    return _gptq(fields, source)


class _Fields:
    """A config object's fields, each checked as read; errors name the file and the field."""

    def __init__(self, config: Mapping[str, Any], where: str):
        self.config, self.where = config, where

    def error(self, field: str, value: object, why: str) -> ModelLoadError:
        return ModelLoadError(f"{self.where}: {field} = {shown(value)} {why}")

    def get(self, *names: str, default: Any = None) -> tuple[str, Any]:
        for name in names:
            if name in self.config and self.config[name] is not None:
                return name, self.config[name]
        return names[0], default

    def bits(self, allowed: tuple[int, ...], method: str, *names: str, value: object = None) -> int:
        name, bits = (names[0], value) if value is not None else self.get(*names)
        if isinstance(bits, bool) or not isinstance(bits, int):
            raise self.error(name, bits, "is not a number of bits")
        if bits not in allowed:
            raise self.error(name, bits, f"is not supported: llaisys runs {method} checkpoints of "
                                         f"{' or '.join(map(str, allowed))} bits")
        return bits

    def group_size(self, *names: str, value: object = None) -> int:
        name, size = (names[0], value) if value is not None else self.get(*names, default=-1)
        if isinstance(size, bool) or not isinstance(size, int) or not (size == -1 or size > 0):
            raise self.error(name, size, "is not a group size (a positive number of inputs, or -1 for whole rows)")
        return size

    def flag(self, name: str, default: bool, value: object = None) -> bool:
        flag = self.config.get(name, default) if value is None else value
        if flag is None:
            return default
        if not isinstance(flag, bool):
            raise self.error(name, flag, "is not true or false")
        return flag

    def names(self, name: str, nested: bool = False) -> tuple[str, ...]:
        value = self.config.get(name)
        if value is None:
            return ()
        items = [x for group in value for x in (group if isinstance(group, list) else [group])] if (
            nested and isinstance(value, list)) else value
        if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
            raise self.error(name, value, "is not a list of module names")
        return tuple(items)


def _gptq(f: _Fields, source: str) -> QuantizedCheckpoint:
    bits = f.bits(gptq.BITS, "GPTQ", "bits")
    form_field, form = f.get("checkpoint_format", "format", default="gptq")
    if f.config.get("is_marlin_format"):
        form_field, form = "is_marlin_format", "marlin"
    if not isinstance(form, str) or form.lower() not in GPTQ_FORMATS:
        raise f.error(form_field, form, f"is not supported: llaisys reads GPTQ's {' and '.join(GPTQ_FORMATS)} "
                                        f"formats (repack others with GPTQModel)")
    _, pack_dtype = f.get("pack_dtype", default="int32")
    if str(pack_dtype).removeprefix("torch.") != "int32":
        raise f.error("pack_dtype", pack_dtype, "is not supported: llaisys reads GPTQ codes packed in int32 words")
    base = LinearQuant("gptq", bits, f.group_size("group_size"), f.flag("desc_act", False),
                       v1=form.lower() == "gptq")
    f.flag("sym", True)  # (checked; a symmetric checkpoint stores its zero points like any other: gptq.py)
    dynamic = f.config.get("dynamic") or {}
    if not isinstance(dynamic, dict):
        raise f.error("dynamic", dynamic, "is not an object of module patterns")
    rules = []
    for key, overrides in dynamic.items():
        excluded = key.startswith("-:")
        pattern = key.removeprefix("-:").removeprefix("+:")
        try:
            compiled = re.compile(pattern)
        except re.error as e:
            raise f.error(f"dynamic[{shown(key)}]", pattern, f"is not a regular expression: {e}") from None
        if not isinstance(overrides, dict):
            raise f.error(f"dynamic[{shown(key)}]", overrides, "is not an object of overrides")
        field = f"dynamic[{shown(key)}]"
        checked_overrides: dict[str, Any] = {}
        if "bits" in overrides:
            checked_overrides["bits"] = f.bits(gptq.BITS, "GPTQ", f"{field}.bits", value=overrides["bits"])
        if "group_size" in overrides:
            checked_overrides["group_size"] = f.group_size(f"{field}.group_size", value=overrides["group_size"])
        if "desc_act" in overrides:
            checked_overrides["desc_act"] = f.flag(f"{field}.desc_act", base.desc_act, value=overrides["desc_act"])
        if "sym" in overrides:
            f.flag(f"{field}.sym", True, value=overrides["sym"])
        rules.append((excluded, compiled, checked_overrides))
    return QuantizedCheckpoint(source, base, lm_head=f.flag("lm_head", False), dynamic=tuple(rules),
                               in_block=f.names("modules_in_block_to_quantize", nested=True))


def _awq(f: _Fields, source: str) -> QuantizedCheckpoint:
    bits = f.bits((awq.BITS,), "AWQ", "bits", "w_bit")
    version_field, version = f.get("version", default="gemm")
    if not isinstance(version, str) or version.lower() != "gemm":
        raise f.error(version_field, version, "is not supported: llaisys reads AWQ's GEMM layout (version \"gemm\"; "
                                              "GEMV and GEMV_FAST order the codes otherwise)")
    backend = f.config.get("backend")
    if isinstance(backend, str) and backend.lower() == "llm-awq":
        raise f.error("backend", backend, "is not supported: llm-awq packs its codes as GEMV_FAST does")
    if not f.flag("zero_point", True):
        raise f.error("zero_point", False, "is not supported: AWQ's GEMM layout stores zero points")
    group_field, _ = f.get("group_size", "q_group_size")
    base = LinearQuant("awq", bits, f.group_size(group_field))
    return QuantizedCheckpoint(source, base, not_converted=f.names("modules_to_not_convert"))


# -- one linear -----------------------------------------------------------------------------------------------


class GQLinear:
    """One quantized linear of a checkpoint, checked (``checked``): ``weight`` builds it on a device."""

    def __init__(self, module: str, shape: tuple[int, int], how: LinearQuant, infos: dict[str, TensorInfo],
                 perm: np.ndarray | None):
        self.module, self.shape, self.how, self.infos, self.perm = module, shape, how, infos, perm
        self._unpacked: gptq.Unpacked | None = None  # kept while the parts of a fused matrix are built
        self._rows_built = 0

    @property
    def group_size(self) -> int:
        return self.shape[1] if self.how.group_size == -1 else self.how.group_size

    @property
    def nbytes(self) -> int:
        return sum(info.nbytes for info in self.infos.values())

    def unpacked(self) -> gptq.Unpacked:
        """The integer matrices, unpacked from the (mapped) file; its pages dropped once read."""
        if self._unpacked is not None:
            return self._unpacked
        arrays = {field: info.file.array(info) for field, info in self.infos.items()}
        if self.how.method == "awq":
            u = awq.unpack(arrays["qweight"], arrays["qzeros"], arrays["scales"], self.group_size)
        else:
            u = gptq.unpack(arrays["qweight"], arrays["qzeros"], arrays["scales"], self.perm, self.how.bits,
                            self.group_size, self.how.v1)
        for info in self.infos.values():
            info.file.release_pages(info.offset, info.nbytes)
        return u

    def weight(self, device: llaisys.Device, dtype: llaisys.DType, rows: tuple[int, int] | None = None,
               dequantize: bool = False) -> GQWeight | llaisys.Tensor:
        """The linear (or its outputs ``rows``: a part of a fused matrix) on ``device``: a GQWeight, or with
        ``dequantize`` its exact values in ``dtype``."""
        start, stop = rows or (0, self.shape[0])
        whole = (start, stop) == (0, self.shape[0])
        u = self.unpacked()
        if not whole:  # a fused matrix: unpacked once for all its parts
            self._unpacked = u
            self._rows_built += stop - start
            if self._rows_built >= self.shape[0]:
                self._unpacked, self._rows_built = None, 0
        part = u if whole else u.rows(start, stop)
        if dequantize:
            return llaisys.from_numpy(part.dequantized().astype(dtype.numpy), device)
        return gq_weight(part, device, self.how.method)


def gq_weight(u: gptq.Unpacked, device: llaisys.Device, fmt: str) -> GQWeight:
    """``u`` packed for ``linear_gq`` (``llaisys.ops.pack_gq``) on ``device``: on the CPU straight into the
    weight's own buffers."""
    n, k = u.shape
    shapes = llaisys.ops.gq_shapes(n, k, u.bits, u.group_size)
    buffers = BlockBuffers([(shapes[0], llaisys.uint8), (shapes[1], llaisys.float16), (shapes[2], llaisys.uint8)],
                           device)
    weight, scales, zeros = buffers.arrays
    llaisys.ops.pack_gq(u.q, u.scales, u.zeros.astype(np.uint8), u.bits, u.group_size, out_weight=weight,
                        out_scales=scales, out_zeros=zeros)
    perm = None if u.perm is None else llaisys.from_numpy(u.perm.astype(np.int32), device)
    weight_t, scales_t, zeros_t = buffers.placed()
    return GQWeight(weight_t, scales_t, zeros_t, u.bits, u.group_size, u.shape, fmt, perm)


_DTYPES = {"qweight": ("I32",), "qzeros": ("I32",), "scales": ("F16",), "g_idx": ("I32", "I64")}


def checked(checkpoint: Checkpoint, module: str, shape: tuple[int, ...], how: LinearQuant, source: str,
            kept: bool = True) -> GQLinear:
    """``module``'s tensors checked against the [N, K] ``shape`` the config implies and ``how`` it is stored:
    present, of their dtypes and shapes; g_idx in range, each group whole; ``kept`` (to run in ``linear_gq``): a
    width and group size its layout takes, v1 zero points that fit in ``bits``."""
    n, k = shape
    bits, method = how.bits, how.method
    gs = k if how.group_size == -1 else how.group_size
    fields = ("qweight", "qzeros", "scales", "g_idx") if method == "gptq" else ("qweight", "qzeros", "scales")
    infos: dict[str, TensorInfo] = {}
    for field in fields:
        name = f"{module}.{field}"
        if name in checkpoint:
            infos[field] = checkpoint.info(name)
        elif field != "g_idx":  # (a GPTQ checkpoint without g_idx: k // group_size)
            float_too = f"; it holds a float {module}.weight, which {source} does not say" if (
                f"{module}.weight" in checkpoint) else ""
            raise ModelLoadError(f"tensor {name!r} is missing from the checkpoint in {checkpoint.directory}: {source} "
                                 f"quantizes {module} ({method.upper()}, {bits} bits){float_too}")
    where = f"tensor '{module}.qweight' in {infos['qweight'].file.path.name}"
    if k % gs:
        raise ModelLoadError(f"{where}: group_size {gs} does not divide its input width {k} "
                             f"({method.upper()} groups are whole)")
    if kept:
        try:
            llaisys.ops.gq_shapes(n, k, bits, how.group_size)
        except ValueError as e:
            raise ModelLoadError(f"{where}: linear_gq cannot run it: {e}; load it with dequantize=True (--dequantize) "
                                 f"to decode it into floats") from None
    per = gptq.per_word(bits)
    groups = k // gs
    expected = {"qweight": (k // per, n), "qzeros": (groups, n // per), "scales": (groups, n), "g_idx": (k,)}
    packed_n = "qzeros"
    if method == "awq":
        expected = {"qweight": (k, n // per), "qzeros": (groups, n // per), "scales": (groups, n)}
        packed_n = "qweight"
    if k % per and method == "gptq":
        raise ModelLoadError(f"{where}: input width {k} is not a multiple of {per}, the {bits}-bit codes of a word")
    if n % per:
        raise ModelLoadError(f"tensor '{module}.{packed_n}': output width {n} is not a multiple of {per}, the "
                             f"{bits}-bit codes of a word")
    for field, info in infos.items():
        if info.dtype_name not in _DTYPES[field]:
            raise ModelLoadError(f"tensor {info.name!r} in {info.file.path.name} has dtype {info.dtype_name}; "
                                 f"{method.upper()} stores {field} as {' or '.join(_DTYPES[field])}")
        if info.shape != expected[field]:
            raise ModelLoadError(f"tensor {info.name!r} in {info.file.path.name} has shape {info.shape}, but a "
                                 f"{method.upper()} linear of {n} outputs and {k} inputs, {bits} bits in groups of "
                                 f"{gs}, has {field} of shape {expected[field]}")
    perm = None
    if "g_idx" in infos:
        info = infos["g_idx"]
        perm = gptq.groups(info.file.array(info), k, gs, groups, info.name)
    if method == "gptq" and how.v1 and kept:  # a v1 zero is the stored value + 1: 2^bits - 1 would be 2^bits
        info, top = infos["qzeros"], 2 ** bits - 1
        stored = gptq.unpack_rows(info.file.array(info), bits)
        if (stored == top).any():
            g, col = (int(i[0]) for i in np.nonzero(stored == top))
            raise ModelLoadError(f"tensor {info.name!r} holds {top} at group {g}, output {col}: a zero point of "
                                 f"{top + 1} in the v1 format (checkpoint_format \"gptq\" stores zeros minus one), which "
                                 f"{bits}-bit zeros cannot hold (AutoGPTQ's wrap-around of a zero of 0); load it with "
                                 f"dequantize=True (--dequantize) to decode it into floats")
    return GQLinear(module, (n, k), how, infos, perm)


# -- the HF reference ---------------------------------------------------------------------------------------


def _quantized_modules(checkpoint: Checkpoint, scheme: QuantizedCheckpoint) -> dict[str, GQLinear]:
    """Every quantized linear of the checkpoint (by its ``qweight``), checked, its shape from the tensors."""
    found = {}
    for name, info in checkpoint.infos.items():
        if not name.endswith(".qweight") or len(info.shape) != 2:
            continue
        module = name.removesuffix(".qweight")
        how = scheme.linear(module)
        if how is None:
            raise ModelLoadError(f"tensor {name!r} is quantized, but {scheme.source} keeps {module} in float")
        rows, cols = info.shape
        per = gptq.per_word(how.bits)
        shape = (cols, rows * per) if how.method == "gptq" else (cols * per, rows)
        found[module] = checked(checkpoint, module, shape, how, scheme.source, kept=False)
    return found


def dequantized_state(directory: str | Path) -> dict[str, np.ndarray]:
    """The checkpoint's tensors with every quantized linear decoded (exactly, float32) into ``<module>.weight``, the
    other tensors as stored (bfloat16 widened to float32, exactly): an HF model's state dict."""
    directory = Path(directory)
    scheme = read(directory)
    if scheme is None:
        raise ModelLoadError(f"{directory} is not a GPTQ or AWQ checkpoint (no quantization config)")
    checkpoint = Checkpoint(directory, mapped=True)
    modules = _quantized_modules(checkpoint, scheme)
    packed = {f"{m}.{field}" for m, linear in modules.items() for field in linear.infos}
    state = {}
    for name, info in checkpoint.infos.items():
        if name in packed:
            continue
        array = info.file.array(info)
        state[name] = array.astype(np.float32) if info.dtype == llaisys.bfloat16 else np.array(array)
    for module, linear in modules.items():
        state[f"{module}.weight"] = linear.unpacked().dequantized()
    return state


def is_quantized(directory: str | Path) -> bool:
    """Whether ``directory`` is a model directory whose config says GPTQ or AWQ."""
    directory = Path(directory)
    return directory.is_dir() and (directory / "config.json").is_file() and read(directory) is not None
