"""llaisys Iluvatar CoreX backend: registers device type "iluvatar" through the ``llaisys.backends`` entry point.

The kernels are llaisys-backend-cuda's CUDA C++ sources built by CoreX's clang (warps of 64 threads)."""

from pathlib import Path

from ._version import __version__

LIBRARY = Path(__file__).with_name("libllaisys_iluvatar.so")
PREFIX = "llaisys_iluvatar"

__all__ = ["LIBRARY", "PREFIX", "__version__"]
