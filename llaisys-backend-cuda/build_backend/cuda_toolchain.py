"""Where the CUDA toolchain is: a toolkit (CUDA_HOME / CUDA_PATH, or nvcc on PATH) or NVIDIA's pip wheels.

Used by setup.py (to compile) and by the in-tree build backend (to ask pip for the CUDA wheels only when
no toolkit is installed). Everything here is stdlib-only: it runs before any build requirement exists.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

CUDA_MAJOR = 13
# pip wheels that make a CUDA 13.0 toolchain (the folder nvidia/cu13 of site-packages)
NVCC_WHEELS = ["nvidia-cuda-nvcc==13.0.*", "nvidia-cuda-runtime==13.0.*", "nvidia-cuda-crt==13.0.*",
               "nvidia-cuda-cccl==13.0.*", "nvidia-nvvm==13.0.*"]
CUBLAS_WHEEL = "nvidia-cublas==13.0.*"
WHEEL_SUBDIR = Path("nvidia") / f"cu{CUDA_MAJOR}"


def _toolkit_from_environment() -> Path | None:
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if root and (Path(root) / "bin" / "nvcc").is_file():
            return Path(root)
    nvcc = shutil.which("nvcc")
    if nvcc:
        return _nvcc_root(Path(nvcc))
    return None


def _nvcc_root(nvcc: Path) -> Path:
    """The toolkit folder of an nvcc on PATH, which may be a symlink or a wrapper script: nvcc's dry run
    names its own folder (_HERE_)."""
    root = nvcc.resolve().parent.parent
    if (root / "bin" / "nvcc").is_file() and (root / "include" / "cuda_runtime.h").is_file():
        return root
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "probe.cu"
        source.write_text("")
        dry = subprocess.run([str(nvcc), "--dryrun", "-c", str(source), "-o", str(Path(tmp) / "probe.o")],
                             capture_output=True, text=True)
    match = re.search(r"^#\$ _HERE_=(.+)$", dry.stdout + dry.stderr, re.MULTILINE)
    return Path(match[1].strip()).resolve().parent if match else root


def _wheel_roots() -> list[Path]:
    """Every nvidia/cu13 folder on sys.path (a build environment's site-packages, or the user's)."""
    roots = []
    for entry in sys.path:
        candidate = Path(entry or ".") / WHEEL_SUBDIR
        if candidate.is_dir() and candidate not in roots:
            roots.append(candidate)
    return roots


def _find(relative: str, roots: list[Path]) -> Path | None:
    for root in roots:
        for path in root.glob(relative):
            return path
    return None


@dataclass
class Toolchain:
    nvcc: Path
    include_dirs: list[Path]
    library_dirs: list[Path]  # where libcudart.so.13 and libcublas.so.13 are for the link
    from_wheels: bool  # the toolkit itself came from pip wheels (no system CUDA)

    @property
    def system_lib_dirs(self) -> list[Path]:
        """Library folders of a system toolkit (worth a RUNPATH entry; a wheel's build folder is not)."""
        return [] if self.from_wheels else [d for d in self.library_dirs if WHEEL_SUBDIR.as_posix() not in d.as_posix()]


def missing_build_wheels() -> list[str]:
    """The CUDA wheels a build needs on this machine: none when a full toolkit is installed."""
    toolkit = _toolkit_from_environment()
    wanted = []
    if toolkit is None:
        wanted += NVCC_WHEELS
    roots = ([toolkit] if toolkit else []) + _wheel_roots()
    if toolkit is None or _find("include/cublas_v2.h", roots) is None:
        wanted.append(CUBLAS_WHEEL)
    return wanted


def find_cuda_root() -> Path | None:
    """A CUDA tree with the runtime headers (include/cuda_runtime.h), cuBLAS or not: a toolkit, else NVIDIA's
    wheels. Enough for compile-only checks that bring their own cuBLAS declarations (CoreX's, in the tests)."""
    toolkit = _toolkit_from_environment()
    for root in ([toolkit] if toolkit else []) + _wheel_roots():
        if (root / "include" / "cuda_runtime.h").is_file():
            return root
    return None


def find_toolchain() -> Toolchain:
    toolkit = _toolkit_from_environment()
    wheels = _wheel_roots()
    from_wheels = toolkit is None
    if toolkit is None:
        nvcc = _find("bin/nvcc", wheels)
        if nvcc is None:
            raise RuntimeError("llaisys-backend-cuda: no CUDA compiler: set CUDA_HOME, put nvcc on PATH, or let pip "
                               "install the nvidia-cuda-nvcc wheels (build with build isolation)")
        toolkit = nvcc.parent.parent
    roots = [toolkit, *wheels]
    include_dirs, library_dirs = [], []
    for header in ("cuda_runtime.h", "cublas_v2.h"):
        found = _find(f"include/{header}", roots)
        if found is None:
            raise RuntimeError(f"llaisys-backend-cuda: {header} not found in {', '.join(map(str, roots))}: "
                               f"install the CUDA toolkit with cuBLAS, or the {CUBLAS_WHEEL} wheel")
        if found.parent not in include_dirs:
            include_dirs.append(found.parent)
    for library in ("libcudart.so*", "libcublas.so*"):
        found = None
        for pattern in (f"lib64/{library}", f"lib/{library}", f"targets/*/lib/{library}"):
            found = found or _find(pattern, roots)
        if found is None:
            raise RuntimeError(f"llaisys-backend-cuda: {library} not found in {', '.join(map(str, roots))}")
        if found.parent not in library_dirs:
            library_dirs.append(found.parent)
    return Toolchain(toolkit / "bin" / "nvcc", include_dirs, library_dirs, from_wheels)
