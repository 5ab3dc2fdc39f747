"""``native``: each compiled backend library of abi.NATIVE_BACKENDS (or the --backend one), bound from
llaisys/backend.h; a backend whose package is not installed is skipped with the reason."""

import pytest
from abi import NATIVE_BACKENDS, Library


def pytest_generate_tests(metafunc):
    if "native" in metafunc.fixturenames:
        wanted = metafunc.config.getoption("--backend")
        backends = [b for b in NATIVE_BACKENDS if wanted in (None, b.name)]
        params = [pytest.param(b, id=b.name) for b in backends]
        metafunc.parametrize("native", params or [pytest.param(None, marks=pytest.mark.skip(
            reason=f"no native backend named {wanted!r} to probe"), id=str(wanted))], indirect=True)


@pytest.fixture
def native(request):
    try:
        return Library(request.param)
    except ImportError as e:
        pytest.skip(f"{request.param.package} is not installed ({e})")


@pytest.fixture
def on_device(native):
    """The library, for probes that need device memory: skipped where the backend sees no device."""
    if native.device_count() < 1:
        pytest.skip(f"{native.backend.name}: no device ({native.last_error() or 'device_count is 0'})")
    return native
