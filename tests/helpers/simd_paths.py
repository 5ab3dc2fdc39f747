"""Running a check on every SIMD path of the CPU backend (LLAISYS_CPU_SIMD caps the path per process)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent.parent  # tests/ (this file is in tests/helpers/)

LEVELS = ["portable", "avx2", "avx512"]


def cpu_simd_level() -> str:
    """The SIMD path the CPU library takes in this process."""
    import llaisys_backend_cpu
    fn = ctypes.CDLL(str(llaisys_backend_cpu.LIBRARY)).llaisys_cpu_simd_level
    fn.restype = ctypes.c_char_p
    return fn().decode()


def skip_unless_level_available(device, level: str) -> None:
    if device.type != "cpu":
        pytest.skip("SIMD paths belong to the CPU backend")
    best = cpu_simd_level()
    if LEVELS.index(level) > LEVELS.index(best):
        pytest.skip(f"this CPU (or LLAISYS_CPU_SIMD) allows at most {best}")


def run_in_child(module_name: str, env_extra: dict, call: str, expect_level: str | None = None) -> None:
    """Runs ``call`` (an expression using the test module as ``t``) in a child process with extra environment."""
    module_file = Path(sys.modules[module_name].__file__)
    here = module_file.parent
    env = {**os.environ, **env_extra,
           "PYTHONPATH": os.pathsep.join([str(here), str(TESTS), os.environ.get("PYTHONPATH", "")])}
    check = (f"from helpers.simd_paths import cpu_simd_level as level; assert level() == {expect_level!r}, level(); "
             if expect_level else "")
    code = f"import {module_file.stem} as t; {check}{call}"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{env_extra} failed:\n{result.stdout}\n{result.stderr[-4000:]}"


def run_under_simd(module_name: str, level: str, call: str) -> None:
    """Runs ``call`` at one SIMD level: in this process if it is already at that level, else in a child
    process pinned to it with LLAISYS_CPU_SIMD."""
    if level == cpu_simd_level():
        exec(call, {"t": sys.modules[module_name]})
        return
    run_in_child(module_name, {"LLAISYS_CPU_SIMD": level}, call, expect_level=level)
