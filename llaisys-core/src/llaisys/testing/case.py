"""One conformance case: an op, a dtype, a named layout class and a body that runs the op and checks it.

A body gets a ``Ctx`` (the device, the dtype, a generator seeded from the case's name, helpers to make
inputs on the device) and raises ``CaseFailed`` when the result is wrong. ``Case.evaluate(device)`` turns
whatever happens into an ``Outcome`` (the runner's view); ``Case.run(device)`` is the pytest view: it returns
on a pass, raises AssertionError naming op, dtype and case on a failure, and skips (``pytest.skip``) where the
backend has no native kernel for the op.
"""

from __future__ import annotations

import dataclasses
import sys
import time
import zlib
from collections.abc import Callable

import numpy as np

from ..device import Device, as_device
from ..dtype import DType, bfloat16, bool_, float16, float32, float64, int8, int32, int64, uint8
from ..errors import NotSupportedError
from ..tensor import Tensor, from_numpy
from .compare import CaseFailed

SHORT = {float32: "f32", float16: "f16", bfloat16: "bf16", float64: "f64", int8: "i8", int32: "i32", int64: "i64",
         uint8: "u8", bool_: "bool"}

# layout classes (the second word of a case's name says which)
CONTIGUOUS, ODD, STRIDED, IN_PLACE, ALIASING, BATCH, PROPERTY = (
    "contiguous", "odd shape", "strided", "in-place", "aliasing refused", "batch-invariant", "property")

# Outcome statuses; FAILING ones make a report not ok
PASS, FAIL, ERROR, NOT_IMPLEMENTED, FALLBACK, UNSUPPORTED = (
    "pass", "FAIL", "ERROR", "not implemented", "fallback", "unsupported")
NATIVE = "native"  # (op_support: the op runs on the device's own kernel)
FAILING = (FAIL, ERROR)


class Ctx:
    """What a case body works with: ``device``, ``dtype``, ``rng`` (seeded per case) and input helpers."""

    def __init__(self, device: Device, dtype: DType, seed: int):
        self.device, self.dtype = device, dtype
        self.rng = np.random.default_rng(seed)

    def normal(self, shape, scale: float = 1.0, dtype: DType | None = None) -> tuple[Tensor, np.ndarray]:
        """N(0, scale^2) values rounded to ``dtype`` (the case's by default): (tensor on the device, the same
        values as float64, the inputs the reference computes with)."""
        host = (self.rng.standard_normal(shape) * scale).astype((dtype or self.dtype).numpy)
        return self.upload(host), host.astype(np.float64)

    def upload(self, array) -> Tensor:
        return from_numpy(np.asarray(array), device=self.device)

    def nan(self, shape, dtype: DType | None = None) -> Tensor:
        """An output full of NaN, so that elements a kernel does not write show."""
        return self.upload(np.full(shape, np.nan, (dtype or self.dtype).numpy))

    def full(self, shape, value, dtype: DType) -> Tensor:
        return self.upload(np.full(shape, value, dtype.numpy))


@dataclasses.dataclass(frozen=True)
class Outcome:
    status: str  # PASS, FAIL, ERROR, NOT_IMPLEMENTED, FALLBACK, UNSUPPORTED
    message: str = ""
    max_error: float | None = None
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return self.status in FAILING


@dataclasses.dataclass(frozen=True)
class Case:
    """``op`` in ``dtype``, one ``layout`` class; ``detail`` says the shape and arguments."""

    op: str
    dtype: DType
    layout: str
    detail: str
    body: Callable[[Ctx], None] = dataclasses.field(repr=False, compare=False)

    @property
    def name(self) -> str:
        """The case as a report names it: layout class and detail, e.g. "odd shape (17,)"."""
        return f"{self.layout} {self.detail}"

    @property
    def id(self) -> str:
        """A pytest id: op-dtype-layout-detail without spaces."""
        return "-".join([self.op, SHORT[self.dtype], self.layout, self.detail]).replace(" ", "_")

    def __str__(self) -> str:
        return f"{self.op} {SHORT[self.dtype]} [{self.name}]"

    def evaluate(self, device, support: str | None = None) -> Outcome:
        """Run the case on ``device``; never raises (but KeyboardInterrupt). ``support``: ``op_support`` of the op
        on the device, where the caller knows it already."""
        device = as_device(device)
        support = support or op_support(self.op, device)
        if support != NATIVE:
            return Outcome(support, f"op '{self.op}' is {support} on '{device.type}'")
        start = time.perf_counter()
        status, message, error = PASS, "", None
        try:
            self.body(Ctx(device, self.dtype, zlib.crc32(self.id.encode())))
        except CaseFailed as e:
            status, message, error = FAIL, e.message, e.max_error
        except NotSupportedError as e:  # a dtype or mode the backend says it lacks (backend.h NOT_SUPPORTED)
            status, message = UNSUPPORTED, f"{e}"
        except Exception as e:  # a kernel's error, or anything else: reported with its cause, the run goes on
            status, message = ERROR, f"{type(e).__name__}: {e}"
        return Outcome(status, message, error, time.perf_counter() - start)

    def run(self, device) -> None:
        """The pytest entry point: pass, AssertionError naming op, dtype and case, or a skip saying why."""
        outcome = self.evaluate(device)
        if outcome.failed:
            raise AssertionError(f"{self}: {outcome.message}")
        if outcome.status != PASS:
            reason = f"{self}: {outcome.message or outcome.status}"
            pytest = sys.modules.get("pytest")
            if pytest is None:
                raise NotSupportedError(reason)
            pytest.skip(reason)


def op_support(op: str, device) -> str:
    """NATIVE (the device's backend has the kernel, or a plugin overrides it for the device type), FALLBACK (the
    op runs on the CPU backend: a partial backend) or NOT_IMPLEMENTED, from ``llaisys.capabilities``."""
    from ..plugins import capabilities

    source = capabilities(device).get(op)
    if source in ("native", "override"):
        return NATIVE
    return FALLBACK if source == "fallback" else NOT_IMPLEMENTED
