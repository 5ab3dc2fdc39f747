"""Backend discovery: every plugin loads or fails on its own, and errors say what to do."""

import importlib.metadata

import pytest

import llaisys
from helpers.plugin_stubs import FakeBackend, FakeDist, FakeEntryPoint, plugin
from llaisys.cli import format_backend_report
from llaisys.plugins import Registry


def registry(*eps, env=""):
    return Registry(entry_points=list(eps), env_filter=env)


def status(reg):
    return {(r.name, r.package): (r.status, r.reason) for r in reg.records}


def test_broken_plugin_beside_a_good_one():
    reg = registry(FakeEntryPoint("broken", error=ImportError("libfoo.so: cannot open shared object file")),
                   FakeEntryPoint("good", plugin("good", devices=2)))
    rows = status(reg)
    assert rows[("good", "llaisys-backend-good")] == ("loaded", "")
    state, reason = rows[("broken", "llaisys-backend-broken")]
    assert state == "failed" and "libfoo.so" in reason
    assert [str(d) for d in reg.available_devices()] == ["good:0", "good:1"]
    with pytest.raises(llaisys.BackendUnavailableError, match="failed to load: ImportError: libfoo.so"):
        reg.backend("broken")


def test_load_failure_names_package_and_remedy():
    reg = registry(FakeEntryPoint("cuda", plugin("cuda", load_error=OSError("libcudart.so.13: not found"))))
    with pytest.raises(llaisys.BackendUnavailableError) as e:
        reg.backend("cuda:0")
    assert "llaisys-backend-cuda" in str(e.value) and "libcudart.so.13" in str(e.value)
    assert "pip install --force-reinstall llaisys-backend-cuda" in str(e.value)


def test_api_version_of_another_major_is_recorded():
    """(tests/core/test_abi_version.py: the version rules in full)"""
    other = llaisys.API_VERSION + 1000  # the next major version
    reg = registry(FakeEntryPoint("old", plugin("old", api_version=other)))
    state, reason = status(reg)[("old", "llaisys-backend-old")]
    assert state == "failed" and f"API {llaisys.abi.version_text(other)}" in reason
    assert reg.available_devices() == []


def test_backend_without_devices_is_not_an_error():
    reg = registry(FakeEntryPoint("cuda", plugin("cuda", devices=0)), FakeEntryPoint("cpu", plugin("cpu")))
    assert status(reg)[("cuda", "llaisys-backend-cuda")][0] == "no device"
    assert [str(d) for d in reg.available_devices()] == ["cpu:0"]
    with pytest.raises(llaisys.BackendUnavailableError, match="installed but found no device"):
        reg.backend("cuda")


def test_missing_backend_error_text():
    reg = registry(FakeEntryPoint("cpu", plugin("cpu")))
    with pytest.raises(llaisys.BackendUnavailableError) as e:
        reg.backend("cuda:1")
    assert str(e.value) == ("No llaisys backend provides 'cuda'. Installed: cpu. "
                            "Install it from the llaisys source tree: pip install ./llaisys-backend-cuda")
    with pytest.raises(llaisys.BackendUnavailableError, match="cpu:2 does not exist"):
        reg.backend("cpu:2")


def test_env_filter_restricts_loading():
    calls = []
    reg = registry(FakeEntryPoint("cpu", plugin("cpu", calls=calls)),
                   FakeEntryPoint("cuda", plugin("cuda", calls=calls)), env="cpu")
    assert calls == ["cpu"]
    assert status(reg)[("cuda", "llaisys-backend-cuda")] == ("disabled", "disabled by LLAISYS_BACKENDS=cpu")
    with pytest.raises(llaisys.BackendUnavailableError) as e:
        reg.backend("cuda")
    assert "installed but disabled by LLAISYS_BACKENDS=cpu; add 'cuda' to LLAISYS_BACKENDS" in str(e.value)
    assert "pip install" not in str(e.value)  # it is installed: no install hint


def test_install_hints_name_only_real_packages():
    with pytest.warns(llaisys.LlaisysWarning, match="names 'cuda'"):
        reg = registry(FakeEntryPoint("cpu", plugin("cpu")), env="cuda")
    with pytest.raises(llaisys.BackendUnavailableError) as e:
        reg.backend("nonsense")
    assert str(e.value) == ("No llaisys backend provides 'nonsense'. Installed: none (cpu disabled by "
                            "LLAISYS_BACKENDS=cuda). No llaisys package provides it (backend packages exist for "
                            "cpu, cuda, iluvatar)")
    with pytest.raises(llaisys.BackendUnavailableError, match=r"pip install \./llaisys-backend-iluvatar"):
        reg.backend("iluvatar")


def test_why_no_device_names_each_plugins_state():
    assert registry().why_no_device() == ("no llaisys backend is installed. Install it from the llaisys source "
                                          "tree: pip install ./llaisys-backend-cpu")
    reg = registry(FakeEntryPoint("cpu", plugin("cpu")), FakeEntryPoint("cuda", plugin("cuda", devices=0)), env="cuda")
    assert reg.available_devices() == []
    assert reg.why_no_device() == ("no llaisys device is available: 'cpu' (llaisys-backend-cpu) disabled by "
                                   "LLAISYS_BACKENDS=cuda; 'cuda' (llaisys-backend-cuda) no device: the runtime "
                                   "reports 0 devices")


