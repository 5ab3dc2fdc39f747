"""Builds csrc/ into src/llaisys_backend_cpu/libllaisys_cpu.so (a plain C ABI, no CPython).

Every op source in csrc/ops/ is compiled once per instruction set of ISAS (portable = baseline x86-64,
avx2, avx512), with -DLLAISYS_ISA=<name> and that set's -m flags: its kernels land in namespace
llaisys::cpu::<name>, so the builds share no symbol and the library picks one at run time (the exported
entry points are compiled with the portable build). The rest (csrc/common, csrc/copy_ops, runtime.cpp, streams.cpp) is
compiled once, for baseline x86-64. Every avx2 / avx512 object is then checked to define code only in its
own namespace: any other function it defined (an inline helper, a std:: template) could be the copy the
linker keeps for the portable path too, and crash CPUs without that instruction set.
Exports are named llaisys_cpu_<slot> (LLAISYS_PREFIX); the slots come from llaisys-core's
llaisys/backend.h, found in the monorepo beside this package, in csrc/include (an sdist's copy)
or through an installed llaisys-core (llaisys.get_include()). Only those names are exported (a version
script keeps static libstdc++ and every other symbol local). The compiler's libgomp.so.1 is copied beside
the library, which finds it through RUNPATH $ORIGIN (see OPENMP_RUNTIME).
Environment: CXX (default g++), LLAISYS_CPU_CXXFLAGS (extra flags, e.g. -Werror),
LLAISYS_BUILD_JOBS (parallel compiles; default: every core this process may use), LLAISYS_CCACHE=0 (do not
compile through ccache where it is installed; the objects are the same either way).
Progress goes to stderr, one line per object (pip shows it with -v; without, only its own "Building wheel").
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

ROOT = Path(__file__).parent.resolve()
CSRC = ROOT / "csrc"
LIBRARY = "libllaisys_cpu.so"
PREFIX = "llaisys_cpu"
# CPU time to compile every object, measured with g++ 12 on a Zen 4 core (for the estimate printed).
CPU_SECONDS = 65


def core_include_dir() -> Path:
    """The folder holding llaisys/backend.h."""
    for candidate in (ROOT.parent / "llaisys-core" / "src" / "llaisys" / "include", CSRC / "include"):
        if (candidate / "llaisys" / "backend.h").is_file():
            return candidate
    try:
        import llaisys
        return Path(llaisys.get_include())
    except ImportError:
        sys.exit("llaisys-backend-cpu: cannot find llaisys/backend.h: build from the llaisys monorepo, "
                 "or install llaisys-core first")


BASE_FLAGS = ["-O3", "-std=c++17", "-fPIC", "-fopenmp", "-fvisibility=hidden", "-Wall", "-Wextra",
              "-Wmissing-declarations", "-fno-math-errno", "-falign-functions=32", "-falign-loops=32",
              f"-DLLAISYS_PREFIX={PREFIX}", f"-I{CSRC}", f"-I{core_include_dir()}"]
ISAS = {
    "portable": [],
    "avx2": ["-mavx2", "-mfma", "-mf16c"],
    "avx512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx2", "-mfma", "-mf16c"],
}
LINK_FLAGS = ["-shared", "-fopenmp", "-static-libstdc++", "-static-libgcc", "-Wl,--no-undefined",
              "-Wl,--enable-new-dtags", "-Wl,-rpath,$ORIGIN"]  # RUNPATH $ORIGIN: finds the libgomp.so.1 beside it
# GNU OpenMP's runtime, the one library the kernels need beyond glibc, is copied beside the library (a
# wheel then runs where libgomp is not installed) under its own name: torch's wheel ships its copy the
# same way, and the dynamic loader loads one library per name, so a process with both shares one runtime
# (the plugin's OMP_WAIT_POLICY default relies on that; auditwheel's renamed copy would be a second one).
OPENMP_RUNTIME = "libgomp.so.1"
# Export llaisys_cpu_* only: static libstdc++ and the std:: templates our code instantiates stay local.
VERSION_SCRIPT = f"{{ global: {PREFIX}_*; local: *; }};\n"


class Unit:
    """One compile: a source for one instruction set (isa None: compiled once, for the baseline)."""

    def __init__(self, source: Path, isa: str | None, build_dir: Path):
        self.source, self.isa = source, isa
        name = source.relative_to(CSRC).as_posix().replace("/", "__")
        self.obj = build_dir / (isa or "once") / (name + ".o")

    def command(self, cxx: list[str], extra: list[str]) -> list[str]:
        isa_flags = [f"-DLLAISYS_ISA={self.isa}", *ISAS[self.isa]] if self.isa else []
        return [*cxx, *BASE_FLAGS, *isa_flags, *extra, "-c", str(self.source), "-o", str(self.obj)]

    def up_to_date(self, command: list[str], headers_mtime: float) -> bool:
        """The object exists, is newer than its source and every header, and was built by this command."""
        recorded = self.obj.with_suffix(".cmd")
        return (self.obj.exists() and recorded.exists() and recorded.read_text() == shlex.join(command)
                and self.obj.stat().st_mtime > max(self.source.stat().st_mtime, headers_mtime))


def units(build_dir: Path) -> list[Unit]:
    per_isa = sorted((CSRC / "ops").glob("*.cpp"))
    once = sorted(p for p in CSRC.rglob("*.cpp") if p.parent != CSRC / "ops")
    return [Unit(s, isa, build_dir) for s in per_isa for isa in ISAS] + [Unit(s, None, build_dir) for s in once]


def build_jobs() -> int:
    if os.environ.get("LLAISYS_BUILD_JOBS"):
        return max(1, int(os.environ["LLAISYS_BUILD_JOBS"]))
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def launcher() -> list[str]:
    """ccache, where installed and not turned off (LLAISYS_CCACHE=0) or already in CXX: a rebuild of unchanged
    sources takes seconds. It is not part of an object's recorded command (its presence rebuilds nothing)."""
    cxx = shlex.split(os.environ.get("CXX", "g++"))
    if os.environ.get("LLAISYS_CCACHE") == "0" or any(Path(word).name == "ccache" for word in cxx):
        return []
    found = shutil.which("ccache")
    return [found] if found else []


