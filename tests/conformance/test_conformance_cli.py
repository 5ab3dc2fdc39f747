"""``llaisys check-backend``: the table on stdout, exit 0 when every case passes, 1 on a failure, and a one-line
error (exit 2) for an unknown op, dtype or device, or a device whose backend is not loaded."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers.wrong_kernels import add_one_ulp_off_in_f32
from llaisys.cli import main


def check_backend(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llaisys.cli", "check-backend", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=600)


def test_passing_run_prints_the_table_and_exits_0():
    run = check_backend("cpu", "--ops", "add,rms_norm", "--dtypes", "f32,bf16")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].split() == ["op", "f32", "bf16"]
    assert lines[1].split()[:3] == ["add", "pass", "10"] and lines[2].split()[0] == "rms_norm"
    assert any(line.startswith("cpu:0: ") and line.endswith(": ok") for line in lines)


@pytest.mark.parametrize("args,message", [
    (["nosuch"], "llaisys: error: No llaisys backend provides 'nosuch'. Installed: "),
    (["cpu", "--ops", "add,nosuch"], "llaisys: error: unknown op 'nosuch'; the ops are add, argmax, embedding, "),
    (["cpu", "--dtypes", "f8"], "llaisys: error: unknown dtype 'f8'; the suite's dtypes are f32, f16, bf16, i8, i64"),
    (["cpu:7"], "llaisys: error: device cpu:7 does not exist: backend 'cpu' (llaisys-backend-cpu) has 1 device(s)"),
], ids=["device", "op", "dtype", "index"])
def test_bad_names_are_one_line_errors(args, message):
    run = check_backend(*args)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.startswith(message) and run.stderr.count("\n") == 1, run.stderr


def test_a_backend_that_is_not_loaded_gets_the_registrys_reason():
    run = check_backend("cpu", env={"LLAISYS_BACKENDS": "none"})
    errors = [line for line in run.stderr.splitlines() if line.startswith("llaisys: error:")]
    assert run.returncode == 2 and errors == [
        "llaisys: error: the 'cpu' backend (llaisys-backend-cpu) is installed but disabled by LLAISYS_BACKENDS=none; "
        "add 'cpu' to LLAISYS_BACKENDS to use it"], run.stderr


def test_a_failure_exits_1_and_names_op_dtype_and_case(fake_backend, capsys):
    device = fake_backend("wrongcli", {"add": add_one_ulp_off_in_f32})
    assert main(["check-backend", device, "--ops", "add"]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[1].split()[:2] == ["add", "FAIL"]
    assert "  add f32 [odd shape 17]: c: 3 of 17 elements are not bit-exact; first at (3,): got " in out
    assert "FAILED (7 cases)" in out


def test_perf_times_each_op_against_the_cpu_backend():
    run = check_backend("cpu", "--ops", "add,argmax", "--dtypes", "bf16", "--perf")
    assert run.returncode == 0, run.stderr
    perf = run.stdout.split("time per call, best of several (--perf):\n")[1].splitlines()
    assert perf[0].split() == ["op", "shape", "(bf16)", "cpu:0", "ms", "cpu", "ms", "speedup", "vs", "cpu"]
    for row, op in zip(perf[1:], ("add", "argmax")):
        name, *_, device_ms, cpu_ms, speedup = row.split()
        assert name == op and float(device_ms) > 0 and float(cpu_ms) > 0 and speedup.endswith("x")
