"""Which device a model runs on, and in which dtype: the one asked for, or the best available device whose
backend runs every kernel the model calls (its family's kernels, plus the quantized linears when asked for
them); a device whose backend lacks one is refused here, naming the kernels, never in the middle of a forward.
"""

from __future__ import annotations

from collections.abc import Sequence

import llaisys
from llaisys.device import as_device
from llaisys.dtype import as_dtype

from ..errors import ModelLoadError
from ..families.family import KERNELS
from . import quantize as quantization
from .weights import FLOAT_WEIGHTS


def float_dtype(dtype: str | llaisys.DType) -> llaisys.DType:
    dtype = as_dtype(dtype)
    if dtype not in FLOAT_WEIGHTS:
        raise ModelLoadError(f"dtype must be float32, float16 or bfloat16, got {dtype.name}")
    return dtype


def missing_kernels(device: llaisys.Device, kernels: Sequence[str] = KERNELS) -> list[str]:
    return [op for op in kernels if not llaisys.ops.implemented(op, device)]


def pick_device(device: str | llaisys.Device | None, quantize: str | None = None, kernels: Sequence[str] = KERNELS,
                experts: bool = False) -> llaisys.Device:
    """The device asked for, or (None) the best available one whose backend runs every op of ``kernels`` (the
    family's: a mixture of experts adds MOE_KERNELS) and the quantized linears when ``quantize`` asks for them
    (``experts``: the experts' too)."""
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
