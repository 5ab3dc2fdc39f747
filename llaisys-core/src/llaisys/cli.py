"""The ``llaisys`` command. Core owns ``devices``; other packages add subcommands through
the entry-point group ``llaisys.commands``: ``name = "module:register"`` where
``register(subparsers)`` adds one parser whose ``func(args) -> int`` runs it."""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
import warnings

COMMANDS_GROUP = "llaisys.commands"


def format_backend_report(records) -> str:
    """``backend_report()`` as a table: one row per plugin, the reason last."""
    rows = [("backend", "package", "version", "status", "devices", "details")]
    rows += [(r.name, r.package, r.version, r.status, str(r.devices), r.reason) for r in records]
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[5] for row in rows]
    if not records:
        lines.append("(no llaisys backend installed: pip install ./llaisys-backend-cpu from the llaisys source tree)")
    return "\n".join(line.rstrip() for line in lines)


def format_devices(records) -> str:
    """Each available device with the name its backend gives it (the CPU's names its SIMD path and threads)."""
    lines = []
    for r in records:
        if r.status != "loaded":
            continue
        for index in range(r.devices):
            try:
                name = r.backend.device_name(index)
            except Exception as e:  # a listing must not fail because one backend cannot name its device
                name = f"(no name: {e})"
            lines.append(f"  {r.name}:{index}  {name}")
    return "\n".join(lines)


def format_op_sources(reg) -> str:
    """Per loaded backend, where its ops run (``llaisys.capabilities``): one short line for a backend with every
    op native, else the native count and the ops that fall back to the cpu backend (or are unavailable)."""
    from .abi import OP_SLOTS
    from .plugins import FALLBACK, NATIVE, OVERRIDE, UNAVAILABLE

    lines = []
    for name in sorted(reg.backends, key=lambda n: (n == "cpu", n)):
        try:
            sources = reg.capabilities(name)
        except Exception as e:  # a listing must not fail because one backend cannot say
            lines.append(f"  {name}: (cannot tell: {e})")
            continue
        by = {kind: [op for op, where in sources.items() if where == kind]
              for kind in (NATIVE, OVERRIDE, FALLBACK, UNAVAILABLE)}
        if len(by[NATIVE]) == len(OP_SLOTS):
            lines.append(f"  {name}: all {len(OP_SLOTS)} ops native")
            continue
        parts = [f"native: {len(by[NATIVE])} ops"]
        parts += [f"{label}: {', '.join(by[kind])}" for kind, label in
                  ((OVERRIDE, "overridden"), (FALLBACK, "falls back to cpu"), (UNAVAILABLE, "unavailable")) if by[kind]]
        lines.append(f"  {name}: {'; '.join(parts)}")
    return "\n".join(lines)


def format_versions() -> str:
    """llaisys-core's version, then every other installed llaisys distribution's (name order), one per line."""
    from ._version import __version__
    others: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"] or ""
        if name.lower().startswith("llaisys-") and name.lower() != "llaisys-core":
            others.setdefault(name, dist.version)  # the first on sys.path is the one imported
    return "\n".join([f"llaisys-core {__version__}", *(f"{name} {others[name]}" for name in sorted(others))])


def _devices(args) -> int:
    from .plugins import available_devices, backend_report, registry
    records = backend_report()
    print(format_backend_report(records))
    devices = available_devices()
    print(f"\navailable devices: {', '.join(map(str, devices)) or 'none'}")
    if devices:
        print(format_devices(records))
        print(f"\nops:\n{format_op_sources(registry())}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llaisys", description="llaisys: LLM inference on any backend")
    parser.add_argument("--version", action="store_true",
                        help="print the version of llaisys-core and of every installed llaisys package")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    devices = sub.add_parser("devices", help="list backend plugins and their devices")
    devices.set_defaults(func=_devices)
    importlib.import_module(".new_backend", __package__).register(sub)  # llaisys new-backend NAME
    importlib.import_module(".check_backend", __package__).register(sub)  # llaisys check-backend NAME
    for ep in importlib.metadata.entry_points(group=COMMANDS_GROUP):
        try:
            ep.load()(sub)
        except Exception as e:  # a broken extension must not take the CLI down
            print(f"llaisys: warning: command '{ep.name}' from {ep.value} failed to load: {e}", file=sys.stderr)
    return parser


def _one_line_warnings() -> None:
    """Show llaisys' own warnings as one line ("llaisys: warning: ..."), without a source line."""
    from .errors import LlaisysWarning
    default = warnings.formatwarning

    def format_warning(message, category, filename, lineno, line=None):
        if issubclass(category, LlaisysWarning):
            return f"llaisys: warning: {message}\n"
        return default(message, category, filename, lineno, line)
    warnings.formatwarning = format_warning


def main(argv=None) -> int:
    _one_line_warnings()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        print(format_versions())
        return 0
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
