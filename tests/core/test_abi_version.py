"""ABI versions (backend.h): a library of core's major loads whatever its minor, without the slots added after
its minor; another major is refused in one line naming both versions and what to rebuild.

The libraries are the fake backends of tests/fake_backends/native built with -DFAKE_API_VERSION /
-DPARTIAL_API_VERSION: what their api_version() returns instead of the header's. The older-minor direction
runs against a core one minor ahead of the header (``newer_core``: its tables as a core that added mem_info
and the add op in that minor would have them), since the header's own minor may be 0.
"""

from __future__ import annotations

import partial_backend
import pytest

import llaisys
from helpers.plugin_stubs import _EntryPoint, _fake_plugin
from llaisys import abi, plugins
from llaisys._version import __version__ as CORE_VERSION
from llaisys.cli import format_backend_report

MAJOR, VERSION = abi.API_MAJOR, abi.API_VERSION
OTHER_MAJORS = {"newer major": VERSION + 1000, "older major": VERSION - 1000}


@pytest.fixture
def newer_core(monkeypatch):
    """Core's tables one minor ahead of the header: mem_info (optional) and add (an op) added in that minor."""
    minor = abi.API_MINOR + 1
    monkeypatch.setattr(abi, "API_MINOR", minor)
    monkeypatch.setattr(abi, "API_VERSION", MAJOR * 1000 + minor)
    monkeypatch.setitem(abi.SLOT_SINCE, "mem_info", minor)
    monkeypatch.setitem(abi.SLOT_SINCE, "add", minor)
    return minor


def fake_registry(library) -> plugins.Registry:
    return plugins.Registry(entry_points=[_EntryPoint("fake", _fake_plugin(library))], env_filter="")


def test_a_library_of_this_header_binds_every_slot_it_exports(fake_library):
    backend = llaisys.NativeBackend("fake", fake_library(mem_info=True), prefix="llaisys_fake")
    assert backend.api_version == VERSION and backend.supports("mem_info")


def test_an_older_minor_loads_without_the_slots_added_since(fake_library, newer_core):
    """Built for minor N-1 (the header's), the library exports mem_info, but core N added it in N: not bound."""
    library = fake_library(mem_info=True)  # api_version() = the header's: one minor behind this core
    backend = llaisys.NativeBackend("fake", library, prefix="llaisys_fake")
    assert not backend.supports("mem_info") and backend.mem_info(0) is None
    assert backend.device_count() == 2  # the slots of its own minor work
    record = fake_registry(library).records[0]
    assert record.status == "loaded"
    assert record.reason == (f"built for API {MAJOR}.{newer_core - 1} (core: {MAJOR}.{newer_core}): "
                             f"the slots added since are missing")


def test_an_op_added_after_a_librarys_minor_falls_back_even_if_exported(c_compiler, tmp_path, newer_core,
                                                                        monkeypatch):
    import numpy as np

    monkeypatch.delenv("LLAISYS_FALLBACK", raising=False)
    library = partial_backend.build(tmp_path, host=True, api_version=MAJOR * 1000 + newer_core - 1,
                                    compiler=c_compiler)
    reg = partial_backend.registry_with(library)
    monkeypatch.setattr(reg.backend("cpu").lib, "api_version", abi.API_VERSION)  # as if rebuilt for core N
    saved = partial_backend.use(reg)
    try:
        caps = llaisys.capabilities("partial")
        assert caps["add"] == "fallback" and caps["embedding"] == "native"  # add: newer than the library
        a = llaisys.from_numpy(np.arange(6, dtype=np.float32), "partial")
        out = llaisys.empty((6,), llaisys.float32, "partial")
        with llaisys.profile() as prof:
            llaisys.ops.add(out, a, a)
        assert dict(prof.calls) == {"add (cpu fallback)": 1}
        np.testing.assert_array_equal(out.numpy(), 2 * np.arange(6, dtype=np.float32))
    finally:
        partial_backend.use(saved)


def test_a_newer_minor_loads_and_core_ignores_what_it_does_not_know(fake_library):
    library = fake_library(mem_info=True, api_version=VERSION + 1)
    backend = llaisys.NativeBackend("fake", library, prefix="llaisys_fake")
    assert backend.supports("mem_info") and backend.device_count() == 2
    record = fake_registry(library).records[0]
    assert (record.status, record.reason) == ("loaded", "")


def test_a_library_from_before_minors_is_its_major_dot_0(fake_library):
    backend = llaisys.NativeBackend("fake", fake_library(api_version=MAJOR), prefix="llaisys_fake")
    assert abi.split_version(backend.api_version) == (MAJOR, 0) and backend.device_count() == 2


@pytest.mark.parametrize("which", list(OTHER_MAJORS))
def test_another_major_is_refused_in_one_line_naming_both_versions(fake_library, which):
    version = OTHER_MAJORS[which]
    library = fake_library(api_version=version)
    theirs, ours = abi.version_text(version), abi.version_text(VERSION)
    with pytest.raises(llaisys.ApiVersionError) as e:
        llaisys.NativeBackend("fake", library, prefix="llaisys_fake")
    assert f"built for llaisys backend API {theirs}" in str(e.value) and f"speaks API {ours}" in str(e.value)
    assert e.value.version == version

    reg = fake_registry(library)
    record = reg.records[0]
    assert record.status == "failed" and "\n" not in record.reason
    assert record.reason.startswith(f"llaisys-backend-fake 0.0.1 was built for the llaisys backend API {theirs}, "
                                    f"but llaisys-core {CORE_VERSION} speaks API {ours} (another major version")
    if version > VERSION:
        assert record.reason.endswith(f"upgrade llaisys-core to a release that speaks API {MAJOR + 1}.x, or install "
                                      f"a llaisys-backend-fake built for API {MAJOR}.x")
    else:
        assert record.reason.endswith(f"rebuild llaisys-backend-fake against llaisys-core {CORE_VERSION} "
                                      f"(API {ours}) and reinstall it")
    with pytest.raises(llaisys.BackendUnavailableError, match="another major version"):
        reg.backend("fake")
    row = [line for line in format_backend_report(reg.records).splitlines() if line.startswith("fake ")]
    assert len(row) == 1 and theirs in row[0] and "failed" in row[0]  # llaisys devices


def test_a_package_of_the_source_tree_is_told_its_pip_command():
    """A plugin's own declared version (BackendSpec.api_version) follows the same rule; a package of the
    llaisys source tree gets the command that rebuilds it."""
    from helpers.plugin_stubs import FakeEntryPoint, plugin

    old = (MAJOR - 1) * 1000  # 5.0
    reg = plugins.Registry(entry_points=[FakeEntryPoint("cuda", plugin("cuda", api_version=old))], env_filter="")
    reason = reg.records[0].reason
    assert reason.startswith(f"llaisys-backend-cuda 1.2.3 was built for the llaisys backend API {MAJOR - 1}.0")
    assert reason.endswith("rebuild it against this llaisys-core: pip install --force-reinstall "
                           "./llaisys-backend-cuda (llaisys source tree)")
    compatible = plugins.Registry(entry_points=[FakeEntryPoint("cuda", plugin("cuda", api_version=VERSION + 3))],
                                  env_filter="")
    assert compatible.records[0].status == "loaded"
    garbage = plugins.Registry(entry_points=[FakeEntryPoint("cuda", plugin("cuda", api_version="6"))], env_filter="")
    assert garbage.records[0].reason == ("llaisys-backend-cuda 1.2.3 declares the backend API version '6', not an "
                                         "int (llaisys.API_VERSION)")
