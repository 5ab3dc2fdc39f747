"""``llaisys bench --model M``: a model's prefill and decode rates over a grid of settings, as llama-bench measures.

    llaisys bench --model Qwen/Qwen2.5-0.5B-Instruct --prompt-tokens 128,512 --new-tokens 128 \\
        --quantize none,int8 --threads 4,8 --output json --output-file base.json
    llaisys bench --model Qwen/Qwen2.5-0.5B-Instruct ... --compare base.json   # exit 1 on a >10% slowdown

Tests, each a row per combination of the axes (--device, --dtype, --quantize, --threads, --speculative):
``ppN``, the prefill of N random token ids (a fresh prompt every run, so the prefix cache reuses nothing), N /
its time; ``tgN``, N greedy decode steps after a 1-token prompt (``eos_token_ids=()``: none stops early), N /
their time. One warm-up run, then the mean and stdev over --repetitions runs. A tg row also shows the
memory-bandwidth bound: a decode step reads every weight matrix (and the KV cache) once, so it cannot run faster
than a copy's bandwidth on that device (``llaisys.ops.rearrange`` of 256 MiB, measured just before and after the
row, the higher reading) / those bytes.

The CPU backend sizes its thread team from OMP_NUM_THREADS once, when it loads: each --threads value therefore
runs in a child process of its own (``python -m llaisys_models.bench.model SPEC``), which sends its rows back as
JSON lines. Without --threads everything runs in this process, with the threads it has.
"""

from __future__ import annotations

import datetime
import itertools
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from . import report
from .bandwidth import copy_bandwidth, decode_bytes
from .compare import compare, read_baseline

if TYPE_CHECKING:  # (the model's classes are imported when measuring)
    import argparse

    from ..engine.speculative.config import Speculation
    from ..families.causal_lm import CausalLM

DEFAULT_PROMPT_TOKENS = 512  # llama-bench's -p
DEFAULT_NEW_TOKENS = 128  # llama-bench's -n
DEFAULT_REPETITIONS = 5  # llama-bench's -r
PROMPT_SEED = 1234
DTYPES = ("float32", "float16", "bfloat16", "f32", "f16", "bf16")
QUANTIZE = ("none", "int8", "int4")
ROW_MARK = "@bench-row "  # a child's lines to its parent (anything else it prints is passed on)
ERROR_MARK = "@bench-error "


# -- arguments -----------------------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..cli.generate import MODEL_HELP

    parser.add_argument("--model", type=Path, default=None, metavar="PATH|ID", help=MODEL_HELP)
    parser.add_argument("--prompt-tokens", default=None, metavar="N[,N...]",
                        help=f"prefill sizes, a test ppN each (default: {DEFAULT_PROMPT_TOKENS}, halved until it fits "
                             f"the model's context)")
    parser.add_argument("--new-tokens", default=None, metavar="N[,N...]",
                        help=f"decode lengths, a test tgN each (default: {DEFAULT_NEW_TOKENS}, halved until it fits "
                             f"the model's context)")
    parser.add_argument("--repetitions", type=int, default=DEFAULT_REPETITIONS, metavar="R",
                        help="measured runs per test, after one warm-up run (default: %(default)s)")
    parser.add_argument("--device", default=None, metavar="D[,D...]",
                        help="cpu, cuda, cuda:1, ... (default: the best available)")
    parser.add_argument("--dtype", default=None, metavar="T[,T...]",
                        help="compute dtypes: float32, float16, bfloat16 (default: the dtype the weights are stored in)")
    parser.add_argument("--quantize", default=None, metavar="Q[,Q...]",
                        help="none, int8, int4: the linears' weights quantized at load time (default: none)")
    parser.add_argument("--threads", default=None, metavar="N[,N...]",
                        help="CPU threads (OMP_NUM_THREADS), each value in a process of its own (default: this "
                             "process's, from OMP_NUM_THREADS or the cores it may use)")
    parser.add_argument("--speculative", default=None, metavar="S[,S...]",
                        help="off, ngram, draft:PATH: speculative decoding in the tg tests (default: off)")
    parser.add_argument("--output", choices=report.FORMATS, default="table",
                        help="the final rendering: json (what --compare reads), csv, md; table: only the rows "
                             "printed as they complete (default: table)")
    parser.add_argument("--output-file", type=Path, default=None, metavar="FILE",
                        help="where --output goes (default: stdout; the table then goes to stderr)")
    parser.add_argument("--compare", type=Path, default=None, metavar="BASELINE.json",
                        help="the JSON of an earlier run: print each row's rate against it; exit status 1 when "
                             "any row is slower by more than --tolerance")
    parser.add_argument("--tolerance", type=float, default=0.1,
                        help="--compare: the slowdown allowed, a fraction (default: %(default)s)")
    parser.add_argument("--trace", type=Path, default=None, metavar="FILE",
                        help="write a Chrome/Perfetto trace of one extra (unmeasured) run of each test, to FILE "
                             "with the row's name before its suffix (t.json -> t.cpu_0-float32-none-4-off-pp512.json)")


