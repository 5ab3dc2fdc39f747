"""From a path to a model on a device: its family (families/registry.py), the device and dtype (device.py),
the weights (weights.py; a GGUF file's: gguf/), EOS.

    model = load("path/to/hf-dir")          # or a GGUF file (gguf/), or a Hub id (hub.py)

This process's model: on one device, or (``layout``, ``group``) one rank's part of a tensor-parallel model
(``llaisys_models.load(..., tensor_parallel=N)`` starts the ranks: parallel/launch.py; each loads its part here).
"""

from __future__ import annotations

from pathlib import Path

import llaisys

from ..errors import ModelLoadError
from ..families import causal_lm
from ..families.causal_lm import CausalLM
from ..families.config import ModelConfig, token_ids
from ..families.registry import FAMILIES, read_config
from ..parallel.layout import Layout
from . import mtp as _mtp  # noqa: F401  (hands the families its reader of DeepSeek's MTP module)
from . import quantize as quantization
from . import quantized_checkpoint
from .device import float_dtype, pick_device
from .files import is_gguf, model_directory, read_json, read_json_object
from .hub import resolve
from .safetensors import Checkpoint
from .weights import default_dtype, load_weights


def load(path: str | Path, device: str | llaisys.Device | None = None, dtype: str | llaisys.DType | None = None, *,
         progress: bool | None = None, mmap: bool | None = None, numerics: str | None = None,
         quantize: str | None = None, dequantize: bool = False, layout: Layout | None = None,
         group: llaisys.distributed.Group | None = None) -> CausalLM:
    """The model in the HuggingFace directory (or GGUF file, or Hub id: hub.py) ``path``, its class the family
    its config names (registry.py). See ``llaisys_models.load`` for the options.

    ``layout`` and ``group`` (parallel/): load only this rank's part of the weights, its collectives through
    ``group`` (the checkpoint is then mapped: each part is read from the mapping)."""
    path = resolve(path)  # a Hub id ("org/name") -> its copy in the Hub cache (downloaded when missing)
    if is_gguf(path):
        return load_gguf(path, device, dtype, progress=progress, numerics=numerics, quantize=quantize,
                         dequantize=dequantize, layout=layout, group=group)
    parts = read_directory(path, device, dtype, progress=progress, mmap=True if layout is not None else mmap,
                           quantize=quantize, layout=layout, dequantize=dequantize)
    return FAMILIES[parts["config"].architecture].model.from_weights(**parts, numerics=numerics, group=group)


def read_directory(path: str | Path, device: str | llaisys.Device | None = None,
                   dtype: str | llaisys.DType | None = None, *, progress: bool | None = None, mmap: bool | None = None,
                   quantize: str | None = None, layout: Layout | None = None, dequantize: bool = False) -> dict:
    """What a model is made of, read from a HuggingFace directory: keyword arguments of ``from_weights``
    (with ``layout``: this rank's part of the weights, and its config). A GPTQ / AWQ checkpoint's linears stay in
    their groups (quantized_checkpoint.py), or with ``dequantize`` are decoded into ``dtype``."""
    quantize = quantization.resolve(quantize)
    path = model_directory(resolve(path))
    config = config_file(path)
    family = FAMILIES[config.architecture]
    published = quantized_checkpoint.read(path)  # GPTQ / AWQ: None for a float checkpoint
    kernels = family.kernels
    if published is not None:
        published.refuse(path, quantize=quantize, tensor_parallel=layout is not None and layout.world > 1,
                         experts=bool(config.sparse_layers))
        kernels += () if dequantize else quantized_checkpoint.KERNELS
    device = pick_device(device, quantize, kernels, experts=bool(config.sparse_layers))
    if mmap is None:  # CPU: weights read into memory, unless int8 (quantized in memory from the mapping) or GPTQ
        mmap = device.type != "cpu" or quantize is not None or published is not None
    checkpoint = Checkpoint(path, mapped=mmap)
    dtype = default_dtype(checkpoint, config) if dtype is None else float_dtype(dtype)
    eos = eos_token_ids(path, config)
    weights = load_weights(checkpoint, config, family, dtype, device, progress=progress, quantize=quantize,
                           layout=layout, published=published, dequantize=dequantize)
    if layout is not None:
        config = layout.local_config(config)
    # the checkpoint stays alive with the model: its memory maps are what the weights may point into
    return dict(path=path, config=config, weights=weights, device=device, dtype=dtype, eos_token_ids=eos,
                source=checkpoint, quantize=quantize)


