"""``llaisys bench --model M``: rows per axis combination and test, outputs, --compare, --trace, bad input.

Runs on the demo model with tiny sizes; rates are only checked for being measured (positive, finite), never
against a wall-clock threshold. --compare's verdicts are checked on planted baselines.
"""

from __future__ import annotations

import csv
import inspect
import io
import json
import math

import pytest

import llaisys
from helpers.startup_imports import heavy_imports
from llaisys.cli import main

TINY = ["--prompt-tokens", "4", "--new-tokens", "2", "--repetitions", "1"]
AXES = ("model", "device", "dtype", "quantize", "threads", "speculative")


def bench(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main(["bench", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("llaisys: error:")]
    assert len(lines) == 1, err
    return lines[0]


def test_json_has_a_row_for_every_axis_combination_and_test(capsys, tmp_path, device):
    out_file = tmp_path / "bench.json"
    status, out, _ = bench(capsys, "--device", str(device), "--prompt-tokens", "4,8", "--new-tokens", "4",
                           "--repetitions", "2", "--dtype", "float32,bfloat16", "--speculative", "off,ngram",
                           "--output", "json", "--output-file", str(out_file))
    assert status == 0
    data = json.loads(out_file.read_text())
    rows = data["rows"]
    assert len(rows) == 2 * 2 * 3  # dtypes x speculative x (pp4, pp8, tg4)
    assert [r["test"] for r in rows[:3]] == ["pp4", "pp8", "tg4"]
    assert {(r["dtype"], r["speculative"], r["test"]) for r in rows} == {
        (d, s, t) for d in ("float32", "bfloat16") for s in ("off", "ngram") for t in ("pp4", "pp8", "tg4")}
    assert {r["model"] for r in rows} == {"demo"} and {r["quantize"] for r in rows} == {"none"}
    assert {r["device"] for r in rows} == {str(llaisys.as_device(device))}
    for r in rows:
        assert math.isfinite(r["tokens_per_s"]) and r["tokens_per_s"] > 0 and r["stdev"] >= 0
        if r["test"].startswith("tg"):
            assert r["bound_tokens_per_s"] > 0
            assert r["pct_of_bound"] == pytest.approx(100 * r["tokens_per_s"] / r["bound_tokens_per_s"])
        else:
            assert r["bound_tokens_per_s"] is None and r["pct_of_bound"] is None
    meta = data["meta"]
    assert meta["command"].startswith("llaisys bench") and "--dtype float32,bfloat16" in meta["command"]
    assert meta["llaisys"] == llaisys.__version__ and meta["cpu"] and meta["date"][:2] == "20"
    # the table, a line per row as it completed, one header
    lines = out.splitlines()
    assert lines[0].split()[:7] == list(AXES) + ["test"] and len(lines) == 1 + len(rows)
    assert len({len(line.rstrip()) for line in lines[1:] if "tg" in line}) == 1  # the rows line up


def test_csv_and_md_outputs_parse_and_the_table_goes_to_stderr(capsys):
    status, out, err = bench(capsys, *TINY, "--quantize", "none,int8", "--output", "csv")
    assert status == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [(r["quantize"], r["test"]) for r in rows] == [("none", "pp4"), ("none", "tg2"), ("int8", "pp4"),
                                                          ("int8", "tg2")]
    assert float(rows[1]["tokens_per_s"]) > 0 and rows[0]["pct_of_bound"] == "-"
    assert "tokens_per_s" in err  # the table went to stderr, out is the CSV alone
    status, out, _ = bench(capsys, *TINY, "--output", "md")
    lines = out.splitlines()
    assert status == 0 and len(lines) == 4 and all(line.startswith("|") for line in lines)
    assert lines[0].split("|")[1].strip() == "model" and set(lines[1]) <= set("|-")


def test_compare_passes_on_its_own_baseline_and_names_a_planted_slowdown(capsys, tmp_path):
    baseline = tmp_path / "base.json"
    assert bench(capsys, *TINY, "--output", "json", "--output-file", str(baseline))[0] == 0
    # the same settings again: no row is 100x slower than its own earlier run
    status, out, _ = bench(capsys, *TINY, "--compare", str(baseline), "--tolerance", "0.99")
    assert status == 0 and "ratio" in out and "regression" not in out
    # a planted slowdown in one row (its baseline far faster), one row missing, one row extra
    data = json.loads(baseline.read_text())
    tg = next(r for r in data["rows"] if r["test"] == "tg2")
    tg["tokens_per_s"] *= 1000
    pp = next(r for r in data["rows"] if r["test"] == "pp4")
    data["rows"] = [tg, {**pp, "test": "pp99"}]
    baseline.write_text(json.dumps(data))
    status, out, _ = bench(capsys, *TINY, "--compare", str(baseline), "--tolerance", "0.99")
    assert status == 1
    regression = next(line for line in out.splitlines() if line.startswith("regression"))
    assert "tg2" in regression and "pp4" not in regression
    assert "not in the baseline: pp4" in out and "not measured now: pp99" in out


def test_compare_judges_each_row_by_its_ratio():
    from llaisys_models.bench.compare import compare, row_key

    row = {"model": "m", "device": "cpu:0", "dtype": "float32", "quantize": "none", "threads": 4,
           "speculative": "off", "test": "tg128", "tokens_per_s": 100.0}
    other = {**row, "test": "pp512", "tokens_per_s": 1000.0}
    out = io.StringIO()
    assert compare([row, other], {row_key(r): r for r in (row, other)}, 0.1, out) == 0
    planted = {**row, "tokens_per_s": 200.0}  # a 2x slowdown of tg128
    out = io.StringIO()
    assert compare([row, other], {row_key(planted): planted, row_key(other): other}, 0.1, out) == 1
    assert "tg128" in out.getvalue().splitlines()[-1] and "0.50x" in out.getvalue()
    near = {**row, "tokens_per_s": 105.0}  # within the tolerance
    assert compare([row], {row_key(near): near}, 0.1, io.StringIO()) == 0


@pytest.mark.parametrize("argv, says", [
    (["--prompt-tokens", "512,,x"], "--prompt-tokens '512,,x'"),
    (["--new-tokens", "0"], "--new-tokens '0'"),
    (["--quantize", "int3"], "'int3' is not one of none, int8, int4"),
    (["--dtype", "float8"], "'float8' is not one of"),
    (["--threads", "two"], "--threads 'two'"),
    (["--repetitions", "0"], "--repetitions 0"),
    (["--prompt-tokens", "1000"], "--prompt-tokens 1000: pp1000 needs 1001 positions and the model's context "
                                  "holds 256"),
    (["--compare", "/nonexistent/base.json"], "--compare /nonexistent/base.json: No such file"),
    (["--trace", "/nonexistent/t.json"], "--trace /nonexistent/t.json: the folder /nonexistent does not exist"),
    (["--speculative", "off,lookahead"], "'lookahead' is not one of off, ngram, draft:PATH"),
])
def test_bad_input_is_a_one_line_error(capsys, argv, says):
    status, _, err = bench(capsys, *TINY, *argv)
    assert status == 2
    assert says in error_line(err)


def test_a_compare_file_that_is_not_bench_json_is_a_one_line_error(capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    status, _, err = bench(capsys, *TINY, "--compare", str(bad))
    assert status == 2 and f"--compare {bad}: not the JSON output of llaisys bench" in error_line(err)


def test_rows_before_a_failing_grid_point_are_written(capsys, tmp_path):
    out_file = tmp_path / "partial.json"
    status, out, err = bench(capsys, "--prompt-tokens", "4,1000", "--new-tokens", "2", "--repetitions", "1",
                             "--output", "json", "--output-file", str(out_file))
    assert status == 2 and "--prompt-tokens 1000" in error_line(err)
    assert [r["test"] for r in json.loads(out_file.read_text())["rows"]] == ["pp4"]
    assert "pp4" in out  # printed as it completed


def test_each_threads_value_runs_in_a_process_of_its_own(capsys, tmp_path):
    out_file = tmp_path / "threads.json"
    status, _, _ = bench(capsys, *TINY, "--device", "cpu", "--threads", "1,2", "--output", "json",
                         "--output-file", str(out_file))
    assert status == 0
    rows = json.loads(out_file.read_text())["rows"]
    assert [(r["threads"], r["test"]) for r in rows] == [(1, "pp4"), (1, "tg2"), (2, "pp4"), (2, "tg2")]
    # a child's error: one line, its rows kept
    status, _, err = bench(capsys, "--prompt-tokens", "4,1000", "--new-tokens", "2", "--repetitions", "1",
                           "--device", "cpu", "--threads", "1", "--output", "json", "--output-file", str(out_file))
    assert status == 2 and "pp1000 needs 1001 positions" in error_line(err)
    assert [r["test"] for r in json.loads(out_file.read_text())["rows"]] == ["pp4"]


def test_decode_bytes_follow_the_weights_format():
    import llaisys_models
    from llaisys_models.bench.bandwidth import decode_bytes

    sizes = {q: decode_bytes(llaisys_models.load(llaisys_models.DEMO_MODEL_DIR, device="cpu", dtype="float32",
                                                 quantize=q, progress=False), 4) for q in (None, "int8")}
    bf16 = decode_bytes(llaisys_models.load(llaisys_models.DEMO_MODEL_DIR, device="cpu", dtype="bfloat16",
                                            progress=False), 4)
    assert sizes["int8"] < bf16 < sizes[None]
    assert bf16 == pytest.approx(sizes[None] / 2, rel=0.01)  # (the KV cache halves too)


def test_trace_writes_a_chrome_trace_per_row(capsys, tmp_path):
    if "trace" not in inspect.signature(llaisys.profile).parameters:
        pytest.skip("llaisys.profile(trace=path) is not in llaisys-core yet")
    status, _, _ = bench(capsys, *TINY, "--device", "cpu", "--trace", str(tmp_path / "t.json"))
    assert status == 0
    traces = sorted(tmp_path.glob("t.*.json"))
    assert [p.name.rsplit("-", 1)[-1] for p in traces] == ["pp4.json", "tg2.json"]
    for path in traces:
        data = json.loads(path.read_text())
        events = data["traceEvents"] if isinstance(data, dict) else data
        assert events and all("name" in e and "ph" in e for e in events)


def test_bench_imports_nothing_heavy():
    """No tokenizer, no transformers: the prompts are random token ids."""
    run = "cli('bench', '--prompt-tokens', '4', '--new-tokens', '2', '--repetitions', '1')"
    imported, out = heavy_imports("cli('bench', '--help')", run)
    assert imported["cli('bench', '--help')"] == [] and "--prompt-tokens" in out
    assert not set(imported[run]) & {"torch", "transformers", "tokenizers", "fastapi", "gguf"}
    assert "tg2" in out
