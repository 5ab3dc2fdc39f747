"""``llaisys check-backend NAME``: the conformance suite (``llaisys.testing``) on one device, as a table."""

from __future__ import annotations

import argparse
import sys


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "check-backend", help="run the conformance suite on a backend's device",
        description="Run every op slot x dtype x layout class of llaisys/backend.h on the device against float64 "
                    "references and print an op x dtype table; exit 1 if any case fails.")
    parser.add_argument("device", metavar="NAME", help="the device or device type: cpu, cuda, cuda:1, a plugin's name")
    parser.add_argument("--ops", metavar="OPS", help="comma-separated op names (default: every op slot)")
    parser.add_argument("--dtypes", metavar="DTYPES", help="comma-separated dtypes: f32,f16,bf16 (rearrange also "
                                                           "i8,i64); default: all")
    parser.add_argument("--perf", action="store_true",
                        help="also time one representative shape per op on the device and on the CPU backend")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each case as it runs")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from .testing import check_backend

    def progress(result) -> None:
        print(f"{result.outcome.status:>15}  {result.case}", file=sys.stderr, flush=True)

    report = check_backend(args.device, ops=args.ops, dtypes=args.dtypes, perf=args.perf,
                           progress=progress if args.verbose else None)
    print(report)
    return 0 if report.ok else 1
