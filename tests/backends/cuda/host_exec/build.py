"""Builds the CUDA backend's sources for host execution: g++, LLAISYS_HOST_EXEC, a warp size, ASan + UBSan.

The result is a shared library with the backend's C ABI under the prefix ``llaisys_hostexec``; it is
cached under build/host_exec/ (or $LLAISYS_HOST_EXEC_CACHE) by a hash of every input, so a test session
rebuilds only after a source changed. ``python build.py 64`` builds one by hand and prints its path.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[3]
CSRC = REPO / "llaisys-backend-cuda" / "csrc"
CORE_INCLUDE = REPO / "llaisys-core" / "src" / "llaisys" / "include"
PREFIX = "llaisys_hostexec"
LIBRARY = "libllaisys_hostexec.so"
SANITIZERS = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]


def compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++")


# Each warp size is one real configuration: 32 as NVIDIA's (built for sm_80), 64 as Iluvatar CoreX's
# (LLAISYS_COREX_CONFIG: compat.h's CoreX branch, built for ivcore20, which a compute capability 8.0 device is).
CONFIGS = {
    32: ['-DLLAISYS_CUDA_SASS="80"', '-DLLAISYS_CUDA_PTX=""'],
    64: ["-DLLAISYS_COREX_CONFIG", '-DLLAISYS_COREX_ARCHS="ivcore20"'],
}


def flags(warp: int) -> list[str]:
    return ["-x", "c++", "-std=c++20", "-O1", "-g", "-fPIC", "-pthread", "-Wall", "-Wextra", "-Werror",
            "-Wno-unused-parameter", "-Wno-unknown-pragmas", "-DLLAISYS_HOST_EXEC", f"-DLLAISYS_WARP_SIZE={warp}",
            f"-DLLAISYS_PREFIX={PREFIX}", *CONFIGS[warp], f"-I{HERE}", f"-I{CSRC}", f"-I{CORE_INCLUDE}", *SANITIZERS]


def sources() -> list[Path]:
    return sorted(CSRC.rglob("*.cu"))


def inputs_digest(cxx: str, warp: int) -> str:
    digest = hashlib.sha256(" ".join([cxx, *flags(warp)]).encode())
    inputs = [*sources(), *CSRC.rglob("*.h"), *CSRC.rglob("*.cuh"), *HERE.glob("*.h"),
              CORE_INCLUDE / "llaisys" / "backend.h"]
    for path in sorted(inputs):
        digest.update(path.as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def build(warp: int, jobs: int | None = None) -> Path:
    """The library for `warp` (32 or 64), compiled if no cached copy matches the sources."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler (g++) for the host-execution build")
    cache = Path(os.environ.get("LLAISYS_HOST_EXEC_CACHE", REPO / "build" / "host_exec"))
    out_dir = cache / f"warp{warp}-{inputs_digest(cxx, warp)}"
    library = out_dir / LIBRARY
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / ".lock", "w") as lock:  # one build per folder at a time (parallel test runs)
        fcntl.flock(lock, fcntl.LOCK_EX)
        if library.exists():
            return library

        def compile_one(source: Path) -> Path:
            obj = out_dir / (source.relative_to(CSRC).as_posix().replace("/", "__") + ".o")
            subprocess.run([cxx, *flags(warp), "-c", str(source), "-o", str(obj)], check=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            return obj

        try:
            with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
                objects = list(pool.map(compile_one, sources()))
        except subprocess.CalledProcessError as e:
            raise RuntimeError(f"host-execution compile failed:\n{' '.join(e.cmd)}\n{e.stdout}") from e
        tmp = out_dir / (LIBRARY + ".tmp")
        subprocess.run([cxx, "-shared", "-pthread", *SANITIZERS, *map(str, objects), "-o", str(tmp)], check=True)
        tmp.rename(library)
    return library


def sanitizer_preload() -> str:
    """LD_PRELOAD for a process that loads the library: the ASan runtime must come first, and libstdc++
    right after it, so that ASan's __cxa_throw interceptor finds the real one (Python does not link it)."""
    cxx = compiler() or "g++"
    paths = [subprocess.run([cxx, f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
             for name in ("libasan.so", "libstdc++.so")]
    return " ".join(str(Path(p).resolve()) for p in paths)


if __name__ == "__main__":
    print(build(int(sys.argv[1]) if len(sys.argv) > 1 else 32))
