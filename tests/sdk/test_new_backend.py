"""``llaisys new-backend NAME [--dir D]``: what it refuses (one line, exit 2, nothing written), what it writes, and
that the C++ it writes builds into a library core loads. Fast: no pip, one compile of four small sources.
The end-to-end run (pip install, the demo model, the conformance suite) is test_new_backend_install.py."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import llaisys
from llaisys import new_backend
from llaisys.cli import main

# What the template writes, for device type "demo_dev"
EXPECTED_FILES = sorted([
    ".gitignore", "MANIFEST.in", "README.md", "pyproject.toml", "setup.py",
    "csrc/common.h", "csrc/runtime.cpp", "csrc/ops/add.cpp", "csrc/ops/linear.cpp", "csrc/ops/rms_norm.cpp",
    "src/llaisys_backend_demo_dev/__init__.py", "src/llaisys_backend_demo_dev/plugin.py",
    "tests/test_conformance.py",
])
NATIVE_OPS = {"add", "rms_norm", "linear"}


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    """The llaisys command's exit status, stdout and stderr, without the warnings of other packages' commands
    that failed to load (the command goes on without them; they are not new-backend's output)."""
    code = main(args)
    captured = capsys.readouterr()
    err = "".join(line for line in captured.err.splitlines(keepends=True)
                  if not line.startswith("llaisys: warning: command "))
    return code, captured.out, err


def listing(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    """llaisys-backend-demo_dev as `llaisys new-backend demo_dev --dir D` writes it."""
    target = tmp_path_factory.mktemp("generated") / "llaisys-backend-demo_dev"
    assert main(["new-backend", "demo_dev", "--dir", str(target)]) == 0
    return target


def load_setup(package: Path):
    """The generated setup.py as a module (setup() itself runs only as __main__, as pip runs it)."""
    spec = importlib.util.spec_from_file_location("generated_setup", package / "setup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def library(package, tmp_path_factory) -> Path:
    """The generated library, built by the generated setup.py's own function, with warnings as errors."""
    setup = load_setup(package)
    out = tmp_path_factory.mktemp("lib")
    old = os.environ.get("CXXFLAGS")
    os.environ["CXXFLAGS"] = "-Werror"
    try:
        return setup.build_library(out, out / "build")
    finally:
        if old is None:
            del os.environ["CXXFLAGS"]
        else:
            os.environ["CXXFLAGS"] = old


# -- refusals ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["", "MyDev", "1dev", "my-dev", "my dev", "dev\n", "_dev", "dév",
                                  "cpu", "cuda", "iluvatar", "class", "import", "x" * 33])
def test_an_invalid_name_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, name):
    code, out, err = run_cli(["new-backend", name, "--dir", str(tmp_path / "pkg")], capsys)
    assert code == 2
    assert err.startswith("llaisys: error: invalid backend name") and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["mydev", "demo_dev", "x1", "npu2_v3"])
def test_valid_names(name):
    new_backend.check_name(name)


def test_a_non_empty_folder_is_refused_and_left_alone(tmp_path, capsys):
    target = tmp_path / "pkg"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    code, _, err = run_cli(["new-backend", "mydev", "--dir", str(target)], capsys)
    assert code == 2 and err.count("\n") == 1 and "is not empty" in err, err
    assert listing(tmp_path) == ["pkg/notes.txt"]


def test_a_file_in_the_way_is_refused(tmp_path, capsys):
    (tmp_path / "pkg").write_text("a file")
    code, _, err = run_cli(["new-backend", "mydev", "--dir", str(tmp_path / "pkg")], capsys)
    assert code == 2 and err.count("\n") == 1 and "is not a folder" in err, err
    assert (tmp_path / "pkg").read_text() == "a file" and listing(tmp_path) == ["pkg"]


def test_a_missing_parent_is_refused(tmp_path, capsys):
    code, _, err = run_cli(["new-backend", "mydev", "--dir", str(tmp_path / "no" / "pkg")], capsys)
    assert code == 2 and err.count("\n") == 1 and "does not exist" in err, err
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_folder_is_one_line_exit_2(tmp_path, capsys):
    if os.geteuid() == 0:  # root writes through permission bits; /proc takes no new folder from anyone
        parent = Path("/proc")
    else:
        parent = tmp_path / "readonly"
        parent.mkdir()
        parent.chmod(0o555)
    try:
        code, _, err = run_cli(["new-backend", "mydev", "--dir", str(parent / "pkg")], capsys)
    finally:
        parent.chmod(0o755) if parent != Path("/proc") else None
    assert code == 2 and err.startswith("llaisys: error: cannot write") and err.count("\n") == 1, err
    assert not (parent / "pkg").exists()


