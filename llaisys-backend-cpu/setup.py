"""Builds csrc/ into src/llaisys_backend_cpu/libllaisys_cpu.so (a plain C ABI, no CPython).

Every op source in csrc/ops/ is compiled once per instruction set of ISAS, the sets of the target architecture
(ISAS_BY_ARCH: on x86-64 portable = baseline x86-64, avx2, avx512; on AArch64 portable = armv8-a without fused
products, neon, dotprod), with -DLLAISYS_ISA=<name> and that set's flags: its kernels land in namespace
llaisys::cpu::<name>, so the builds share no symbol and the library picks one at run time (the exported
entry points are compiled with the portable build). The rest (csrc/common, csrc/copy_ops, runtime.cpp, streams.cpp) is
compiled once, for the architecture's baseline. Every object of the other sets is then checked to define code only
in its own namespace: any other function it defined (an inline helper, a std:: template) could be the copy the
linker keeps for the portable path too, and crash CPUs without that instruction set.
The target architecture is LLAISYS_CPU_TARGET_ARCH (x86_64 or aarch64; amd64 / arm64 also accepted) or else the
compiler's (`$CXX -dumpmachine`), so a cross compiler builds for its target: CXX=aarch64-linux-gnu-g++ builds the
AArch64 library on an x86-64 machine (its objects are checked with aarch64-linux-gnu-nm where installed), and a
wheel built so is tagged linux_aarch64.
Exports are named llaisys_cpu_<slot> (LLAISYS_PREFIX); the slots come from llaisys-core's
llaisys/backend.h, found in the monorepo beside this package, in csrc/include (an sdist's copy)
or through an installed llaisys-core (llaisys.get_include()). Only those names are exported (a version
script keeps static libstdc++ and every other symbol local). The compiler's libgomp.so.1 is copied beside
the library, which finds it through RUNPATH $ORIGIN (see OPENMP_RUNTIME).
Environment: CXX (default g++), LLAISYS_CPU_TARGET_ARCH, LLAISYS_CPU_CXXFLAGS (extra flags, e.g. -Werror),
LLAISYS_BUILD_JOBS (parallel compiles; default: every core this process may use), LLAISYS_CCACHE=0 (do not
compile through ccache where it is installed; the objects are the same either way).
Progress goes to stderr, one line per object (pip shows it with -v; without, only its own "Building wheel").
"""

import os
import platform
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
ISAS_BY_ARCH = {
    "x86_64": {
        "portable": [],
        "avx2": ["-mavx2", "-mfma", "-mf16c"],
        "avx512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx2", "-mfma", "-mf16c"],
    },
    # NEON (Advanced SIMD) is part of armv8-a: the portable build keeps x86-64's portable arithmetic (no fused
    # a * b + c, which GCC would otherwise contract into fmla) and is the reference the others are tested against.
    # neon: every AArch64 CPU; dotprod: sdot for the int8 / block linears (armv8.2-a's FEAT_DotProd, Cortex-A55 /
    # A76 and later, Neoverse, Graviton 2+, Apple M1+). See csrc/common/cpu_features.h.
    "aarch64": {
        "portable": ["-march=armv8-a", "-ffp-contract=off"],
        "neon": ["-march=armv8-a"],
        "dotprod": ["-march=armv8.2-a+dotprod"],
    },
}
ARCH_ALIASES = {"x86_64": "x86_64", "amd64": "x86_64", "x64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}


def compiler() -> list[str]:
    return shlex.split(os.environ.get("CXX", "g++"))


def target_arch() -> str:
    """x86_64 or aarch64: LLAISYS_CPU_TARGET_ARCH, else what the compiler builds for, else this machine."""
    named = os.environ.get("LLAISYS_CPU_TARGET_ARCH", "").strip()
    if named:
        if named.lower() not in ARCH_ALIASES:
            sys.exit(f"llaisys-backend-cpu: LLAISYS_CPU_TARGET_ARCH={named} is not one of {', '.join(ISAS_BY_ARCH)}")
        return ARCH_ALIASES[named.lower()]
    try:
        machine = subprocess.run([*compiler(), "-dumpmachine"], capture_output=True, text=True,
                                 timeout=60).stdout.strip().split("-")[0]
    except (OSError, subprocess.SubprocessError):
        machine = ""
    machine = machine or platform.machine()
    if machine.lower() not in ARCH_ALIASES:
        sys.exit(f"llaisys-backend-cpu: cannot build for {machine!r}: the kernels have instruction sets for "
                 f"{', '.join(ISAS_BY_ARCH)} (set LLAISYS_CPU_TARGET_ARCH if the compiler was misread)")
    return ARCH_ALIASES[machine.lower()]


TARGET_ARCH = target_arch()
ISAS = ISAS_BY_ARCH[TARGET_ARCH]
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


def nm_tool() -> str:
    """nm for the target's objects: in a cross build, the cross binutils' <triple>-nm (the triple as the compiler
    names it to -dumpmachine, e.g. aarch64-linux-gnu) where installed; else nm."""
    if TARGET_ARCH != ARCH_ALIASES.get(platform.machine().lower()):
        try:
            triple = subprocess.run([*compiler(), "-dumpmachine"], capture_output=True, text=True,
                                    timeout=60).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            triple = ""
        if triple and (found := shutil.which(f"{triple}-nm")):
            return found
    return "nm"


def foreign_code(unit: Unit, nm: str = "nm") -> list[str]:
    """Functions an object of a non-portable set defines outside namespace llaisys::cpu::<isa>."""
    own = re.compile(rf"_Z(?:T[WH])?Z*N[rVKRO]*7llaisys3cpu{len(unit.isa)}{unit.isa}")
    listing = subprocess.run([nm, "--defined-only", "-P", str(unit.obj)], check=True, capture_output=True,
                             text=True).stdout
    code = (line.split()[0] for line in listing.splitlines() if line.split()[1] in ("T", "W", "i"))
    return [name for name in code if not own.match(name)]


def compile_library(out_dir: Path, build_dir: Path) -> Path:
    cxx = compiler()
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
    nm = nm_tool()
    for unit in todo:
        if unit.isa and unit.isa != "portable" and (foreign := foreign_code(unit, nm)):
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
            objects = ROOT / "build" / ("objects" if TARGET_ARCH == "x86_64" else f"objects-{TARGET_ARCH}")
            compile_library(Path(self.build_lib) / "llaisys_backend_cpu", objects)
            if self.editable_mode:  # editable installs load the library from the source tree
                compile_library(ROOT / "src" / "llaisys_backend_cpu", objects)
        except Exception as e:
            # setuptools runs a custom build_py of an editable install "safely": it would print a warning
            # and go on with a stale or missing library. A failed build must fail the install.
            raise SystemExit(f"llaisys-backend-cpu: the library did not build: {e}") from e


class PlatformWheel(bdist_wheel):
    """The library uses no CPython API: one wheel per platform serves every Python 3. A cross build (the target
    architecture is not this machine's) is tagged for the target: linux_aarch64 from an x86-64 Linux machine."""

    def get_tag(self):
        _, _, plat = super().get_tag()
        host = ARCH_ALIASES.get(platform.machine().lower())
        if host and host != TARGET_ARCH and plat.endswith(platform.machine()):
            plat = plat[: -len(platform.machine())] + TARGET_ARCH
        return "py3", "none", plat


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


if __name__ == "__main__":  # as setuptools runs it; a test imports the module to drive compile_library
    setup(cmdclass={"build_py": BuildWithLibrary, "bdist_wheel": PlatformWheel}, distclass=BinaryDistribution)