def _numbers(text: str | None, flag: str, default: list[int] | None = None, low: int = 1) -> list[int] | None:
    """A comma-separated list of whole numbers >= low (None: ``default``)."""
    from llaisys import LlaisysValueError

    if text is None:
        return default
    values = []
    for item in text.split(","):
        if not item.strip().isdigit() or int(item) < low:
            raise LlaisysValueError(f"{flag} {text!r}: expected whole numbers >= {low} separated by commas, "
                                    f"got {item.strip()!r}")
        values.append(int(item))
    return values


def _names(text: str | None, flag: str, allowed: Sequence[str] | None = None) -> Sequence[str | None]:
    """A comma-separated list of names, each one of ``allowed`` (when given); None: [None] (the default)."""
    from llaisys import LlaisysValueError

    if text is None:
        return [None]
    values = [item.strip() for item in text.split(",")]
    for value in values:
        if not value or (allowed and value not in allowed and not (flag == "--speculative"
                                                                    and value.startswith("draft:") and value[6:])):
            raise LlaisysValueError(f"{flag} {text!r}: {value!r} is not one of {', '.join(allowed)}" if allowed
                                    else f"{flag} {text!r}: an empty name")
    return values


def _plan(args: argparse.Namespace) -> dict[str, Any]:
    """The run the flags ask for, checked before anything loads (a typo fails at once). JSON-able: a child
    process gets it as is."""
    from llaisys import LlaisysValueError

    from ..cli.generate import model_dir

    if args.repetitions < 1:
        raise LlaisysValueError(f"--repetitions {args.repetitions}: must be at least 1")
    if not 0 <= args.tolerance < 1:
        raise LlaisysValueError(f"--tolerance {args.tolerance}: must be a fraction in [0, 1)")
    quantize = _names(args.quantize, "--quantize", QUANTIZE)
    return {
        "model": str(model_dir(args)),
        "name": args.model.name if args.model is not None else "demo",
        "prompt_tokens": _numbers(args.prompt_tokens, "--prompt-tokens"),  # None: the default, fitted to the model
        "new_tokens": _numbers(args.new_tokens, "--new-tokens"),
        "repetitions": args.repetitions,
        "devices": _names(args.device, "--device"),
        "dtypes": _names(args.dtype, "--dtype", DTYPES),
        "quantize": [None if q == "none" else q for q in quantize],
        "speculative": [s or "off" for s in _names(args.speculative, "--speculative", ("off", "ngram", "draft:PATH"))],
        "threads": _numbers(args.threads, "--threads"),
        "trace": None if args.trace is None else _trace_file(args.trace),
    }


def _trace_file(path: Path) -> str:
    """--trace FILE, its folder checked now (not after the first test ran)."""
    from llaisys import LlaisysValueError

    if not path.parent.is_dir():
        raise LlaisysValueError(f"--trace {path}: the folder {path.parent} does not exist")
    return str(path.resolve())  # (a child process may run elsewhere: the same file)


def _command_line(args: argparse.Namespace) -> str:
    """The command as run, every setting spelled out (the meta of the JSON output)."""
    parts = ["llaisys", "bench"]
    for name in ("model", "prompt_tokens", "new_tokens", "repetitions", "device", "dtype", "quantize", "threads",
                 "speculative", "output", "output_file", "compare", "tolerance", "trace"):
        value = getattr(args, name)
        if value is not None:
            parts += ["--" + name.replace("_", "-"), str(value)]
    return shlex.join(parts)


# -- the run ---------------------------------------------------------------------------------------------------

def run(args: argparse.Namespace) -> int:
    from llaisys import LlaisysError

    plan = _plan(args)
    baseline = read_baseline(args.compare) if args.compare is not None else None  # unreadable: fails before work
    final_to_stdout = args.output != "table" and args.output_file is None
    printer = TablePrinter(plan, sys.stderr if final_to_stdout else sys.stdout)
    rows: list[dict[str, Any]] = []
    failure = None
    try:
        for row in _all_rows(plan):
            rows.append(row)
            printer.print(row)
    except LlaisysError as e:  # the rows measured so far are still written
        failure = e
    finally:  # (Ctrl-C too)
        if args.output != "table":
            _write(report.render(rows, args.output, _meta(args)), args.output_file)
    if failure is not None:
        raise failure
    if baseline is None:
        return 0
    return compare(rows, baseline, args.tolerance, sys.stderr if final_to_stdout else sys.stdout)


