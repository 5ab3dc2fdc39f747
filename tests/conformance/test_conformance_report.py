"""The report's cells and lists for what is neither a pass nor a failure: a dtype or mode the backend answers
NOT_SUPPORTED for, an op it lacks; and the table's layout."""

from __future__ import annotations

import llaisys
import llaisys.testing

NOT_SUPPORTED = 4  # backend.h LLAISYS_NOT_SUPPORTED


def without_bf16(kernel):
    def f(device, stream, code, *args):
        return NOT_SUPPORTED if code == llaisys.bfloat16.code else kernel(device, stream, code, *args)
    return f


def without_hf_numerics(kernel):
    def f(device, stream, code, numerics, *args):
        return NOT_SUPPORTED if numerics == 1 else kernel(device, stream, code, numerics, *args)
    return f


def test_not_supported_dtypes_and_modes_are_listed_and_do_not_fail(fake_backend):
    device = fake_backend("choosy", native={"add": without_bf16, "rms_norm": without_hf_numerics})
    report = llaisys.testing.check_backend(device, ops="add,rms_norm")
    assert report.ok, report.details()
    assert report.cell("add", llaisys.float32) == "pass 10"
    assert report.cell("add", llaisys.bfloat16) == "unsupported"
    assert report.cell("rms_norm", llaisys.float16) == "partial 8/9"  # all but "numerics=hf"
    text = str(report)
    assert "not supported by the backend (NOT_SUPPORTED):\n" in text
    assert "  rms_norm f16 [contiguous numerics=hf 7x1536]: " in text
    assert "  add bf16 [odd shape 1]: " in text
    # (these stand-in kernels set no last_error: what follows the call's name is whatever the library's thread
    # reported last, "failed with status 4" only when nothing failed before it in this process)
    assert text.count("[contiguous numerics=hf 7x1536]: llaisys_cpu_rms_norm: ") == 3


def test_a_kernel_error_is_a_failure_with_its_message(fake_backend):
    def broken(kernel):
        return lambda *args: 2  # LLAISYS_RUNTIME_ERROR, whatever the arguments
    device = fake_backend("broken", native={"scale": broken})
    report = llaisys.testing.check_backend(device, ops="scale", dtypes="f16")
    assert not report.ok and report.cell("scale", llaisys.float16) == "FAIL (5/5)"
    assert report.failures[0].line().startswith("scale f16 [odd shape 1]: LlaisysError: llaisys_cpu_scale")
