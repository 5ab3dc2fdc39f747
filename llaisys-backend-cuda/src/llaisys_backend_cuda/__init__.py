"""llaisys CUDA backend: registers device type "cuda" through the ``llaisys.backends`` entry point."""

from pathlib import Path

LIBRARY = Path(__file__).with_name("libllaisys_cuda.so")
PREFIX = "llaisys_cuda"
