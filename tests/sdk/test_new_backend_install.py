"""End to end: a backend made by `llaisys new-backend`, installed by pip, found by llaisys, running the demo model
and passing the conformance suite for its native ops.

Every shell command of the blocks of docs/backends.md marked `<!-- run by tests/sdk/test_new_backend_install.py -->`
and of the generated README.md is in DOC_COMMANDS (a fast test below checks that the two agree, reading the
fenced blocks with the docs test's parser, tests/helpers/doc_blocks.py), and each test runs its command from
there: the doc's words, with the device type demo_dev where the doc says mydev, plus only what keeps the test
apart from the environment it runs in. That is the install: `pip install` gets `--no-deps --target SITE`, a
folder of its own that the child processes have on PYTHONPATH, instead of the shared virtual environment, where
demo_dev would become every other test process's best device while it is there (and would stay if this process
died).

    llaisys new-backend mydev                                              the package fixture
    python -m pip install --no-build-isolation ./llaisys-backend-mydev     the env fixture (+ --no-deps --target)
    llaisys devices                                                        test_llaisys_devices_lists_it
    llaisys check-backend mydev                                            test_check_backend_passes_its_native_ops
    llaisys generate --device mydev --prompt "1234+5678="                  test_the_demo_model_runs_on_it
    LLAISYS_FALLBACK=0 llaisys generate ...                                test_the_demo_model_needs_the_fallback
    cd llaisys-backend-mydev; python -m pytest tests                       test_the_generated_tests_pass
    python -m pip wheel ... ; auditwheel repair ...                        test_the_wheel_builds_and_repairs

The doc's one Python block marked for this test is the generated tests/test_conformance.py (the fast test checks
that too), which test_the_generated_tests_pass runs.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from helpers.doc_blocks import Block, blocks
from helpers.doc_runner import SHELL_LANGS, raw_commands, split_env
from llaisys import new_backend

REPO = Path(__file__).resolve().parents[2]
NAME = "demo_dev"
NATIVE_OPS = ("add", "rms_norm", "linear")  # the template's kernels; every other op falls back to the cpu
OPS_SHOWN = (*NATIVE_OPS, "rope", "embedding")  # the rows of check-backend's table the tests read
BIN = Path(sys.executable).parent  # the environment's python, llaisys and (in nox sessions) auditwheel
WHEEL = "llaisys_backend_mydev-0.1.0-py3-none-linux_x86_64.whl"

THIS = Path(__file__).resolve().relative_to(REPO).as_posix()  # what the doc's `run by` markers name

# The shell commands of docs/backends.md (its blocks run by this test) and of the generated README.md, as they
# write them.
DOC_COMMANDS = [
    "llaisys new-backend mydev",
    "python -m pip install --no-build-isolation ./llaisys-backend-mydev",
    "llaisys devices",
    "llaisys check-backend mydev",
    'llaisys generate --device mydev --prompt "1234+5678="',
    'LLAISYS_FALLBACK=0 llaisys generate --device mydev --prompt "1234+5678="',
    "cd llaisys-backend-mydev",
    "python -m pytest tests",
    "python -m pip wheel --no-build-isolation --no-deps --wheel-dir dist ./llaisys-backend-mydev",
    f"auditwheel repair --wheel-dir wheelhouse dist/{WHEEL}",
]


def doc_command(text: str) -> list[str]:
    """A command of DOC_COMMANDS as this test runs it: for demo_dev, with this environment's executables (the
    VAR=value settings before it: ``doc_env``)."""
    assert text in DOC_COMMANDS, text
    words = split_env(shlex.split(text.replace("mydev", NAME)))[1]
    if words[0] == "python":
        return [sys.executable, *words[1:]]
    return [str(BIN / words[0]) if (BIN / words[0]).exists() else words[0], *words[1:]]


def doc_env(text: str) -> dict[str, str]:
    """The VAR=value settings a command of DOC_COMMANDS starts with."""
    assert text in DOC_COMMANDS, text
    return split_env(shlex.split(text))[0]


def run(command: list[str], cwd: Path, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, f"{result.args} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def shown_commands(found: list[Block]) -> set[str]:
    """The commands of the shell blocks among ``found``, as written (without trailing # comments)."""
    return {command for block in found if block.lang in SHELL_LANGS for command in raw_commands(block.text)}


def rendered(template: str, tmp_path: Path) -> Path:
    """A file of the package new-backend writes for mydev, rendered from its template into ``tmp_path``."""
    path = tmp_path / template.removesuffix(".tmpl")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new_backend.render((new_backend.TEMPLATE / template).read_text(),
                                       new_backend.substitutions("mydev")))
    return path


