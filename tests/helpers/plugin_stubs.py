"""Stand-ins for installed plugins: an entry point and a plugin object over a fake native library."""

from __future__ import annotations

import llaisys


class _EntryPoint:
    """An installed-plugin stand-in: entry point name, distribution and the plugin object."""

    def __init__(self, name, plugin):
        self.name, self.value, self._plugin = name, f"{name}_plugin", plugin
        self.dist = type("Dist", (), {"metadata": {"Name": f"llaisys-backend-{name}"}, "version": "0.0.1"})()

    def load(self):
        return self._plugin


def _fake_plugin(library):
    class Plugin:
        @llaisys.hookimpl
        def llaisys_backends(self):
            return [llaisys.BackendSpec("fake", lambda: llaisys.NativeBackend("fake", library, "llaisys_fake"))]
    return Plugin()


class FakeBackend(llaisys.Backend):
    def __init__(self, name, devices=1, kernels=None):
        self.name, self.devices, self.kernels = name, devices, kernels or {}

    def device_count(self):
        return self.devices

    def kernel(self, op):
        return self.kernels.get(op)


class FakeDist:
    def __init__(self, name, version="1.2.3"):
        self.metadata, self.version = {"Name": name}, version


class FakeEntryPoint:
    def __init__(self, name, plugin=None, error=None):
        self.name, self.value = name, f"fake_{name}.plugin"
        self.dist = FakeDist(f"llaisys-backend-{name}")
        self._plugin, self._error = plugin, error

    def load(self):
        if self._error:
            raise self._error
        return self._plugin


def plugin(name, devices=1, api_version=llaisys.API_VERSION, priority=0, kernels=None, overrides=(),
           calls=None, load_error=None):
    class Plugin:
        @llaisys.hookimpl
        def llaisys_backends(self):
            if calls is not None:
                calls.append(name)

            def load():
                if load_error:
                    raise load_error
                return FakeBackend(name, devices, kernels)
            return [llaisys.BackendSpec(name=name, load=load, api_version=api_version, priority=priority)]

        @llaisys.hookimpl
        def llaisys_kernels(self):
            return list(overrides)
    return Plugin()
