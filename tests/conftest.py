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


# Settings a user may export that change what the tests expect (the numerics mode of every model, an API key
# that the CLI's server would then require): the suite runs with the defaults whatever the runner's
# environment holds; tests that need a setting set it themselves (monkeypatch, or a child's env). (LLAISYS_FALLBACK=0
# would turn the ops a test backend lacks into errors: tests/core/test_fallback.py sets it where it tests that.)
RUNNER_SETTINGS = ("LLAISYS_NUMERICS", "LLAISYS_API_KEY", "LLAISYS_FALLBACK")


def pytest_configure(config):
    import os

    for name in RUNNER_SETTINGS:
        os.environ.pop(name, None)


@pytest.fixture(scope="session")
def ray_cluster():
    """``ray_cluster.SHARED``: ``.start()`` gives the two-node Ray cluster on 127.0.0.1, this process its driver
    (started once for a run of modules that use it; stopped after the last of them: below)."""
    from helpers.ray_cluster import SHARED

    yield SHARED
    SHARED.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield  # (after the item's fixtures are torn down: at a module's end, its module-scoped ones too)
    from helpers.ray_cluster import SHARED

    next_module = getattr(nextitem, "module", None)
    if SHARED.cluster is not None and (nextitem is None or (next_module is not getattr(item, "module", None)
                                                            and "ray_cluster" not in nextitem.fixturenames)):
        SHARED.stop()
