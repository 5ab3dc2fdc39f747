"""A process that has imported llaisys once and forks a child per command: the docs test runs many short
``llaisys`` commands and Python snippets, and each would otherwise pay ~4 s of CPU to import transformers.

Run as a script (``python fork_server.py``); it reads one JSON request a line on stdin and answers one JSON line
on stdout. A request names what the child runs (``{"cli": [args of llaisys]}`` or ``{"python": code}``), its
``cwd``, ``env``, ``stdin`` text, the files its ``stdout`` and ``stderr`` go to, and ``background``:

- foreground: the answer is ``{"rc": status}`` once the child exits, or ``{"rc": null, "timeout": true}`` after
  ``timeout`` seconds (the child's process group is then killed);
- background: the answer is ``{"pid": pid}`` at once; ``{"poll": pid}`` answers ``{"rc": status}`` once it has
  exited (else null), and ``{"stop": pid}`` sends SIGTERM (SIGKILL after 30 s) and answers ``{"rc": status}``.

The parent only imports: no kernel runs in it, so no thread team or OpenMP runtime is live when it forks. A child
starts its own process group, so a command's own children (tensor-parallel ranks) go with it.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import sys
import time
import traceback

PRELOAD = ["llaisys", "llaisys.cli", "llaisys_models", "llaisys_models.cli.generate", "llaisys_models.serve.cli",
           "llaisys_models.bench.cli", "transformers", "llaisys_models.text.tokenizer",
           # the server's and the API client's, where installed
           "fastapi", "uvicorn", "llaisys_models.serve.app", "openai"]


REPLY_FD = -1  # the answers' pipe, which no child may hold


def _warm_up() -> None:
    """transformers imports its tokenizer modules lazily, on first use: load the demo model's tokenizer once here,
    so that no child pays for those imports again (loading runs no tokenizer thread, so forking stays safe)."""
    with contextlib.suppress(Exception):
        from transformers import AutoTokenizer, PreTrainedTokenizerFast  # noqa: F401

        import llaisys_models

        tokenizer = llaisys_models.load_tokenizer(llaisys_models.DEMO_MODEL_DIR)
        tokenizer.apply_chat_template([{"role": "user", "content": "1+1="}], tokenize=False,
                                      add_generation_prompt=True)


def _child(request: dict) -> int:
    os.setpgid(0, 0)
    os.close(REPLY_FD)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    stdin = os.open(request["stdin_file"] or os.devnull, os.O_RDONLY)
    out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if request["stderr"] != \
        request["stdout"] else out
    for fd, target in ((stdin, 0), (out, 1), (err, 2)):
        os.dup2(fd, target)
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", closefd=False, buffering=1)
    try:
        if "cli" in request:
            import llaisys.cli

            sys.argv = ["llaisys", *request["cli"]]
            return int(llaisys.cli.main(request["cli"]) or 0)
        sys.argv = ["-c"]
        exec(compile(request["python"], request.get("name", "<doc block>"), "exec"), {"__name__": "__main__"})
        return 0
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        return 1


def _fork(request: dict) -> int:
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            status = _child(request)
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(status)
    return pid


def _wait(pid: int, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            return {"rc": os.waitstatus_to_exitcode(status), "cpu": usage.ru_utime + usage.ru_stime}
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return {"rc": None, "timeout": True}
        time.sleep(0.02)


def _stop(pid: int) -> dict:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    try:
        answer = _wait(pid, 30.0)
    except ChildProcessError:  # already reaped by a poll
        answer = {"rc": None}
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)  # what the command started and left behind
    return answer


def main() -> None:
    global REPLY_FD
    REPLY_FD = os.dup(1)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # what an import prints cannot garble the answers
    reply = os.fdopen(REPLY_FD, "w", buffering=1)
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    _warm_up()
    background: set[int] = set()
    print(json.dumps({"ready": True}), file=reply)
    for line in sys.stdin:
        request = json.loads(line)
        if "stop" in request:
            background.discard(request["stop"])
            answer = _stop(request["stop"])
        elif "poll" in request:  # has a background child exited? (it stays ours to stop)
            done, status = os.waitpid(request["poll"], os.WNOHANG) if request["poll"] in background else (0, 0)
            answer = {"rc": os.waitstatus_to_exitcode(status) if done else None}
            if done:
                background.discard(request["poll"])
        else:
            pid = _fork(request)
            if request.get("background"):
                background.add(pid)
                answer = {"pid": pid}
            else:
                answer = _wait(pid, request["timeout"])
        print(json.dumps(answer), file=reply)
    for pid in background:
        _stop(pid)


if __name__ == "__main__":
    main()
