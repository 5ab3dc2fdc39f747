"""The CPU plugin's OpenMP defaults: set while the library loads, never over the user's."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from llaisys_backend_cpu.plugin import OPENMP_DEFAULTS, OPENMP_KNOBS

CHILD = "import os, llaisys; llaisys.available_devices(); print('left', [k for k in {knobs!r} if k in os.environ])"


def openmp_settings(**env) -> tuple[dict[str, str], str]:
    """(the settings the OpenMP runtime started with, as it displays them; what the child printed)."""
    environ = {k: v for k, v in os.environ.items() if k not in OPENMP_KNOBS} | env | {"OMP_DISPLAY_ENV": "verbose"}
    proc = subprocess.run([sys.executable, "-c", CHILD.format(knobs=OPENMP_KNOBS)], capture_output=True, text=True,
                          env=environ, timeout=120)
    assert proc.returncode == 0, proc.stderr
    shown = {}
    for line in (proc.stdout + proc.stderr).splitlines():
        name, eq, value = line.strip().partition(" = ")
        if eq and name in OPENMP_KNOBS:
            shown[name] = value.strip("'")
    if not shown:
        pytest.skip("the OpenMP runtime does not display its settings (not GNU libgomp)")
    return shown, proc.stdout


def test_defaults_apply_when_the_user_set_none():
    shown, out = openmp_settings()
    for knob, value in OPENMP_DEFAULTS.items():
        assert shown[knob] == value.upper(), (knob, shown)
    assert "left []" in out, "the defaults stayed in the environment (child processes would inherit them)"


@pytest.mark.parametrize("knob, value", [("OMP_WAIT_POLICY", "active"), ("GOMP_SPINCOUNT", "12345")])
def test_the_users_setting_wins(knob, value):
    shown, out = openmp_settings(**{knob: value})
    assert shown[knob] == value.upper(), shown  # (and with GOMP_SPINCOUNT set, no policy is forced on top)
    assert f"left ['{knob}']" in out
