"""Each of the newer families (a Qwen3 directory, Phi-3 and Gemma 3 GGUF files with their tokenizer and chat
template in the metadata; both with sliding windows) served over the OpenAI API: a greedy chat reply is
``model.generate`` on the chat template's ids, decoded."""

from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType as Q

import llaisys_models
from helpers.chat_server import ChatServer, serve_device
from helpers.serve_helpers import chat_ids, generate_text, require_serving, user

require_serving()


@pytest.mark.parametrize("name, gguf", [("qwen3_f32", False), ("phi3_f32", True), ("gemma3_f32", True)])
def test_greedy_chat_is_generate(tmp_path, pytestconfig, name, gguf):
    from helpers.gguf_files import write_gguf
    from helpers.tiny_models import SPECS, make_checkpoint
    from llaisys_models.serve.engine import Engine
    from llaisys_models.serve.server import Server
    from llaisys_models.text.tokenizer import load_tokenizer

    directory = tmp_path / name
    directory.mkdir()
    make_checkpoint(directory, SPECS[name])
    path = directory
    if gguf:
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(directory).eval()
        path = write_gguf(hf, directory, tmp_path / f"{name}.gguf", Q.F32)
    device = serve_device(pytestconfig)
    tokenizer = load_tokenizer(path)
    reference = llaisys_models.load(path, device=device)
    messages = user("Hello there")
    want = generate_text(reference, tokenizer, chat_ids(tokenizer, messages), 12)
    engine = Engine(llaisys_models.load(path, device=device), tokenizer, max_running=4, kv_memory=16 << 20)
    with ChatServer(Server(engine, tokenizer, name)) as server:
        r = server.client().chat.completions.create(model=name, messages=messages, max_tokens=12, temperature=0)
    assert r.choices[0].message.content == want and want
