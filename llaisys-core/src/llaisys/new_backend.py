"""``llaisys new-backend NAME [--dir D]``: write a new backend package from the template core ships.

The template lives in ``templates/backend/`` beside this file (package data). Every file there is written
with its ``.tmpl`` suffix dropped and the placeholders below replaced; a path part may hold one too
(``src/@MODULE@/``). The package is written into a temporary folder next to the target and renamed into
place at the end, so a failure leaves nothing half-written. Only the standard library is imported here:
the ``llaisys`` command imports this module on every start.
"""

from __future__ import annotations

import argparse
import keyword
import os
import re
import shutil
import tempfile
from pathlib import Path

from ._version import __version__
from .errors import LlaisysValueError

TEMPLATE = Path(__file__).with_name("templates") / "backend"
SUFFIX = ".tmpl"
NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]*")
MAX_NAME_LENGTH = 32  # the name becomes file, module and C symbol names
PLACEHOLDER = re.compile(r"@[A-Z_]+@")


def check_name(name: str) -> None:
    """Raise LlaisysValueError (one line) unless ``name`` can be a new device type."""
    from .plugins import KNOWN_PACKAGES  # the device types llaisys' own packages provide

    if not NAME_PATTERN.fullmatch(name):
        raise LlaisysValueError(f"invalid backend name {name!r}: use a lowercase identifier "
                                "(a letter, then letters, digits or _), e.g. 'mydev'")
    if len(name) > MAX_NAME_LENGTH:
        raise LlaisysValueError(f"invalid backend name {name!r}: at most {MAX_NAME_LENGTH} characters")
    if keyword.iskeyword(name):
        raise LlaisysValueError(f"invalid backend name {name!r}: it is a Python keyword")
    if name in KNOWN_PACKAGES:
        raise LlaisysValueError(f"invalid backend name {name!r}: llaisys already has a '{name}' backend "
                                f"({KNOWN_PACKAGES[name]}); pick the name of your device")


def substitutions(name: str) -> dict[str, str]:
    """The placeholders of the template and what they become for backend ``name``."""
    major, minor = __version__.split(".")[:2]
    return {
        "@NAME@": name,                                    # the device type: "mydev", Device("mydev", 0)
        "@DIST@": f"llaisys-backend-{name}",               # the pip distribution
        "@MODULE@": f"llaisys_backend_{name}",             # the import name
        "@PREFIX@": f"llaisys_{name}",                     # LLAISYS_PREFIX: exports llaisys_<name>_<slot>
        "@CORE_REQUIREMENT@": f"llaisys-core>={major}.{minor},<{major}.{int(minor) + 1}",
    }


def render(text: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        text = text.replace(key, value)
    return text


def template_files() -> list[Path]:
    """Every file of the template, relative to it, in a stable order."""
    return sorted(p.relative_to(TEMPLATE) for p in TEMPLATE.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def output_path(relative: Path, values: dict[str, str]) -> Path:
    """Where a template file lands in the package: placeholders replaced, ``.tmpl`` dropped."""
    text = render(relative.as_posix(), values)
    return Path(text[: -len(SUFFIX)] if text.endswith(SUFFIX) else text)


def write_package(folder: Path, name: str) -> list[Path]:
    """Write the package for backend ``name`` into the existing, empty ``folder``; return its files."""
    values = substitutions(name)
    written = []
    for relative in template_files():
        text = render((TEMPLATE / relative).read_text(), values)
        left = PLACEHOLDER.search(text)
        if left:  # a template that names a placeholder this module does not fill is a bug here, not the user's
            raise RuntimeError(f"template {relative} has an unknown placeholder {left.group()}")
        target = folder / output_path(relative, values)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        written.append(target.relative_to(folder))
    return written


def check_target(target: Path) -> None:
    """Refuse a target that exists and is not an empty folder, or whose parent is missing."""
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise LlaisysValueError(f"{target} exists and is not a folder: choose another --dir")
    if target.is_dir() and any(target.iterdir()):
        raise LlaisysValueError(f"{target} exists and is not empty: choose another --dir, or remove it first")
    if not target.parent.is_dir():
        raise LlaisysValueError(f"cannot write {target}: its parent folder {target.parent} does not exist")


def create(name: str, target: Path) -> list[Path]:
    """Write backend ``name``'s package to ``target`` (which must not exist, or be an empty folder), all at
    once: it is assembled in a temporary folder beside ``target`` and renamed into place."""
    check_name(name)
    target = Path(os.path.abspath(target))  # absolute, without . or .. (its name and parent are real ones)
    check_target(target)
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    except OSError as e:
        raise LlaisysValueError(f"cannot write into {target.parent}: {e.strerror or e}") from None
    try:
        files = write_package(staging, name)
        if target.is_dir():
            fill(target, staging)
        else:
            umask = os.umask(0)
            os.umask(umask)
            staging.chmod(0o777 & ~umask)  # mkdtemp makes it private; the package is an ordinary folder
            os.rename(staging, target)  # fails if something appeared there meanwhile
    except OSError as e:
        raise LlaisysValueError(f"cannot write {target}: {e.strerror or e}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already when the rename succeeded
    return files


def fill(target: Path, staging: Path) -> None:
    """Move the staged package's entries into the existing empty folder ``target``, or none of them. (Renaming
    the staging folder over it would replace the folder itself, under a shell whose current folder it is.)"""
    moved: list[Path] = []
    try:
        for entry in sorted(staging.iterdir()):
            os.rename(entry, target / entry.name)
            moved.append(target / entry.name)
    except OSError:
        for path in moved:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
        raise


def _pip_argument(target: Path) -> str:
    """``target`` as pip must be given it: a relative path that does not start with . needs ./ (or pip reads it
    as the name of a package to download)."""
    text = target.as_posix()
    return text if target.is_absolute() or text.startswith(".") else f"./{text}"


def _run(args: argparse.Namespace) -> int:
    target = Path(args.dir) if args.dir else Path(f"llaisys-backend-{args.name}")
    files = create(args.name, target)
    print(f"wrote llaisys-backend-{args.name} (device type '{args.name}', {len(files)} files) to {target}")
    print("next steps (its README.md says more):")
    print(f"  python -m pip install --no-build-isolation {_pip_argument(target)}")
    print("  llaisys devices")
    print(f"  llaisys check-backend {args.name}")
    return 0


def register(subparsers) -> None:
    """Add ``new-backend`` to the ``llaisys`` command."""
    parser = subparsers.add_parser(
        "new-backend", help="write a new backend package (C++ library, plugin, tests) to start from",
        description="Write llaisys-backend-NAME: a pip package with a C++ library implementing the required "
                    "runtime slots of llaisys/backend.h and the ops add, rms_norm and linear on host memory, "
                    "its plugin, README and conformance tests. Ops it lacks run on the CPU backend.")
    parser.add_argument("name", metavar="NAME", help="the device type, a lowercase identifier (e.g. mydev)")
    parser.add_argument("--dir", metavar="D", help="where to write it (default: ./llaisys-backend-NAME); "
                                                   "must not exist or be empty")
    parser.set_defaults(func=_run)
