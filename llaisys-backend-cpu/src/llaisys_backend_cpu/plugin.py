"""The pluggy plugin: a cheap descriptor; the library is opened only when core loads it."""

import contextlib
import os
from collections.abc import Iterator

import llaisys
from llaisys.backend import DLPACK_CPU

from . import LIBRARY

# The kernels run on the library's own thread team (csrc/common/thread_pool.h), not on OpenMP's threads.
# But torch ships the same OpenMP runtime (libgomp.so.1) and shares it, and GNU OpenMP's own default spins
# for up to ~300,000 iterations (milliseconds) at every barrier: in a process that uses torch and llaisys,
# torch's spinning threads would take the cores from llaisys' team (and, when another process shares
# them, a thread waiting for a preempted sibling burns its time slice: a 10-token prefill of the demo took
# 70x longer). So the runtime starts passive, where it starts with this library. This applies only when
# the user has set neither knob, and only when the process's OpenMP runtime starts with this library: a
# process that imported torch first already runs one and keeps the settings it started with.
OPENMP_DEFAULTS = {"OMP_WAIT_POLICY": "passive"}
OPENMP_KNOBS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


@contextlib.contextmanager
def openmp_defaults() -> Iterator[None]:
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
def llaisys_backends() -> list[llaisys.BackendSpec]:
    return [llaisys.BackendSpec(name="cpu", load=_load, api_version=llaisys.API_VERSION, priority=0)]