def _all_rows(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every row, in order: in this process, or one child process per --threads value."""
    if plan["threads"] is None:
        yield from measure(plan, _own_threads())
        return
    for threads in plan["threads"]:
        yield from _child_rows(plan, threads)


def _own_threads() -> int:
    """The CPU backend's team size in this process (omp_get_max_threads(): OMP_NUM_THREADS, else the cores)."""
    text = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(text) if text.isdigit() and int(text) > 0 else len(os.sched_getaffinity(0))


def _child_rows(plan: dict[str, Any], threads: int) -> Iterator[dict[str, Any]]:
    """The rows of ``plan`` measured by a child process with ``threads`` CPU threads, as they come."""
    from llaisys import LlaisysValueError

    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    child = subprocess.Popen([sys.executable, "-m", "llaisys_models.bench.model", json.dumps(plan), str(threads)],
                             stdout=subprocess.PIPE, text=True, env=env)
    assert child.stdout is not None  # (stdout=PIPE)
    error = None
    try:
        for line in child.stdout:
            if line.startswith(ROW_MARK):
                yield json.loads(line[len(ROW_MARK):])
            elif line.startswith(ERROR_MARK):
                error = line[len(ERROR_MARK):].strip()
            else:
                sys.stderr.write(line)
    finally:
        if child.poll() is None and error is None:
            child.terminate()  # (the parent stopped early: Ctrl-C, or its consumer went away)
        status = child.wait()
    if error is not None:
        raise LlaisysValueError(error)
    if status != 0:
        raise LlaisysValueError(f"the bench process for --threads {threads} failed (exit status {status}; its "
                                f"error is above)")


def _child_main(argv: list[str]) -> int:
    """``python -m llaisys_models.bench.model PLAN THREADS``: the rows, one JSON line each, on stdout."""
    from llaisys import LlaisysError

    plan, threads = json.loads(argv[0]), int(argv[1])
    try:
        for row in measure(plan, threads):
            print(ROW_MARK + json.dumps(row), flush=True)
    except LlaisysError as e:
        print(ERROR_MARK + str(e).replace("\n", " "), flush=True)
        return 2
    except KeyboardInterrupt:  # (Ctrl-C reaches the whole process group: the parent says it)
        return 130
    return 0


# -- measuring -------------------------------------------------------------------------------------------------

def measure(plan: dict[str, Any], threads: int) -> Iterator[dict[str, Any]]:
    """Yield a row per (device, dtype, quantize, speculative, test) of ``plan``, the model loaded once per
    (device, dtype, quantize)."""
    for device, dtype, quantize in itertools.product(plan["devices"], plan["dtypes"], plan["quantize"]):
        model = _load(plan["model"], device, dtype, quantize)
        tests = _tests(plan, model.context_length)
        rng = np.random.default_rng(PROMPT_SEED)  # one stream for the whole model: no prompt is drawn twice
        for speculative in plan["speculative"]:
            speculation = _speculation(speculative, model)
            for test, n in tests:
                row = {"model": plan["name"], "device": str(model.device), "dtype": model.dtype.name,
                       "quantize": quantize or "none", "threads": threads, "speculative": speculative,
                       "test": f"{test}{n}"}
                _check_fits(model, test, n)
                rates = _rates(model, test, n, plan["repetitions"], rng, speculation, plan["trace"], row)
                yield {**row, **rates}
        del model  # (its memory back before the next one loads)


def _load(path: str, device: str | None, dtype: str | None, quantize: str | None) -> CausalLM:
    import llaisys_models

    t0 = time.perf_counter()
    model = llaisys_models.load(path, device=device, dtype=dtype, quantize=quantize, progress=False)
    print(f"bench: loaded {path} on {model.device} as {model.dtype.name}"
          f"{' ' + quantize if quantize else ''} in {time.perf_counter() - t0:.2f}s", file=sys.stderr, flush=True)
    return model


def _tests(plan: dict[str, Any], context: int) -> list[tuple[str, int]]:
    """[("pp", N), ..., ("tg", N), ...]: the sizes given, or the defaults halved until they fit ``context``."""
    def sizes(given: list[int] | None, default: int, extra: int) -> list[int]:
        if given is not None:
            return given
        while default + extra > context and default > 1:
            default //= 2
        return [default]
    return ([("pp", n) for n in sizes(plan["prompt_tokens"], DEFAULT_PROMPT_TOKENS, 1)]
            + [("tg", n) for n in sizes(plan["new_tokens"], DEFAULT_NEW_TOKENS, 2)])


def _check_fits(model: CausalLM, test: str, n: int) -> None:
    from llaisys import LlaisysValueError

    positions = n + 1 if test == "pp" else n + 2  # pp: N + the first new token; tg: 1 + the first + N steps
    if positions > model.context_length:
        flag = "--prompt-tokens" if test == "pp" else "--new-tokens"
        raise LlaisysValueError(f"{flag} {n}: {test}{n} needs {positions} positions and the model's context holds "
                                f"{model.context_length}")


def _speculation(method: str, model: CausalLM) -> Speculation | None:
    import argparse

    from ..cli import speculative_flags as flags

    return flags.from_arguments(argparse.Namespace(speculative=method, num_speculative_tokens=None), model)[0]


def _run_once(model: CausalLM, test: str, n: int, rng: np.random.Generator, speculation: Speculation | None) -> float:
    """One run of the test: its tokens per second."""
    vocab = model.config.vocab_size
    if test == "pp":
        model.generate(rng.integers(0, vocab, size=n).tolist(), 1, eos_token_ids=())
        s = model.last_stats
        assert s is not None  # (generate sets it)
        return s.prompt_tokens / s.prefill_seconds  # (prompt_tokens: the prompt less any cached prefix)
    model.generate(rng.integers(0, vocab, size=1).tolist(), n + 1, eos_token_ids=(), speculative=speculation)
    s = model.last_stats
    assert s is not None
    return s.decode_tokens_per_second  # n steps after the first token


def _rates(model: CausalLM, test: str, n: int, repetitions: int, rng: np.random.Generator,
           speculation: Speculation | None, trace: str | None, row: dict[str, Any]) -> dict[str, float | None]:
    """tokens_per_s and stdev over ``repetitions`` runs after a warm-up; for tg the bandwidth bound too."""
    _run_once(model, test, n, rng, speculation)  # warm-up: pool growth, decode graphs, caches
    before = copy_bandwidth(model.device) if test == "tg" else None
    rates = [_run_once(model, test, n, rng, speculation) for _ in range(repetitions)]
    mean = statistics.fmean(rates)
    result: dict[str, float | None] = {"tokens_per_s": mean,
                                       "stdev": statistics.stdev(rates) if len(rates) > 1 else 0.0,
                                       "bound_tokens_per_s": None, "pct_of_bound": None}
    if before is not None:  # (a tg test)
        bandwidth = max(before, copy_bandwidth(model.device))  # (a VM's bandwidth drifts: the higher reading)
        bound = bandwidth / decode_bytes(model, n)
        result["bound_tokens_per_s"] = bound
        result["pct_of_bound"] = 100 * mean / bound
    if trace is not None:  # one more run, traced (the profiler's timing slows it: not measured)
        import llaisys

        with llaisys.profile(trace=trace_path(trace, row)):
            _run_once(model, test, n, rng, speculation)
    return result


def trace_path(trace: str, row: dict[str, Any]) -> str:
    """--trace FILE with the row's name before its suffix: t.json -> t.cpu_0-float32-none-4-off-pp512.json."""
    path = Path(trace)
    name = "-".join(str(row[k]) for k in ("device", "dtype", "quantize", "threads", "speculative", "test"))
    return str(path.with_name(f"{path.stem}.{name.replace(':', '_')}{path.suffix or '.json'}"))


# -- output ----------------------------------------------------------------------------------------------------

class TablePrinter:
    """The table, a row at a time as each completes, through report.render: the cells padded to widths known
    from the plan, so the rows line up without waiting for the last one."""

    NUMBER_WIDTH = 9  # report's cells: 4 significant digits, or one decimal from 1000 on

    def __init__(self, plan: dict[str, Any], stream: TextIO) -> None:
        self.stream, self.header = stream, True
        self.text = {"model": len(plan["name"]), "device": 7, "dtype": 8, "quantize": 4,
                     "speculative": max(len(s) for s in plan["speculative"]), "test": 6}  # widths, left-aligned

    def print(self, row: dict[str, Any]) -> None:
        cells = {}
        for column, value in row.items():
            text = report.cell(value)
            width = max(len(column), self.text.get(column, 3 if column == "threads" else self.NUMBER_WIDTH))
            cells[column] = text.ljust(width) if column in self.text else text.rjust(width)  # numbers: right
        lines = report.render([cells], "table").splitlines(keepends=True)
        self.stream.write("".join(lines if self.header else lines[1:]))
        self.stream.flush()
        self.header = False


def _write(text: str, path: Path | None) -> None:
    from llaisys import LlaisysValueError

    if path is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        path.write_text(text)
    except OSError as e:
        raise LlaisysValueError(f"--output-file {path}: {e.strerror or e}") from None


def _meta(args: argparse.Namespace) -> dict[str, Any]:
    import llaisys

    from .. import __version__ as models_version

    return {"command": _command_line(args), "llaisys": llaisys.__version__, "llaisys_models": models_version,
            "cpu": _cpu_model(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()




if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