def test_a_failure_midway_leaves_nothing_behind(tmp_path, monkeypatch):
    """The package is staged beside the target and renamed at the end: a write that fails after some files
    (a full disk) leaves neither the target nor the staging folder."""
    written = []
    real_write = Path.write_text

    def failing_write(self, text, *args, **kwargs):
        if len(written) == 5:
            raise OSError(28, "No space left on device")
        written.append(self)
        return real_write(self, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", failing_write)
    with pytest.raises(llaisys.LlaisysError, match="No space left on device"):
        new_backend.create("mydev", tmp_path / "pkg")
    assert len(written) == 5 and list(tmp_path.iterdir()) == []


def test_an_empty_folder_is_filled(tmp_path, capsys):
    target = tmp_path / "pkg"
    target.mkdir()
    code, out, _ = run_cli(["new-backend", "mydev", "--dir", str(target)], capsys)
    assert code == 0 and "llaisys-backend-mydev" in out
    assert "src/llaisys_backend_mydev/plugin.py" in listing(target)
    assert [p.name for p in tmp_path.iterdir()] == ["pkg"]  # no staging folder left


def test_the_current_folder_when_empty_is_filled_in_place(tmp_path, capsys, monkeypatch):
    """`--dir .` from an empty folder writes into that folder, not into a new one that replaces it under the shell."""
    monkeypatch.chdir(tmp_path)
    inode = os.stat(".").st_ino
    code, _, _ = run_cli(["new-backend", "mydev", "--dir", "."], capsys)
    assert code == 0 and os.stat(".").st_ino == inode
    assert (Path.cwd() / "setup.py").is_file() and (tmp_path / "csrc" / "ops" / "add.cpp").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".llaisys")]  # no staging folder left


