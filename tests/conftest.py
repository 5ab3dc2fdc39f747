"""Shared fixtures. ``device`` runs a test once per available device (or the --backend one)."""

import pytest

import llaisys


def pytest_addoption(parser):
    parser.addoption("--backend", default=None,
                     help="run device tests only on this device type (cpu, cuda, iluvatar)")


def pytest_generate_tests(metafunc):
    if "device" not in metafunc.fixturenames:
        return
    wanted = metafunc.config.getoption("--backend")
    devices = [d for d in llaisys.available_devices() if wanted in (None, d.type)]
    if devices:
        metafunc.parametrize("device", devices, ids=str)
    else:
        reason = f"no '{wanted}' device available" if wanted else "no llaisys device available"
        rows = "; ".join(f"{r.name}: {r.status} {r.reason}".strip() for r in llaisys.backend_report())
        metafunc.parametrize("device", [pytest.param(None, marks=pytest.mark.skip(
            reason=f"{reason} (backends: {rows or 'none installed'})"))], ids=[wanted or "none"])
