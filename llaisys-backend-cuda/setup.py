"""Builds csrc/**/*.cu with nvcc into src/llaisys_backend_cuda/libllaisys_cuda.so (a plain C ABI, no CPython).

Toolchain: CUDA_HOME / CUDA_PATH, else nvcc on PATH, else NVIDIA's pip wheels (build_backend/ asks pip for
them only when needed); see build_backend/cuda_toolchain.py. Exports are named llaisys_cuda_<slot>
(LLAISYS_PREFIX); the slots come from llaisys-core's llaisys/backend.h, found in the monorepo beside this
package, in csrc/include (an sdist's copy) or through an installed llaisys-core (llaisys.get_include()).

The library finds cudart and cuBLAS at run time through its RUNPATH: $ORIGIN/../nvidia/cu13/lib (the
nvidia-cuda-runtime and nvidia-cublas wheels in site-packages), then a system toolkit's lib folder when it
was built with one; the package preloads them with ctypes if that fails (editable installs).

Environment:
  LLAISYS_CUDA_ARCHS   compute capabilities, e.g. "90" or "80;90;120+PTX" (default below; "+PTX" also
                       embeds PTX for GPUs newer than the list)
  LLAISYS_CUDA_VERBOSE 1: print ptxas register / shared memory use per kernel (-Xptxas -v)
  LLAISYS_BUILD_JOBS   parallel compiles (default: CPU count)
  NVCC_APPEND_FLAGS    extra nvcc flags (read by nvcc itself)
"""

import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

ROOT = Path(__file__).parent.resolve()
sys.path.insert(0, str(ROOT / "build_backend"))
from cuda_toolchain import WHEEL_SUBDIR, find_toolchain  # noqa: E402

LIBRARY = "libllaisys_cuda.so"
PREFIX = "llaisys_cuda"
DEFAULT_ARCHS = "80;86;89;90;100;120+PTX"  # Ampere, Ada, Hopper, Blackwell (+ PTX for newer)
HEADER = Path("llaisys") / "backend.h"


def core_include_dir() -> Path:
    """The folder holding llaisys/backend.h."""
    for candidate in (ROOT.parent / "llaisys-core" / "src" / "llaisys" / "include", ROOT / "csrc" / "include"):
        if (candidate / HEADER).is_file():
            return candidate
    try:
        import llaisys
        return Path(llaisys.get_include())
    except ImportError:
        sys.exit("llaisys-backend-cuda: cannot find llaisys/backend.h: build from the llaisys monorepo, "
                 "or install llaisys-core first")


def parse_archs(text: str) -> tuple[list[int], list[int]]:
    """("80;90+PTX") -> machine-code capabilities [80, 90], PTX capabilities [90]."""
    sass, ptx = [], []
    for item in re.split(r"[;,\s]+", text.strip()):
        if not item:
            continue
        match = re.fullmatch(r"(?:sm_|compute_)?(\d+)(?:\.(\d))?(\+PTX)?", item, re.IGNORECASE)
        if not match:
            sys.exit(f"llaisys-backend-cuda: LLAISYS_CUDA_ARCHS entry {item!r} is not like 90, 8.6 or 120+PTX")
        major_minor = int(match[1]) * 10 + int(match[2]) if match[2] else int(match[1])
        sass.append(major_minor)
        if match[3]:
            ptx.append(major_minor)
    return sorted(set(sass)), sorted(set(ptx))


def nvcc_flags(toolchain, sass, ptx) -> list[str]:
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in sass]
    gencode += [f"-gencode=arch=compute_{a},code=compute_{a}" for a in ptx]
    host_flags = "-fPIC,-fvisibility=hidden,-Wall,-Wextra,-Werror"
    flags = ["-std=c++17", "-O3", "--expt-relaxed-constexpr", "-Werror=all-warnings", f"-Xcompiler={host_flags}",
             f"-DLLAISYS_PREFIX={PREFIX}", f"-DLLAISYS_CUDA_SASS=\"{','.join(map(str, sass))}\"",
             f"-DLLAISYS_CUDA_PTX=\"{','.join(map(str, ptx))}\"",
             f"-I{ROOT / 'csrc'}", f"-I{core_include_dir()}", *(f"-I{d}" for d in toolchain.include_dirs), *gencode]
    if os.environ.get("LLAISYS_CUDA_VERBOSE") == "1":
        flags.append("-Xptxas=-v")
    return flags