def test_every_command_the_docs_show_is_run_here(tmp_path):
    """The blocks of docs/backends.md marked `run by` this test and the README that new-backend writes (for mydev)
    show exactly DOC_COMMANDS; the doc's Python block marked so is the generated tests/test_conformance.py (fast)."""
    ours = [b for b in blocks(REPO / "docs" / "backends.md")[0] if b.run_by == THIS]
    readme = blocks(rendered("README.md.tmpl", tmp_path))[0]
    assert readme and all(b.lang in SHELL_LANGS for b in readme), [(b.where, b.lang) for b in readme]
    shown = shown_commands(ours) | shown_commands(readme)
    assert shown == set(DOC_COMMANDS), (sorted(shown - set(DOC_COMMANDS)), sorted(set(DOC_COMMANDS) - shown))
    python = [b for b in ours if b.lang == "python"]
    assert len(python) == 1 and len(ours) == len(python) + len([b for b in ours if b.lang in SHELL_LANGS]), \
        [(b.where, b.lang) for b in ours]
    assert python[0].text in rendered("tests/test_conformance.py.tmpl", tmp_path).read_text()


# -- the run (slow) ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("new_backend")


@pytest.fixture(scope="module")
def base_env() -> dict[str, str]:
    """The runner's environment without what would change the children's view."""
    drop = ("PYTHONPATH", "LLAISYS_BACKENDS", "LLAISYS_FALLBACK", "LLAISYS_NUMERICS")
    return {k: v for k, v in os.environ.items() if k not in drop}


@pytest.fixture(scope="module")
def package(work, base_env) -> Path:
    ok(run(doc_command("llaisys new-backend mydev"), work, base_env))
    return work / f"llaisys-backend-{NAME}"


@pytest.fixture(scope="module")
def env(package, work, base_env):
    """The environment of a process that has the package installed: pip built it into SITE."""
    site = work / "site"
    install = doc_command("python -m pip install --no-build-isolation ./llaisys-backend-mydev")
    try:
        ok(run([*install[:-1], "--no-deps", "--target", str(site), install[-1]], work, base_env))
        yield {**base_env, "PYTHONPATH": str(site)}
    finally:
        shutil.rmtree(site, ignore_errors=True)


@pytest.mark.slow
def test_the_install_has_the_library_and_the_entry_point(env):
    site = Path(env["PYTHONPATH"])
    assert (site / f"llaisys_backend_{NAME}" / f"libllaisys_{NAME}.so").is_file()
    (info,) = site.glob(f"llaisys_backend_{NAME}-*.dist-info")
    assert f"{NAME} = llaisys_backend_{NAME}.plugin" in (info / "entry_points.txt").read_text()


@pytest.mark.slow
def test_llaisys_devices_lists_it(env, work):
    out = ok(run(doc_command("llaisys devices"), work, env))
    rows = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert NAME in rows and "loaded" in rows[NAME] and f"llaisys-backend-{NAME}" in rows[NAME], out
    assert f"{NAME}:0" in out.split("available devices:")[1].splitlines()[0], out
    assert f"{NAME}: native: 3 ops; falls back to cpu:" in out, out  # where ops run (the fallback's listing)