def test_the_default_folder_is_llaisys_backend_name_in_the_current_one(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_cli(["new-backend", "mydev"], capsys)
    assert code == 0 and (tmp_path / "llaisys-backend-mydev" / "setup.py").is_file()
    assert "pip install --no-build-isolation ./llaisys-backend-mydev" in out  # a path pip takes as a path


# -- what it writes ----------------------------------------------------------------------------------------

def test_the_generated_tree(package):
    assert listing(package) == EXPECTED_FILES
    for path in package.rglob("*"):
        if path.is_file():
            text = path.read_text()
            assert not new_backend.PLACEHOLDER.search(text), f"{path.name}: a placeholder left"
    assert (package.stat().st_mode & 0o777) == (0o777 & ~current_umask())  # not mkdtemp's private mode


def current_umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def test_the_pyproject_declares_the_entry_point_and_core(package):
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((package / "pyproject.toml").read_text())
    assert project["project"]["name"] == "llaisys-backend-demo_dev"
    assert project["project"]["entry-points"]["llaisys.backends"] == {"demo_dev": "llaisys_backend_demo_dev.plugin"}
    major, minor = llaisys.__version__.split(".")[:2]
    core = f"llaisys-core>={major}.{minor},<{major}.{int(minor) + 1}"
    assert project["project"]["dependencies"] == [core]
    assert core in project["build-system"]["requires"]


def test_the_generated_python_is_ruff_clean(package):
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed")
    result = subprocess.run([ruff, "check", "--no-cache", "--isolated", "--select", "E,F,W,I,B,UP",
                             "--line-length", "120", "--target-version", "py310", str(package)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# -- the C++ -----------------------------------------------------------------------------------------------

def test_the_library_builds_and_exports_only_its_slots(library):
    exported = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True,
                              check=True).stdout.split()
    symbols = {s for s in exported if s.startswith("llaisys_") or s.startswith("_Z")}
    assert all(s.startswith("llaisys_demo_dev_") for s in symbols), sorted(symbols)
    slots = {s.removeprefix("llaisys_demo_dev_") for s in symbols}
    required = {name for name, (kind, _, _) in llaisys.abi.RUNTIME_SLOTS.items() if kind is llaisys.abi.REQUIRED}
    assert required <= slots and NATIVE_OPS <= slots
    assert slots - required - NATIVE_OPS == {"build_info", "device_attribute", "device_name"}


CLANG = next(filter(shutil.which, ("clang++", "clang++-22")), None)


@pytest.mark.skipif(CLANG is None, reason="clang++ is not installed")
def test_clang_compiles_the_sources_too(package):
    """A second compiler catches what only g++ accepts."""
    assert CLANG is not None
    for source in sorted((package / "csrc").rglob("*.cpp")):
        result = subprocess.run([CLANG, "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror",
                                 "-DLLAISYS_PREFIX=llaisys_demo_dev", f"-I{package / 'csrc'}",
                                 f"-I{llaisys.get_include()}", str(source)], capture_output=True, text=True)
        assert result.returncode == 0, f"{source.name}:\n{result.stderr}"


def test_core_loads_the_library_and_its_runtime_works(library):
    backend = llaisys.NativeBackend("demo_dev", library, prefix="llaisys_demo_dev")
    assert backend.api_version == llaisys.API_VERSION and backend.device_count() == 1
    assert backend.host_addressable(0) and "demo_dev" in backend.device_name(0)
    ptr = backend.malloc(0, 1000)
    try:
        assert ptr % 256 == 0
        src = np.arange(250, dtype=np.float32)
        backend.memcpy(0, ptr, src.ctypes.data, src.nbytes, llaisys.native.MemcpyKind.H2D)
        stream = backend.stream_create(0)
        backend.memset(0, ptr, 0, 8, stream)  # the first two floats
        back = np.empty_like(src)
        backend.memcpy_async(0, back.ctypes.data, ptr, src.nbytes, llaisys.native.MemcpyKind.D2H, stream)
        backend.stream_synchronize(0, stream)
        backend.stream_destroy(0, stream)
        backend.synchronize(0)
        assert back.tolist() == [0.0, 0.0, *src[2:].tolist()]
    finally:
        backend.free(0, ptr)
    with pytest.raises(llaisys.LlaisysValueError, match=r"llaisys_demo_dev_malloc: malloc: no device 1"):
        backend.malloc(1, 8)


def call_op(backend, op: str, *args) -> int:
    return backend.kernel(op)(0, None, *args)


@pytest.mark.parametrize("dtype", [llaisys.float32, llaisys.float16, llaisys.bfloat16], ids=lambda d: d.name)
def test_the_three_ops_against_float64(library, dtype):
    """A quick look at each kernel (the conformance suite, in the slow test, checks them fully): the result
    rounded once from float64, within the dtype's tolerance; an unknown dtype is NOT_SUPPORTED with a message."""
    backend = llaisys.NativeBackend("demo_dev", library, prefix="llaisys_demo_dev")
    rng = np.random.default_rng(0)
    tol = {llaisys.float32: 1e-5, llaisys.float16: 1e-3, llaisys.bfloat16: 1e-2}[dtype]

    def arr(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(dtype.numpy)

    def ptr(a):
        return a.ctypes.data

    def close(got, want):
        want = want.astype(dtype.numpy).astype(np.float64)
        np.testing.assert_array_less(np.abs(got.astype(np.float64) - want), tol + tol * np.abs(want) + 1e-30)

    a, b = arr(1001), arr(1001)
    c = np.full_like(a, np.nan)
    assert call_op(backend, "add", dtype.code, a.size, ptr(c), ptr(a), ptr(b)) == 0
    close(c, a.astype(np.float64) + b.astype(np.float64))

    x, w = arr(3, 4097), arr(4097)
    out = np.full_like(x, np.nan)
    assert call_op(backend, "rms_norm", dtype.code, 0, dtype.code, 3, 4097, 1e-6, ptr(out), ptr(x), ptr(w)) == 0
    x64 = x.astype(np.float64)
    close(out, x64 / np.sqrt((x64 ** 2).mean(axis=1, keepdims=True) + 1e-6) * w.astype(np.float64))

    m, n, k = 3, 17, 4097
    x, w, bias = arr(m, k, scale=k ** -0.5), arr(n, k), arr(n)
    out = np.full((m, n), np.nan, dtype.numpy)
    assert call_op(backend, "linear", dtype.code, m, n, k, ptr(out), ptr(x), ptr(w), ptr(bias)) == 0
    close(out, x.astype(np.float64) @ w.astype(np.float64).T + bias.astype(np.float64))

    assert call_op(backend, "add", llaisys.int32.code, 1, ptr(c), ptr(a), ptr(b)) == llaisys.native.Status.NOT_SUPPORTED
    assert "add: dtype code 5 is not implemented" in backend.lib.last_error()


CONVERSIONS = r"""
#include "common.h"
// the template's conversion helpers, exported for the test (as C, over arrays)
using namespace backend;
#define EACH for (int64_t i = 0; i < n; ++i)
extern "C" {
void f16_to_f32(const uint16_t* in, float* out, int64_t n) { EACH out[i] = to_float(f16{in[i]}); }
void bf16_to_f32(const uint16_t* in, float* out, int64_t n) { EACH out[i] = to_float(bf16{in[i]}); }
void f32_to_f16(const float* in, uint16_t* out, int64_t n) { EACH out[i] = to_f16(in[i]).bits; }
void f32_to_bf16(const float* in, uint16_t* out, int64_t n) { EACH out[i] = to_bf16(in[i]).bits; }
}
"""


def test_the_f16_and_bf16_conversions_are_exact_and_round_to_nearest_even(package, tmp_path):
    """Every f16 and bf16 value widens exactly; f32 values of every exponent (subnormals, halfway cases, overflow,
    inf, NaN) round as numpy (f16) and ml_dtypes (bf16) round: to nearest, ties to even."""
    import ctypes

    import ml_dtypes

    source = tmp_path / "conversions.cpp"
    source.write_text(CONVERSIONS)
    library = tmp_path / "libconversions.so"
    subprocess.run(["g++", "-std=c++17", "-O2", "-shared", "-fPIC", "-DLLAISYS_PREFIX=llaisys_test",
                    f"-I{package / 'csrc'}", f"-I{llaisys.get_include()}", str(source), "-o", str(library)], check=True)
    lib = ctypes.CDLL(str(library))

    def convert(fn, values, out_dtype):
        out = np.empty(values.shape, out_dtype)
        getattr(lib, fn)(ctypes.c_void_p(values.ctypes.data), ctypes.c_void_p(out.ctypes.data),
                         ctypes.c_int64(values.size))
        return out

    def same(got, want):  # equal values, NaN where NaN (its payload may differ)
        nan = np.isnan(want.astype(np.float32))
        assert np.array_equal(np.isnan(got.astype(np.float32)), nan)
        assert np.array_equal(got[~nan].view(np.uint16 if got.itemsize == 2 else np.uint32),
                              want[~nan].view(np.uint16 if want.itemsize == 2 else np.uint32))

    every = np.arange(1 << 16, dtype=np.uint16)
    same(convert("f16_to_f32", every, np.float32), every.view(np.float16).astype(np.float32))
    same(convert("bf16_to_f32", every, np.float32), every.view(ml_dtypes.bfloat16).astype(np.float32))

    rng = np.random.default_rng(0)
    floats = rng.integers(0, 1 << 32, size=1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32)
    # values next to every f16 / bf16 value and exactly halfway between two of them (ties)
    halves = every.view(np.float16).astype(np.float32)
    halves = halves[np.isfinite(halves)]
    near = np.concatenate([halves, np.nextafter(halves, np.float32(np.inf)), np.nextafter(halves, np.float32(-np.inf)),
                           (halves[:-1].astype(np.float64) + np.diff(halves.astype(np.float64)) / 2).astype(np.float32)])
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504, 65519.99, 65520, 1e-8, 2 ** -25, 2 ** -24,
                         3 * 2 ** -26, np.finfo(np.float32).max, np.finfo(np.float32).tiny], np.float32)
    for values in (floats, near, specials):
        values = np.ascontiguousarray(values, np.float32)
        with np.errstate(over="ignore", invalid="ignore"):  # overflow to inf and NaN are cases here, not accidents
            want_f16, want_bf16 = values.astype(np.float16), values.astype(ml_dtypes.bfloat16)
        same(convert("f32_to_f16", values, np.uint16).view(np.float16), want_f16)
        same(convert("f32_to_bf16", values, np.uint16).view(ml_dtypes.bfloat16), want_bf16)


def test_no_compiler_is_one_clear_line(package, monkeypatch):
    setup = load_setup(package)
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    with pytest.raises(setup.BuildError, match=r"^no C\+\+ compiler: CXX=/nonexistent/c\+\+ is not an executable"):
        setup.build_library(package / "unused", package / "unused")
    monkeypatch.delenv("CXX")
    monkeypatch.setenv("PATH", str(package))  # no compiler there
    with pytest.raises(setup.BuildError, match=r"^no C\+\+ compiler found \(looked for c\+\+, g\+\+, clang\+\+"):
        setup.build_library(package / "unused", package / "unused")
    assert not (package / "unused").exists()


def test_core_wheel_ships_the_template(tmp_path):
    """The template is package data of llaisys-core: a built wheel (not only this source tree) holds it."""
    import zipfile

    core = tmp_path / "llaisys-core"  # a copy: the build leaves build/ behind, and stale files there would ship
    shutil.copytree(Path(__file__).resolve().parents[2] / "llaisys-core", core,  # this checkout's, not site-packages
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path), str(core)], check=True, capture_output=True)
    wheel = next(tmp_path.glob("llaisys_core-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    template = {f"llaisys/templates/backend/{p.as_posix()}" for p in new_backend.template_files()}
    assert template <= names, sorted(template - names)
    assert "llaisys/new_backend.py" in names