def compile_library(out_dir: Path, build_dir: Path) -> Path:
    toolchain = find_toolchain()
    sass, ptx = parse_archs(os.environ.get("LLAISYS_CUDA_ARCHS", DEFAULT_ARCHS))
    flags = nvcc_flags(toolchain, sass, ptx)
    sources = sorted((ROOT / "csrc").rglob("*.cu"))
    headers = [*(ROOT / "csrc").rglob("*.h"), *(ROOT / "csrc").rglob("*.cuh"), core_include_dir() / HEADER]
    newest_input = max(p.stat().st_mtime for p in [*headers, Path(__file__)])
    build_dir.mkdir(parents=True, exist_ok=True)
    stamp = build_dir / "flags.txt"  # objects built by another nvcc or with other flags (archs) are rebuilt
    signature = " ".join([str(toolchain.nvcc), *flags])
    if not stamp.exists() or stamp.read_text() != signature:
        for old in build_dir.glob("*.o"):
            old.unlink()
        stamp.write_text(signature)
    print(f"llaisys-backend-cuda: nvcc {toolchain.nvcc}, sm {sass}, PTX {ptx}", file=sys.stderr)

    def compile_one(source: Path) -> Path:
        obj = build_dir / (source.relative_to(ROOT / "csrc").as_posix().replace("/", "__") + ".o")
        if obj.exists() and obj.stat().st_mtime > max(source.stat().st_mtime, newest_input):
            return obj  # up to date
        cmd = [str(toolchain.nvcc), *flags, "-c", str(source), "-o", str(obj)]
        print(" ".join(cmd), file=sys.stderr)
        subprocess.run(cmd, check=True)
        return obj

    jobs = int(os.environ.get("LLAISYS_BUILD_JOBS", os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        objects = list(pool.map(compile_one, sources))
    out_dir.mkdir(parents=True, exist_ok=True)
    library = out_dir / LIBRARY
    runpath = ":".join([f"$ORIGIN/../{WHEEL_SUBDIR.as_posix()}/lib", *map(str, toolchain.system_lib_dirs)])
    cxx = os.environ.get("CXX", "g++")
    # export llaisys_cuda_* only: -fvisibility=hidden alone still exports copies of std:: templates
    exports_map = build_dir / "exports.map"
    exports_map.write_text(f"{{ global: {PREFIX}_*; local: *; }};\n")
    cmd = [cxx, "-shared", "-static-libstdc++", "-static-libgcc", "-Wl,-z,defs", "-Wl,--enable-new-dtags",
           f"-Wl,-rpath,{runpath}", f"-Wl,--version-script={exports_map}", *map(str, objects),
           *(f"-L{d}" for d in toolchain.library_dirs),
           "-l:libcudart.so.13", "-l:libcublas.so.13", "-ldl", "-lpthread", "-o", str(library)]
    print(" ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True)
    return library


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        try:
            if self.editable_mode:  # editable installs load the library from the source tree
                compile_library(ROOT / "src" / "llaisys_backend_cuda", ROOT / "build" / "objects")
            else:
                compile_library(Path(self.build_lib) / "llaisys_backend_cuda", ROOT / "build" / "objects")
        except Exception as e:
            # setuptools runs a custom build_py of an editable install "safely": it would print a warning
            # and go on with a stale or missing library. A failed build must fail the install.
            raise SystemExit(f"llaisys-backend-cuda: the library did not build: {e}") from e


class SdistWithHeader(sdist):
    """An sdist carries its own copy of llaisys/backend.h (csrc/include), so it builds without the monorepo."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        target = Path(base_dir) / "csrc" / "include" / HEADER
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(core_include_dir() / HEADER, target)


class PlatformWheel(bdist_wheel):
    """The library uses no CPython API: one wheel per platform serves every Python 3."""

    def get_tag(self):
        _, _, platform = super().get_tag()
        return "py3", "none", platform


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithLibrary, "sdist": SdistWithHeader, "bdist_wheel": PlatformWheel},
      distclass=BinaryDistribution)
