"""Choosing cases by op and dtype name, and running them on a device into a Report."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from ..abi import OP_SLOTS
from ..device import as_device
from ..dtype import DType, float32
from ..errors import LlaisysValueError
from ..plugins import registry
from .case import SHORT, Case, op_support
from .cases import all_cases
from .report import Report, Result

OPS = tuple(OP_SLOTS)  # every op slot of llaisys/backend.h


def suite_dtypes() -> tuple[DType, ...]:
    """The dtypes the suite has cases in (the floating ones, and the item sizes rearrange also moves)."""
    present = {case.dtype for case in all_cases()}
    return tuple(d for d in SHORT if d in present)


def _listed(value: str | Iterable | None) -> list | None:
    """One comma-separated string, or an iterable of items, as a list (None stays None)."""
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else list(value)
    return [i.strip() if isinstance(i, str) else i for i in items if not isinstance(i, str) or i.strip()]


def _dtype_named(name) -> DType:
    if isinstance(name, DType):
        return name
    for dtype, short in SHORT.items():
        if name in (short, dtype.name):
            return dtype
    raise LlaisysValueError(f"unknown dtype {name!r}; the suite's dtypes are {', '.join(SHORT[d] for d in suite_dtypes())}")


def cases(ops: str | Iterable[str] | None = None, dtypes: str | Iterable | None = None) -> list[Case]:
    """The suite's cases of ``ops`` (names, or one comma-separated string; default all) in ``dtypes`` (DTypes or
    names: "f32", "bfloat16", ...; default all), in a fixed order. An unknown name raises LlaisysValueError."""
    op_names, dtype_names = _listed(ops), _listed(dtypes)
    if op_names is not None:
        unknown = [n for n in op_names if n not in OPS]
        if unknown or not op_names:
            raise LlaisysValueError(f"unknown op {', '.join(map(repr, unknown)) or '(none given)'}; the ops are "
                                    f"{', '.join(OPS)}")
    wanted = None
    if dtype_names is not None:
        if not dtype_names:
            raise LlaisysValueError(f"no dtype given; the suite's dtypes are "
                                    f"{', '.join(SHORT[d] for d in suite_dtypes())}")
        wanted = {_dtype_named(n) for n in dtype_names}
    return [c for c in all_cases()
            if (op_names is None or c.op in op_names) and (wanted is None or c.dtype in wanted)]


def check_backend(device, ops=None, dtypes=None, perf: bool = False,
                  progress: Callable[[Result], None] | None = None) -> Report:
    """Run the conformance suite (``ops`` / ``dtypes``: see ``cases``) on ``device``; with ``perf``, also time one
    representative shape per op on it and on the CPU backend. A device whose backend is not loaded raises
    BackendUnavailableError with the registry's reason. ``progress(result)`` is called after each case."""
    selected = cases(ops, dtypes)
    device = as_device(device)
    registry().backend(device)  # raises, saying why, for a backend that is missing, failed or has no device
    start = time.perf_counter()
    support = {op: op_support(op, device) for op in dict.fromkeys(c.op for c in selected)}
    results = []
    for case in selected:
        result = Result(case, case.evaluate(device, support[case.op]))
        results.append(result)
        if progress is not None:
            progress(result)
    report = Report(device, results, time.perf_counter() - start)
    if perf:
        from .perf import measure

        floats = [d for d in report.dtypes if d.is_floating_point]
        report.perf_dtype = floats[0] if floats else float32
        report.perf = measure(device, list(support), report.perf_dtype)
    return report
