"""Child process: the CUDA backend's host-execution build (tests/backends/cuda/host_exec: the CUDA sources
compiled by g++ under ASan / UBSan, its C ABI under the prefix llaisys_hostexec) loaded as the llaisys backend
of device type "hostexec", and the conformance suite run on it.

    python host_exec_child.py LIBRARY [OPS] [DTYPES]

The parent starts it with the ASan runtime preloaded (the library needs it, Python is not built with it). It
prints the report and exits 0 if it is ok, 1 if a case failed.
"""

from __future__ import annotations

import importlib.metadata
import sys

import llaisys
import llaisys.testing
from llaisys import plugins

DEVICE = "hostexec"
PREFIX = "llaisys_hostexec"


class EntryPoint:
    name, value = DEVICE, "host_exec_child"
    dist = type("Dist", (), {"metadata": {"Name": "llaisys-backend-cuda (host execution)"}, "version": "test"})()

    def __init__(self, library: str):
        self.library = library

    def load(self):
        library = self.library

        class Plugin:
            @llaisys.hookimpl
            def llaisys_backends(self):
                return [llaisys.BackendSpec(DEVICE, lambda: llaisys.NativeBackend(DEVICE, library, PREFIX))]
        return Plugin()


def main(library: str, ops: str | None = None, dtypes: str | None = None) -> int:
    installed = list(importlib.metadata.entry_points(group=plugins.ENTRY_POINT_GROUP))  # the CPU backend: fallbacks
    plugins._registry = plugins.Registry(entry_points=[*installed, EntryPoint(library)], env_filter="")

    def progress(result) -> None:
        print(f"{result.outcome.status:>15}  {result.outcome.seconds:6.2f} s  {result.case}", file=sys.stderr,
              flush=True)

    report = llaisys.testing.check_backend(DEVICE, ops=ops or None, dtypes=dtypes or None, progress=progress)
    print(report, flush=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
