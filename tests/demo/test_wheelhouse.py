"""The wheels a user takes to another machine: the CPU stack installed from a wheelhouse alone runs the demo.

nox's tests session builds the wheelhouse once (``pip wheel`` of core, the CPU backend and the models package
with every dependency's wheel, the backend's retagged by ``auditwheel repair``), installs the suite's packages
from it and passes it here as LLAISYS_WHEELHOUSE. Without it these tests skip: making one compiles the CPU
library from scratch (minutes) and downloads the dependencies, which a test run outside nox should not do
behind its user's back.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

WHEELHOUSE = os.environ.get("LLAISYS_WHEELHOUSE")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not WHEELHOUSE, reason="LLAISYS_WHEELHOUSE is not set: nox's tests session builds the wheelhouse and sets it")]
PACKAGES = ["llaisys-core", "llaisys-backend-cpu", "llaisys-models"]


def cpu_wheel() -> Path:
    wheels = sorted(Path(WHEELHOUSE).resolve().glob("llaisys_backend_cpu-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_the_cpu_wheel_is_manylinux_and_carries_its_openmp_runtime():
    # the tag auditwheel gave it: the oldest glibc whose symbol versions cover what the library uses
    assert re.fullmatch(r"llaisys_backend_cpu-[\d.]+-py3-none-manylinux_2_\d+_x86_64\.whl", cpu_wheel().name)
    names = set(zipfile.ZipFile(cpu_wheel()).namelist())
    assert {"llaisys_backend_cpu/libllaisys_cpu.so", "llaisys_backend_cpu/libgomp.so.1"} <= names


def run(command: list, cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}  # only the venv's packages
    proc = subprocess.run(list(map(str, command)), cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{command}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_the_cpu_stack_installs_from_the_wheelhouse_alone_and_runs_the_demo(tmp_path):
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path)
    python = venv / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-compile", "--no-index", "--find-links",
         WHEELHOUSE, *PACKAGES], tmp_path)
    assert run([venv / "bin" / "llaisys", "generate", "--prompt", "1234+5678=", "--max-new-tokens", "8"],
               tmp_path).startswith("6912")
    # the kernels run on the OpenMP runtime the wheel carries, not on one the machine happens to have
    maps = ("import llaisys; llaisys.available_devices(); "
            "print(*{line.split()[-1] for line in open('/proc/self/maps') if 'gomp' in line})")
    runtime = Path(run([python, "-c", maps], tmp_path).strip())
    assert runtime.name == "libgomp.so.1" and runtime.parent.name == "llaisys_backend_cpu"
    assert runtime.is_relative_to(venv)
