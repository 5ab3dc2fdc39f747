"""The conformance suite over the CUDA backend's host-execution build: the CUDA kernel sources compiled by g++
(tests/backends/cuda/host_exec/build.py: warp 32, ASan + UBSan), loaded as a llaisys backend of device type
"hostexec" in a child process that has the ASan runtime preloaded (host_exec_child.py). The suite then runs
through llaisys.ops exactly as on a GPU; the ops the CUDA tree lacks fall back to the CPU backend and are
reported as such. Slow: the build takes minutes of CPU (cached across runs), the suite in float32 ~2 minutes
(every kernel launch runs its blocks' threads on the host, under the sanitizers).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import llaisys.testing

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
BUILD = HERE.parent / "backends" / "cuda" / "host_exec" / "build.py"


def _build_module():
    spec = importlib.util.spec_from_file_location("host_exec_build", BUILD)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def failed_cases(stdout: str) -> dict[str, str]:
    """{case: message} of the report's "failures:" section."""
    lines = stdout.split("\nfailures:\n", 1)[1].splitlines() if "\nfailures:\n" in stdout else []
    failed = {}
    for line in lines:
        if not line.startswith("  "):
            break
        case, _, message = line.strip().partition("]: ")
        failed[case + "]"] = message
    return failed


def test_the_cuda_host_execution_build_passes_the_suite():
    if shutil.which("g++") is None:
        pytest.skip("host execution needs g++ (with libasan / libubsan)")
    build = _build_module()
    library = build.build(32)
    env = dict(os.environ, LD_PRELOAD=build.sanitizer_preload(), ASAN_OPTIONS="detect_leaks=0:abort_on_error=1",
               UBSAN_OPTIONS="print_stacktrace=1")
    # float32 only: every kernel launch runs on the host under the sanitizers, so each dtype costs minutes; the
    # bf16 / f16 paths of these kernels are checked against float64 by tests/backends/cuda/test_host_exec_*.py
    run = subprocess.run([sys.executable, str(HERE / "host_exec_child.py"), str(library), "", "f32"],
                         capture_output=True, text=True, env=env, timeout=1800)
    assert run.returncode in (0, 1), f"the child died (exit {run.returncode}):\n{run.stderr[-6000:]}"
    assert "hostexec:0: " in run.stdout, run.stdout + run.stderr[-3000:]
    assert run.returncode == 0 and not failed_cases(run.stdout), run.stdout
    table = run.stdout.split("\n\n")[0].splitlines()
    assert len(table) == 1 + len(llaisys.testing.OPS)  # the header and a row per op slot
    native = [row for row in table[1:] if "fallback" not in row]
    assert len(native) >= 20, table  # the CUDA tree implements nearly every slot
