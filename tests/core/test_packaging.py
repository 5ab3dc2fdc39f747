"""Build requirements that match what the package metadata uses.

``license = "MIT"`` (a PEP 639 license expression) is read by setuptools 77 and later; older
ones reject the project table. Every pyproject.toml that declares one must require
setuptools >= 77, and so must the test requirements (the tests build packages without build
isolation, with the environment's setuptools).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PEP639_SETUPTOOLS = (77,)
PYPROJECTS = sorted(p for p in [*ROOT.glob("*/pyproject.toml"), *ROOT.glob("tests/fake_backends/*/pyproject.toml")])


def setuptools_floor(text: str) -> tuple[int, ...] | None:
    found = re.search(r"""["']setuptools\s*>=\s*([\d.]+)""", text) or re.search(r"^setuptools\s*>=\s*([\d.]+)", text, re.M)
    return tuple(int(part) for part in found.group(1).split(".")) if found else None


@pytest.mark.parametrize("pyproject", PYPROJECTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_license_expression_needs_setuptools_77(pyproject):
    text = pyproject.read_text()
    build_system = text.split("[project]")[0]
    if not re.search(r'^license\s*=\s*"', text, re.M):
        pytest.skip(f"{pyproject.relative_to(ROOT)} declares no license expression")
    floor = setuptools_floor(build_system)
    assert floor is not None and floor >= PEP639_SETUPTOOLS, (
        f"{pyproject.relative_to(ROOT)} uses license = \"...\" but requires setuptools {floor}; it needs >= 77")


def test_test_requirements_pin_a_setuptools_that_reads_the_metadata():
    assert PYPROJECTS, "no pyproject.toml found beside the tests"
    floor = setuptools_floor((ROOT / "tests" / "requirements.txt").read_text())
    assert floor is not None and floor >= PEP639_SETUPTOOLS, f"tests/requirements.txt: setuptools floor {floor}"
