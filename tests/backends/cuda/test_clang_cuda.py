"""Debian's clang in CUDA mode compiles every kernel source, in the NVIDIA configuration (warp 32) and in
the Iluvatar CoreX one (LLAISYS_COREX_CONFIG: warp 64, compat.h's CoreX branch minus what only CoreX's own
headers have), with warnings as errors. CoreX builds these sources with its own clang, so constructs only
nvcc accepts would break it; this is the check for them that runs without CoreX.

Needs clang++-22 (apt-get install clang-22) and a CUDA 13 tree with cuBLAS headers (CUDA_HOME, nvcc on
PATH, or NVIDIA's wheels); skips naming what is missing.
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
CLANG = os.environ.get("LLAISYS_CLANG_CUDA", "clang++-22")
sys.path.insert(0, str(PACKAGE / "build_backend"))
from cuda_toolchain import find_toolchain  # noqa: E402

CONFIGS = {
    "nvidia": ["-DLLAISYS_PREFIX=llaisys_cuda"],
    # CUDA's headers declare 32-bit lane masks where CoreX takes 64-bit ones: the narrowing of the all-ones
    # mask is expected here and only here
    "corex": ["-DLLAISYS_PREFIX=llaisys_iluvatar", "-DLLAISYS_COREX_CONFIG", "-Wno-constant-conversion"],
}


@pytest.fixture(scope="module")
def toolchain():
    if shutil.which(CLANG) is None:
        pytest.skip(f"{CLANG} is not installed (apt-get install clang-22)")
    try:
        return find_toolchain()
    except RuntimeError as e:
        pytest.skip(f"no CUDA 13 tree with cuBLAS headers: {e}")


@pytest.mark.parametrize("config", CONFIGS)
def test_every_source_compiles_with_clang_cuda(toolchain, config, tmp_path):
    # clang's CUDA wrapper includes curand_mtgp32_kernel.h, which a CUDA tree without cuRAND lacks
    (tmp_path / "curand_mtgp32_kernel.h").write_text("")
    cuda_root = toolchain.nvcc.parent.parent
    flags = ["-x", "cuda", "--cuda-gpu-arch=sm_80", f"--cuda-path={cuda_root}", "-Wno-unknown-cuda-version",
             "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", f"-I{PACKAGE / 'csrc'}",
             f"-I{REPO / 'llaisys-core' / 'src' / 'llaisys' / 'include'}",
             *(f"-I{d}" for d in toolchain.include_dirs), "-isystem", str(tmp_path), *CONFIGS[config]]
    sources = sorted((PACKAGE / "csrc").rglob("*.cu"))

    def compile_one(source: Path):
        result = subprocess.run([CLANG, *flags, "-c", str(source), "-o", str(tmp_path / (source.stem + ".o"))],
                                capture_output=True, text=True)
        return source, result

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        failures = [f"{s.relative_to(PACKAGE)}:\n{r.stderr[-3000:]}" for s, r in pool.map(compile_one, sources)
                    if r.returncode]
    assert not failures, "\n".join(failures)
