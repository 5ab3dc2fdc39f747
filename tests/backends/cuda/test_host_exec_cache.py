"""The host-execution build's cache (host_exec/build.py): outside the clone, keyed so that a stale build is
never reused and a fresh clone of the same sources reuses it, bounded in size. Nothing is compiled here."""

import fcntl
import os
import shutil

import pytest
from host_exec import build as host_build


def test_the_cache_lies_outside_the_clone(monkeypatch, tmp_path):
    monkeypatch.delenv("LLAISYS_HOST_EXEC_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert host_build.cache_root() == tmp_path / "xdg" / "llaisys" / "host_exec"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert host_build.cache_root() == tmp_path / "home" / ".cache" / "llaisys" / "host_exec"
    monkeypatch.setenv("LLAISYS_HOST_EXEC_CACHE", str(tmp_path / "chosen"))
    assert host_build.cache_root() == tmp_path / "chosen"


@pytest.fixture
def clone(monkeypatch, tmp_path):
    """A second clone of the build's inputs, with build.py's paths pointing into it, and a stub compiler version."""
    version = {"text": "g++ (Debian 12.2.0) 12.2.0\n"}
    monkeypatch.setattr(host_build, "compiler_version", lambda cxx: version["text"])
    original = host_build.inputs_digest("g++", 32)
    root = tmp_path / "clone"
    for folder in (host_build.CSRC, host_build.CORE_INCLUDE, host_build.HERE):
        shutil.copytree(folder, root / folder.relative_to(host_build.REPO), ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("CSRC", "CORE_INCLUDE", "HERE"):
        monkeypatch.setattr(host_build, name, root / getattr(host_build, name).relative_to(host_build.REPO))
    monkeypatch.setattr(host_build, "REPO", root)
    return original, root, version


def test_the_key_is_the_same_in_another_clone_and_changes_with_every_input(clone):
    original, root, version = clone
    assert host_build.inputs_digest("g++", 32) == original
    assert host_build.inputs_digest("g++", 64) != original  # another warp size, another build
    assert host_build.inputs_digest("clang++", 32) != original  # another compiler command
    version["text"] = "g++ (Debian 13.1.0) 13.1.0\n"
    assert host_build.inputs_digest("g++", 32) != original  # the same command, another compiler
    version["text"] = "g++ (Debian 12.2.0) 12.2.0\n"
    header = root / "tests" / "backends" / "cuda" / "host_exec" / "llaisys_host_exec.h"
    header.write_bytes(header.read_bytes() + b"\n")
    assert host_build.inputs_digest("g++", 32) != original  # one byte of one header


def test_prune_keeps_the_builds_used_last_and_any_being_built(tmp_path):
    for age, name in enumerate(["new", "old", "older", "busy"]):
        library = tmp_path / name / host_build.LIBRARY
        library.parent.mkdir()
        library.write_bytes(b"")
        os.utime(library, (1e9 - age, 1e9 - age))
    with open(tmp_path / "busy" / ".lock", "w") as busy:
        fcntl.flock(busy, fcntl.LOCK_EX)  # another build holds it
        host_build.prune(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy", "new", "old"]
