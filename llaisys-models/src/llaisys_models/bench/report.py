"""Rows of measurements (one dict each, the same keys in every row) as a table, JSON, CSV or Markdown."""

from __future__ import annotations

import csv
import io
import json
import math

FORMATS = ("table", "json", "csv", "md")


def render(rows: list[dict], fmt: str = "table", meta: dict | None = None) -> str:
    """``rows`` in ``fmt``. JSON is ``{"meta": meta, "rows": rows}`` (what ``--compare`` reads back); the others
    show the rows alone, their columns in the first row's key order."""
    if fmt == "json":
        return json.dumps({"meta": meta or {}, "rows": rows}, indent=2, allow_nan=False, default=str) + "\n"
    columns = list(rows[0]) if rows else []
    cells = [[cell(row.get(c)) for c in columns] for row in rows]
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(cells)
        return out.getvalue()
    if fmt == "md":
        lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
        return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in cells]) + "\n"
    if fmt != "table":
        raise ValueError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.rjust(w) if _numeric(v) else v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines) + "\n"


def cell(value: object) -> str:
    """One value as the table, CSV and Markdown show it: 4 significant digits, "-" for none."""
    if value is None:
        return "-"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.4g}" if abs(value) < 1000 else f"{value:.1f}"
    return str(value)


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
