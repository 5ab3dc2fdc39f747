"""PEP 517 backend: setuptools, with one check first. Building the wheel needs the CoreX SDK; without it every
wheel hook stops at once with one line ("CoreX SDK not found: set COREX_HOME or install it at
/usr/local/corex") before anything is compiled. The sdist needs no SDK."""

from __future__ import annotations

import os
from collections.abc import Mapping

from corex_toolchain import SdkNotFound, find_sdk
from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403 (the rest of the PEP 517 interface, unchanged)

_ConfigSettings = Mapping[str, str | list[str] | None] | None  # PEP 517's config_settings, as setuptools types them
_Path = str | os.PathLike[str]


def _require_sdk() -> None:
    try:
        find_sdk()
    except SdkNotFound as e:
        raise SystemExit(str(e)) from None


def get_requires_for_build_wheel(config_settings: _ConfigSettings = None) -> list[str]:
    _require_sdk()
    return _setuptools.get_requires_for_build_wheel(config_settings)


def get_requires_for_build_editable(config_settings: _ConfigSettings = None) -> list[str]:
    _require_sdk()
    return _setuptools.get_requires_for_build_editable(config_settings)


def prepare_metadata_for_build_wheel(metadata_directory: _Path, config_settings: _ConfigSettings = None) -> str:
    _require_sdk()
    return _setuptools.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def prepare_metadata_for_build_editable(metadata_directory: _Path, config_settings: _ConfigSettings = None) -> str:
    _require_sdk()
    return _setuptools.prepare_metadata_for_build_editable(metadata_directory, config_settings)


def build_wheel(wheel_directory: _Path, config_settings: _ConfigSettings = None,
                metadata_directory: _Path | None = None) -> str:
    _require_sdk()
    return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory: _Path, config_settings: _ConfigSettings = None,
                   metadata_directory: _Path | None = None) -> str:
    _require_sdk()
    return _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
