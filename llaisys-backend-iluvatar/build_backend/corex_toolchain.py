"""The Iluvatar CoreX SDK, and the command lines that build the shared CUDA kernel sources with it.

CoreX compiles CUDA C++ with its own clang (``-x ivcore``, which defines ``__ILUVATAR__``) for a named GPU
architecture (``--cuda-gpu-arch=ivcore10|ivcore11|ivcore20``) against the SDK's CUDA-compatible headers and
libraries (``$COREX_HOME/include``, ``$COREX_HOME/lib64``). Kernels are compiled whole, one object per
source: no relocatable device code, so no device link step and no ``cudadevrt``.

Stdlib only: the build backend runs this before any build requirement is installed; setup.py, nox and the
tests import it too, so every command line has one definition.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

DEFAULT_SDK = Path("/usr/local/corex")
SDK_NOT_FOUND = "CoreX SDK not found: set COREX_HOME or install it at /usr/local/corex"
ARCH_VARIABLE = "LLAISYS_ILUVATAR_ARCH"
DEFAULT_ARCH = "ivcore20"
KNOWN_ARCHS = ("ivcore10", "ivcore11", "ivcore20")  # BI-V100; BI-V150 / MR-V100; ivcore20 parts
PREFIX = "llaisys_iluvatar"  # exported names: llaisys_iluvatar_<slot>
LIBRARY = "libllaisys_iluvatar.so"
# The linker's version script: only the slots are exported. -fvisibility=hidden alone leaves the std:: template
# instances the sources use (std::string, std::to_string) exported, as weak symbols of default visibility.
EXPORTS_MAP = f"{{ global: {PREFIX}_*; local: *; }};\n"


class SdkNotFound(RuntimeError):
    """No CoreX SDK where COREX_HOME or the default location says; the message is one line."""


def find_sdk(environ: Mapping[str, str] | None = None) -> Path:
    """The SDK folder: $COREX_HOME if set, else /usr/local/corex; it must hold bin/clang++.

    The path is kept as given (not resolved), so that a /usr/local/corex symlink to a versioned folder keeps
    working in the library's RUNPATH after an SDK upgrade."""
    environ = os.environ if environ is None else environ
    home = environ.get("COREX_HOME", "")
    root = Path(home) if home else DEFAULT_SDK
    if (root / "bin" / "clang++").is_file():
        return root
    if home:
        raise SdkNotFound(f"CoreX SDK not found: COREX_HOME={home} has no bin/clang++ "
                          "(set COREX_HOME to the SDK folder, or unset it to use /usr/local/corex)")
    raise SdkNotFound(SDK_NOT_FOUND)


def target_archs(environ: Mapping[str, str] | None = None) -> list[str]:
    """The architectures to build for: $LLAISYS_ILUVATAR_ARCH ("ivcore11", or a list "ivcore11,ivcore20"
    for one library that runs on both), default ivcore20. A name CoreX's clang does not know is left for it
    to reject; anything not shaped like an architecture is refused here, in one line."""
    environ = os.environ if environ is None else environ
    text = environ.get(ARCH_VARIABLE, "").strip() or DEFAULT_ARCH
    archs: list[str] = []
    for item in re.split(r"[;,\s]+", text):
        if not item:
            continue
        if not re.fullmatch(r"ivcore\d+", item):
            raise ValueError(f"{ARCH_VARIABLE}={text!r}: {item!r} is not a CoreX GPU architecture "
                             f"(one of {', '.join(KNOWN_ARCHS)}, or a comma-separated list)")
        if item not in archs:
            archs.append(item)
    return archs


def defines(archs: list[str]) -> list[str]:
    """What the shared sources need to know about this build: the export prefix and the architectures
    (a device of another architecture is then refused by name; see compat.h)."""
    return [f"-DLLAISYS_PREFIX={PREFIX}", f'-DLLAISYS_COREX_ARCHS="{",".join(archs)}"']


def compile_command(sdk: Path, archs: list[str], source: Path, obj: Path, include_dirs: list[Path]) -> list[str]:
    """One source to one object: CoreX's clang in ivcore mode, whole-program device code (no -fgpu-rdc)."""
    return [str(sdk / "bin" / "clang++"), "-x", "ivcore", "-std=c++17",
            *(f"--cuda-gpu-arch={arch}" for arch in archs), f"--cuda-path={sdk}", "-fPIC", "-O3",
            "-fvisibility=hidden", *defines(archs), *(f"-I{d}" for d in include_dirs), f"-I{sdk / 'include'}",
            "-c", str(source), "-o", str(obj)]


def link_command(sdk: Path, objects: list[Path], library: Path, exports_map: Path) -> list[str]:
    """The shared library: CoreX's cudart and cuBLAS from $COREX_HOME/lib64, found again at run time through
    the RUNPATH (no LD_LIBRARY_PATH needed while the SDK stays where it was at build time). -z defs turns a
    runtime function this SDK lacks into a build error instead of a failure to load. `exports_map` holds
    EXPORTS_MAP."""
    lib64 = sdk / "lib64"
    return [str(sdk / "bin" / "clang++"), "-shared", "-fPIC", "-Wl,-z,defs", "-Wl,--enable-new-dtags",
            f"-Wl,-rpath,{lib64}", f"-Wl,--version-script={exports_map}", *map(str, objects),
            f"-L{lib64}", "-lcudart", "-lcublas", "-ldl", "-lpthread",
            "-o", str(library)]
