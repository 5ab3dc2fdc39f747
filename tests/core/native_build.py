"""Building small shared libraries against llaisys/backend.h for core's tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

import llaisys


def compile_shared(compiler: str, source: Path, output: Path, flags=()) -> Path:
    result = subprocess.run([compiler, *flags, "-shared", "-fPIC", f"-I{llaisys.get_include()}", str(source),
                             "-o", str(output)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return output
