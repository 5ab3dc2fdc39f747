"""The CPU backend on AArch64, tested on this (x86-64) machine: the library cross-built with Debian's
g++-aarch64-linux-gnu (setup.py's compile_library, CXX=aarch64-linux-gnu-g++), and its ops run under qemu's
user-mode emulation (qemu-aarch64-static, Debian's qemu-user-static) for each ARM SIMD level: ``-cpu cortex-a53``
(Advanced SIMD only: the neon build), ``-cpu neoverse-n1`` (+ sdot: the dotprod build), ``-cpu max`` (every
feature qemu emulates, SVE, bf16 and i8mm included: the dotprod build, its bf16 linears on bfdot, FEAT_BF16's
pair dot products, picked at run time from AT_HWCAP2 as AVX512-BF16 is on x86-64; once more with
LLAISYS_CPU_LINEAR_BF16DOT=0, its f32 chain).

A C++ driver (aarch64_driver/driver.cpp, cross-compiled too) loads the library twice through its C ABI: one copy
pinned to the portable build as the reference, one at the level the emulated CPU reports; it runs every op with a
SIMD path on random inputs, f32 / f16 / bf16, odd sizes, and compares (and a few ops against float64 references);
it also runs the shared-memory collectives between two processes (fork) and the thread team (OMP_NUM_THREADS=2).
No ARM hardware runs any of this: the emulation checks the instructions' results (and that no instruction above
the CPU's level runs: qemu raises SIGILL for one the -cpu lacks), not speed, memory ordering on a weakly ordered
machine (qemu runs the guest's atomics on the host's), or macOS.

The slow tests skip, saying why, without the cross compiler or qemu (`apt-get install g++-aarch64-linux-gnu
qemu-user-static`). The build is cached in the temporary directory (compile_library rebuilds only what changed).
"""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SETUP = REPO / "llaisys-backend-cpu" / "setup.py"
DRIVER_SOURCE = Path(__file__).resolve().parent / "aarch64_driver" / "driver.cpp"
CORE_INCLUDE = REPO / "llaisys-core" / "src" / "llaisys" / "include"
CROSS_CXX = "aarch64-linux-gnu-g++"
QEMU = "qemu-aarch64-static"
SYSROOT = Path("/usr/aarch64-linux-gnu")  # Debian's aarch64 glibc and libstdc++ (libc6-arm64-cross)
CACHE = Path(tempfile.gettempdir()) / "llaisys-backend-cpu-aarch64"

# (qemu -cpu model, the environment's settings) -> the level the library must pick there
RUNS = {("cortex-a53", ""): "neon", ("neoverse-n1", ""): "dotprod", ("max", ""): "dotprod",
        ("max", "LLAISYS_CPU_LINEAR_BF16DOT=0"): "dotprod", ("max", "LLAISYS_CPU_SIMD=neon"): "neon"}

BUILD = """
import importlib.util, sys
from pathlib import Path
spec = importlib.util.spec_from_file_location("llaisys_cpu_setup", sys.argv[1])
setup = importlib.util.module_from_spec(spec)
spec.loader.exec_module(setup)
assert setup.TARGET_ARCH == "aarch64", setup.TARGET_ARCH
setup.compile_library(Path(sys.argv[2]), Path(sys.argv[3]))
"""


