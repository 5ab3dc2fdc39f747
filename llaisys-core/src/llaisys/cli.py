"""The ``llaisys`` command. Core owns ``devices``; other packages add subcommands through
the entry-point group ``llaisys.commands``: ``name = "module:register"`` where
``register(subparsers)`` adds one parser whose ``func(args) -> int`` runs it."""

from __future__ import annotations

import argparse
import importlib.metadata
import sys

COMMANDS_GROUP = "llaisys.commands"


def _devices(args) -> int:
    from .plugins import available_devices, backend_report, format_backend_report
    print(format_backend_report(backend_report()))
    print(f"\navailable devices: {', '.join(map(str, available_devices())) or 'none'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llaisys", description="llaisys: LLM inference on any backend")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    devices = sub.add_parser("devices", help="list backend plugins and their devices")
    devices.set_defaults(func=_devices)
    for ep in importlib.metadata.entry_points(group=COMMANDS_GROUP):
        try:
            ep.load()(sub)
        except Exception as e:  # a broken extension must not take the CLI down
            print(f"llaisys: warning: command '{ep.name}' from {ep.value} failed to load: {e}", file=sys.stderr)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    from .errors import LlaisysError
    try:
        return args.func(args) or 0
    except LlaisysError as e:
        print(f"llaisys: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
