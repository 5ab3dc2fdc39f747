"""The build of llaisys-backend-iluvatar, run by pip against a fake CoreX SDK: a stub bin/clang++ that records
its command line and writes a real (empty) object, then links with the host's cc, and stand-in libcudart /
libcublas in lib64. So pip runs the package's real PEP 517 backend and setup.py, and the test sees the exact
command lines a CoreX machine would run and the library's real RUNPATH.

What only a CoreX machine shows (that CoreX's clang accepts these lines and the code runs) is checked there
by nox -s "tests(backend='iluvatar')"; the sources' CoreX configuration is compiled by clang-22 in
tests/backends/cuda/test_clang_cuda.py."""

import json
import os
import runpy
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PACKAGE = REPO / "llaisys-backend-iluvatar"
CSRC = REPO / "llaisys-backend-cuda" / "csrc"
CORE_INCLUDE = REPO / "llaisys-core" / "src" / "llaisys" / "include"
VERSION = runpy.run_path(str(PACKAGE / "src" / "llaisys_backend_iluvatar" / "_version.py"))["__version__"]
SDK_LINE = "CoreX SDK not found: set COREX_HOME or install it at /usr/local/corex"

STUB_CLANG = """#!{python}
# A stand-in for CoreX's clang++: records the command line, then makes what it was asked for with the host cc:
# for a compile (-c) an object defining one slot and one foreign name, both weak and of default visibility (as
# the std:: template instances in the real objects are), the real link otherwise.
import json, subprocess, sys
from pathlib import Path
with open(Path(__file__).resolve().parent.parent / "calls.jsonl", "a") as log:
    log.write(json.dumps(sys.argv) + "\\n")
args = sys.argv[1:]
if "-c" in args:
    source = b"__attribute__((weak)) int llaisys_iluvatar_api_version(void) {{ return 2; }}\\n" \\
             b"__attribute__((weak)) int foreign_instance(void) {{ return 0; }}\\n"
    sys.exit(subprocess.run(["cc", "-c", "-x", "c", "-", "-o", args[args.index("-o") + 1]], input=source).returncode)
sys.exit(subprocess.run(["cc", *args]).returncode)
"""

pytestmark = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("readelf") is None,
                                reason="the fake CoreX SDK needs a host C compiler (cc) and readelf")


@pytest.fixture(scope="module")
def fake_sdk(tmp_path_factory) -> Path:
    sdk = tmp_path_factory.mktemp("corex")
    (sdk / "bin").mkdir()
    (sdk / "include").mkdir()
    (sdk / "lib64").mkdir()
    clang = sdk / "bin" / "clang++"
    clang.write_text(STUB_CLANG.format(python=sys.executable))
    clang.chmod(0o755)
    for name in ("libcudart.so", "libcublas.so"):
        subprocess.run(["cc", "-shared", "-x", "c", "/dev/null", "-o", str(sdk / "lib64" / name)], check=True)
    return sdk


def calls(sdk: Path) -> list[list[str]]:
    log = sdk / "calls.jsonl"
    lines = log.read_text().splitlines() if log.exists() else []
    log.unlink(missing_ok=True)
    return [json.loads(line) for line in lines]


def monorepo_copy(tmp_path: Path) -> Path:
    """This package as it sits in the monorepo (a copy, so the build's files stay out of the checkout), with
    the CUDA package and core beside it."""
    shutil.copytree(PACKAGE, tmp_path / PACKAGE.name,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "*.so"))
    for sibling in ("llaisys-backend-cuda", "llaisys-core"):
        (tmp_path / sibling).symlink_to(REPO / sibling, target_is_directory=True)
    return tmp_path / PACKAGE.name


def pip_wheel(source: Path, out: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("COREX_HOME", "LLAISYS_ILUVATAR_ARCH")}
    environ.update(env, PIP_DISABLE_PIP_VERSION_CHECK="1")
    return subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-cache-dir",
                           "-w", str(out), str(source)], capture_output=True, text=True, env=environ)


def expected_compile(sdk: Path, arch_flags: list[str], archs: str, source: Path, obj: Path, csrc: Path,
                     core_include: Path) -> list[str]:
    return [f"{sdk}/bin/clang++", "-x", "ivcore", "-std=c++17", *arch_flags, f"--cuda-path={sdk}", "-fPIC", "-O3",
            "-fvisibility=hidden", "-DLLAISYS_PREFIX=llaisys_iluvatar", f'-DLLAISYS_COREX_ARCHS="{archs}"',
            f"-I{csrc}", f"-I{core_include}", f"-I{sdk}/include", "-c", str(source), "-o", str(obj)]


