"""Builds csrc/**/*.cpp into src/llaisys_backend_cpu/libllaisys_cpu.so (a plain C ABI, no CPython).

Files named *_avx2.cpp / *_avx512.cpp are compiled with that instruction set; the rest
for baseline x86-64, so the library runs on any x86-64 and picks a path at run time.
Exports are named llaisys_cpu_<slot> (LLAISYS_PREFIX); the slots come from llaisys-core's
llaisys/backend.h, found in the monorepo beside this package, in csrc/include (an sdist's copy)
or through an installed llaisys-core (llaisys.get_include()).
Environment: CXX (default g++), LLAISYS_CPU_CXXFLAGS (extra flags), LLAISYS_BUILD_JOBS.
"""

import os
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

ROOT = Path(__file__).parent.resolve()
LIBRARY = "libllaisys_cpu.so"
PREFIX = "llaisys_cpu"


def core_include_dir() -> Path:
    """The folder holding llaisys/backend.h."""
    for candidate in (ROOT.parent / "llaisys-core" / "src" / "llaisys" / "include", ROOT / "csrc" / "include"):
        if (candidate / "llaisys" / "backend.h").is_file():
            return candidate
    try:
        import llaisys
        return Path(llaisys.get_include())
    except ImportError:
        sys.exit("llaisys-backend-cpu: cannot find llaisys/backend.h: build from the llaisys monorepo, "
                 "or install llaisys-core first")


BASE_FLAGS = ["-O3", "-std=c++17", "-fPIC", "-fopenmp", "-fvisibility=hidden", "-Wall", "-Wextra",
              "-Wmissing-declarations", "-fno-math-errno",
              f"-DLLAISYS_PREFIX={PREFIX}", f"-I{ROOT / 'csrc'}", f"-I{core_include_dir()}"]
ISA_FLAGS = {
    "_avx2": ["-mavx2", "-mfma", "-mf16c"],
    "_avx512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx2", "-mfma", "-mf16c"],
}


def isa_flags(source: Path) -> list[str]:
    for suffix, flags in ISA_FLAGS.items():
        if source.stem.endswith(suffix):
            return flags
    return []


def compile_library(out_dir: Path, build_dir: Path) -> Path:
    cxx = shlex.split(os.environ.get("CXX", "g++"))
    extra = shlex.split(os.environ.get("LLAISYS_CPU_CXXFLAGS", ""))
    sources = sorted((ROOT / "csrc").rglob("*.cpp"))
    headers = [*(ROOT / "csrc").rglob("*.h"), core_include_dir() / "llaisys" / "backend.h"]
    headers_mtime = max(p.stat().st_mtime for p in headers)
    build_dir.mkdir(parents=True, exist_ok=True)

    def compile_one(source: Path) -> Path:
        obj = build_dir / (source.relative_to(ROOT / "csrc").as_posix().replace("/", "__") + ".o")
        if obj.exists() and obj.stat().st_mtime > max(source.stat().st_mtime, headers_mtime):
            return obj  # up to date
        cmd = [*cxx, *BASE_FLAGS, *isa_flags(source), *extra, "-c", str(source), "-o", str(obj)]
        print(" ".join(cmd), file=sys.stderr)
        subprocess.run(cmd, check=True)
        return obj

    # Baseline objects link first: an inline function emitted by several objects (std::to_string, ...)
    # keeps the first copy the linker sees, which must not be one compiled with AVX instructions.
    sources.sort(key=lambda source: bool(isa_flags(source)))
    jobs = int(os.environ.get("LLAISYS_BUILD_JOBS", os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        objects = list(pool.map(compile_one, sources))
    out_dir.mkdir(parents=True, exist_ok=True)
    library = out_dir / LIBRARY
    cmd = [*cxx, "-shared", "-fopenmp", "-static-libstdc++", "-static-libgcc", *extra,
           *map(str, objects), "-o", str(library)]
    print(" ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True)
    return library


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        compile_library(Path(self.build_lib) / "llaisys_backend_cpu", ROOT / "build" / "objects")
        if self.editable_mode:  # editable installs load the library from the source tree
            compile_library(ROOT / "src" / "llaisys_backend_cpu", ROOT / "build" / "objects")


class PlatformWheel(bdist_wheel):
    """The library uses no CPython API: one wheel per platform serves every Python 3."""

    def get_tag(self):
        _, _, platform = super().get_tag()
        return "py3", "none", platform


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithLibrary, "bdist_wheel": PlatformWheel}, distclass=BinaryDistribution)