@pytest.mark.slow
def test_the_ops_are_native_or_fall_back(env, work):
    code = ("import llaisys; c = llaisys.capabilities('demo_dev'); "
            "print(sorted(op for op, where in c.items() if where == 'native')); print(sorted(set(c.values())))")
    lines = ok(run([sys.executable, "-c", code], work, env)).splitlines()
    assert lines == ["['add', 'linear', 'rms_norm']", "['fallback', 'native']"]


@pytest.mark.slow
def test_the_demo_model_runs_on_it(env, work):
    out = ok(run(doc_command('llaisys generate --device mydev --prompt "1234+5678="'), work, env))
    assert out.split()[0] == "6912", out


@pytest.mark.slow
def test_the_demo_model_needs_the_fallback(env, work):
    """The run above went through demo_dev: without the CPU fallback (LLAISYS_FALLBACK=0) it is refused in one
    line that names ops the template lacks, and none of the three it has."""
    command = 'LLAISYS_FALLBACK=0 llaisys generate --device mydev --prompt "1234+5678="'
    result = run(doc_command(command), work, {**env, **doc_env(command)})
    err = result.stderr
    assert result.returncode != 0 and err.startswith("llaisys: error:") and err.count("\n") == 1, err
    assert "'demo_dev'" in err and "embedding" in err, err
    assert not any(op in err for op in ("linear", "rms_norm", " add")), err


def table(out: str) -> dict[str, list[str]]:
    """check-backend's op x dtype table (cells apart by 2+ spaces): op -> its f32, f16 and bf16 cells ("pass 10",
    "FAIL ...", "fallback")."""
    rows = {}
    for line in out.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if cells[0] in OPS_SHOWN and len(cells) >= 4:
            rows[cells[0]] = cells[1:4]
    return rows


@pytest.mark.slow
def test_check_backend_passes_its_native_ops(env, work):
    out = ok(run(doc_command("llaisys check-backend mydev"), work, env, timeout=900))
    rows = table(out)
    for op in NATIVE_OPS:
        assert len(rows[op]) == 3 and all(cell.startswith("pass ") for cell in rows[op]), out
    assert rows["rope"] == ["fallback"] * 3 and rows["embedding"] == ["fallback"] * 3, out
    assert "FAIL" not in out


@pytest.mark.slow
def test_check_backend_checks_the_ops_it_is_given(env, work):
    """The README's `--ops add,linear` (in its text, not a command block)."""
    out = ok(run([*doc_command("llaisys check-backend mydev"), "--ops", "add,linear"], work, env))
    assert sorted(table(out)) == ["add", "linear"], out


@pytest.mark.slow
def test_the_generated_tests_pass(env, package):
    assert doc_command("cd llaisys-backend-mydev")[1] == package.name
    out = ok(run([*doc_command("python -m pytest tests"), "-q", "-p", "no:cacheprovider"], package, env,
                 timeout=900))
    summary = out.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, out


@pytest.mark.slow
def test_the_wheel_builds_and_repairs(package, work, base_env):
    ok(run(doc_command("python -m pip wheel --no-build-isolation --no-deps --wheel-dir dist ./llaisys-backend-mydev"),
           work, base_env))
    wheel = work / "dist" / WHEEL.replace("mydev", NAME)
    assert wheel.is_file(), sorted(p.name for p in (work / "dist").iterdir())
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"llaisys_backend_{NAME}/libllaisys_{NAME}.so", f"llaisys_backend_{NAME}/plugin.py"} <= names
    repair = doc_command(f"auditwheel repair --wheel-dir wheelhouse dist/{WHEEL}")
    if shutil.which(repair[0]) is None:
        pytest.skip("auditwheel is not installed here (the nox sessions install it): the wheel built, "
                    "its manylinux repair was not checked")
    ok(run(repair, work, base_env))
    (repaired,) = (work / "wheelhouse").glob(f"llaisys_backend_{NAME}-0.1.0-py3-none-manylinux_*_x86_64.whl")
    grafted = [n for n in zipfile.ZipFile(repaired).namelist() if ".libs/" in n]
    assert grafted == [], f"auditwheel copied libraries into the wheel: {grafted}"  # static libstdc++ / libgcc
