"""llaisys CPU backend: registers device type "cpu" through the ``llaisys.backends`` entry point."""

from pathlib import Path

from ._version import __version__

LIBRARY = Path(__file__).with_name("libllaisys_cpu.so")

__all__ = ["LIBRARY", "__version__"]
