"""llaisys Iluvatar CoreX backend: registers device type "iluvatar" through the ``llaisys.backends`` entry point.

The kernels are llaisys-backend-cuda's CUDA C++ sources built by CoreX's clang (warps of 64 threads)."""

from pathlib import Path

LIBRARY = Path(__file__).with_name("libllaisys_iluvatar.so")
PREFIX = "llaisys_iluvatar"