def say(message: str) -> None:
    print(f"llaisys-backend-cpu: {message}", file=sys.stderr, flush=True)


def foreign_code(unit: Unit) -> list[str]:
    """Functions an avx2 / avx512 object defines outside namespace llaisys::cpu::<isa>."""
    own = re.compile(rf"_Z(?:T[WH])?Z*N[rVKRO]*7llaisys3cpu{len(unit.isa)}{unit.isa}")
    listing = subprocess.run(["nm", "--defined-only", "-P", str(unit.obj)], check=True, capture_output=True,
                             text=True).stdout
    code = (line.split()[0] for line in listing.splitlines() if line.split()[1] in ("T", "W", "i"))
    return [name for name in code if not own.match(name)]


def compile_library(out_dir: Path, build_dir: Path) -> Path:
    cxx = shlex.split(os.environ.get("CXX", "g++"))
    extra = shlex.split(os.environ.get("LLAISYS_CPU_CXXFLAGS", ""))
    todo = units(build_dir)
    headers = [*CSRC.rglob("*.h"), core_include_dir() / "llaisys" / "backend.h"]
    headers_mtime = max(p.stat().st_mtime for p in headers)
    stale = [u for u in todo if not u.up_to_date(u.command(cxx, extra), headers_mtime)]
    jobs = min(build_jobs(), max(1, len(stale)))
    cache = launcher()
    if stale:
        per_isa = len({u.source for u in todo if u.isa})
        seconds = CPU_SECONDS * len(stale) / len(todo) / jobs
        say(f"compiling {len(stale)} of {len(todo)} objects ({per_isa} op sources x {len(ISAS)} instruction sets "
            f"({', '.join(ISAS)}), the rest once) with {jobs} parallel jobs{' through ccache' if cache else ''}: "
            f"about {seconds:.0f} s on an idle machine, more on a busy one")
    start = time.monotonic()
    done = 0
    lock = threading.Lock()

    def compile_one(unit: Unit) -> None:
        nonlocal done
        unit.obj.parent.mkdir(parents=True, exist_ok=True)
        cmd = unit.command(cxx, extra)
        if subprocess.run([*cache, *cmd]).returncode != 0:
            raise RuntimeError(f"compiling {unit.source.relative_to(ROOT)} failed:\n{shlex.join(cmd)}")
        unit.obj.with_suffix(".cmd").write_text(shlex.join(cmd))
        with lock:  # one line per object: how far, and how long the rest should take at this pace
            done += 1
            elapsed = time.monotonic() - start
            left = f", about {elapsed / done * (len(stale) - done):.0f} s left" if done < len(stale) else ""
            say(f"[{done}/{len(stale)}] {unit.source.relative_to(CSRC)} ({unit.isa or 'baseline'}) "
                f"{elapsed:.0f} s{left}")

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(compile_one, stale))
    for unit in todo:
        if unit.isa and unit.isa != "portable" and (foreign := foreign_code(unit)):
            raise RuntimeError(f"{unit.obj.name} ({unit.isa}) defines code outside namespace llaisys::cpu::"
                               f"{unit.isa}, which the linker could pick for other instruction sets: "
                               f"{', '.join(foreign[:8])}")
    out_dir.mkdir(parents=True, exist_ok=True)
    library = out_dir / LIBRARY
    exports = build_dir / "exports.map"
    exports.write_text(VERSION_SCRIPT)
    cmd = [*cxx, *LINK_FLAGS, f"-Wl,--version-script={exports}", *extra, *(str(u.obj) for u in todo),
           "-o", str(library)]
    say(f"linking {library.name}")
    subprocess.run(cmd, check=True)
    bundle_openmp_runtime(cxx, out_dir)
    if stale:
        say(f"built {library.name} in {time.monotonic() - start:.0f} s")
    return library


