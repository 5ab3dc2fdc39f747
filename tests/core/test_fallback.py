"""Partial backends: an op whose slot a backend lacks runs on the CPU backend, with the CPU's bits.

The backend is tests/fake_backends/native/partial_backend.c (add and embedding only; partial_backend.py),
built twice: host-addressable (the CPU kernels run in place, after a stream synchronize) and not (the
fallback copies each op's buffers to the host and back; the library refuses a copy outside an allocation).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import partial_backend
import pytest

import llaisys
from llaisys import abi, ops, plugins
from llaisys.cli import main
from llaisys.transfer import capture

REPO = Path(__file__).resolve().parents[2]
D2H, H2D = abi.MemcpyKind.D2H, abi.MemcpyKind.H2D


@pytest.fixture(params=[True, False], ids=["host-addressable", "device-memory"])
def partial(request, partial_libraries, monkeypatch):
    """The process registry: the installed backends and device "partial" (add and embedding native)."""
    monkeypatch.delenv("LLAISYS_FALLBACK", raising=False)
    library = partial_libraries[request.param]
    saved = partial_backend.use(partial_backend.registry_with(library))
    copies, syncs = partial_backend.counters(library)
    yield SimpleNamespace(host=request.param, library=library, copies=copies, syncs=syncs)
    partial_backend.use(saved)


def both(array: np.ndarray):
    """The same values on the cpu and on the partial device."""
    return llaisys.from_numpy(array), llaisys.from_numpy(array, "partial")


def bf16(*shape, seed=0):
    import ml_dtypes

    return np.random.default_rng(seed).standard_normal(shape).astype(ml_dtypes.bfloat16)


def test_capabilities_say_what_runs_where(partial):
    caps = llaisys.capabilities("partial:0")
    assert set(caps) == set(abi.OP_SLOTS)
    assert {op for op, where in caps.items() if where == "native"} == set(partial_backend.NATIVE_OPS)
    assert {where for op, where in caps.items() if op not in partial_backend.NATIVE_OPS} == {"fallback"}
    assert set(llaisys.capabilities("cpu").values()) == {"native"}
    assert ops.implemented("linear", "partial") and ops.implemented("add", "partial")
    with pytest.raises(llaisys.BackendUnavailableError, match="device partial:1 does not exist"):
        llaisys.capabilities("partial:1")


def test_a_missing_op_gives_the_cpu_backends_bits(partial):
    """rms_norm, linear, swiglu and rope run by the fallback give exactly what they give on the cpu; in place
    (out is x) too; native add and fallback ops mix in one sequence."""
    x_c, x_p = both(bf16(5, 64))
    w_c, w_p = both(bf16(64, seed=1))
    lw_c, lw_p = both(bf16(48, 64, seed=2))
    results = []
    for device, x, w, lw in (("cpu", x_c, w_c, lw_c), ("partial", x_p, w_p, lw_p)):
        normed = llaisys.empty((5, 64), llaisys.bfloat16, device)
        ops.rms_norm(normed, x, w, 1e-6)
        out = llaisys.empty((5, 48), llaisys.bfloat16, device)
        ops.linear(out, normed, lw)
        ops.add(out, out, out)  # native on partial
        gate, up = out.slice(1, 0, 24).contiguous(), out.slice(1, 24, 48).contiguous()
        ops.swiglu(gate, gate, up)  # in place
        ops.rms_norm(x, x, w, 1e-6)  # in place
        results.append((gate.numpy(), x.numpy()))
    for cpu, fell_back in zip(*results):
        assert cpu.tobytes() == fell_back.tobytes()
    if partial.host:
        assert partial.copies(D2H) == partial.copies(H2D) == 0  # in place: no copies at all
        assert partial.syncs() > 0  # but the op's stream drained first
    else:
        assert partial.copies(D2H) > 0 and partial.copies(H2D) > 0


def test_strided_views_and_offsets_fall_back_whole(partial):
    """rearrange (a strided copy, its bytes from shape and strides) of a permuted slice at an offset."""
    base = np.arange(4 * 6 * 5, dtype=np.float32).reshape(4, 6, 5)
    t = llaisys.from_numpy(base, "partial").slice(1, 2, 5).permute(2, 0, 1)
    np.testing.assert_array_equal(t.contiguous().numpy(), base[:, 2:5].transpose(2, 0, 1))


def test_a_kernel_error_on_the_cpu_names_the_op_and_the_backend(partial):
    logits = llaisys.from_numpy(np.zeros(8, np.float32), "partial")
    ids = llaisys.from_numpy(np.array([3, 2], np.int64), "partial")  # not increasing: the kernel refuses
    counts = llaisys.from_numpy(np.ones((2, 2), np.int64), "partial")
    with pytest.raises(llaisys.LlaisysValueError, match=r"op 'penalize_logits' of the 'partial' backend, run on "
                                                        r"the cpu backend") as e:
        ops.penalize_logits(logits, ids, counts, repetition_penalty=2.0)
    assert "\n" not in str(e.value)
    assert not logits.numpy().any()  # nothing written back


def test_strict_mode_refuses_a_missing_op_naming_it_and_the_backend(partial, monkeypatch):
    monkeypatch.setenv("LLAISYS_FALLBACK", "0")
    ops.clear_plans()  # kernels are resolved once: forget the ones resolved before
    x = llaisys.from_numpy(np.ones((2, 8), np.float32), "partial")
    w = llaisys.from_numpy(np.ones(8, np.float32), "partial")
    with pytest.raises(llaisys.NotSupportedError) as e:
        ops.rms_norm(x, x, w, 1e-6)
    message = str(e.value)
    assert "op 'rms_norm' is not implemented by the 'partial' backend (llaisys-backend-partial)" in message
    assert "LLAISYS_FALLBACK=0" in message and "\n" not in message
    ops.add(x, x, x)  # native ops still run
    assert llaisys.capabilities("partial")["rms_norm"] == "unavailable"
    assert llaisys.capabilities("partial")["add"] == "native"
    assert not ops.implemented("rms_norm", "partial")


def test_a_bad_fallback_setting_is_one_clear_error(partial, monkeypatch):
    monkeypatch.setenv("LLAISYS_FALLBACK", "maybe")
    ops.clear_plans()
    with pytest.raises(llaisys.LlaisysValueError, match=r"LLAISYS_FALLBACK='maybe': expected 1 .* or 0"):
        llaisys.capabilities("partial")
    with pytest.raises(llaisys.LlaisysValueError, match="LLAISYS_FALLBACK"):  # not a quiet "not implemented"
        ops.implemented("linear", "partial")


def test_without_a_cpu_backend_a_missing_op_is_unavailable(partial_libraries, monkeypatch):
    monkeypatch.delenv("LLAISYS_FALLBACK", raising=False)
    saved = partial_backend.use(partial_backend.registry_with(partial_libraries[True], installed=False))
    try:
        caps = llaisys.capabilities("partial")
        assert caps["add"] == "native" and caps["linear"] == "unavailable"
        x = llaisys.from_numpy(np.ones((2, 8), np.float32), "partial")
        with pytest.raises(llaisys.NotSupportedError, match="no cpu backend is loaded to run it instead"):
            ops.rms_norm(x, x, llaisys.from_numpy(np.ones(8, np.float32), "partial"), 1e-6)
    finally:
        partial_backend.use(saved)


def test_the_profiler_shows_fallback_ops_and_their_copies(partial):
    x = llaisys.from_numpy(np.ones((2, 8), np.float32), "partial")
    w = llaisys.from_numpy(np.ones(8, np.float32), "partial")
    ops.rms_norm(x, x, w, 1e-6)  # (resolved outside the block too: the block resolves its own, timed)
    with llaisys.profile() as prof:
        ops.rms_norm(x, x, w, 1e-6)
        ops.add(x, x, x)
    copies = {"fallback copy to host": 1, "fallback copy to device": 1}
    assert dict(prof.calls) == {"rms_norm (cpu fallback)": 1, "add": 1, **({} if partial.host else copies)}
    assert "rms_norm (cpu fallback)" in prof.table()
    with llaisys.profile(shapes=True) as prof:
        ops.rms_norm(x, x, w, 1e-6)
    assert "rms_norm (cpu fallback) 2x8" in prof.calls
    ops.rms_norm(x, x, w, 1e-6)  # after the block: the plain fallback again
    assert plugins.registry().kernel_wrapper is None


def test_graphs_are_off_for_steps_with_fallback_ops(partial, monkeypatch):
    """A fallback synchronizes and copies on the host, which a graph cannot record: why_no_graphs names the
    ops that fall back, and a capture that meets one fails before the op does anything."""
    backend = plugins.registry().backend("partial")
    assert "cannot capture graphs" in llaisys.why_no_graphs("partial")
    plain = backend.supports
    monkeypatch.setattr(backend, "supports", lambda capability: capability == "graphs" or plain(capability))
    assert llaisys.why_no_graphs("partial", ["add", "embedding"]) == ""  # native ops only
    reason = llaisys.why_no_graphs("partial", ["add", "rms_norm", "linear"])
    assert "rms_norm, linear" in reason and "cpu" in reason
    assert llaisys.graphs_supported("partial") and not llaisys.graphs_supported("partial", ["rms_norm"])
    with pytest.raises(llaisys.LlaisysValueError, match="unknown op 'rms_nrom'; the op slots are add, "):
        llaisys.why_no_graphs("partial", ["rms_nrom"])
    x = llaisys.from_numpy(np.ones((2, 8), np.float32), "partial")
    w = llaisys.from_numpy(np.ones(8, np.float32), "partial")
    syncs = partial.syncs()
    capture.active = True  # as Graph.capture sets it
    try:
        with pytest.raises(llaisys.NotSupportedError, match="op 'rms_norm' runs on the cpu backend .* a graph cannot"):
            ops.rms_norm(x, x, w, 1e-6)
    finally:
        capture.active = False
    assert partial.syncs() == syncs  # refused before touching the stream


def test_llaisys_devices_lists_the_ops_that_fall_back(partial, capsys):
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    lines = {line.split(":")[0].strip(): line for line in out.split("\nops:\n")[1].splitlines()}
    assert lines["cpu"].strip() == f"cpu: all {len(abi.OP_SLOTS)} ops native"
    fallbacks = ", ".join(op for op in abi.OP_SLOTS if op not in partial_backend.NATIVE_OPS)
    assert lines["partial"].strip() == f"partial: native: 2 ops; falls back to cpu: {fallbacks}"


@pytest.mark.slow
@pytest.mark.parametrize("host", ["1", "0"], ids=["host-addressable", "device-memory"])
def test_every_op_test_passes_through_the_fallback(c_compiler, host):
    """tests/ops on the partial device: every op but add and embedding through the fallback, against the same
    references (outputs start as NaN, so a buffer copied back short shows; the device-memory build refuses
    a copy past an allocation, so one copied long fails). The command docs/backends.md shows (the device-memory
    build): PYTHONPATH=tests/core LLAISYS_PARTIAL_HOST=0 python -m pytest -p partial_backend tests/ops
    --backend=partial"""
    env = {**os.environ, "LLAISYS_PARTIAL_HOST": host, "LLAISYS_FALLBACK": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "partial_backend", "tests/ops", "--backend=partial",
                             "-q", "-x", "-m", "not slow", "-p", "no:cacheprovider"],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "failed" not in result.stdout
