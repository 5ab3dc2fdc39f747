"""A partial backend for the fallback tests: tests/fake_backends/native/partial_backend.c, built against
llaisys/backend.h and registered beside the installed backends as device type "partial".

It implements add and embedding only; every other op runs on the CPU backend. ``host=True`` builds it
host-addressable (the CPU kernels run in place), ``host=False`` not (the fallback copies each op's buffers to
the host and back, and the library refuses a copy that strays outside an allocation).

Also a pytest plugin, to run a whole test directory through the fallback:

    LLAISYS_PARTIAL_HOST=0 python -m pytest -p partial_backend tests/ops --backend=partial
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import shutil
import tempfile
from pathlib import Path

from native_build import compile_shared

import llaisys
from llaisys import plugins
from llaisys.ops._dispatch import clear_plans

SOURCE = Path(__file__).parent.parent / "fake_backends" / "native" / "partial_backend.c"
NATIVE_OPS = ("add", "embedding")
PACKAGE = "llaisys-backend-partial"


def build(folder: Path, host: bool, api_version: int | None = None, compiler: str | None = None) -> Path:
    """The library, built into ``folder`` (once per variant)."""
    compiler = compiler or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    assert compiler, "no C compiler on PATH"
    name = f"libpartial_{'host' if host else 'device'}{'' if api_version is None else f'_v{api_version}'}.so"
    output = folder / name
    if not output.exists():
        flags = ["-std=c99", "-Wall", "-Wextra", "-Werror", "-DLLAISYS_PREFIX=llaisys_partial",
                 f"-DPARTIAL_HOST={int(host)}"]
        flags += [] if api_version is None else [f"-DPARTIAL_API_VERSION={api_version}"]
        compile_shared(compiler, SOURCE, output, [*flags, "-pthread"])
    return output


class EntryPoint:
    """An installed-plugin stand-in for the library (entry point "partial" of llaisys-backend-partial)."""

    name, value = "partial", "partial_plugin"

    def __init__(self, library: Path):
        self.library = library
        self.dist = type("Dist", (), {"metadata": {"Name": PACKAGE}, "version": "0.0.1"})()

    def load(self):
        library = self.library

        class Plugin:
            @llaisys.hookimpl
            def llaisys_backends(self):
                return [llaisys.BackendSpec(
                    "partial", lambda: llaisys.NativeBackend("partial", library, "llaisys_partial"))]
        return Plugin()


def registry_with(library: Path, installed: bool = True) -> plugins.Registry:
    """A registry of the installed backends (or none) and the partial one."""
    eps = list(importlib.metadata.entry_points(group=plugins.ENTRY_POINT_GROUP)) if installed else []
    return plugins.Registry(entry_points=[*eps, EntryPoint(library)], env_filter="")


def use(reg: plugins.Registry) -> plugins.Registry | None:
    """Make ``reg`` the process registry (the op plans forgotten); returns the one it replaces."""
    saved, plugins._registry = plugins._registry, reg
    clear_plans()
    return saved


def counters(library: Path):
    """(copies(kind), syncs()) of the library's counters."""
    lib = ctypes.CDLL(str(library))
    lib.partial_copies.restype = lib.partial_syncs.restype = ctypes.c_longlong
    return (lambda kind: lib.partial_copies(int(kind))), (lambda: lib.partial_syncs())


def pytest_configure(config):
    """(``-p partial_backend``) the process registry gets device "partial" for the whole run."""
    host = os.environ.get("LLAISYS_PARTIAL_HOST", "1").strip() != "0"
    folder = Path(tempfile.mkdtemp(prefix="llaisys_partial_"))
    use(registry_with(build(folder, host)))
