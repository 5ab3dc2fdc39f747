"""Fixtures for core tests: a C compiler and small backend libraries built against llaisys/backend.h."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from native_build import compile_shared

FAKE_BACKEND_SOURCE = Path(__file__).parent.parent / "fake_backends" / "native" / "fake_backend.c"


@pytest.fixture(scope="session")
def c_compiler():
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        pytest.skip("no C compiler on PATH (the CPU backend's build needs one too)")
    return compiler


@pytest.fixture(scope="session")
def fake_library(c_compiler, tmp_path_factory):
    """build(devices=2, peer=False, mem_info=False, omit_memcpy=False, api_version=None) -> path of
    tests/fake_backends/native/fake_backend.c built with prefix llaisys_fake (the required slots, the optional
    ones asked for, no operators; api_version: what its api_version() returns instead of the header's)."""
    folder = tmp_path_factory.mktemp("fake_native")
    built = {}

    def build(devices: int = 2, peer: bool = False, mem_info: bool = False, omit_memcpy: bool = False,
              api_version: int | None = None) -> Path:
        key = (devices, peer, mem_info, omit_memcpy, api_version)
        if key not in built:
            flags = ["-std=c99", "-Wall", "-Wextra", "-Werror", "-DLLAISYS_PREFIX=llaisys_fake",
                     f"-DFAKE_DEVICES={devices}"]
            flags += ["-DFAKE_PEER"] if peer else []
            flags += ["-DFAKE_MEM_INFO"] if mem_info else []
            flags += ["-DFAKE_OMIT_MEMCPY"] if omit_memcpy else []
            flags += [] if api_version is None else [f"-DFAKE_API_VERSION={api_version}"]
            name = (f"libfake_{devices}{'_peer' if peer else ''}{'_meminfo' if mem_info else ''}"
                    f"{'_nomemcpy' if omit_memcpy else ''}{'' if api_version is None else f'_v{api_version}'}.so")
            built[key] = compile_shared(c_compiler, FAKE_BACKEND_SOURCE, folder / name, flags)
        return built[key]
    return build


@pytest.fixture(scope="session")
def partial_libraries(c_compiler, tmp_path_factory):
    """{host_addressable: path} of the partial test backend's two builds (partial_backend.py), built once."""
    import partial_backend

    folder = tmp_path_factory.mktemp("partial")
    return {host: partial_backend.build(folder, host, compiler=c_compiler) for host in (True, False)}
