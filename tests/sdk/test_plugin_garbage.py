"""A backend plugin whose hook returns garbage is a failed row with a one-line reason, never a crash of discovery.

tests/core/test_plugins.py covers a hook that raises and one that returns nothing; this adds what an
out-of-tree plugin (the package `llaisys new-backend` starts) can get wrong besides: a hook that returns a
string or a list of things that are not ``llaisys.BackendSpec``, a spec whose name cannot be a device type,
and a ``load()`` that returns something that is not a backend. Each fails alone; the CPU still loads; and
`llaisys devices` (installed through a real entry point, in a child process) shows it in one line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import llaisys
from llaisys.plugins import Registry


class FakeDist:
    def __init__(self, name):
        self.metadata, self.version = {"Name": name}, "0.0.1"


class FakeEntryPoint:
    def __init__(self, name, plugin):
        self.name, self.value, self.dist, self._plugin = name, f"fake_{name}.plugin", FakeDist(f"pkg-{name}"), plugin

    def load(self):
        return self._plugin


def returning(value):
    class Plugin:
        @llaisys.hookimpl
        def llaisys_backends(self):
            return value() if callable(value) else value
    return Plugin()


class CpuBackend(llaisys.Backend):
    name = "cpu"

    def device_count(self):
        return 1


GOOD_CPU = returning([llaisys.BackendSpec(name="cpu", load=CpuBackend)])

GARBAGE = {
    "a_string": "cpu",
    "not_specs": [{"name": "x"}, 42],
    "a_dict": {"name": "a_dict"},
    "bad_name": [llaisys.BackendSpec(name="not a device type!", load=CpuBackend)],
    "name_not_str": [llaisys.BackendSpec(name=7, load=CpuBackend)],
    "load_returns_int": [llaisys.BackendSpec(name="load_returns_int", load=lambda: 42)],
}


@pytest.mark.parametrize("name", sorted(GARBAGE))
def test_a_garbage_hook_result_fails_alone_in_one_line(name):
    reg = Registry(entry_points=[FakeEntryPoint(name, returning(GARBAGE[name])), FakeEntryPoint("cpu", GOOD_CPU)],
                   env_filter="")
    rows = [r for r in reg.records if r.package == f"pkg-{name}"]
    assert rows and all(r.status == "failed" for r in rows), [(r.name, r.status, r.reason) for r in rows]
    for r in rows:
        assert r.reason and "\n" not in r.reason, r.reason
    assert [str(d) for d in reg.available_devices()] == ["cpu:0"]


def test_a_non_spec_is_named_as_such():
    reg = Registry(entry_points=[FakeEntryPoint("not_specs", returning(GARBAGE["not_specs"]))], env_filter="")
    (row,) = [r for r in reg.records if r.package == "pkg-not_specs"]
    assert "BackendSpec" in row.reason, row.reason


PLUGIN = """\
import llaisys


@llaisys.hookimpl
def llaisys_backends():
    return ["not a BackendSpec"]
"""


def test_llaisys_devices_shows_a_garbage_plugin_in_one_line(tmp_path):
    """A real entry point (a dist-info on the child's path, as pip writes one) whose hook returns garbage."""
    (tmp_path / "garbage_backend_plugin.py").write_text(PLUGIN)
    info = tmp_path / "llaisys_backend_garbage-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: llaisys-backend-garbage\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text("[llaisys.backends]\ngarbage = garbage_backend_plugin\n")
    env = {**{k: v for k, v in os.environ.items() if k != "LLAISYS_BACKENDS"}, "PYTHONPATH": str(tmp_path)}
    llaisys_command = Path(sys.executable).with_name("llaisys")
    result = subprocess.run([str(llaisys_command), "devices"], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stdout + result.stderr
    rows = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip()}
    assert "failed" in rows["garbage"] and "llaisys-backend-garbage" in rows["garbage"], result.stdout
    assert "loaded" in rows["cpu"]
    assert len([line for line in result.stdout.splitlines() if "garbage" in line]) == 1  # one row, one line
