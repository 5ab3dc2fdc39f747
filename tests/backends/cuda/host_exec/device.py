"""HostExecDevice: the parent side of a host-execution library running in a child process under ASan.

Tensors live in the child's "device" memory (host memory there); this side holds their pointers, shapes and
dtypes, uploads torch tensors and downloads results as torch tensors. A failed slot raises SlotError with
the library's status and message; a crash of the child (a sanitizer report, a host-execution abort)
raises ChildDied with the child's stderr.
"""

from __future__ import annotations

import dataclasses
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from . import build as host_build
from .server import read_message, write_message

SERVER = Path(__file__).with_name("server.py")
DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.int64: 6}


class SlotError(Exception):
    def __init__(self, slot: str, status: int, message: str):
        super().__init__(f"{slot} returned status {status}: {message}")
        self.status, self.message = status, message


class ChildDied(RuntimeError):
    pass


@dataclasses.dataclass
class DevTensor:
    ptr: int
    shape: tuple
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * torch.empty((), dtype=self.dtype).element_size()

    @property
    def code(self) -> int:
        return DTYPE_CODES[self.dtype]

    def offset(self, elements: int, shape: tuple) -> DevTensor:
        """A view starting `elements` further on (for misaligned and aliased views)."""
        return DevTensor(self.ptr + elements * torch.empty((), dtype=self.dtype).element_size(), shape, self.dtype)


def out(kind: str, size: int = 0):
    """An output argument of a slot: "ptr", "int", "int64", "size", "float", or ("bytes", size)."""
    return ("OUT", kind, size) if size else ("OUT", kind)


class HostExecDevice:
    def __init__(self, warp: int, **extra_env: str):
        self.warp = warp
        library = host_build.build(warp)
        env = dict(os.environ, LD_PRELOAD=host_build.sanitizer_preload(),
                   ASAN_OPTIONS="detect_leaks=0:abort_on_error=1", UBSAN_OPTIONS="print_stacktrace=1", **extra_env)
        self._stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, str(SERVER), str(library), host_build.PREFIX],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, env=env,
                                     cwd=str(Path(__file__).parent))
        self.allocations: list[int] = []

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
        self._stderr.close()

    def _request(self, message):
        try:
            write_message(self.proc.stdin, message)
            reply = read_message(self.proc.stdout)
        except (BrokenPipeError, struct.error):
            reply = None
        if reply is None:
            self.proc.wait(timeout=30)
            self._stderr.seek(0)
            raise ChildDied(f"host-execution child died (exit {self.proc.returncode}):\n"
                            f"{self._stderr.read().decode(errors='replace')[-6000:]}")
        return reply

    # ---- slots ---------------------------------------------------------------------------------------
    def call(self, slot: str, *args, check: bool = True):
        """(status, message, output values) of a slot; raises SlotError on a non-zero status if check."""
        status, message, values = self._request((slot, list(args)))
        if check and status:
            raise SlotError(slot, status, message)
        return status, message, values

    def string(self, slot: str) -> str:
        """A slot that returns a string (build_info)."""
        return self._request(("string", slot))[2]

    def op(self, name: str, *args):
        """An operator on the default stream: op(name, dtype-or-other args..., tensors as DevTensor)."""
        return self.call(name, 0, None, *(a.ptr if isinstance(a, DevTensor) else a for a in args))

    def synchronize(self):
        self.call("device_synchronize", 0)

    # ---- tensors ---------------------------------------------------------------------------------------
    def upload(self, t: torch.Tensor) -> DevTensor:
        t = t.contiguous()
        data = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()
        status, message, ptr = self._request(("upload", data))
        if status:
            raise SlotError("upload", status, message)
        self.allocations.append(ptr)
        return DevTensor(ptr, tuple(t.shape), t.dtype)

    def empty(self, shape, dtype: torch.dtype, fill=float("nan")) -> DevTensor:
        return self.upload(torch.full(tuple(shape), fill, dtype=dtype))

    def download(self, t: DevTensor) -> torch.Tensor:
        status, message, data = self._request(("download", t.ptr, t.nbytes))
        if status:
            raise SlotError("download", status, message)
        if t.dtype == torch.bfloat16:
            return torch.frombuffer(bytearray(data), dtype=torch.int16).view(torch.bfloat16).reshape(t.shape)
        return torch.frombuffer(bytearray(data), dtype=t.dtype).reshape(t.shape).clone()

    def free_all(self):
        for ptr in self.allocations:
            self.call("free", 0, ptr)
        self.allocations.clear()