def bundle_openmp_runtime(cxx: list[str], out_dir: Path) -> None:
    """Copy the compiler's OPENMP_RUNTIME (the one the library was linked against) into ``out_dir``."""
    found = subprocess.run([*cxx, f"-print-file-name={OPENMP_RUNTIME}"], check=True, capture_output=True,
                           text=True).stdout.strip()
    if not Path(found).is_absolute() or not Path(found).is_file():
        raise RuntimeError(f"{shlex.join(cxx)} does not know where its {OPENMP_RUNTIME} is (it said {found!r})")
    staged = out_dir / f".{OPENMP_RUNTIME}.tmp"  # replaced, not rewritten: a running process may map the old one
    shutil.copyfile(Path(found).resolve(), staged)
    os.replace(staged, out_dir / OPENMP_RUNTIME)


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        try:
            compile_library(Path(self.build_lib) / "llaisys_backend_cpu", ROOT / "build" / "objects")
            if self.editable_mode:  # editable installs load the library from the source tree
                compile_library(ROOT / "src" / "llaisys_backend_cpu", ROOT / "build" / "objects")
        except Exception as e:
            # setuptools runs a custom build_py of an editable install "safely": it would print a warning
            # and go on with a stale or missing library. A failed build must fail the install.
            raise SystemExit(f"llaisys-backend-cpu: the library did not build: {e}") from e


class PlatformWheel(bdist_wheel):
    """The library uses no CPython API: one wheel per platform serves every Python 3."""

    def get_tag(self):
        _, _, platform = super().get_tag()
        return "py3", "none", platform


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


if __name__ == "__main__":  # as setuptools runs it; a test imports the module to drive compile_library
    setup(cmdclass={"build_py": BuildWithLibrary, "bdist_wheel": PlatformWheel}, distclass=BinaryDistribution)
