"""llaisys CUDA backend: registers device type "cuda" through the ``llaisys.backends`` entry point."""

from pathlib import Path

from ._version import __version__

LIBRARY = Path(__file__).with_name("libllaisys_cuda.so")
PREFIX = "llaisys_cuda"

__all__ = ["LIBRARY", "PREFIX", "__version__"]
