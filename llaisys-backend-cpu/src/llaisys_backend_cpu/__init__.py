"""llaisys CPU backend: registers device type "cpu" through the ``llaisys.backends`` entry point."""

from pathlib import Path

LIBRARY = Path(__file__).with_name("libllaisys_cpu.so")
