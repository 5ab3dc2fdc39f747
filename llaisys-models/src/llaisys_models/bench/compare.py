"""``llaisys bench --compare BASELINE.json``: each row's rate against an earlier run's, a regression check a CI
can run (exit 1 when a row is slower than ``1 - tolerance`` of its baseline)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TextIO

from . import report

AXES = ("model", "device", "dtype", "quantize", "threads", "speculative")  # with "test": what rows match on


def row_key(row: dict[str, Any]) -> tuple[str, ...]:
    """What rows match on: their axes and test."""
    return tuple(str(row.get(k)) for k in (*AXES, "test"))

def read_baseline(path: Path) -> dict[tuple[str, ...], dict[str, Any]]:
    """The rows of an earlier JSON output, by their axes and test."""
    from llaisys import LlaisysValueError

    try:
        rows = json.loads(path.read_text())["rows"]
        return {row_key(row): row for row in rows if isinstance(row.get("tokens_per_s"), (int, float))}
    except OSError as e:
        raise LlaisysValueError(f"--compare {path}: {e.strerror or e}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise LlaisysValueError(f"--compare {path}: not the JSON output of llaisys bench ({e})") from None

def compare(rows: list[dict[str, Any]], baseline: dict[tuple[str, ...], dict[str, Any]], tolerance: float,
            stream: TextIO) -> int:
    """Each row's rate against the baseline's; 1 when any is below 1 - tolerance of it."""
    current = {row_key(row): row for row in rows}
    table, slower = [], []
    for key, row in current.items():
        if key not in baseline:
            continue
        ratio = row["tokens_per_s"] / baseline[key]["tokens_per_s"] if baseline[key]["tokens_per_s"] else float("inf")
        table.append({**{k: row[k] for k in (*AXES, "test")}, "baseline": baseline[key]["tokens_per_s"],
                      "tokens_per_s": row["tokens_per_s"], "ratio": ratio})
        if ratio < 1 - tolerance:
            slower.append(f"{label(row)} at {ratio:.2f}x")
    stream.write(f"\ncompared with the baseline (tolerance {tolerance:g}):\n" + report.render(table, "table"))
    for key in current.keys() - baseline.keys():
        stream.write(f"not in the baseline: {label(current[key])}\n")
    for key in baseline.keys() - current.keys():
        stream.write(f"not measured now: {label(baseline[key])}\n")
    if slower:
        stream.write(f"regression (below {1 - tolerance:g}x of the baseline): {'; '.join(slower)}\n")
    stream.flush()
    return 1 if slower else 0

def label(row: dict) -> str:
    return f"{row.get('test')} ({', '.join(f'{k}={row.get(k)}' for k in AXES)})"
