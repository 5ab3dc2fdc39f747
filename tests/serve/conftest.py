"""Servers for the serving tests, shared by the whole session (each started once).

``chat_server``: a random Qwen2 made here (byte-level tokenizer with a chat template), served
in-process by uvicorn on a free 127.0.0.1 port. Its lm_head rows of every token but printable
ASCII are zero and it has no EOS, so greedy replies are plain text that decodes the same token
by token or at once, and run exactly to max_tokens. It is big enough (~4M parameters, 4096 positions) that
a long reply streams for seconds, so stopping one mid-stream is not a race.

``demo_server``: ``llaisys serve`` itself (the CLI, as a subprocess) on the embedded demo model,
with an API key from LLAISYS_API_KEY.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import llaisys_models
from helpers.chat_server import ChatServer, serve_device
from helpers.child_process import popen
from helpers.serve_helpers import API_KEY, CHAT_MODEL, http_request
from helpers.tiny_models import Spec, make_checkpoint

# fastapi, uvicorn and openai (the serve extra and the test client) are imported where used:
# each test module skips, naming what is missing, where they are not installed (serve_helpers.require_serving)

CHAT_SPEC = Spec(dtype="f32", vocab=384, hidden=256, inter=1024, layers=4, heads=4, kv_heads=2, max_pos=4096, seed=12)
PRINTABLE = range(32, 127)


def make_chat_checkpoint(directory: Path) -> Path:
    make_checkpoint(directory, CHAT_SPEC)
    weights_path = directory / "model.safetensors"
    weights = load_file(weights_path)
    keep = torch.zeros(CHAT_SPEC.vocab, dtype=torch.bool)
    keep[list(PRINTABLE)] = True
    weights["lm_head.weight"][~keep] = 0.0  # logit 0 < the best printable logit: never chosen greedily
    save_file(weights, weights_path, metadata={"format": "pt"})
    for name in ("config.json", "generation_config.json"):
        path = directory / name
        if path.is_file():
            raw = json.loads(path.read_text())
            raw["eos_token_id"] = None
            path.write_text(json.dumps(raw, indent=2))
    return directory


@pytest.fixture(scope="session")
def chat_model_dir(tmp_path_factory) -> Path:
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    return make_chat_checkpoint(tmp_path_factory.mktemp("serve_model"))


@pytest.fixture(scope="session")
def chat_reference(chat_model_dir, pytestconfig):
    """A second copy of the served model, for references (the server's copy belongs to its engine)."""
    return llaisys_models.load(chat_model_dir, device=serve_device(pytestconfig))


@pytest.fixture(scope="session")
def tokenizer(chat_model_dir):
    from llaisys_models.text.tokenizer import load_tokenizer

    return load_tokenizer(chat_model_dir)


@pytest.fixture(scope="session")
def chat_server(chat_model_dir, pytestconfig):
    from llaisys_models.serve.engine import Engine
    from llaisys_models.serve.server import Server
    from llaisys_models.text.tokenizer import load_tokenizer

    model = llaisys_models.load(chat_model_dir, device=serve_device(pytestconfig))
    engine = Engine(model, load_tokenizer(chat_model_dir), max_running=8, kv_memory=64 << 20)
    with ChatServer(Server(engine, load_tokenizer(chat_model_dir), CHAT_MODEL)) as server:
        yield server


@pytest.fixture(scope="session")
def tool_model_dir(tmp_path_factory) -> Path:
    """A tiny model with Qwen2.5's chat template (tool_server.py)."""
    from helpers.tool_server import make_tool_model

    return make_tool_model(tmp_path_factory.mktemp("tool_model"))


@pytest.fixture(scope="session")
def tool_server(tool_model_dir):
    """The server on the tool model; its engine answers what ``tool_server.scripted.reply`` says (None: the
    model itself). Every test that uses it sets the reply it wants."""
    from helpers.tool_server import ScriptedEngine, ToolServer
    from llaisys_models.serve.background import BackgroundServer
    from llaisys_models.serve.engine import Engine
    from llaisys_models.serve.server import Server
    from llaisys_models.text.tokenizer import load_tokenizer

    model = llaisys_models.load(tool_model_dir)
    engine = Engine(model, load_tokenizer(tool_model_dir), max_running=4, kv_memory=8 << 20)
    scripted = ScriptedEngine(engine)
    engine.submit = scripted.submit
    with BackgroundServer(Server(engine, load_tokenizer(tool_model_dir), CHAT_MODEL)) as background:
        yield ToolServer(background.base_url, scripted)


@pytest.fixture(scope="session")
def demo_server(demo_server_process):
    """``llaisys serve`` (the installed command) on the demo model, requiring API_KEY: its base URL."""
    return demo_server_process[0]


@pytest.fixture(scope="session")
def demo_server_log(demo_server_process) -> Path:
    """What the demo server printed (start-up lines first)."""
    return demo_server_process[1]


@pytest.fixture(scope="session")
def demo_server_process(tmp_path_factory, pytestconfig):
    """(base URL, log file) of ``llaisys serve`` on the demo model."""
    exe = Path(sys.executable).parent / "llaisys"  # this environment's command, else the one on PATH
    exe = str(exe) if exe.exists() else shutil.which("llaisys")
    if exe is None:
        pytest.skip("the llaisys command is not installed (pip install ./llaisys-core ./llaisys-models)")
    env = {**os.environ, "LLAISYS_API_KEY": API_KEY}
    log_path = tmp_path_factory.mktemp("demo_server") / "serve.log"
    log = open(log_path, "w")
    device = serve_device(pytestconfig)
    # --port 0: the server binds a free port itself and names it in its banner (no race for a port)
    command = [exe, "serve", "--port", "0"] + (["--device", device] if device else [])
    proc = popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)  # SIGTERM ends it at the end
    try:
        deadline = time.monotonic() + 120
        base_url = None
        while True:
            if proc.poll() is not None:
                pytest.fail(f"llaisys serve exited with {proc.returncode}:\n{log_path.read_text()}")
            if base_url is None:
                announced = re.search(r" at (http://127\.0\.0\.1:\d+)/", log_path.read_text())
                base_url = announced and announced.group(1)
            if base_url is not None:
                with contextlib.suppress(OSError):
                    if http_request(base_url, "GET", "/health", timeout=2).status == 200:
                        break
            if time.monotonic() > deadline:
                pytest.fail(f"llaisys serve did not answer /health within 120 s:\n{log_path.read_text()}")
            time.sleep(0.2)
        yield base_url, log_path
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
