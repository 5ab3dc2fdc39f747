"""How the docs test runs a code block of the docs (see tests/docs/test_docs_examples.py for the rules).

``DocChecker.check(block)`` raises AssertionError, naming the block's file and line, when the block fails: a
command exits non-zero (a removed flag, an error), Python raises, a marker is wrong, or no rule can run it.
Commands run in children of a fork server (``fork_server.py``) that imported llaisys once; commands that set
environment variables before the command (``VAR=value llaisys ...``) get a fresh process, since llaisys reads
some of them once, at import.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from helpers.child_process import popen
from helpers.doc_blocks import ROOT, Block
from helpers.serve_helpers import http_request

COMMAND_TIMEOUT = 300  # seconds for one command on a loaded 2-core machine
START_TIMEOUT = 120  # seconds for a server to answer /health
DOC_URLS = ("http://127.0.0.1:8000", "http://localhost:8000")  # what the docs call the server
ENV_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*")
ANNOUNCED = re.compile(r" at (http://[0-9.]+:\d+)/")
SHELL_LANGS = {"bash", "sh", "shell", "console"}
PIP_PATH_OPTIONS = {"-r", "--requirement", "-c", "--constraint", "-e", "--editable"}  # their value is a file/folder
PIP_OTHER_OPTIONS = {"--wheel-dir", "-w", "--find-links", "-f", "--index-url", "-i", "--extra-index-url", "--target",
                     "-t", "--dest", "-d"}  # their value is not a source to check


def shell_commands(text: str) -> list[list[str]]:
    """The commands of a shell block: its lines (``\\`` continues one), comments dropped, split at ``&&``, a
    trailing ``&`` dropped."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words and words[-1] == "&":
            words = words[:-1]
        command: list[str] = []
        for word in [*words, "&&"]:
            if word == "&&":
                if command:
                    out.append(command)
                command = []
            else:
                command.append(word)
    return out


def raw_commands(text: str) -> list[str]:
    """The commands of a shell block as written (quotes kept), whitespace made single, comments dropped."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        line = re.sub(r"(^|\s)#.*$", "", line).strip().removesuffix("&").strip()
        out += [" ".join(part.split()) for part in line.split(" && ") if part.strip()]
    return out


def split_env(words: list[str]) -> tuple[dict[str, str], list[str]]:
    env = {}
    while words and ENV_WORD.fullmatch(words[0]):
        name, _, value = words[0].partition("=")
        env[name] = value
        words = words[1:]
    return env, words


def with_option(words: list[str], option: str, value: str) -> list[str]:
    """``words`` with ``option``'s value set to ``value`` (replaced where given, else appended)."""
    if option in words:
        i = words.index(option)
        return [*words[:i + 1], value, *words[i + 2:]]
    prefixed = [w for w in words if w.startswith(option + "=")]
    if prefixed:
        return [f"{option}={value}" if w.startswith(option + "=") else w for w in words]
    return [*words, option, value]


def short_limits(args: list[str]) -> list[str]:
    """``llaisys`` arguments with the measuring commands' loads cut down (their results are not looked at)."""
    if args[:2] == ["bench", "serve"]:
        for option, value in (("--num-prompts", "4"), ("--input-len", "16"), ("--output-len", "8")):
            args = with_option(args, option, value)
    elif args[:1] == ["bench"] and "--repetitions" not in args:
        args = [*args, "--repetitions", "1"]
    return args


@dataclasses.dataclass
class Result:
    rc: int | None
    output: str  # stdout and stderr together


