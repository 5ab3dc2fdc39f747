"""The plugin module of llaisys-backend-iluvatar (installed, or from the source tree where it is not: building
the package needs the CoreX SDK): the descriptor it gives core, and what a failed load says."""

import importlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import llaisys

PACKAGE = Path(__file__).resolve().parents[3] / "llaisys-backend-iluvatar"
try:
    from llaisys_backend_iluvatar import plugin
except ImportError:  # not installed: the modules from the source tree, then forgotten again, so that other tests
    # (the ABI probes of tests/backends) still see the package as not installed
    sys.path.insert(0, str(PACKAGE / "src"))
    plugin = importlib.import_module("llaisys_backend_iluvatar.plugin")
    sys.path.remove(str(PACKAGE / "src"))
    for name in ("llaisys_backend_iluvatar.plugin", "llaisys_backend_iluvatar"):
        del sys.modules[name]


def test_the_plugin_offers_the_iluvatar_device_type():
    (spec,) = plugin.llaisys_backends()
    assert spec.name == "iluvatar" and spec.api_version == llaisys.API_VERSION and spec.load is plugin.load
    assert plugin.PREFIX == "llaisys_iluvatar" and plugin.LIBRARY.name == "libllaisys_iluvatar.so"
    pyproject = (PACKAGE / "pyproject.toml").read_text()
    assert re.search(r'\[project\.entry-points\."llaisys\.backends"\]\s*iluvatar = "llaisys_backend_iluvatar\.plugin"',
                     pyproject)


def test_a_missing_library_names_the_remedy(monkeypatch, tmp_path):
    monkeypatch.setattr(plugin, "LIBRARY", tmp_path / "libllaisys_iluvatar.so")
    with pytest.raises(FileNotFoundError, match=r"installed without its compiled kernels .*"
                                                r"pip install \./llaisys-backend-iluvatar"):
        plugin.load()


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a host C compiler (cc) to make a library")
def test_a_library_whose_runtime_moved_says_to_set_the_library_path(monkeypatch, tmp_path):
    """Built against an SDK that is no longer where the RUNPATH points: the load error says what to do."""
    runtime = tmp_path / "libcudart.so.10.2"
    subprocess.run(["cc", "-shared", "-x", "c", "/dev/null", "-Wl,-soname,libcudart.so.10.2", "-o", str(runtime)],
                   check=True)
    library = tmp_path / "libllaisys_iluvatar.so"
    subprocess.run(["cc", "-shared", "-x", "c", "/dev/null", "-x", "none", "-Wl,--no-as-needed", str(runtime), "-o",
                    str(library)],
                   check=True)
    runtime.unlink()
    monkeypatch.setattr(plugin, "LIBRARY", library)
    with pytest.raises(llaisys.LlaisysError, match=r"libcudart\.so\.10\.2.*set LD_LIBRARY_PATH=\$COREX_HOME/lib64"):
        plugin.load()
