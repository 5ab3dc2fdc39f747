"""What ``llaisys bench serve`` reports of its requests: counts, throughputs, goodput and latency percentiles."""

from __future__ import annotations

import math
from typing import Any

from .client import Record

PERCENTILES = (50, 90, 99)

def percentile(values: list[float], q: float) -> float:
    """The q-th percentile, interpolated linearly between the nearest ranks (numpy's default)."""
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    low = math.floor(k)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (k - low)

def meets(record: Record, slos: dict[str, float]) -> bool:
    """Whether a completed request met every SLO (a one-token answer has no TPOT, so it meets that one)."""
    values = {"ttft": record.ttft, "tpot": record.tpot, "e2e": record.e2e}
    return all((value := values[name]) is None or value * 1e3 <= ms for name, ms in slos.items())

def summarize(records: list[Record], duration: float, slos: dict[str, float]) -> dict[str, Any]:
    """The run's figures as one flat row: counts, throughputs, then mean and percentiles (ms) of each latency."""
    ok = [r for r in records if r.ok]
    output_tokens = sum(r.output_tokens for r in ok)
    prompt_tokens = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    input_tokens = sum(prompt_tokens) if len(prompt_tokens) == len(ok) else None  # (None: a server without usage)
    rate = 1 / duration if duration > 0 else math.nan
    row = {"completed": len(ok), "failed": len(records) - len(ok), "duration_s": duration,
           "input_tokens": input_tokens, "output_tokens": output_tokens,
           "request_throughput": len(ok) * rate, "output_throughput": output_tokens * rate,
           "total_token_throughput": None if input_tokens is None else (input_tokens + output_tokens) * rate,
           "goodput": sum(meets(r, slos) for r in ok) * rate if slos else None}
    samples = {"ttft": [r.ttft for r in ok if r.ttft is not None], "tpot": [r.tpot for r in ok if r.tpot is not None],
               "itl": [gap for r in ok for gap in r.itl], "e2e": [r.e2e for r in ok if r.e2e is not None]}
    for name, values in samples.items():
        ms = [v * 1e3 for v in values]
        row[f"{name}_mean_ms"] = sum(ms) / len(ms) if ms else None
        for q in PERCENTILES:
            row[f"{name}_p{q}_ms"] = percentile(ms, q) if ms else None
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
