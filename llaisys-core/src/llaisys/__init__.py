"""llaisys: a plugin-based LLM inference SDK. Core: tensors, devices, ops and backend discovery."""

from . import distributed, ops
from ._version import __version__
from .abi import API_VERSION
from .backend import Backend
from .device import Device, as_device
from .dlpack import from_dlpack
from .dtype import DType, as_dtype, bfloat16, bool_, float16, float32, float64, int8, int32, int64, uint8
from .errors import (
    ApiVersionError,
    BackendUnavailableError,
    LlaisysError,
    LlaisysValueError,
    LlaisysWarning,
    NotSupportedError,
    OutOfMemoryError,
)
from .graph import Graph, graphs_supported, why_no_graphs
from .memory import empty_cache, mem_info, memory_stats, reset_peak_memory_stats, set_cache_limit
from .native import NativeBackend, get_include
from .plugins import (
    BackendSpec,
    KernelOverride,
    available_devices,
    backend_report,
    capabilities,
    hookimpl,
    hookspec,
)
from .profiler import OpProfile, profile
from .stream import Stream, stream, synchronize
from .tensor import Tensor, empty, from_buffer, from_numpy, zeros

__all__ = [
    "API_VERSION", "__version__", "ApiVersionError", "Backend", "BackendSpec", "BackendUnavailableError", "DType",
    "Device", "Graph", "KernelOverride", "LlaisysError", "LlaisysValueError", "LlaisysWarning", "NativeBackend",
    "NotSupportedError", "OpProfile", "OutOfMemoryError", "Stream", "Tensor", "as_device", "as_dtype",
    "available_devices", "backend_report", "bfloat16", "bool_", "capabilities", "distributed", "empty",
    "empty_cache", "float16", "float32", "float64", "from_buffer", "from_dlpack", "from_numpy", "get_include",
    "graphs_supported", "hookimpl", "hookspec", "int8", "int32", "int64", "mem_info", "memory_stats", "ops", "profile",
    "reset_peak_memory_stats", "set_cache_limit", "stream", "synchronize", "uint8", "why_no_graphs", "zeros",
]
