"""A tiny model with Qwen2.5's chat template (tools and all) and a server on it whose engine a test may script:
the tool-call tests' model and server (conftest.py's ``tool_model_dir`` and ``tool_server``)."""

from __future__ import annotations

import json
from pathlib import Path

from helpers.qwen_template import QWEN25_TEMPLATE
from helpers.tiny_models import Spec, make_checkpoint

SPEC = Spec(dtype="f32", vocab=384, hidden=64, inter=128, layers=1, heads=2, kv_heads=1, max_pos=4096, seed=3)


def make_tool_model(directory: Path) -> Path:
    make_checkpoint(directory, SPEC)
    config = directory / "tokenizer_config.json"
    raw = json.loads(config.read_text())
    raw["chat_template"] = QWEN25_TEMPLATE
    config.write_text(json.dumps(raw, indent=2))
    (directory / "chat_template.jinja").unlink(missing_ok=True)  # it would win over tokenizer_config.json
    return directory


class ScriptedEngine:
    """The engine's ``submit``, replaced: each choice answers ``reply`` (its tokens pushed through the engine's
    TextStream one at a time, as the engine would), then stops; the prompts it was given are kept."""

    def __init__(self, engine):
        self.tokenizer = engine.tokenizer
        self.generate = engine.submit  # the engine's own, for ``reply = None``
        self.reply: str | None = ""
        self.prompts: list[list[int]] = []

    def submit(self, request):
        from llaisys_models.serve.engine import Delta, Finished, Usage
        from llaisys_models.text.stream import TextStream

        self.prompts.append(request.prompt)
        if self.reply is None:  # the model itself answers
            return self.generate(request)
        ids = self.tokenizer(self.reply, add_special_tokens=False).input_ids
        for index in range(request.n):
            text = TextStream(self.tokenizer, request.params.stop, request.keep_tokens)
            for token in ids:
                piece, _ = text.push(token)
                if piece:
                    request.emit(Delta(piece, index))
            piece, _ = text.finish()
            if piece:
                request.emit(Delta(piece, index))
            request.emit(Finished("stop", Usage(len(request.prompt), len(ids), 0), index))


class ToolServer:
    """The server on a free 127.0.0.1 port, its scripted engine, and a client."""

    def __init__(self, base_url: str, scripted: ScriptedEngine):
        self.base_url, self.scripted = base_url, scripted

    def client(self):
        import openai

        return openai.OpenAI(base_url=self.base_url + "/v1", api_key="unused", max_retries=0, timeout=60)
