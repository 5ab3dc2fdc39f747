"""Requests that set no temperature, top_p, top_k or repetition_penalty sample as the served model says (its
generation_config.json), as vLLM serves them; ``--generation-config none`` keeps OpenAI's defaults."""

from __future__ import annotations

import json
import shutil

import pytest

import llaisys_models
from helpers.chat_server import ChatServer, serve_device
from helpers.serve_helpers import http_request, require_serving, user

require_serving()

QWEN = {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}
EXPLICIT = dict(temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05)


@pytest.fixture(scope="module")
def sampling_model_dir(chat_model_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("serve_sampling") / "model"
    shutil.copytree(chat_model_dir, path)
    config = json.loads((path / "generation_config.json").read_text())
    (path / "generation_config.json").write_text(json.dumps({**config, **QWEN}))
    return path


@pytest.fixture(scope="module")
def server(sampling_model_dir, pytestconfig):
    from llaisys_models.serve.engine import Engine
    from llaisys_models.serve.server import Server
    from llaisys_models.text.tokenizer import load_tokenizer

    model = llaisys_models.load(sampling_model_dir, device=serve_device(pytestconfig))
    engine = Engine(model, load_tokenizer(sampling_model_dir), max_running=4, kv_memory=16 << 20)
    with ChatServer(Server(engine, load_tokenizer(sampling_model_dir), "sampling")) as server:
        yield server


def reply(client, seed: int, **sampling) -> str:
    r = client.chat.completions.create(model="sampling", messages=user("hello"), max_tokens=12, seed=seed,
                                       extra_body={k: v for k, v in sampling.items() if k in ("top_k",
                                                                                                "repetition_penalty")},
                                       **{k: v for k, v in sampling.items() if k in ("temperature", "top_p")})
    return r.choices[0].message.content


def test_the_model_card_says_the_defaults(server):
    card = http_request(server.base_url, "GET", "/v1/models").json()["data"][0]
    assert card["sampling_defaults"] == EXPLICIT


def test_unset_settings_are_the_model_s(server):
    client = server.client()
    greedy = reply(client, 0, temperature=0, repetition_penalty=1.0)
    seeds = [seed for seed in range(12) if reply(client, seed, **EXPLICIT) != greedy]
    assert seeds, "12 seeds sampled the greedy reply: the comparison below could not fail"
    for seed in seeds[:3]:
        assert reply(client, seed) == reply(client, seed, **EXPLICIT)
    assert reply(client, seeds[0], temperature=0) != reply(client, seeds[0])  # a setting given wins


def test_generation_config_none_keeps_openai_defaults(sampling_model_dir, monkeypatch):
    from llaisys.cli import build_parser
    from llaisys_models.serve import access_log
    from llaisys_models.serve.launch import load_server
    from llaisys_models.serve.tenancy import Tenants

    monkeypatch.setattr(access_log, "configure", lambda *options: None)  # (this process's log stays as it is)

    for flag, expected in (([], EXPLICIT), (["--generation-config", "none"], {})):
        args = build_parser().parse_args(["serve", *flag])
        server = load_server(args, sampling_model_dir, 4 << 20, Tenants(), 8000)
        assert server.sampling.settings() == expected
