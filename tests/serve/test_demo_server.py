"""``llaisys serve`` itself (the installed command) on the embedded demo model, with an API key
from LLAISYS_API_KEY: the key guards every endpoint but /health and the page; the demo adds."""

from __future__ import annotations

import re

import pytest

from helpers.serve_helpers import API_KEY, http_request, require_serving

require_serving()

import openai  # noqa: E402

import llaisys_models  # noqa: E402

DEMO = "llaisys-demo"


@pytest.fixture(scope="module")
def client(demo_server):
    return openai.OpenAI(base_url=demo_server + "/v1", api_key=API_KEY, max_retries=0, timeout=60)


@pytest.mark.parametrize("path", ["/v1/models", "/metrics"])
@pytest.mark.parametrize("key", [None, "wrong-key"])
def test_endpoints_need_the_key(demo_server, path, key):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = http_request(demo_server, "GET", path, headers=headers)
    assert r.status == 401
    assert r.json()["error"]["type"] == "authentication_error" and r.json()["error"]["code"] == "invalid_api_key"
    assert http_request(demo_server, "GET", path, headers={"Authorization": f"Bearer {API_KEY}"}).status == 200


def test_start_up_reports_the_kv_cache(demo_server, demo_server_log):
    """The KV budget (--kv-memory, or its default) is said at start-up: bytes, blocks, tokens."""
    line = next(line for line in demo_server_log.read_text().splitlines() if "KV cache" in line)
    size = r"\d+(\.\d\d)? ([KMGT]iB|B)"  # the unit that fits: 4 MiB is not "0.00 GiB"
    assert re.search(rf"KV cache {size}: \d+ blocks of 16 positions \(\d+ tokens, \d+ bytes each\)", line), line