def test_unknown_names_in_env_filter_warn_naming_the_installed_ones():
    with pytest.warns(llaisys.LlaisysWarning, match=r"LLAISYS_BACKENDS=cpu,cdua names 'cdua'.*installed backends: "
                                                    r"cpu, cuda"):
        registry(FakeEntryPoint("cpu", plugin("cpu")), FakeEntryPoint("cuda", plugin("cuda")), env="cpu,cdua")


def test_accelerators_come_first():
    reg = registry(FakeEntryPoint("cpu", plugin("cpu")), FakeEntryPoint("cuda", plugin("cuda", devices=2)))
    assert [str(d) for d in reg.available_devices()] == ["cuda:0", "cuda:1", "cpu:0"]


def test_priority_decides_between_two_plugins_of_one_type():
    fast = plugin("cuda", priority=10, kernels={"add": "fast-add"})
    slow = plugin("cuda", priority=0, kernels={"add": "slow-add"})
    ep_fast, ep_slow = FakeEntryPoint("cuda", fast), FakeEntryPoint("cuda", slow)
    ep_fast.dist, ep_slow.dist = FakeDist("vendor-cuda"), FakeDist("llaisys-backend-cuda")
    for order in ([ep_slow, ep_fast], [ep_fast, ep_slow]):
        reg = registry(*order)
        assert reg.kernel("add", "cuda") == "fast-add"
        assert status(reg)[("cuda", "llaisys-backend-cuda")][0] == "shadowed"


def test_kernel_override_and_missing_kernel():
    override = llaisys.KernelOverride(op="add", device_type="cpu", kernel="my-add")
    reg = registry(FakeEntryPoint("cpu", plugin("cpu", kernels={"add": "stock-add", "linear": "stock-linear"})),
                   FakeEntryPoint("extra", plugin("extra", overrides=[override])))
    assert reg.kernel("add", "cpu") == "my-add"
    assert reg.kernel("linear", "cpu") == "stock-linear"
    with pytest.raises(llaisys.LlaisysError, match="'rope' is not implemented by the 'cpu' backend"):
        reg.kernel("rope", "cpu")


def test_hooks_are_called_once_and_kernels_resolved_once():
    calls, looked_up = [], []

    class CountingBackend(FakeBackend):
        def kernel(self, op):
            looked_up.append(op)
            return f"{op}-kernel"

    class Plugin:
        @llaisys.hookimpl
        def llaisys_backends(self):
            calls.append(1)
            return [llaisys.BackendSpec("cpu", load=lambda: CountingBackend("cpu"))]

    reg = registry(FakeEntryPoint("cpu", Plugin()))
    for _ in range(5):
        reg.kernel("add", "cpu")
        reg.available_devices()
    assert calls == [1] and looked_up == ["add"]


def test_plugin_whose_hook_raises_or_returns_nothing():
    class Raising:
        @llaisys.hookimpl
        def llaisys_backends(self):
            raise RuntimeError("driver exploded")

    class Empty:
        @llaisys.hookimpl
        def llaisys_backends(self):
            return []

    reg = registry(FakeEntryPoint("a", Raising()), FakeEntryPoint("b", Empty()), FakeEntryPoint("cpu", plugin("cpu")))
    rows = status(reg)
    assert rows[("a", "llaisys-backend-a")] == ("failed", "RuntimeError: driver exploded")
    assert rows[("b", "llaisys-backend-b")][0] == "failed"
    assert [str(d) for d in reg.available_devices()] == ["cpu:0"]


def test_report_table_lists_every_plugin():
    reg = registry(FakeEntryPoint("broken", error=ImportError("no module named foo")),
                   FakeEntryPoint("cpu", plugin("cpu")))
    table = format_backend_report(reg.records)
    lines = table.splitlines()
    assert lines[0].split() == ["backend", "package", "version", "status", "devices", "details"]
    assert any(line.startswith("broken") and "failed" in line and "no module named foo" in line for line in lines)
    assert any(line.startswith("cpu") and "loaded" in line for line in lines)


def test_cli_devices_names_each_device(capsys):
    from llaisys.cli import main
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    cpu_line = next(line for line in out.splitlines() if line.strip().startswith("cpu:0"))
    assert llaisys.plugins.registry().backend("cpu").device_name(0) in cpu_line
    assert "threads" in cpu_line  # the CPU's name says its SIMD path and thread count


def test_cli_version_names_core_then_every_installed_llaisys_package(capsys):
    from llaisys.cli import main
    assert main(["--version"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"llaisys-core {llaisys.__version__}"
    assert f"llaisys-backend-cpu {importlib.metadata.version('llaisys-backend-cpu')}" in lines[1:]
    assert all(line.startswith("llaisys-") for line in lines) and len(set(lines)) == len(lines)


def test_real_cpu_backend_is_discovered():
    rows = {r.name: r for r in llaisys.backend_report()}
    assert rows["cpu"].status == "loaded" and rows["cpu"].package == "llaisys-backend-cpu"
    assert llaisys.available_devices()[-1] == llaisys.Device("cpu")


def test_ops_implemented_asks_the_devices_backend():
    """llaisys.ops.implemented: a model can check its kernels before it runs (the installed CPU backend)."""
    assert llaisys.ops.implemented("add", "cpu")
    assert llaisys.ops.implemented("paged_attention", llaisys.Device("cpu", 0))
    assert not llaisys.ops.implemented("add", "no_such_device")