def check_build(sdk: Path, root: Path, csrc: Path, core_include: Path, commands: list[list[str]],
                arch_flags: list[str], archs: str) -> None:
    """One compile per shared source, each exactly the CoreX command line, then exactly one link."""
    *compiles, link = commands
    objects_dir = root / "build" / "corex-objects"
    sources = sorted(csrc.rglob("*.cu"))
    assert sorted(cmd[cmd.index("-c") + 1] for cmd in compiles) == sorted(map(str, sources))
    for cmd in compiles:
        source = Path(cmd[cmd.index("-c") + 1])
        obj = objects_dir / (source.relative_to(csrc).as_posix().replace("/", "__") + ".o")
        assert cmd == expected_compile(sdk, arch_flags, archs, source, obj, csrc, core_include)
    objects = [cmd[-1] for cmd in compiles]
    exports_map = objects_dir / "exports.map"
    assert link[:7] == [f"{sdk}/bin/clang++", "-shared", "-fPIC", "-Wl,-z,defs", "-Wl,--enable-new-dtags",
                        f"-Wl,-rpath,{sdk}/lib64", f"-Wl,--version-script={exports_map}"]
    assert exports_map.read_text() == "{ global: llaisys_iluvatar_*; local: *; };\n"
    assert sorted(link[7:7 + len(objects)]) == sorted(objects)
    assert link[7 + len(objects):-1] == [f"-L{sdk}/lib64", "-lcudart", "-lcublas", "-ldl", "-lpthread", "-o"]
    assert link[-1].endswith("/llaisys_backend_iluvatar/libllaisys_iluvatar.so")
    for cmd in commands:  # whole-program device code: no relocatable device code, no device runtime
        assert not any("rdc" in arg or "cudadevrt" in arg for arg in cmd), cmd


def check_wheel(wheel_dir: Path, sdk: Path, tmp_path: Path) -> None:
    (wheel,) = wheel_dir.glob(f"llaisys_backend_iluvatar-{VERSION}-py3-none-linux_*.whl")
    dist_info = f"llaisys_backend_iluvatar-{VERSION}.dist-info/"
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        package_files = sorted(n for n in names if not n.startswith(dist_info))
        assert package_files == ["llaisys_backend_iluvatar/__init__.py",
                                 "llaisys_backend_iluvatar/_version.py",
                                 "llaisys_backend_iluvatar/libllaisys_iluvatar.so",
                                 "llaisys_backend_iluvatar/plugin.py"]
        assert f"\nVersion: {VERSION}\n" in zf.read(dist_info + "METADATA").decode()  # from _version.py
        entry_points = zf.read(dist_info + "entry_points.txt").decode()
        assert "[llaisys.backends]\niluvatar = llaisys_backend_iluvatar.plugin" in entry_points
        library = tmp_path / "libllaisys_iluvatar.so"
        library.write_bytes(zf.read("llaisys_backend_iluvatar/libllaisys_iluvatar.so"))
    dynamic = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True, check=True).stdout
    runpaths = [line.split("[", 1)[1].rstrip("]") for line in dynamic.splitlines() if "(RUNPATH)" in line]
    assert runpaths == [f"{sdk}/lib64"], dynamic  # RUNPATH (not RPATH): LD_LIBRARY_PATH can still override it
    assert "(RPATH)" not in dynamic
    symbols = subprocess.run(["readelf", "--dyn-syms", "-W", str(library)], capture_output=True, text=True,
                             check=True).stdout
    rows = [f for f in map(str.split, symbols.splitlines()) if len(f) >= 8 and f[0].rstrip(":").isdigit()]
    defined = {f[7] for f in rows if f[6] != "UND" and f[4] != "LOCAL"}  # Num Value Size Type Bind Vis Ndx Name
    assert defined == {"llaisys_iluvatar_api_version"}, "the version script exports the slots and nothing else"


def test_the_monorepo_build_runs_the_corex_command_lines(fake_sdk, tmp_path):
    root = monorepo_copy(tmp_path / "repo")
    calls(fake_sdk)
    result = pip_wheel(root, tmp_path / "wheel", COREX_HOME=str(fake_sdk))
    assert result.returncode == 0, result.stdout + result.stderr
    csrc = root.parent / "llaisys-backend-cuda" / "csrc"  # the CUDA package's sources, not a copy
    check_build(fake_sdk, root, csrc, root.parent / "llaisys-core" / "src" / "llaisys" / "include", calls(fake_sdk),
                ["--cuda-gpu-arch=ivcore20"], "ivcore20")
    check_wheel(tmp_path / "wheel", fake_sdk, tmp_path)
    assert not (root / "csrc").exists()  # git holds one copy of the sources