def test_errors_name_no_server_path(demo_server, demo_server_log):
    """A message from the tokenizer names its folder (site-packages/llaisys_models/demo): the client is told
    the model's name instead, the server's log keeps the path."""
    r = http_request(demo_server, "POST", "/v1/completions", {"model": DEMO, "prompt": "hello"},
                     headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status == 400, r.text
    message = r.json()["error"]["message"]
    assert "tokenizer from llaisys-demo (" in message and "/" not in message, message
    assert f"tokenizer from {llaisys_models.DEMO_MODEL_DIR}" in demo_server_log.read_text()


def test_completions_need_the_key(demo_server):
    bad = openai.OpenAI(base_url=demo_server + "/v1", api_key="wrong-key", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model=DEMO, messages=[{"role": "user", "content": "1+1="}])


def test_health_and_page_are_open(demo_server):
    assert http_request(demo_server, "GET", "/health").json() == {"status": "ok", "model": DEMO}
    page = http_request(demo_server, "GET", "/")
    assert page.status == 200 and page.headers["content-type"].startswith("text/html")
    assert "<title>llaisys chat</title>" in page.text


def test_demo_adds_and_stops_at_eos(client):
    r = client.chat.completions.create(model=DEMO, messages=[{"role": "user", "content": "12+34="}], temperature=0)
    assert r.choices[0].message.content == "46"
    assert r.choices[0].finish_reason == "stop"  # the demo model ends its answer with EOS
    assert r.usage.completion_tokens == 3  # "4", "6", EOS
    chunks = list(client.chat.completions.create(model=DEMO, messages=[{"role": "user", "content": "1234+5678="}],
                                                 temperature=0, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "6912"
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_demo_greedy_equals_generate(client):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(llaisys_models.DEMO_MODEL_DIR)
    model = llaisys_models.load(llaisys_models.DEMO_MODEL_DIR)
    for prompt in ("7+8=", "999+1=", "4321+1234="):
        ids = tokenizer(prompt).input_ids
        want = tokenizer.decode(model.generate(ids, 8)[len(ids):], skip_special_tokens=True)
        r = client.completions.create(model=DEMO, prompt=prompt, max_tokens=8, temperature=0)
        assert r.choices[0].text == want and want.isdigit()


@pytest.mark.parametrize("flag, value", [("--port", "70000"), ("--max-running", "0"), ("--max-batch-tokens", "0"),
                                         ("--block-size", "0"), ("--kv-memory", "lots"), ("--kv-memory", "0GiB")])
def test_bad_command_line_values_are_refused(capsys, flag, value):
    from llaisys.cli import main

    assert main(["serve", flag, value]) == 2
    err = capsys.readouterr().err
    if flag == "--kv-memory":
        assert f"{value!r}" in err and ("not a memory size" in err or "must be positive" in err)
    else:
        assert f"{flag} = {value} is out of range" in err


def test_port_zero_is_announced_as_the_port_bound(demo_server, demo_server_log):
    """The fixture starts ``llaisys serve --port 0``: the banner names the port the server listens on."""
    port = int(demo_server.rsplit(":", 1)[1])
    assert port != 0 and f"at http://127.0.0.1:{port}/" in demo_server_log.read_text()
    assert http_request(demo_server, "GET", "/health").status == 200


def test_a_port_in_use_fails_at_once_in_one_line(capsys, monkeypatch):
    import socket

    from llaisys.cli import main

    loaded = []
    monkeypatch.setattr(llaisys_models, "load", lambda *a, **k: loaded.append(1))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "in use" in err and "Traceback" not in err
    assert " at http://" not in err, "the banner announced a port the server could not bind"
    assert not loaded, "the model was loaded before the port was found busy"


@pytest.mark.parametrize("argv, env, says", [
    (["--api-key", ""], {"LLAISYS_API_KEY": "set-but-unused"}, "--api-key is empty"),  # --api-key "$UNSET"
    (["--api-key", "good", "--api-key", ""], {}, "--api-key is empty"),
    ([], {"LLAISYS_API_KEY": ""}, "LLAISYS_API_KEY is empty"),
    (["--api-key", " padded"], {}, "--api-key begins or ends with spaces"),
    (["--api-key-file", "{comments_only}"], {}, "holds no key"),
    (["--api-key-file", "{missing}"], {}, "does not exist"),
], ids=["empty-flag", "one-empty-flag", "empty-variable", "padded", "no-key-in-file", "missing-file"])
def test_a_key_that_would_open_the_server_is_refused_at_start_up(capsys, monkeypatch, tmp_path, argv, env, says):
    """An empty key would silently turn authentication off: one line, before the port or the model."""
    from llaisys.cli import main
    from llaisys_models.serve import cli as serve_cli

    started = []
    monkeypatch.setattr(llaisys_models, "load", lambda *a, **k: started.append("load"))
    monkeypatch.setattr(serve_cli, "bind", lambda *a: started.append("bind"))
    monkeypatch.delenv("LLAISYS_API_KEY", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    comments_only = tmp_path / "keys.txt"
    comments_only.write_text("# no key yet\n\n   \n")
    argv = [a.format(comments_only=comments_only, missing=tmp_path / "absent.txt") for a in argv]
    assert main(["serve", "--port", "0", *argv]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert started == []


def test_api_keys_from_flags_file_and_environment(tmp_path):
    from llaisys.cli import build_parser
    from llaisys_models.serve.cli import api_keys

    key_file = tmp_path / "keys"
    key_file.write_text("# team keys\nkey-one\n\n  key-two  \n# key-retired\nkey-three\r\n")

    def parse(*argv):
        return build_parser().parse_args(["serve", *argv])
    env = {"LLAISYS_API_KEY": "env-key"}
    assert api_keys(parse("--api-key", "a", "--api-key", "b", "--api-key-file", str(key_file)), env) == [
        "a", "b", "key-one", "key-two", "key-three"]
    assert api_keys(parse("--api-key-file", str(key_file)), {}) == ["key-one", "key-two", "key-three"]
    assert api_keys(parse(), env) == ["env-key"]  # the variable: one key, when no option gives any
    assert api_keys(parse("--api-key", "a"), {"LLAISYS_API_KEY": ""}) == ["a"]  # not read when a key is given
    assert api_keys(parse(), {}) == []