class ForkServer:
    """The client side of fork_server.py."""

    def __init__(self):
        self.proc = popen([sys.executable, str(Path(__file__).with_name("fork_server.py"))], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True, bufsize=1)
        assert json.loads(self.proc.stdout.readline() or "{}").get("ready"), "the fork server did not start"

    def _ask(self, request: dict) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, "the fork server died"
        return json.loads(line)

    def request(self, what: dict, cwd: Path, env: dict, log: Path, stdin: str | None = None,
                background: bool = False, timeout: float = COMMAND_TIMEOUT) -> dict:
        stdin_file = None
        if stdin is not None:
            stdin_file = cwd / ".stdin"
            stdin_file.write_text(stdin)
        return self._ask({**what, "cwd": str(cwd), "env": env, "stdin_file": stdin_file and str(stdin_file),
                          "stdout": str(log), "stderr": str(log), "background": background, "timeout": timeout})

    def stop(self, pid: int) -> int | None:
        return self._ask({"stop": pid})["rc"]

    def exited(self, pid: int) -> bool:
        """Whether background child ``pid`` has exited."""
        return self._ask({"poll": pid})["rc"] is not None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Server:
    """``llaisys serve`` in the background, on a free port: a fork server's child, or (with environment
    variables of its own) a fresh process."""

    def __init__(self, forks: ForkServer, args: list[str], cwd: Path, env: dict, extra_env: dict):
        args = with_option(args, "--port", "0")
        self.log_path = cwd / f"serve-{time.monotonic_ns()}.log"
        self.log_path.touch()
        self.forks, self.pid, self.proc, self._exited = forks, None, None, None
        if extra_env:
            self._log = open(self.log_path, "w")
            self.proc = popen([_llaisys(), *args], cwd=cwd, env={**env, **extra_env}, stdout=self._log,
                              stderr=subprocess.STDOUT)
        else:
            self.pid = forks.request({"cli": args}, cwd, env, self.log_path, background=True)["pid"]
        self.url = self._wait_healthy(" ".join(args))

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def _running(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        if self._exited is None and self.forks.exited(self.pid):
            self._exited = True
        return not self._exited

    def _wait_healthy(self, what: str) -> str:
        deadline = time.monotonic() + START_TIMEOUT
        url = None
        while True:
            if not self._running():
                raise AssertionError(f"`llaisys {what}` exited before it answered /health:\n{self.log()}")
            announced = url or ANNOUNCED.search(self.log())
            if announced and url is None:
                url = announced.group(1).replace("0.0.0.0", "127.0.0.1")
            if url:
                with contextlib.suppress(OSError):
                    if http_request(url, "GET", "/health", timeout=2).status == 200:
                        return url
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"`llaisys {what}` did not answer /health in {START_TIMEOUT} s:\n{self.log()}")
            time.sleep(0.1)

    def stop(self) -> int | None:
        if self.proc is None:
            return self.forks.stop(self.pid)
        self.proc.terminate()
        try:
            rc = self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = None
        self._log.close()
        return rc


def _llaisys() -> str:
    exe = Path(sys.executable).parent / "llaisys"
    return str(exe) if exe.exists() else (shutil.which("llaisys") or "llaisys")


class Placeholders:
    """What the docs' placeholder paths stand for: tiny models made here on first use (they need torch)."""

    NAMES = ("path/to/model.gguf", "path/to/draft-model", "path/to/model")  # longest first

    def __init__(self, root: Path):
        self.root = root
        self._made: dict[str, Path] = {}

    def _hf(self) -> Path:
        if "hf" not in self._made:
            from helpers.tiny_models import SPECS, make_checkpoint

            directory = self.root / "tiny-model"
            directory.mkdir()
            self._made["hf"] = make_checkpoint(directory, SPECS["f32_gqa2_hd32"])
        return self._made["hf"]

    def _gguf(self) -> Path:
        if "gguf" not in self._made:
            import gguf
            from transformers import AutoModelForCausalLM

            from helpers.gguf_files import write_gguf

            hf = AutoModelForCausalLM.from_pretrained(self._hf())
            self._made["gguf"] = write_gguf(hf, self._hf(), self.root / "tiny-model.gguf", gguf.GGMLQuantizationType.Q8_0)
        return self._made["gguf"]

    def substitute(self, text: str) -> str:
        for name in self.NAMES:
            if name in text:
                path = self._gguf() if name.endswith(".gguf") else self._hf()
                text = re.sub(r"/?" + re.escape(name), str(path), text)
        return text