def test_the_sdist_carries_the_shared_sources_and_builds_alone(fake_sdk, tmp_path):
    root = monorepo_copy(tmp_path / "repo")
    hook = "import sys; sys.path.insert(0, 'build_backend'); import backend; print(backend.build_sdist(sys.argv[1]))"
    environ = {k: v for k, v in os.environ.items() if k != "COREX_HOME"}  # the sdist needs no SDK
    made = subprocess.run([sys.executable, "-c", hook, str(tmp_path / "dist")], cwd=root, capture_output=True,
                          text=True, env=environ)
    assert made.returncode == 0, made.stdout + made.stderr
    with tarfile.open(tmp_path / "dist" / made.stdout.split()[-1]) as tar:
        tar.extractall(tmp_path / "alone", filter="data")  # far from the monorepo: nothing beside it
    (unpacked,) = (tmp_path / "alone").iterdir()
    copied = unpacked / "csrc"
    assert sorted(p.relative_to(copied).as_posix() for p in copied.rglob("*") if p.is_file()) == sorted(
        [*(p.relative_to(CSRC).as_posix() for p in CSRC.rglob("*") if p.is_file()), "include/llaisys/backend.h"])
    for source in CSRC.rglob("*"):
        if source.is_file():
            assert (copied / source.relative_to(CSRC)).read_bytes() == source.read_bytes(), source
    header = Path("llaisys") / "backend.h"
    assert (copied / "include" / header).read_bytes() == (CORE_INCLUDE / header).read_bytes()

    calls(fake_sdk)
    result = pip_wheel(unpacked, tmp_path / "wheel", COREX_HOME=str(fake_sdk), LLAISYS_ILUVATAR_ARCH="ivcore11,ivcore20")
    assert result.returncode == 0, result.stdout + result.stderr
    check_build(fake_sdk, unpacked, copied, copied / "include", calls(fake_sdk),
                ["--cuda-gpu-arch=ivcore11", "--cuda-gpu-arch=ivcore20"], "ivcore11,ivcore20")
    check_wheel(tmp_path / "wheel", fake_sdk, tmp_path)


@pytest.mark.skipif(Path("/usr/local/corex").exists(), reason="a CoreX SDK is installed here at /usr/local/corex")
def test_without_the_sdk_pip_stops_at_once_with_one_line(fake_sdk, tmp_path):
    root = monorepo_copy(tmp_path / "repo")
    calls(fake_sdk)
    result = pip_wheel(root, tmp_path / "wheel")
    assert result.returncode != 0 and SDK_LINE in result.stdout + result.stderr
    assert not calls(fake_sdk) and not list((tmp_path / "wheel").glob("*.whl"))
    # what pip shows as the build backend's output: exactly that line, from the first hook pip calls
    for hook in ("get_requires_for_build_wheel()", "prepare_metadata_for_build_wheel('.')", "build_wheel('.')"):
        run = subprocess.run([sys.executable, "-c", f"import backend; backend.{hook}"], cwd=root / "build_backend",
                             capture_output=True, text=True, env={k: v for k, v in os.environ.items() if k != "COREX_HOME"})
        assert (run.returncode, run.stdout, run.stderr) == (1, "", SDK_LINE + "\n"), hook


def test_a_corex_home_without_the_compiler_is_named(tmp_path):
    root = monorepo_copy(tmp_path / "repo")
    run = subprocess.run([sys.executable, "-c", "import backend; backend.get_requires_for_build_wheel()"],
                         cwd=root / "build_backend", capture_output=True, text=True,
                         env=dict(os.environ, COREX_HOME=str(tmp_path / "nowhere")))
    assert run.returncode == 1 and run.stderr == (f"CoreX SDK not found: COREX_HOME={tmp_path / 'nowhere'} has no "
                                                  "bin/clang++ (set COREX_HOME to the SDK folder, or unset it to use "
                                                  "/usr/local/corex)\n")


def test_architecture_choice():
    sys.path.insert(0, str(PACKAGE / "build_backend"))
    from corex_toolchain import target_archs

    assert target_archs({}) == ["ivcore20"]
    assert target_archs({"LLAISYS_ILUVATAR_ARCH": "ivcore11"}) == ["ivcore11"]
    assert target_archs({"LLAISYS_ILUVATAR_ARCH": "ivcore10; ivcore20,ivcore10"}) == ["ivcore10", "ivcore20"]
    with pytest.raises(ValueError, match=r"'sm_80' is not a CoreX GPU architecture \(one of ivcore10, ivcore11, "
                                         r"ivcore20"):
        target_archs({"LLAISYS_ILUVATAR_ARCH": "sm_80"})
