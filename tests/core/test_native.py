"""Binding a compiled backend: required and optional slots, capabilities, and copies chosen by capability.

The libraries here are tests/fake_backends/native/fake_backend.c built against llaisys/backend.h
(only the required slots; two "accelerators" whose memory the host must not touch directly).
"""

from __future__ import annotations

import ctypes
import importlib.metadata

import numpy as np
import pytest

import llaisys
from helpers.plugin_stubs import _EntryPoint, _fake_plugin
from llaisys import abi, plugins
from llaisys.cli import format_backend_report
from llaisys.ops._dispatch import clear_plans


def test_required_and_optional_slots_of_a_minimal_library(fake_library):
    backend = llaisys.NativeBackend("fake", fake_library(), prefix="llaisys_fake")
    assert backend.api_version == abi.API_VERSION and backend.device_count() == 2
    assert backend.capabilities() == {name: False for name in abi.CAPABILITIES}
    for call in (lambda: backend.event_create(0), lambda: backend.graph_begin_capture(0, None),
                 lambda: backend.malloc_host(16), lambda: backend.memcpy_peer(1, 0, 0, 0, 0)):
        with pytest.raises(llaisys.NotSupportedError, match="'fake' backend does not support"):
            call()
    assert backend.device_attribute(0, abi.DeviceAttr.WARP_SIZE) is None
    assert not backend.host_addressable(0)
    assert backend.device_name(1) == "fake:1" and backend.mem_info(0) is None and backend.build_info() == ""
    assert backend.kernel("add") is None


def test_missing_required_slot_fails_the_load_naming_it(fake_library):
    with pytest.raises(llaisys.LlaisysError, match="llaisys_fake_memcpy") as e:
        llaisys.NativeBackend("fake", fake_library(omit_memcpy=True), prefix="llaisys_fake")
    assert "memcpy_async" not in str(e.value)  # only what is missing


def test_wrong_prefix_names_the_slots():
    path = plugins.registry().backend("cpu").lib.path
    with pytest.raises(llaisys.LlaisysError, match="llaisys_gpu_api_version"):
        llaisys.NativeBackend("cpu", path, prefix="llaisys_gpu")


def test_cpu_capabilities_and_attributes():
    cpu = plugins.registry().backend("cpu")
    caps = cpu.capabilities()
    assert caps["events"] and caps["device_attributes"] and caps["pinned_host"] and caps["mem_info"]
    assert caps["graphs"] and not caps["peer_copy"]  # graphs: recorded op calls, replayed by graph_launch
    assert cpu.host_addressable(0)
    assert cpu.device_attribute(0, abi.DeviceAttr.WARP_SIZE) == 1
    assert cpu.device_attribute(0, abi.DeviceAttr.MULTIPROCESSOR_COUNT) >= 1
    assert cpu.device_attribute(0, abi.DeviceAttr.COMPUTE_CAPABILITY) is None  # NOT_SUPPORTED -> None
    free, total = cpu.mem_info(0)
    assert 0 < free <= total
    assert "threads" in cpu.device_name(0)
    event = cpu.event_create(0)
    cpu.event_record(0, event)
    cpu.event_synchronize(0, event)
    cpu.event_destroy(0, event)
    with pytest.raises(llaisys.LlaisysError, match="unknown capability"):
        cpu.supports("teleport")


def test_zero_devices_reports_the_backends_reason(fake_library):
    reg = plugins.Registry(entry_points=[_EntryPoint("fake", _fake_plugin(fake_library(devices=0)))], env_filter="")
    record = reg.records[0]
    assert record.status == "no device" and "no fake accelerator is plugged in" in record.reason
    with pytest.raises(llaisys.BackendUnavailableError, match="no fake accelerator is plugged in"):
        reg.backend("fake")
    assert "no fake accelerator is plugged in" in reg.why_no_device()  # the models' "no device" error
    row = [line for line in format_backend_report(reg.records).splitlines() if line.startswith("fake ")]
    assert len(row) == 1 and "no device" in row[0] and "no fake accelerator is plugged in" in row[0]  # llaisys devices


@pytest.fixture
def fake_devices(fake_library):
    """use(peer, mem_info=False) makes the process registry the installed backends plus two fake accelerators."""
    saved = plugins._registry

    def use(peer: bool, mem_info: bool = False):
        library = fake_library(devices=2, peer=peer, mem_info=mem_info)
        installed = list(importlib.metadata.entry_points(group=plugins.ENTRY_POINT_GROUP))
        plugins._registry = plugins.Registry(entry_points=[*installed, _EntryPoint("fake", _fake_plugin(library))],
                                             env_filter="")
        clear_plans()
        copies = ctypes.CDLL(str(library)).fake_copies
        copies.restype = ctypes.c_longlong
        return lambda kind: copies(kind)  # memcpy kind 0..3, 4 = peer copies
    yield use
    plugins._registry = saved
    clear_plans()


@pytest.mark.parametrize("peer", [False, True], ids=["via-host", "peer"])
def test_copies_follow_capabilities_not_names(fake_devices, peer):
    copies = fake_devices(peer)
    H2D, D2H, D2D, PEER = int(abi.MemcpyKind.H2D), int(abi.MemcpyKind.D2H), int(abi.MemcpyKind.D2D), 4
    base = np.arange(12, dtype=np.float32).reshape(3, 4)

    t = llaisys.from_numpy(base, "fake:0")
    assert t.device == "fake:0" and not t.storage.host and copies(H2D) == 1
    np.testing.assert_array_equal(t.numpy(), base)
    assert copies(D2H) == 1

    u = t.to("fake:1")  # between two accelerators of one backend
    np.testing.assert_array_equal(u.numpy(), base)
    if peer:
        assert copies(PEER) == 1 and copies(H2D) == 1
    else:
        assert copies(PEER) == 0 and copies(H2D) == 2  # through a host staging buffer

    back = u.to("cpu")
    assert back.storage.host
    np.testing.assert_array_equal(back.numpy(), base)
    assert copies(D2D) == 0

    z = llaisys.zeros((5,), llaisys.int32, "fake:1")
    assert not z.numpy().any()
    # the fake has no kernels: rearrange runs on the cpu backend, through host copies (its memory is not
    # host-addressable); tests/core/test_fallback.py has the rest
    before = copies(D2H), copies(H2D)
    np.testing.assert_array_equal(t.permute(1, 0).contiguous().numpy(), base.T)
    assert copies(D2H) > before[0] and copies(H2D) > before[1]


def test_mem_info_of_the_cpu_follows_its_capability():
    info = llaisys.mem_info("cpu")
    assert (info is not None) == plugins.registry().backend("cpu").supports("mem_info")
    if info is not None:
        free, total = info
        assert 0 < free <= total


@pytest.mark.parametrize("mem_info", [False, True], ids=["no-slot", "gpu-like"])
def test_mem_info_is_the_backends_slot_or_none(fake_devices, mem_info):
    fake_devices(peer=False, mem_info=mem_info)
    assert plugins.registry().backend("fake").supports("mem_info") == mem_info
    assert llaisys.mem_info("fake:1") == ((60 << 30, 80 << 30) if mem_info else None)
    with pytest.raises(llaisys.BackendUnavailableError, match="device fake:2 does not exist"):
        llaisys.mem_info("fake:2")
