"""From a path to a model on a device: the class (registry.py), the device, the dtype, the weights, EOS.

    model = load("path/to/hf-dir")          # or a GGUF file (gguf/)

Device choice: the one asked for, or the best available device whose backend runs every kernel a model
calls (KERNELS, MOE_KERNELS for a mixture of experts, plus the quantized linears when asked for them); a
device whose backend lacks one is refused here, naming the kernels, never in the middle of a forward.
"""

from __future__ import annotations

from pathlib import Path

import llaisys
from llaisys.device import as_device
from llaisys.dtype import as_dtype

from ..errors import ModelLoadError
from ..families.config import ModelConfig, token_ids
from . import quantize as quantization
from .files import is_gguf, model_directory, read_json
from .safetensors import Checkpoint
from .weights import FLOAT_WEIGHTS, default_dtype, load_weights

# Every op a forward, the paged KV cache and sampling call: a device whose backend lacks one cannot run the
# model (there is no second, unpaged code path). A family that calls more says so (its class's KERNELS).
KERNELS = ("embedding", "rms_norm", "linear", "rope", "paged_kv_write", "paged_attention", "swiglu", "add",
           "rearrange", "argmax", "sample")
MOE_KERNELS = ("moe_router", "moe_linear", "moe_combine")  # ... and a mixture-of-experts model's sparse layers


def load(path, device=None, dtype=None, *, progress: bool | None = None, mmap: bool | None = None,
         numerics: str | None = None, quantize: str | None = None, dequantize: bool = False,
         tensor_parallel: int | None = None, distributed_executor: str | None = None, layout=None, group=None):
    """The model in the HuggingFace directory (or GGUF file, or Hub id: hub.py) ``path``, its class picked by
    the architecture its config names (registry.py). See ``llaisys_models.load`` for the options.

    ``layout`` and ``group`` (tensor_parallel/): load only this rank's part of the weights, its collectives
    through ``group``; ``tensor_parallel`` > 1 starts a group (tensor_parallel/launch.py), its ranks processes
    of this host or (``distributed_executor="ray"``) Ray actors, and returns rank 0's model."""
    from ..families.registry import MODEL_CLASSES
    from .hub import resolve

    if tensor_parallel is not None and (isinstance(tensor_parallel, bool) or not isinstance(tensor_parallel, int)
                                        or tensor_parallel < 1):
        raise ModelLoadError(f"tensor_parallel must be a number of ranks >= 1, got {tensor_parallel!r}")
    if distributed_executor is not None:
        from ..parallel.launch import check_executor

        if check_executor(distributed_executor) == "ray" and tensor_parallel in (None, 1):
            raise ModelLoadError("distributed_executor='ray' places tensor-parallel ranks: give tensor_parallel=N "
                                 "(N > 1)")
    if layout is None and tensor_parallel not in (None, 1):
        from ..parallel.launch import load_parallel

        if mmap is False:
            raise ModelLoadError("tensor_parallel needs the checkpoint mapped (each rank reads its part from the "
                                 "mapping): leave mmap unset")
        return load_parallel(path, tensor_parallel, device, dtype, progress=progress, numerics=numerics,
                             quantize=quantize, distributed_executor=distributed_executor)
    path = resolve(path)  # a Hub id ("org/name") -> its copy in the Hub cache (downloaded when missing)
    if is_gguf(path):
        from . import gguf

        return gguf.load(path, device=device, dtype=dtype, progress=progress, numerics=numerics, quantize=quantize,
                         dequantize=dequantize, layout=layout, group=group)
    path = model_directory(path)
    if layout is not None:
        return MODEL_CLASSES[ModelConfig.from_file(path, supported=MODEL_CLASSES).architecture].from_weights(
            **read_directory(path, device, dtype, progress=progress, mmap=True, quantize=quantize, layout=layout),
            numerics=numerics, group=group)
    config = ModelConfig.from_file(path, supported=MODEL_CLASSES)
    cls = MODEL_CLASSES[config.architecture]
    return cls(path, device=device, dtype=dtype, progress=progress, mmap=mmap, numerics=numerics, quantize=quantize)


def read_directory(path, device=None, dtype=None, *, progress: bool | None = None, mmap: bool | None = None,
                   quantize: str | None = None, layout=None) -> dict:
    """What a model is made of, read from a HuggingFace directory: keyword arguments of ``from_weights``
    (with ``layout``: this rank's part of the weights, and its config)."""
    from ..families.registry import MODEL_CLASSES
    from .hub import resolve

    quantize = quantization.resolve(quantize)
    path = model_directory(resolve(path))
    config = ModelConfig.from_file(path, supported=MODEL_CLASSES)
    cls = MODEL_CLASSES[config.architecture]
    device = pick_device(device, quantize, cls.KERNELS, experts=bool(config.sparse_layers))
    if mmap is None:  # CPU: weights read into memory, unless int8 (quantized in memory from the mapping)
        mmap = device.type != "cpu" or quantize is not None
    checkpoint = Checkpoint(path, mapped=mmap)
    dtype = default_dtype(checkpoint, config) if dtype is None else float_dtype(dtype)
    eos = eos_token_ids(path, config)
    weights = load_weights(checkpoint, config, dtype, device, progress=progress, quantize=quantize, layout=layout)
    if layout is not None:
        config = layout.local_config(config)
    # the checkpoint stays alive with the model: its memory maps are what the weights may point into
    return dict(path=path, config=config, weights=weights, device=device, dtype=dtype, eos_token_ids=eos,
                source=checkpoint, quantize=quantize)


def float_dtype(dtype) -> llaisys.DType:
    dtype = as_dtype(dtype)
    if dtype not in FLOAT_WEIGHTS:
        raise ModelLoadError(f"dtype must be float32, float16 or bfloat16, got {dtype.name}")
    return dtype


def missing_kernels(device: llaisys.Device, kernels=KERNELS) -> list[str]:
    return [op for op in kernels if not llaisys.ops.implemented(op, device)]


def pick_device(device, quantize: str | None = None, kernels=KERNELS, experts: bool = False) -> llaisys.Device:
    """The device asked for, or (None) the best available one whose backend runs every op of ``kernels`` (the
    model class's KERNELS: a mixture of experts adds MOE_KERNELS) and the quantized linears when ``quantize``
    asks for them (``experts``: the experts' too)."""
    if device is None:
        devices = llaisys.available_devices()
        if not devices:  # core's one line: each plugin's state (disabled, no device + why, failed + why) or what to install
            raise llaisys.BackendUnavailableError(llaisys.plugins.why_no_device())
        able = [d for d in devices
                if not missing_kernels(d, kernels) and not quantization.missing_kernels(d, quantize, experts)]
        device = able[0] if able else devices[0]  # none able: the best one's error below
    device = as_device(device)
    llaisys.empty((0,), llaisys.float32, device)  # raises, naming the cause, for a device that is not there
    missing = missing_kernels(device, kernels)
    if missing:
        why = " (its KV cache is paged)" if any(op.startswith("paged_") for op in missing) else ""
        raise llaisys.BackendUnavailableError(
            f"the '{device.type}' backend does not implement {', '.join(missing)}, which the model needs{why}; "
            f"run it on another device (e.g. device='cpu', --device cpu)")
    quantization.check_device(device, quantize, experts)
    return device


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
