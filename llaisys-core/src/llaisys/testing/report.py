"""What a conformance run found: one cell per (op, dtype), the failures named, and the timings of ``--perf``.

A cell reads:
    pass N          all N cases passed
    FAIL e (F/N)    F of N cases failed; e is the largest error measured (the failures are listed below)
    partial P/N     P passed, the others are dtypes or modes the backend reports NOT_SUPPORTED (listed below)
    unsupported     every case was NOT_SUPPORTED
    not impl        the backend has no kernel for the op
    fallback        the op runs on the CPU backend (a partial backend): not counted as the backend's pass
    -               the suite has no case of the op in this dtype
"""

from __future__ import annotations

import dataclasses

from ..abi import OP_SLOTS
from ..device import Device
from ..dtype import DType
from .case import FAILING, FALLBACK, NOT_IMPLEMENTED, PASS, SHORT, UNSUPPORTED, Case, Outcome


@dataclasses.dataclass(frozen=True)
class Result:
    case: Case
    outcome: Outcome

    def line(self) -> str:
        return f"{self.case}: {self.outcome.message or self.outcome.status}"


@dataclasses.dataclass(frozen=True)
class PerfRow:
    """One op's time on the device and on the CPU backend (best of several runs), in milliseconds."""

    op: str
    shape: str
    device_ms: float | None
    cpu_ms: float | None
    note: str = ""


def _cell(outcomes: list[Outcome]) -> str:
    if not outcomes:
        return "-"
    statuses = [o.status for o in outcomes]
    failed = [o for o in outcomes if o.status in FAILING]
    if failed:
        errors = [o.max_error for o in failed if o.max_error is not None and o.max_error == o.max_error]
        worst = f" {max(errors):.2g}" if errors else ""
        return f"FAIL{worst} ({len(failed)}/{len(outcomes)})"
    for status, text in ((NOT_IMPLEMENTED, "not impl"), (FALLBACK, "fallback")):
        if status in statuses:
            return text
    passed = statuses.count(PASS)
    if passed == len(outcomes):
        return f"pass {passed}"
    return f"partial {passed}/{len(outcomes)}" if passed else "unsupported"


@dataclasses.dataclass
class Report:
    """The outcome of every case run on ``device``; ``ok`` is False when any case failed."""

    device: Device
    results: list[Result]
    seconds: float = 0.0
    perf: list[PerfRow] | None = None
    perf_dtype: DType | None = None

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def failures(self) -> list[Result]:
        return [r for r in self.results if r.outcome.failed]

    @property
    def ops(self) -> list[str]:
        """The ops run, in backend.h's order."""
        order = list(OP_SLOTS)
        return sorted({r.case.op for r in self.results}, key=lambda op: order.index(op) if op in order else len(order))

    @property
    def dtypes(self) -> list[DType]:
        order = list(SHORT)
        return sorted({r.case.dtype for r in self.results}, key=order.index)

    def outcomes(self, op: str, dtype: DType) -> list[Outcome]:
        return [r.outcome for r in self.results if r.case.op == op and r.case.dtype == dtype]

    def cell(self, op: str, dtype: DType) -> str:
        """The table's cell for (op, dtype): see the module docstring."""
        return _cell(self.outcomes(op, dtype))

    def table(self) -> str:
        """The op x dtype table."""
        rows = [["op", *(SHORT[d] for d in self.dtypes)]]
        rows += [[op, *(self.cell(op, d) for d in self.dtypes)] for op in self.ops]
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for r in self.results:
            counts[r.outcome.status] = counts.get(r.outcome.status, 0) + 1
        parts = ", ".join(f"{n} {status}" for status, n in counts.items())
        verdict = "ok" if self.ok else f"FAILED ({len(self.failures)} cases)"
        return (f"{self.device}: {len(self.results)} cases of {len(self.ops)} ops ({parts}) in {self.seconds:.1f} s: "
                f"{verdict}")

    def details(self) -> str:
        """The failures, each naming op, dtype and case, then the cases the backend did not support."""
        lines = []
        if self.failures:
            lines += ["failures:", *(f"  {r.line()}" for r in self.failures)]
        unsupported = [r for r in self.results if r.outcome.status == UNSUPPORTED]
        if unsupported:
            lines += ["not supported by the backend (NOT_SUPPORTED):", *(f"  {r.line()}" for r in unsupported)]
        for status, title in ((NOT_IMPLEMENTED, "not implemented"), (FALLBACK, "falls back to the cpu backend")):
            ops = list(dict.fromkeys(r.case.op for r in self.results if r.outcome.status == status))
            if ops:
                lines.append(f"{title}: {', '.join(ops)}")
        return "\n".join(lines)

    def perf_table(self) -> str:
        if not self.perf:
            return ""
        dtype = SHORT[self.perf_dtype] if self.perf_dtype else ""
        rows = [["op", f"shape ({dtype})", f"{self.device} ms", "cpu ms", "speedup vs cpu"]]
        for p in self.perf:
            speedup = f"{p.cpu_ms / p.device_ms:.2f}x" if p.device_ms and p.cpu_ms else p.note
            rows.append([p.op, p.shape, _ms(p.device_ms), _ms(p.cpu_ms), speedup])
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)

    def __str__(self) -> str:
        parts = [self.table(), "", self.summary()]
        if self.details():
            parts += [self.details()]
        if self.perf:
            parts += ["", "time per call, best of several (--perf):", self.perf_table()]
        return "\n".join(parts)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
