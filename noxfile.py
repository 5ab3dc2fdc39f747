"""Sessions: tests per backend, lint, bench, demo. `nox -l` lists them."""

import os
import shutil
from pathlib import Path

import nox
import nox.command

ROOT = Path(__file__).parent
nox.options.sessions = ["tests(backend='cpu')", "lint"]
nox.options.reuse_existing_virtualenvs = False

TOOLCHAINS = {  # what a backend's build needs on this machine
    "cpu": [("g++", "a C++17 compiler")],
    "cuda": [("nvcc", "the CUDA toolkit (nvcc)")],
    "iluvatar": [("/usr/local/corex/bin/clang++", "the Iluvatar CoreX SDK")],
}


def _backend_dir(session: nox.Session, backend: str) -> Path:
    path = ROOT / f"llaisys-backend-{backend}"
    if not (path / "pyproject.toml").exists():
        session.skip(f"llaisys-backend-{backend} is not a package in this checkout yet (no pyproject.toml)")
    for tool, what in TOOLCHAINS[backend]:
        if not (shutil.which(tool) or os.path.exists(tool)):
            session.skip(f"llaisys-backend-{backend} needs {what}, which is not installed here")
    return path


def _install_packages(session: nox.Session, backend: str, extras: str = "") -> None:
    packages = [str(ROOT / "llaisys-core"), str(_backend_dir(session, backend))]
    if (ROOT / "llaisys-models" / "pyproject.toml").exists():
        packages.append(str(ROOT / "llaisys-models") + extras)
    session.install(*packages)


def _install_chromium(session: nox.Session) -> None:
    """Debian's chromium for the web page tests (never a browser download); they skip, saying why, without it."""
    if shutil.which("chromium") or shutil.which("chromium-browser"):
        return
    if not shutil.which("apt-get") or os.geteuid() != 0:
        session.warn("chromium is not installed and apt-get cannot run here as root: the web page tests will skip")
        return
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    try:
        session.run("apt-get", "update", "-q", external=True, env=env)
        session.run("apt-get", "install", "-y", "-q", "chromium", external=True, env=env)
    except nox.command.CommandFailed:
        session.warn("apt-get could not install chromium: the web page tests will skip")


@nox.session
@nox.parametrize("backend", ["cpu", "cuda", "iluvatar"])
def tests(session: nox.Session, backend: str) -> None:
    """Install core, one backend (and the models package) and run the whole test tree on that backend."""
    _backend_dir(session, backend)
    session.install("-r", str(ROOT / "tests" / "requirements.txt"))
    _install_packages(session, backend, extras="[serve]")
    _install_chromium(session)
    session.run("pytest", f"--backend={backend}", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", ".")


@nox.session
def bench(session: nox.Session) -> None:
    """CPU operator benchmarks against torch (pass script args after --)."""
    session.install("torch==2.13.0", "numpy")
    _install_packages(session, "cpu")
    session.run("python", str(ROOT / "benchmarks" / "ops_cpu.py"), *session.posargs)


@nox.session
def demo(session: nox.Session) -> None:
    """Install the CPU stack and run the main job."""
    _install_packages(session, "cpu")
    session.run("llaisys", "devices")
    session.run("llaisys", "generate", "--prompt", "1234+5678=")
