"""What only the CPU library has: its SIMD-level export and the LLAISYS_CPU_SIMD setting."""

import os
import subprocess

import pytest

from helpers.child_process import run_in_child

llaisys_backend_cpu = pytest.importorskip("llaisys_backend_cpu")

LEVELS = ["portable", "avx2", "avx512"]

def simd_level_in_child() -> None:
    """The child: three adds through the library, then the SIMD level it ran and the result."""
    import ctypes

    import numpy as np

    import llaisys

    lib = ctypes.CDLL(str(llaisys_backend_cpu.LIBRARY))
    lib.llaisys_cpu_simd_level.restype = ctypes.c_char_p
    a = llaisys.from_numpy(np.ones(40000, np.float32))
    for _ in range(3):
        llaisys.ops.add(a, a, a)
    print(lib.llaisys_cpu_simd_level().decode(), float(a.numpy()[0]))


def run_child(simd_env: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "LLAISYS_CPU_SIMD"}
    if simd_env is not None:
        env["LLAISYS_CPU_SIMD"] = simd_env
    return run_in_child(simd_level_in_child, env=env, timeout=300, check=True)


def test_unknown_simd_value_warns_once_naming_the_valid_ones():
    best = run_child(None)
    assert "LLAISYS_CPU_SIMD" not in best.stderr
    level = best.stdout.split()[0]
    assert level in LEVELS
    bad = run_child("sse9")
    warnings = [line for line in bad.stderr.splitlines() if "LLAISYS_CPU_SIMD" in line]
    assert len(warnings) == 1, bad.stderr
    assert "sse9" in warnings[0] and all(name in warnings[0] for name in LEVELS), warnings[0]
    assert bad.stdout.split() == [level, "8.0"], "an unknown value is ignored: the best level runs"


def test_simd_level_can_be_lowered_not_raised():
    """A level up to the CPU's runs as asked, silently; one above it (this CPU lacks it: on an AVX2 machine,
    avx512) is reported in one line, and the CPU's best runs."""
    best = run_child(None).stdout.split()[0]
    for wanted in LEVELS:
        got = run_child(wanted)
        warnings = [line for line in got.stderr.splitlines() if "LLAISYS_CPU_SIMD" in line]
        if LEVELS.index(wanted) <= LEVELS.index(best):
            assert warnings == [] and got.stdout.split()[0] == wanted
        else:
            assert warnings == [f"llaisys-backend-cpu: LLAISYS_CPU_SIMD={wanted}: this CPU lacks it; using {best}"]
            assert got.stdout.split()[0] == best