def load_gguf(path: str | Path, device: str | llaisys.Device | None = None, dtype: str | llaisys.DType | None = None,
              *, progress: bool | None = None, numerics: str | None = None, quantize: str | None = None,
              dequantize: bool = False, layout: Layout | None = None,
              group: llaisys.distributed.Group | None = None) -> CausalLM:
    """The model in the GGUF file ``path`` on ``device`` (None: the best available), computing in ``dtype``
    (None: the stored float type, or float32 for quantized weights), its ops rounding as ``numerics`` says
    (``llaisys_models.families.numerics``). Quantized matrices stay in their blocks where llaisys has their format
    and the device the kernels (gguf/weights.py); ``dequantize=True`` decodes every tensor into ``dtype`` instead
    (exactly the stored values in float32, as HF transformers reads the file); ``quantize="int8"`` / ``"int4"``
    requantizes the linears' weights (quantize.py). ``layout`` and ``group``: this rank's part of a
    tensor-parallel model (its quantized matrices keep their blocks where a rank's part cuts none, else are
    decoded, then cut)."""
    # (start-up: these import the gguf package, ~0.15 s, which only a GGUF file needs)
    from .gguf import weights as gguf_weights
    from .gguf.config import model_config
    from .gguf.reader import GGUFFile

    quantize = quantization.resolve(quantize)
    if dequantize and quantize is not None:
        raise ModelLoadError(f"dequantize=True decodes the weights into {dtype or 'float32'}, quantize={quantize!r} "
                             f"requantizes them: choose one")
    f = GGUFFile(path)
    config = model_config(f)
    family = FAMILIES[config.architecture]
    top, layers = gguf_weights.tensor_plan(f, config, family)
    device = pick_device(device, quantize, family.kernels, experts=bool(config.sparse_layers))
    dtype = gguf_weights.default_dtype(f, top, layers) if dtype is None else float_dtype(dtype)
    if layout is not None and layout.world > 1:
        layout = gguf_weights.expert_layout(f, config, layers, layout, device, quantize, dequantize)
    weights = gguf_weights.load_weights(f, config, family, top, layers, dtype, device, progress=progress,
                                        quantize=quantize, dequantize=dequantize, layout=layout)
    local = config if layout is None else layout.local_config(config)
    return family.model.from_weights(f.path, local, weights, device=device, dtype=dtype,
                                     eos_token_ids=config.eos_token_ids, source=f, numerics=numerics,
                                     quantize=quantize, group=group)


def model_config(path: str | Path) -> ModelConfig:
    """The ModelConfig of a HuggingFace directory or GGUF file (e.g. to check a split before loading)."""
    if is_gguf(path):
        # (start-up: the gguf package, only for a GGUF file)
        from .gguf.config import model_config as gguf_config
        from .gguf.reader import GGUFFile

        return gguf_config(GGUFFile(path))
    return config_file(model_directory(path))


def config_file(path: str | Path) -> ModelConfig:
    """The config.json of a directory (or that file), as its family reads it (registry.py); a config of an
    architecture llaisys does not run is refused as such before its fields are read."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        ggufs = sorted(p.name for p in path.parent.glob("*.gguf"))
        hint = f"; it holds a GGUF file: pass the file, {path.parent / ggufs[0]}" if len(ggufs) == 1 else (
            f"; it holds GGUF files: pass one of them ({', '.join(ggufs)})" if ggufs else "")
        raise ModelLoadError(f"{path} does not exist: a model directory needs a HuggingFace config.json{hint}")
    raw = read_json_object(path)
    try:
        return read_config(raw)
    except ModelLoadError as e:
        raise ModelLoadError(f"{path}: {e}") from None


def eos_token_ids(path: Path, config: ModelConfig) -> tuple[int, ...]:
    """EOS ids from config.json and generation_config.json (HF generate stops at either)."""
    ids = list(config.eos_token_ids)
    gen_path = path / "generation_config.json"
    if gen_path.exists():
        gen = read_json(gen_path)
        if isinstance(gen, dict):
            try:
                ids += [i for i in token_ids(gen.get("eos_token_id"), "eos_token_id") if i not in ids]
            except ModelLoadError as e:
                raise ModelLoadError(f"{gen_path}: {e}") from None
    return tuple(ids)


# ``Qwen2(path)`` reads its directory here, as ``load(path)`` does (causal_lm.py: the families sit below this)
causal_lm.set_directory_reader(read_directory)
