"""PEP 517 backend: setuptools, plus NVIDIA's CUDA pip wheels as build requirements only when this machine
has no CUDA toolkit (CUDA_HOME / nvcc on PATH) or the toolkit lacks cuBLAS."""

from __future__ import annotations

from collections.abc import Mapping

from cuda_toolchain import missing_build_wheels
from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403 (the rest of the PEP 517 interface, unchanged)

_ConfigSettings = Mapping[str, str | list[str] | None] | None  # PEP 517's config_settings, as setuptools types them


def get_requires_for_build_wheel(config_settings: _ConfigSettings = None) -> list[str]:
    return _setuptools.get_requires_for_build_wheel(config_settings) + missing_build_wheels()


def get_requires_for_build_editable(config_settings: _ConfigSettings = None) -> list[str]:
    return _setuptools.get_requires_for_build_editable(config_settings) + missing_build_wheels()
