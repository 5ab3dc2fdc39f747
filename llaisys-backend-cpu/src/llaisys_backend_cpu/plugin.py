"""The pluggy plugin: a cheap descriptor; the library is opened only when core loads it."""

import contextlib
import os

import llaisys
from llaisys.backend import DLPACK_CPU

from . import LIBRARY

# How the kernels' idle OpenMP threads wait for the next kernel. libgomp's own default spins
# for up to ~300,000 iterations (milliseconds) at every barrier: fine on idle cores, but when
# another process shares them, a thread waiting for a preempted sibling burns its time slice
# and a 10-token prefill of the demo took 70x longer. These settings stay fast either way
# (measurements: the CPU threads section of the README). They apply only when the user has
# set neither knob, and only when the process's OpenMP runtime starts with this library: a
# process that imported torch first already runs one (torch ships libgomp.so.1 too, and the
# two share it) and keeps the settings it started with.
OPENMP_DEFAULTS = {"OMP_WAIT_POLICY": "passive"}
OPENMP_KNOBS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


@contextlib.contextmanager
def openmp_defaults():
    """OPENMP_DEFAULTS in the environment while the library loads (libgomp reads it once, when it is
    loaded), then the environment as it was, so that other OpenMP runtimes (torch's) and child
    processes do not inherit llaisys' choice."""
    if any(knob in os.environ for knob in OPENMP_KNOBS):
        yield
        return
    os.environ.update(OPENMP_DEFAULTS)
    try:
        yield
    finally:
        for knob in OPENMP_DEFAULTS:
            os.environ.pop(knob, None)


def _load() -> llaisys.NativeBackend:
    if not LIBRARY.exists():
        raise FileNotFoundError(f"{LIBRARY} is missing: the package was installed without its compiled kernels")
    with openmp_defaults():
        return llaisys.NativeBackend("cpu", LIBRARY, prefix="llaisys_cpu", dlpack_device_type=DLPACK_CPU)


@llaisys.hookimpl
def llaisys_backends():
    return [llaisys.BackendSpec(name="cpu", load=_load, api_version=llaisys.API_VERSION, priority=0)]
