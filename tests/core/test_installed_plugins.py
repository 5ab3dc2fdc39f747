"""End to end: a real, installed, broken backend package beside the real CPU backend."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.child_process import run_in_child

FAKE = Path(__file__).parent.parent / "fake_backends" / "llaisys-backend-broken"


@pytest.fixture(scope="module")
def site_with_broken_backend(tmp_path_factory):
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(FAKE)], check=True)
    return target


def run(code, site, **env):
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]), **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ, timeout=120)


@pytest.fixture(scope="module")
def devices_without_broken(tmp_path_factory):
    """The devices a process sees without the broken package (the machine's: an accelerator may be there), which
    one with it must list alike: it adds none and hides none. The CPU is among them, last."""
    result = run("import llaisys; print(', '.join(map(str, llaisys.available_devices())))",
                 tmp_path_factory.mktemp("empty_site"))
    assert result.returncode == 0, result.stderr
    devices = result.stdout.strip()
    assert devices == "cpu:0" or devices.endswith(", cpu:0"), devices
    return devices


def broken_backend_in_child() -> None:
    """The child (the broken package on its path): how each backend is reported, a CPU op, the broken device."""
    import numpy as np

    import llaisys

    rows = {r.name: r for r in llaisys.backend_report()}
    print(rows["broken"].status, "|", rows["broken"].package, "|", rows["broken"].reason)
    print(rows["cpu"].status, llaisys.available_devices())
    t = llaisys.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3)).permute(1, 0).contiguous()
    print(t.numpy().tolist())
    try:
        llaisys.empty((1,), device="broken")
    except llaisys.BackendUnavailableError as e:
        print("error:", e)


def test_broken_backend_is_reported_and_cpu_still_works(site_with_broken_backend, devices_without_broken):
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site_with_broken_backend),
                                                            os.environ.get("PYTHONPATH", "")])}
    result = run_in_child(broken_backend_in_child, env=environ, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("failed | llaisys-backend-broken | ")
    assert "libllaisys_broken.so" in lines[0]
    assert lines[1] == f"loaded [{devices_without_broken}]"
    assert lines[2] == "[[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]"
    assert lines[3].startswith("error: the 'broken' backend (llaisys-backend-broken 0.0.1) failed to load")


def test_cli_devices_shows_the_report(site_with_broken_backend, devices_without_broken):
    result = run("from llaisys.cli import main; raise SystemExit(main(['devices']))", site_with_broken_backend)
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip()}
    assert "failed" in rows["broken"] and "libllaisys_broken.so" in rows["broken"]
    assert "loaded" in rows["cpu"]
    assert f"available devices: {devices_without_broken}" in result.stdout.splitlines()


def test_env_filter_in_a_real_process(site_with_broken_backend):
    result = run("import llaisys; print([(r.name, r.status) for r in llaisys.backend_report()])",
                 site_with_broken_backend, LLAISYS_BACKENDS="cpu")
    assert result.returncode == 0, result.stderr
    assert "('broken', 'disabled')" in result.stdout and "('cpu', 'loaded')" in result.stdout
