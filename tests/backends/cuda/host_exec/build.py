"""Builds the CUDA backend's sources for host execution: g++, LLAISYS_HOST_EXEC, a warp size, ASan + UBSan.

The result is a shared library with the backend's C ABI under the prefix ``llaisys_hostexec`` (minutes of
CPU to build). It is cached outside the clone, in $LLAISYS_HOST_EXEC_CACHE or else
${XDG_CACHE_HOME:-~/.cache}/llaisys/host_exec, so that a fresh clone (CI's) reuses it, under a key that
hashes every input: the sources and headers (by their paths inside the repository and their bytes), the
compiler command and flags, and the compiler's version. A stale build is thus never reused, and a test
session rebuilds only after one of them changed. The cache keeps the KEEP builds used last (removing one is
always safe). ``python build.py 64`` builds one by hand and prints its path.
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
KEEP = 8  # cached builds kept (each ~30 MB): every warp size of a few source versions


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


def cache_root() -> Path:
    if os.environ.get("LLAISYS_HOST_EXEC_CACHE"):
        return Path(os.environ["LLAISYS_HOST_EXEC_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llaisys" / "host_exec"


def compiler_version(cxx: str) -> str:
    return subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True).stdout


def inputs_digest(cxx: str, warp: int) -> str:
    """The cache key: the same in every clone (paths count from the repository's root), different when any
    input, flag or the compiler changes."""
    command = " ".join([cxx, *flags(warp)]).replace(str(REPO), "<repo>")
    digest = hashlib.sha256(f"{command}\n{compiler_version(cxx)}".encode())
    inputs = [*sources(), *CSRC.rglob("*.h"), *CSRC.rglob("*.cuh"), *HERE.glob("*.h"),
              CORE_INCLUDE / "llaisys" / "backend.h"]
    for path in sorted(inputs):
        digest.update(path.relative_to(REPO).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def build(warp: int, jobs: int | None = None) -> Path:
    """The library for `warp` (32 or 64), compiled if no cached copy matches the sources."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler (g++) for the host-execution build")
    cache = cache_root()
    out_dir = cache / f"warp{warp}-{inputs_digest(cxx, warp)}"
    library = out_dir / LIBRARY
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / ".lock", "w") as lock:  # one build per folder at a time (parallel test runs)
        fcntl.flock(lock, fcntl.LOCK_EX)
        if library.exists():
            os.utime(library)  # used now: prune() keeps the builds used last
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
        for obj in objects:  # a later build compiles everything again: only the library is reused
            obj.unlink()
    prune(cache)
    return library


def prune(cache: Path, keep: int = KEEP) -> None:
    """Remove all but the ``keep`` builds used last (by the library's mtime), skipping any being built now."""
    built = sorted(cache.glob(f"*/{LIBRARY}"), key=lambda lib: lib.stat().st_mtime, reverse=True)
    for library in built[keep:]:
        with open(library.parent / ".lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            shutil.rmtree(library.parent)


def sanitizer_preload() -> str:
    """LD_PRELOAD for a process that loads the library: the ASan runtime must come first, and libstdc++
    right after it, so that ASan's __cxa_throw interceptor finds the real one (Python does not link it)."""
    cxx = compiler() or "g++"
    paths = [subprocess.run([cxx, f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
             for name in ("libasan.so", "libstdc++.so")]
    return " ".join(str(Path(p).resolve()) for p in paths)


if __name__ == "__main__":
    print(build(int(sys.argv[1]) if len(sys.argv) > 1 else 32))
