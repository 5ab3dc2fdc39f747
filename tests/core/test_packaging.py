"""Build requirements that match what the package metadata uses, and one version source per package.

``license = "MIT"`` (a PEP 639 license expression) is read by setuptools 77 and later; older
ones reject the project table. Every pyproject.toml that declares one must require
setuptools >= 77, and so must the test requirements (the tests build packages without build
isolation, with the environment's setuptools).

Each package's version is written once, in ``src/<import name>/_version.py``; its pyproject.toml declares the
version dynamic and has setuptools read that file (statically: the build imports nothing of the package).
"""

from __future__ import annotations

import re
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PEP639_SETUPTOOLS = (77,)
PACKAGES = {"llaisys-core": "llaisys", "llaisys-backend-cpu": "llaisys_backend_cpu",
            "llaisys-backend-cuda": "llaisys_backend_cuda", "llaisys-backend-iluvatar": "llaisys_backend_iluvatar",
            "llaisys-models": "llaisys_models"}
PYPROJECTS = sorted(p for p in [*ROOT.glob("*/pyproject.toml"), *ROOT.glob("tests/fake_backends/*/pyproject.toml")])
LICENSE_EXPRESSION = re.compile(r'^license\s*=\s*"', re.M)
LICENSED = [p for p in PYPROJECTS if LICENSE_EXPRESSION.search(p.read_text())]


def setuptools_floor(text: str) -> tuple[int, ...] | None:
    found = re.search(r"""["']setuptools\s*>=\s*([\d.]+)""", text) or re.search(r"^setuptools\s*>=\s*([\d.]+)", text, re.M)
    return tuple(int(part) for part in found.group(1).split(".")) if found else None


def test_every_package_is_mit_licensed_as_the_license_file_says():
    assert sorted(ROOT / folder / "pyproject.toml" for folder in PACKAGES) == sorted(
        p for p in LICENSED if p.parent.parent == ROOT)
    assert all('\nlicense = "MIT"\n' in p.read_text() for p in LICENSED)
    assert (ROOT / "LICENSE").read_text().startswith("MIT License\n")


@pytest.mark.parametrize("pyproject", LICENSED, ids=lambda p: str(p.relative_to(ROOT)))
def test_license_expression_needs_setuptools_77(pyproject):
    text = pyproject.read_text()
    build_system = text.split("[project]")[0]
    floor = setuptools_floor(build_system)
    assert floor is not None and floor >= PEP639_SETUPTOOLS, (
        f"{pyproject.relative_to(ROOT)} uses license = \"...\" but requires setuptools {floor}; it needs >= 77")


def test_test_requirements_pin_a_setuptools_that_reads_the_metadata():
    assert PYPROJECTS, "no pyproject.toml found beside the tests"
    floor = setuptools_floor((ROOT / "tests" / "requirements.txt").read_text())
    assert floor is not None and floor >= PEP639_SETUPTOOLS, f"tests/requirements.txt: setuptools floor {floor}"


def version_of(folder: str) -> str:
    return runpy.run_path(str(ROOT / folder / "src" / PACKAGES[folder] / "_version.py"))["__version__"]


@pytest.mark.parametrize("folder", PACKAGES)
def test_the_version_is_written_once_in_the_package(folder):
    text = (ROOT / folder / "pyproject.toml").read_text()
    project = text.split("\n[project]\n", 1)[1].split("\n[", 1)[0]
    assert re.search(r'^dynamic\s*=\s*\[[^\]]*"version"', project, re.M), f"{folder}: version is not dynamic"
    assert not re.search(r"^version\s*=", project, re.M), f"{folder}: a version written in pyproject.toml"
    assert f'version = {{attr = "{PACKAGES[folder]}._version.__version__"}}' in text
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", version_of(folder))


def test_the_packages_share_the_version_the_changelog_released_last():
    """CHANGELOG.md: "the packages share one version number"; its newest release heading is that number, and
    every package's requirement on llaisys-core admits it."""
    released = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert released, "CHANGELOG.md has no release heading"
    assert {folder: version_of(folder) for folder in PACKAGES} == dict.fromkeys(PACKAGES, released[0])
    major, minor, _ = map(int, released[0].split("."))
    for folder in PACKAGES:
        if folder != "llaisys-core":
            text = (ROOT / folder / "pyproject.toml").read_text()
            assert f'"llaisys-core>={major}.{minor},<{major}.{minor + 1}"' in text, folder


def test_core_metadata_and_llaisys_version_come_from_version_py(tmp_path):
    import llaisys
    assert llaisys.__version__ == version_of("llaisys-core")
    source = tmp_path / "llaisys-core"  # a copy with another version: the build must take it from _version.py
    shutil.copytree(ROOT / "llaisys-core", source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    (source / "src" / "llaisys" / "_version.py").write_text('__version__ = "9.8.7"\n')
    hook = "import sys; from setuptools import build_meta; print(build_meta.prepare_metadata_for_build_wheel(sys.argv[1]))"
    made = subprocess.run([sys.executable, "-c", hook, str(tmp_path)], cwd=source, capture_output=True, text=True)
    assert made.returncode == 0, made.stdout + made.stderr
    assert "\nVersion: 9.8.7\n" in (tmp_path / made.stdout.split()[-1] / "METADATA").read_text()


READMES = [ROOT / "README.md", *sorted(ROOT.glob("llaisys-*/README.md"))]
MD_REFERENCE = re.compile(r"`([\w./-]+\.md)`|\]\(([\w./-]+\.md)(?:#[\w-]*)?\)")


@pytest.mark.parametrize("readme", READMES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_readmes_point_at_files_the_repository_holds(readme):
    """Every .md file a README names (`x.md` or a link) exists, beside the README or from the top (core's README
    pointed at a design file outside the repository)."""
    named = {a or b for a, b in MD_REFERENCE.findall(readme.read_text())}
    missing = [name for name in sorted(named) if not ((readme.parent / name).is_file() or (ROOT / name).is_file())]
    assert not missing, f"{readme.relative_to(ROOT)} names files not in the repository: {missing}"