def _tools_or_skip() -> None:
    missing = [tool for tool in (CROSS_CXX, QEMU) if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed (Debian: apt-get install g++-aarch64-linux-gnu "
                    "qemu-user-static): the AArch64 build is not tested here")
    if not (SYSROOT / "lib" / "ld-linux-aarch64.so.1").exists():
        pytest.skip(f"no aarch64 C library at {SYSROOT} (Debian's libc6-arm64-cross)")


@pytest.fixture(scope="module")
def aarch64():
    """(library, reference copy, driver), cross-built into CACHE."""
    _tools_or_skip()
    CACHE.mkdir(parents=True, exist_ok=True)
    lib_dir = CACHE / "lib"
    # warnings are errors: the sources are as clean for AArch64 as for x86-64
    env = {**os.environ, "CXX": CROSS_CXX, "LLAISYS_CPU_TARGET_ARCH": "aarch64", "LLAISYS_CPU_CXXFLAGS": "-Werror"}
    built = subprocess.run([sys.executable, "-c", BUILD, str(SETUP), str(lib_dir), str(CACHE / "objects")],
                           env=env, capture_output=True, text=True, timeout=3600)
    assert built.returncode == 0, f"the AArch64 cross build failed:\n{built.stderr[-6000:]}"
    library = lib_dir / "libllaisys_cpu.so"
    reference = lib_dir / "libllaisys_cpu_ref.so"  # another path: dlopen loads it as a second library
    shutil.copyfile(library, reference)
    driver = CACHE / "driver"
    sources = [DRIVER_SOURCE, CORE_INCLUDE / "llaisys" / "backend.h"]
    if not driver.exists() or driver.stat().st_mtime < max(p.stat().st_mtime for p in sources):
        subprocess.run([CROSS_CXX, "-O1", "-std=c++17", "-Wall", "-Wextra", "-Werror", f"-I{CORE_INCLUDE}",
                        str(DRIVER_SOURCE), "-o", str(driver), "-ldl", "-static-libstdc++", "-static-libgcc"],
                       check=True, timeout=600)
    return library, reference, driver


def _qemu(cpu: str, *args: str, env_extra: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "LLAISYS_CPU_SIMD"}
    env.update({"OMP_NUM_THREADS": "2", **(env_extra or {})})
    return subprocess.run([QEMU, "-cpu", cpu, "-L", str(SYSROOT), *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_the_cross_built_library_is_aarch64_and_exports_only_its_slots(aarch64):
    library, _, _ = aarch64
    header = library.read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == 183, "not an AArch64 ELF (EM_AARCH64)"
    nm = shutil.which("aarch64-linux-gnu-nm") or "nm"
    listing = subprocess.run([nm, "-D", "--defined-only", str(library)], check=True, capture_output=True,
                             text=True).stdout.split("\n")
    names = [line.split()[-1] for line in listing if len(line.split()) == 3]
    assert names and all(name.startswith("llaisys_cpu_") for name in names), [n for n in names if "llaisys" not in n]
    assert (library.parent / "libgomp.so.1").is_file()  # the cross compiler's runtime, beside it


@pytest.mark.slow
@pytest.mark.parametrize(("cpu", "setting"), list(RUNS), ids=[f"{c}-{s or 'best'}" for c, s in RUNS])
def test_every_op_matches_the_portable_build_under_emulation(aarch64, cpu, setting):
    library, reference, driver = aarch64
    level = RUNS[cpu, setting]
    run = _qemu(cpu, str(driver), str(library), str(reference), level,
                env_extra=dict([setting.split("=")]) if setting else None)
    lines = run.stdout.splitlines()
    failed = [line for line in lines if line.startswith("FAIL")]
    assert run.returncode == 0 and not failed, (f"-cpu {cpu}: exit status {run.returncode}\n" + "\n".join(failed[:20])
                                                + "\n" + "\n".join(lines[-1:]) + f"\n{run.stderr[-3000:]}")
    assert lines[0] == f"level {level}"
    summary = lines[-1]
    assert summary.startswith(f"summary: level {level} ") and summary.endswith(" 0 failed"), summary


SDOT_PROGRAM = r"""
#include <arm_neon.h>
#include <stdio.h>
int main(void) {
    volatile int8_t three = 3, minus_two = -2;
    int32x4_t r = vdotq_s32(vdupq_n_s32(1), vdupq_n_s8(three), vdupq_n_s8(minus_two));
    printf("%d\n", vgetq_lane_s32(r, 0));
    return 0;
}
"""


BFDOT_PROGRAM = r"""
#include <arm_neon.h>
#include <stdio.h>
#include <sys/auxv.h>
int main(void) {
    if (!(getauxval(AT_HWCAP2) & (1ul << 14))) return 3;  /* HWCAP2_BF16: what the library's dispatch reads */
    volatile uint32_t pair = 0x40003fc0u;  /* bf16 (1.5, 2.0) */
    float32x4_t r = vbfdotq_f32(vdupq_n_f32(1), vreinterpretq_bf16_u32(vdupq_n_u32(pair)),
                                vreinterpretq_bf16_u32(vdupq_n_u32(pair)));
    printf("%g\n", vgetq_lane_f32(r, 0));
    return 0;
}
"""


def _static(tmp_path, name: str, program: str, march: str) -> str:
    source, binary = tmp_path / f"{name}.c", tmp_path / name
    source.write_text(program)
    cc = CROSS_CXX.replace("g++", "gcc")
    subprocess.run([cc if shutil.which(cc) else CROSS_CXX, "-x", "c", "-O1", "-static", f"-march={march}",
                    str(source), "-o", str(binary)], check=True, timeout=300)
    return str(binary)


@pytest.mark.slow
def test_the_emulated_cpus_refuse_what_they_lack(tmp_path):
    """What makes the levels' runs mean something: qemu's cortex-a53 raises SIGILL on sdot (so the neon run above
    executed none), neoverse-n1 runs it; max has bfdot and says so in AT_HWCAP2 (so the max runs above took the
    bf16 pair path), neoverse-n1 says it has not; a static NEON program runs here at all."""
    _tools_or_skip()
    sdot = _static(tmp_path, "sdot", SDOT_PROGRAM, "armv8.2-a+dotprod")
    assert _qemu("neoverse-n1", sdot, timeout=60).stdout.strip() == "-23"  # 1 + 4 * (3 * -2)
    assert _qemu("cortex-a53", sdot, timeout=60).returncode in (-4, 128 + 4)  # SIGILL
    bfdot = _static(tmp_path, "bfdot", BFDOT_PROGRAM, "armv8.2-a+dotprod+bf16")
    assert _qemu("max", bfdot, timeout=60).stdout.strip() == "7.25"  # 1 + 1.5 * 1.5 + 2 * 2
    assert _qemu("neoverse-n1", bfdot, timeout=60).returncode == 3


@pytest.mark.slow
def test_llaisys_cpu_simd_names_the_arm_levels(aarch64):
    library, _, driver = aarch64

    def level(cpu: str, setting: str | None) -> tuple[str, list[str]]:
        run = _qemu(cpu, str(driver), "--level", str(library),
                    env_extra={"LLAISYS_CPU_SIMD": setting} if setting is not None else None, timeout=300)
        assert run.returncode == 0, run.stderr
        return run.stdout.strip(), [line for line in run.stderr.splitlines() if "LLAISYS_CPU_SIMD" in line]

    # lowered to any level silently; never raised above the CPU's: reported in one line, as on x86-64
    for setting, expected in [(None, "dotprod"), ("portable", "portable"), ("neon", "neon"), ("dotprod", "dotprod")]:
        assert level("max", setting) == (expected, []), setting
    assert level("cortex-a53", "dotprod") == \
        ("neon", ["llaisys-backend-cpu: LLAISYS_CPU_SIMD=dotprod: this CPU lacks it; using neon"])
    # an unknown name (an x86-64 level here) is reported once, naming this architecture's levels, and ignored
    got, warnings = level("neoverse-n1", "avx512")
    assert got == "dotprod"
    assert warnings == ["llaisys-backend-cpu: ignoring LLAISYS_CPU_SIMD=avx512 (valid: portable, neon, dotprod); "
                        "using dotprod"], warnings


# ---- fast: no cross compiler needed -------------------------------------------------------------------------------

def _load_setup(monkeypatch, **env: str):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    spec = importlib.util.spec_from_file_location("llaisys_cpu_setup_arch", SETUP)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # not as __main__: setup() itself does not run
    return module


def test_setup_picks_the_instruction_sets_of_the_target_architecture(monkeypatch):
    arm = _load_setup(monkeypatch, LLAISYS_CPU_TARGET_ARCH="arm64")
    assert arm.TARGET_ARCH == "aarch64" and list(arm.ISAS) == ["portable", "neon", "dotprod"]
    assert arm.ISAS["dotprod"] == ["-march=armv8.2-a+dotprod"]
    assert "-ffp-contract=off" in arm.ISAS["portable"]  # the portable arithmetic of x86-64: no fused products
    x86 = _load_setup(monkeypatch, LLAISYS_CPU_TARGET_ARCH="x86_64")
    assert list(x86.ISAS) == ["portable", "avx2", "avx512"] and x86.ISAS["portable"] == []
    with pytest.raises(SystemExit, match="riscv64"):
        _load_setup(monkeypatch, LLAISYS_CPU_TARGET_ARCH="riscv64")


def test_setup_reads_the_target_from_the_compiler(monkeypatch):
    if platform.machine() != "x86_64" or shutil.which("g++") is None:
        pytest.skip("reads g++ -dumpmachine on an x86-64 machine")
    monkeypatch.delenv("LLAISYS_CPU_TARGET_ARCH", raising=False)
    assert _load_setup(monkeypatch, CXX="g++").TARGET_ARCH == "x86_64"
    if shutil.which(CROSS_CXX):
        assert _load_setup(monkeypatch, CXX=CROSS_CXX).TARGET_ARCH == "aarch64"


def _simd_in_child(setting: str | None) -> subprocess.CompletedProcess:
    """The level the installed (x86-64) library picks in a fresh process with LLAISYS_CPU_SIMD=setting."""
    code = ("import ctypes, llaisys_backend_cpu as m; f = ctypes.CDLL(str(m.LIBRARY)).llaisys_cpu_simd_level; "
            "f.restype = ctypes.c_char_p; print(f().decode())")
    env = {k: v for k, v in os.environ.items() if k != "LLAISYS_CPU_SIMD"}
    if setting is not None:
        env["LLAISYS_CPU_SIMD"] = setting
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          check=True)


def test_arm_level_names_on_x86_are_reported_once_and_ignored():
    pytest.importorskip("llaisys_backend_cpu")
    if platform.machine() != "x86_64":
        pytest.skip("the x86-64 library's answer to ARM names")
    best = _simd_in_child(None).stdout.strip()
    for name in ("neon", "dotprod"):
        run = _simd_in_child(name)
        warnings = [line for line in run.stderr.splitlines() if "LLAISYS_CPU_SIMD" in line]
        assert warnings == [f"llaisys-backend-cpu: ignoring LLAISYS_CPU_SIMD={name} (valid: portable, avx2, avx512); "
                            f"using {best}"], run.stderr
        assert run.stdout.strip() == best
