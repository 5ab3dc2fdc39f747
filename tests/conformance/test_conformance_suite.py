"""The conformance suite on this repository's own backends: every case passes on every available device (the
CPU backend here; the CUDA backend where a GPU is present; ops a backend lacks are skipped, naming them), and
the suite covers every op slot of backend.h in every floating dtype."""

from __future__ import annotations

import pytest

import llaisys
import llaisys.testing
from llaisys.abi import OP_SLOTS

CASES = llaisys.testing.cases()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_case(device, case):
    case.run(device)


def test_every_op_slot_in_every_floating_dtype_and_layout_class():
    ops = {c.op for c in CASES}
    assert ops == set(OP_SLOTS) and len(ops) == 32
    for op in OP_SLOTS:
        dtypes = {c.dtype for c in CASES if c.op == op}
        assert {llaisys.float32, llaisys.float16, llaisys.bfloat16} <= dtypes, op
        layouts = {c.layout for c in CASES if c.op == op}
        # (these ops' outputs and inputs differ in dtype: no view of one buffer can make them overlap)
        assert "aliasing refused" in layouts or op in ("sample", "mask_logits", "embedding_q"), op
        assert layouts & {"odd shape", "property"}, op
    assert {c.op for c in CASES if c.layout == "strided"} == {"rearrange"}
    assert {c.op for c in CASES if c.layout == "batch-invariant"} == {
        "linear", "linear_i8", "linear_q", "linear_gq", "moe_linear", "moe_linear_i8", "moe_linear_q", "paged_attention",
        "lora_shrink", "lora_expand", "paged_attention_q", "paged_latent_attention"}
    assert len({c.id for c in CASES}) == len(CASES), "case ids must be unique (pytest ids, report lines)"


def test_check_backend_on_cpu_is_ok_and_prints_the_table():
    report = llaisys.testing.check_backend("cpu")
    assert report.ok, report.details()
    lines = report.table().splitlines()
    assert lines[0].split() == ["op", "f32", "f16", "bf16", "i8", "i64"]
    assert [line.split()[0] for line in lines[1:]] == list(OP_SLOTS)  # backend.h's order
    for line in lines[1:]:
        cells = line.split()[1:]
        assert cells[0::2][:3] == ["pass"] * 3, line  # "pass N" in f32, f16 and bf16
    assert report.summary().endswith(": ok")


def test_selection_by_name():
    assert {c.op for c in llaisys.testing.cases("add, rope")} == {"add", "rope"}
    assert {c.dtype for c in llaisys.testing.cases(dtypes="bf16,float16")} == {llaisys.bfloat16, llaisys.float16}
    assert {c.dtype for c in llaisys.testing.cases("rearrange", [llaisys.int8])} == {llaisys.int8}
    with pytest.raises(llaisys.LlaisysValueError, match=r"unknown op 'nosuch'; the ops are add, argmax, "):
        llaisys.testing.cases("add,nosuch")
    with pytest.raises(llaisys.LlaisysValueError, match=r"unknown dtype 'f8'; the suite's dtypes are f32, f16, bf16"):
        llaisys.testing.cases(dtypes="f8")
    with pytest.raises(llaisys.BackendUnavailableError, match="No llaisys backend provides 'nosuch'"):
        llaisys.testing.check_backend("nosuch")
