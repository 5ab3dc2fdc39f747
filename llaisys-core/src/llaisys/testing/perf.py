"""``--perf``: each op's time on the device against the CPU backend, one representative shape per op (the
shapes of a Qwen2-1.5B decode step or prefill chunk: ``cases.*.PERF``), best of several runs, each run waited
for (``llaisys.synchronize``), so that an asynchronous device is timed to the end of its work."""

from __future__ import annotations

import time
import zlib

from ..device import Device, as_device
from ..dtype import DType
from ..errors import LlaisysError
from ..plugins import registry
from ..stream import synchronize
from .case import NATIVE, Ctx, op_support
from .report import PerfRow

MIN_RUNS, MAX_RUNS, BUDGET_S = 5, 50, 0.5  # per op: at least 5 rounds, then until 0.5 s or 50 rounds


def _once(call, device: Device) -> float:
    start = time.perf_counter()
    call()
    synchronize(device)
    return time.perf_counter() - start


def best_ms(calls: list[tuple[object, Device]]) -> list[float]:
    """The fastest run of each (call, device), in milliseconds: two warm-up runs each, then rounds that run
    every call once in turn, so that the machine's noise (other processes, clocks) falls on all of them alike."""
    for call, device in calls:
        for _ in range(2):
            call()  # type: ignore[operator]
        synchronize(device)
    best = [float("inf")] * len(calls)
    spent, rounds = 0.0, 0
    while rounds < MIN_RUNS or (spent < BUDGET_S and rounds < MAX_RUNS):
        for i, (call, device) in enumerate(calls):
            elapsed = _once(call, device)
            best[i], spent = min(best[i], elapsed), spent + elapsed
        rounds += 1
    return [b * 1e3 for b in best]


def _setup(setup, device: Device, dtype: DType, op: str):
    return setup(Ctx(device, dtype, zlib.crc32(op.encode()))), device


def measure(device, ops: list[str], dtype: DType) -> list[PerfRow]:
    """A PerfRow per op of ``ops`` that has a representative shape."""
    from .cases import perf_setups

    device = as_device(device)
    host = Device("cpu", 0)
    has_cpu = "cpu" in registry().backends
    rows = []
    for op, (shape, setup) in perf_setups().items():
        if op not in ops:
            continue
        support = op_support(op, device)
        if support != NATIVE:
            rows.append(PerfRow(op, shape, None, None, support))
            continue
        try:
            calls = [_setup(setup, device, dtype, op)]
            if has_cpu and op_support(op, host) == NATIVE:
                calls.append(_setup(setup, host, dtype, op))
            device_ms, *on_cpu = best_ms(calls)
            cpu_ms = on_cpu[0] if on_cpu else None
        except LlaisysError as e:  # e.g. a dtype the backend does not support: said in the row, the rest go on
            rows.append(PerfRow(op, shape, None, None, f"{type(e).__name__}: {e}"))
            continue
        rows.append(PerfRow(op, shape, device_ms, cpu_ms, "" if has_cpu else "no cpu backend loaded"))
    return rows
