"""The CPU backend's build (llaisys-backend-cpu/setup.py) says what it compiles and how far it is, one line per
object on stderr, compiles in parallel and goes through ccache where it is installed. Driven here with a stand-in
compiler (every object an empty one, the link a real g++ link), so it takes seconds, not minutes."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SETUP = Path(__file__).parents[3] / "llaisys-backend-cpu" / "setup.py"
FAKE_CXX = """#!{python}
import os, shutil, subprocess, sys
args = sys.argv[1:]
if "-c" in args:  # a compile: the empty object stands in for the source's
    shutil.copy({empty!r}, args[args.index("-o") + 1])
else:  # the link, for real
    sys.exit(subprocess.run(["g++", *args]).returncode)
"""
FAKE_CCACHE = """#!/bin/sh
echo "$@" >> {log}
exec "$@"
"""


@pytest.fixture
def build(tmp_path, monkeypatch):
    """build() -> stderr of compile_library into tmp_path, with the stand-in compiler."""
    if shutil.which("g++") is None or shutil.which("nm") is None:
        pytest.skip("g++ and nm are needed to link the stand-in objects")
    empty = tmp_path / "empty.o"
    (tmp_path / "empty.cpp").write_text("")
    subprocess.run(["g++", "-c", "-fPIC", str(tmp_path / "empty.cpp"), "-o", str(empty)], check=True)
    cxx = tmp_path / "fake-cxx"
    cxx.write_text(FAKE_CXX.format(python=sys.executable, empty=str(empty)))
    cxx.chmod(0o755)
    monkeypatch.setenv("CXX", str(cxx))
    monkeypatch.setenv("LLAISYS_BUILD_JOBS", "2")
    monkeypatch.delenv("LLAISYS_CCACHE", raising=False)
    spec = importlib.util.spec_from_file_location("llaisys_cpu_setup", SETUP)
    setup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup)  # not as __main__: setup() itself does not run

    def run(capfd) -> str:
        capfd.readouterr()
        setup.compile_library(tmp_path / "out", tmp_path / "objects")
        assert (tmp_path / "out" / setup.LIBRARY).is_file()
        return capfd.readouterr().err

    run.units = len(setup.units(tmp_path / "objects"))
    return run


def test_the_build_reports_each_object_and_how_long_is_left(build, capfd, monkeypatch):
    monkeypatch.setenv("LLAISYS_CCACHE", "0")  # without ccache, installed or not (a stand-in one in the next test)
    err = build(capfd)
    n = build.units
    assert re.search(rf"^llaisys-backend-cpu: compiling {n} of {n} objects .* with 2 parallel jobs: about \d+ s",
                     err, re.M), err
    progress = re.findall(r"^llaisys-backend-cpu: \[(\d+)/(\d+)\] (\S+) \((portable|avx2|avx512|baseline)\) \d+ s",
                          err, re.M)
    assert [int(done) for done, *_ in progress] == list(range(1, n + 1)), err
    assert {total for _, total, *_ in progress} == {str(n)}
    assert "about" in err.splitlines()[2] and "left" in err.splitlines()[2]  # an estimate while objects remain
    assert "linking libllaisys_cpu.so" in err and "built libllaisys_cpu.so in" in err
    # nothing changed: nothing is compiled again
    again = build(capfd)
    assert "compiling" not in again and "[1/" not in again


def test_ccache_is_used_where_installed_and_rebuilds_nothing(build, capfd, monkeypatch, tmp_path):
    bin_dir, log = tmp_path / "bin", tmp_path / "ccache.log"
    bin_dir.mkdir()
    (bin_dir / "ccache").write_text(FAKE_CCACHE.format(log=log))
    (bin_dir / "ccache").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin:/bin")
    err = build(capfd)
    assert "parallel jobs through ccache" in err
    assert len(log.read_text().splitlines()) == build.units  # every compile went through it
    # without ccache, the objects stand: its presence is not part of a recorded command
    monkeypatch.setenv("LLAISYS_CCACHE", "0")
    assert "compiling" not in build(capfd)
