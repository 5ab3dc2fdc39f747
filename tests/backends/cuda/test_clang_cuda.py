"""Debian's clang in CUDA mode compiles every kernel source, in the NVIDIA configuration (warp 32) and in
the Iluvatar CoreX one, with warnings as errors. CoreX builds these sources with its own clang, so
constructs only nvcc accepts would break it; this is the check for them that runs without CoreX.

The CoreX configuration is what llaisys-backend-iluvatar builds (its defines, from corex_toolchain.py) plus
LLAISYS_COREX_CONFIG for __ILUVATAR__ (compat.h's CoreX branch, minus what only CoreX's own headers have):
warp 64, and cuBLAS as CoreX declares it (tests/backends/iluvatar/corex_api/cublas_v2.h: CUDA 10.2's API,
no cublasSetWorkspace), so it needs only the CUDA runtime headers and runs wherever a CUDA tree is (CI's
CPU session included). The NVIDIA configuration compiles against CUDA 13's own cuBLAS headers (CUDA_HOME,
nvcc on PATH or NVIDIA's wheels: the cuda session has them).

Needs clang++-22 (apt-get install clang-22); skips naming what is missing.
"""

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PACKAGE = REPO / "llaisys-backend-cuda"
COREX_API = REPO / "tests" / "backends" / "iluvatar" / "corex_api"
CLANG = os.environ.get("LLAISYS_CLANG_CUDA", "clang++-22")
sys.path.insert(0, str(PACKAGE / "build_backend"))
sys.path.insert(0, str(REPO / "llaisys-backend-iluvatar" / "build_backend"))
import corex_toolchain  # noqa: E402
from cuda_toolchain import find_cuda_root, find_toolchain  # noqa: E402


def nvidia_config() -> tuple[Path, list[str]]:
    try:
        toolchain = find_toolchain()
    except RuntimeError as e:
        pytest.skip(f"no CUDA 13 tree with cuBLAS headers for the NVIDIA configuration: {e}")
    return toolchain.nvcc.parent.parent, [*(f"-I{d}" for d in toolchain.include_dirs), "-DLLAISYS_PREFIX=llaisys_cuda"]


def corex_config() -> tuple[Path, list[str]]:
    root = find_cuda_root()
    if root is None:
        pytest.skip("no CUDA tree with the runtime headers (include/cuda_runtime.h): set CUDA_HOME")
    # CUDA's headers declare 32-bit lane masks where CoreX takes 64-bit ones: the narrowing of the all-ones
    # mask is expected here and only here
    return root, [f"-I{COREX_API}", *corex_toolchain.defines([corex_toolchain.DEFAULT_ARCH]), "-DLLAISYS_COREX_CONFIG",
                  "-Wno-constant-conversion"]


CONFIGS = {"nvidia": nvidia_config, "corex": corex_config}
pytestmark = pytest.mark.slow  # clang compiles every source, twice


@pytest.mark.parametrize("config", CONFIGS)
def test_every_source_compiles_with_clang_cuda(config, tmp_path):
    if shutil.which(CLANG) is None:
        pytest.skip(f"{CLANG} is not installed (apt-get install clang-22)")
    cuda_root, config_flags = CONFIGS[config]()
    # clang's CUDA wrapper includes curand_mtgp32_kernel.h, which a CUDA tree without cuRAND lacks
    (tmp_path / "curand_mtgp32_kernel.h").write_text("")
    flags = ["-x", "cuda", "--cuda-gpu-arch=sm_80", f"--cuda-path={cuda_root}", "-Wno-unknown-cuda-version",
             "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", f"-I{PACKAGE / 'csrc'}",
             f"-I{REPO / 'llaisys-core' / 'src' / 'llaisys' / 'include'}", *config_flags, "-isystem", str(tmp_path)]
    sources = sorted((PACKAGE / "csrc").rglob("*.cu"))

    def compile_one(source: Path):
        result = subprocess.run([CLANG, *flags, "-c", str(source), "-o", str(tmp_path / (source.stem + ".o"))],
                                capture_output=True, text=True)
        return source, result

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        failures = [f"{s.relative_to(PACKAGE)}:\n{r.stderr[-3000:]}" for s, r in pool.map(compile_one, sources)
                    if r.returncode]
    assert not failures, "\n".join(failures)
