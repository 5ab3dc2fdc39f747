"""Builds the CUDA backend's kernel sources with the Iluvatar CoreX SDK into
src/llaisys_backend_iluvatar/libllaisys_iluvatar.so (a plain C ABI, exports llaisys_iluvatar_<slot>).

The sources are llaisys-backend-cuda's csrc/, the one copy in git: this package compiles them from
../llaisys-backend-cuda/csrc in the monorepo, and its sdist carries a copy in csrc/ (with llaisys/backend.h
in csrc/include) so that it builds on its own. The command lines are in build_backend/corex_toolchain.py.

Environment:
  COREX_HOME              the CoreX SDK (default /usr/local/corex)
  LLAISYS_ILUVATAR_ARCH   ivcore10, ivcore11 or ivcore20 (default), or a comma-separated list
  LLAISYS_BUILD_JOBS      parallel compiles (default: CPU count)
"""

import os
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
from corex_toolchain import EXPORTS_MAP, LIBRARY, SdkNotFound, compile_command, find_sdk, link_command, target_archs  # noqa: E402

PACKAGE = "llaisys_backend_iluvatar"
HEADER = Path("llaisys") / "backend.h"


def shared_csrc() -> Path:
    """The kernel sources: this sdist's copy, or the CUDA package's beside this one in the monorepo."""
    for candidate in (ROOT / "csrc", ROOT.parent / "llaisys-backend-cuda" / "csrc"):
        if (candidate / "compat.h").is_file():
            return candidate
    sys.exit("llaisys-backend-iluvatar: the shared kernel sources are missing: build from the llaisys monorepo "
             "(they are llaisys-backend-cuda/csrc) or from this package's sdist")


def core_include_dir(csrc: Path) -> Path:
    """The folder holding llaisys/backend.h: llaisys-core's in the monorepo, the sdist's copy, or an
    installed llaisys-core's."""
    for candidate in (ROOT.parent / "llaisys-core" / "src" / "llaisys" / "include", csrc / "include"):
        if (candidate / HEADER).is_file():
            return candidate
    try:
        import llaisys
        return Path(llaisys.get_include())
    except ImportError:
        sys.exit("llaisys-backend-iluvatar: cannot find llaisys/backend.h: build from the llaisys monorepo, "
                 "or install llaisys-core first")


def compile_library(out_dir: Path, build_dir: Path) -> Path:
    try:
        sdk, archs = find_sdk(), target_archs()
    except (SdkNotFound, ValueError) as e:
        sys.exit(str(e))
    csrc = shared_csrc()
    include_dirs = [csrc, core_include_dir(csrc)]
    sources = sorted(csrc.rglob("*.cu"))
    if build_dir.exists():
        shutil.rmtree(build_dir)  # objects of another SDK or architecture must not survive
    build_dir.mkdir(parents=True)
    print(f"llaisys-backend-iluvatar: CoreX SDK {sdk}, {', '.join(archs)}, sources {csrc}", file=sys.stderr)

    def compile_one(source: Path) -> Path:
        obj = build_dir / (source.relative_to(csrc).as_posix().replace("/", "__") + ".o")
        cmd = compile_command(sdk, archs, source, obj, include_dirs)
        print(" ".join(cmd), file=sys.stderr)
        if subprocess.run(cmd).returncode != 0:
            sys.exit(f"llaisys-backend-iluvatar: compiling {source.name} failed (the compiler said why, above)")
        return obj

    jobs = int(os.environ.get("LLAISYS_BUILD_JOBS", os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        objects = list(pool.map(compile_one, sources))
    out_dir.mkdir(parents=True, exist_ok=True)
    library = out_dir / LIBRARY
    exports_map = build_dir / "exports.map"
    exports_map.write_text(EXPORTS_MAP)
    cmd = link_command(sdk, objects, library, exports_map)
    print(" ".join(cmd), file=sys.stderr)
    if subprocess.run(cmd).returncode != 0:
        sys.exit(f"llaisys-backend-iluvatar: linking {LIBRARY} failed (the linker said why, above)")
    return library


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        try:
            if self.editable_mode:  # editable installs load the library from the source tree
                compile_library(ROOT / "src" / PACKAGE, ROOT / "build" / "corex-objects")
            else:
                compile_library(Path(self.build_lib) / PACKAGE, ROOT / "build" / "corex-objects")
        except Exception as e:
            # setuptools runs a custom build_py of an editable install "safely": it would print a warning
            # and go on with a stale or missing library. A failed build must fail the install.
            raise SystemExit(f"llaisys-backend-iluvatar: the library did not build: {e}") from e


class SdistWithSharedSources(sdist):
    """The sdist carries its own copy of the shared kernel sources and of llaisys/backend.h (csrc/,
    csrc/include), so it builds without the monorepo. Git holds one copy: llaisys-backend-cuda/csrc."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        csrc = shared_csrc()
        target = Path(base_dir) / "csrc"
        shutil.copytree(csrc, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.o", "__pycache__"))
        header = target / "include" / HEADER
        header.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(core_include_dir(csrc) / HEADER, header)


class PlatformWheel(bdist_wheel):
    """The library uses no CPython API: one wheel per platform serves every Python 3."""

    def get_tag(self):
        _, _, platform = super().get_tag()
        return "py3", "none", platform


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithLibrary, "sdist": SdistWithSharedSources, "bdist_wheel": PlatformWheel},
      distclass=BinaryDistribution)