class DocChecker:
    """Runs blocks; one per test module (it holds the fork server, the tiny models and a shared server)."""

    def __init__(self, work: Path):
        self.work = work
        self.forks = ForkServer()
        self.placeholders = Placeholders(work)
        self.env = {k: v for k, v in os.environ.items() if k not in ("LLAISYS_NUMERICS", "LLAISYS_API_KEY")}
        self._shared: Server | None = None
        self.child_cpu = 0.0  # CPU seconds of the fork server's foreground children

    def close(self) -> None:
        if self._shared is not None:
            self._shared.stop()
        self.forks.close()

    def shared_server(self) -> Server:
        """``llaisys serve`` on the demo model, for blocks that talk to a server they do not start."""
        if self._shared is None:
            self._shared = Server(self.forks, ["serve"], self.work, self.env, {})
        return self._shared

    # -- one block ----------------------------------------------------------------------------------------

    def check(self, block: Block) -> None:
        where = f"{block.where} ({block.lang or 'no language'} block)"
        if block.not_run is not None:
            assert block.not_run, f"{where}: `<!-- not run: ... -->` must say why"
            return
        if block.run_by is not None:
            return self._check_run_by(block, where)
        cwd = Path(tempfile.mkdtemp(prefix="block-", dir=self.work))
        if block.lang == "python":
            output = self._python(block, cwd, where)
        elif block.lang in SHELL_LANGS:
            output = self._shell(block, cwd, where)
        elif block.lang == "json":
            try:
                json.loads(block.text)
            except ValueError as e:
                raise AssertionError(f"{where}: not valid JSON: {e}") from None
            output = ""
        else:
            raise AssertionError(f"{where}: no rule runs a block of this language: mark it `<!-- not run: WHY -->` "
                                 f"(or `<!-- run by tests/... -->`), or make it python / bash / json")
        for text in block.expect:
            assert text in output, f"{where}: the output does not contain {text!r}:\n{output}"

    def _check_run_by(self, block: Block, where: str) -> None:
        path = ROOT / block.run_by
        assert block.run_by and path.is_file(), f"{where}: `run by {block.run_by}`: no such file in the repository"
        text = " ".join(path.read_text(encoding="utf-8").split())
        doc = block.where.rsplit(":", 1)[0]
        if doc in text:
            return  # the test reads its commands from this file
        missing = [c for c in raw_commands(block.text) if c not in text]
        assert not missing, f"{where}: {block.run_by} neither names {doc} nor holds these commands: {missing}"

    def _run(self, what: dict, cwd: Path, env: dict, stdin: str | None = None) -> Result:
        log = cwd / f"out-{time.monotonic_ns()}.log"
        answer = self.forks.request(what, cwd, env, log, stdin=stdin)
        output = log.read_text(errors="replace")
        self.child_cpu += answer.get("cpu", 0.0)
        return Result(None if answer.get("timeout") else answer["rc"], output)

    def _python(self, block: Block, cwd: Path, where: str) -> str:
        code = self.placeholders.substitute(block.text)
        server = None
        if any(url in code for url in DOC_URLS):
            server = self.shared_server()
            for url in DOC_URLS:
                code = code.replace(url, server.url)
        result = self._run({"python": code, "name": where}, cwd, self.env)
        assert result.rc == 0, f"{where}: the Python block {_status(result)}:\n{result.output}"
        return result.output

    def _shell(self, block: Block, cwd: Path, where: str) -> str:
        commands = [split_env(c) for c in shell_commands(self.placeholders.substitute(block.text))]
        own_server = None
        outputs = []
        try:
            for extra_env, words in commands:
                shown = shlex.join(words)
                if not words:
                    raise AssertionError(f"{where}: `{shown}` sets variables and runs nothing")
                if words[0] == "llaisys" and words[1:2] == ["serve"]:
                    assert own_server is None, f"{where}: starts two servers"
                    own_server = Server(self.forks, words[1:], cwd, self.env, extra_env)
                    continue
                if any(url in w for w in words for url in DOC_URLS):
                    url = (own_server or self.shared_server()).url
                    words = [_replace_urls(w, url) for w in words]
                outputs.append(self._command(words, extra_env, cwd, where, shown))
            if own_server is not None:
                rc = own_server.stop()
                assert rc == 0, f"{where}: `llaisys serve` ended with status {rc} when stopped:\n{own_server.log()}"
                outputs.append(own_server.log())
                own_server = None
        finally:
            if own_server is not None:
                own_server.stop()
        return "\n".join(outputs)

    def _command(self, words: list[str], extra_env: dict, cwd: Path, where: str, shown: str) -> str:
        program = words[0]
        if program in ("python", "python3") and words[1:3] == ["-m", "pip"]:
            return self._pip(words[3:], where, shown)
        if program in ("pip", "pip3"):
            return self._pip(words[1:], where, shown)
        stdin = None
        if program == "llaisys":
            args = short_limits(words[1:])
            if "--chat" in args:
                stdin = "12+34=\n"
            if not extra_env:
                result = self._run({"cli": args}, cwd, self.env, stdin=stdin)
                assert result.rc == 0, f"{where}: `{shown}` {_status(result)}:\n{result.output}"
                return result.output
            argv = [_llaisys(), *args]
        elif program == "curl":
            argv = ["curl", "--silent", "--show-error", "--fail-with-body", "--max-time", "120", *words[1:]]
        elif program in ("python", "python3") and words[1:2] == ["-c"]:
            argv = [sys.executable, *words[1:]]
        else:
            raise AssertionError(f"{where}: no rule runs `{shown}`: mark the block `<!-- not run: WHY -->` (or "
                                 f"`<!-- run by tests/... -->`)")
        proc = subprocess.run(argv, cwd=cwd, env={**self.env, **extra_env}, input=stdin, capture_output=True,
                              text=True, timeout=COMMAND_TIMEOUT)
        output = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"{where}: `{shown}` exited with status {proc.returncode}:\n{output}"
        return output

    def _pip(self, args: list[str], where: str, shown: str) -> str:
        """pip is not run (it would change the test's environment): the folders it installs from must exist."""
        if not args or args[0] not in ("install", "wheel"):
            raise AssertionError(f"{where}: `{shown}` is not run (pip {args[:1]}): mark the block")
        paths, skip = [], False
        for word in args[1:]:
            if skip:
                skip = False
                continue
            if word in PIP_OTHER_OPTIONS:
                skip = True
            elif word in PIP_PATH_OPTIONS or word.startswith("-"):
                continue
            elif word.startswith(("./", "../", "/")):
                paths.append(re.sub(r"\[[^\]]*\]$", "", word))
        for option in PIP_PATH_OPTIONS:
            if option in args and args.index(option) + 1 < len(args):
                paths.append(args[args.index(option) + 1])
        missing = [p for p in paths if not (ROOT / p).exists()]
        assert not missing, f"{where}: `{shown}` installs from paths the repository does not have: {missing}"
        not_packages = [p for p in paths if (ROOT / p).is_dir() and not (ROOT / p / "pyproject.toml").is_file()]
        assert not not_packages, f"{where}: `{shown}`: no pyproject.toml in {not_packages}"
        return ""


def _replace_urls(text: str, url: str) -> str:
    for doc_url in DOC_URLS:
        text = text.replace(doc_url, url)
    return text


def _status(result: Result) -> str:
    return "timed out" if result.rc is None else f"exited with status {result.rc}"
