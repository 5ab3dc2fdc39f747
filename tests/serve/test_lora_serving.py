"""LoRA adapters served (serve/lora.py), as vLLM serves them: ``llaisys serve --lora NAME=PATH`` on the chat model
(a tiny Qwen2, f32) with PEFT adapters made over it (helpers/lora_adapters.py).

- a request's ``model`` picks the base model or an adapter; concurrent requests under the base model and two
  adapters (batched together) each get ``model.generate(ids, n, lora=name)``'s tokens; the response names its model;
- ``/v1/models`` lists the adapters with their ``parent`` and ``root``; an unknown name is a 404 naming it;
- with ``--allow-runtime-lora``: loading (409 for a name in use, 400 for a bad adapter), using and unloading an
  adapter, and an unload while a stream runs under it (the stream ends whole, then the unload answers, and new
  requests naming it get the 404 meanwhile); without the flag the two routes are absent (404);
- the prefix cache is keyed by adapter; /metrics counts requests and tokens per adapter; the access log names it;
- a bad ``--lora`` fails start-up with one line; the LoRA block of docs/serving.md runs here.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

import llaisys_models
from helpers.chat_server import parse_metrics, serve_device
from helpers.doc_blocks import ROOT, blocks
from helpers.doc_runner import shell_commands
from helpers.lora_adapters import ADAPTERS, AdapterSpec, make_adapter
from helpers.serve_helpers import at_once, chat_ids, check_error_body, http_request, require_serving, wait_until
from helpers.serve_process import ServeProcess, llaisys_command

require_serving()

import openai  # noqa: E402

BASE = "tiny-lora-base"  # the served model's name
SPECS = {"alpha": ADAPTERS["all_r8"], "beta": ADAPTERS["qv_r16_rslora"], "gamma": ADAPTERS["patterns"],
         "delta": AdapterSpec(r=4, alpha=8, targets=("q_proj", "v_proj", "down_proj"), seed=5)}
STARTED = ("alpha", "beta")  # the adapters the server starts with (--lora); gamma and delta are loaded at run time
LOAD, UNLOAD = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"
DOC = "docs/serving.md"
THIS = "tests/serve/test_lora_serving.py"


@pytest.fixture(scope="module")
def adapter_dirs(chat_model_dir, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("served_adapters")
    return {name: make_adapter(chat_model_dir, root / name, spec) for name, spec in SPECS.items()}


@pytest.fixture(scope="module")
def reference(chat_model_dir, adapter_dirs, pytestconfig):
    """The served model in this process, with every adapter loaded."""
    model = llaisys_models.load(chat_model_dir, device=serve_device(pytestconfig))
    for name, path in adapter_dirs.items():
        model.load_lora(name, path)
    return model


def device_args(pytestconfig) -> list[str]:
    device = serve_device(pytestconfig)
    return ["--device", device] if device else []


@pytest.fixture(scope="module")
def server(chat_model_dir, adapter_dirs, tmp_path_factory, pytestconfig):
    """``llaisys serve`` with alpha and beta, runtime loading on."""
    args = ["--model", str(chat_model_dir), "--served-model-name", BASE, "--kv-memory", "32MiB",
            *[f"--lora={name}={adapter_dirs[name]}" for name in STARTED], "--allow-runtime-lora",
            *device_args(pytestconfig)]
    with ServeProcess(tmp_path_factory.mktemp("lora_server"), *args) as process:
        yield process


def client_of(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="-", max_retries=0, timeout=120)


def ids_of(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def expected(reference, tokenizer, ids: list[int], n: int, name: str | None) -> str:
    """The text ``model.generate`` gives under adapter ``name`` (None: the base model)."""
    out = reference.generate(ids, n, lora=name)
    return tokenizer.decode(out[len(ids):], skip_special_tokens=True)


def complete(server, model: str, ids: list[int], n: int = 16):
    return client_of(server).completions.create(model=model, prompt=ids, max_tokens=n, temperature=0)


def load(server, name: str, path) -> object:
    return http_request(server.base_url, "POST", LOAD, {"lora_name": name, "lora_path": str(path)}, timeout=120)


def unload(server, name: str) -> object:
    return http_request(server.base_url, "POST", UNLOAD, {"lora_name": name}, timeout=120)


def listed(server) -> dict[str, dict]:
    return {card["id"]: card for card in http_request(server.base_url, "GET", "/v1/models").json()["data"]}


# -- a request's model picks the adapter ------------------------------------------------------------------------

def test_concurrent_requests_under_adapters_match_generate(server, reference, tokenizer):
    """Two requests under the base model and two under each adapter, at once (batched together): each the tokens
    of ``model.generate`` under its adapter, and the response names its model."""
    texts = ["Tell me about the sea.", "A list of primes:", "SELECT name FROM", "Once upon a time,",
             "def fib(n):", "The weather today"]
    models = [BASE, BASE, "alpha", "beta", "alpha", "beta"]
    prompts = [ids_of(tokenizer, text) for text in texts]
    clients = [client_of(server) for _ in texts]

    def ask(client, model, ids):
        r = client.completions.create(model=model, prompt=ids, max_tokens=16, temperature=0)
        return r.model, r.choices[0].text

    got = at_once([lambda c=c, m=m, p=p: ask(c, m, p) for c, m, p in zip(clients, models, prompts)])
    for (model, text), name, ids in zip(got, models, prompts):
        assert model == name
        assert text == expected(reference, tokenizer, ids, 16, None if name == BASE else name), name
    base = expected(reference, tokenizer, prompts[2], 16, None)
    assert got[2][1] != base, "the adapter changed nothing"


def test_chat_and_responses_run_under_the_adapter(server, reference, tokenizer):
    client = client_of(server)
    messages = [{"role": "user", "content": "Name three colours."}]
    r = client.chat.completions.create(model="beta", messages=messages, max_tokens=12, temperature=0)
    assert r.model == "beta"
    assert r.choices[0].message.content == expected(reference, tokenizer, chat_ids(tokenizer, messages), 12, "beta")
    r = client.responses.create(model="alpha", input="Name three colours.", max_output_tokens=12, temperature=0)
    assert r.model == "alpha"
    assert r.output_text == expected(reference, tokenizer, chat_ids(tokenizer, messages), 12, "alpha")


def test_no_model_named_is_the_base_model(server, reference, tokenizer):
    ids = ids_of(tokenizer, "No model named:")
    r = http_request(server.base_url, "POST", "/v1/completions", {"prompt": ids, "max_tokens": 8, "temperature": 0})
    assert r.status == 200 and r.json()["model"] == BASE
    assert r.json()["choices"][0]["text"] == expected(reference, tokenizer, ids, 8, None)


def test_models_lists_the_adapters(server, adapter_dirs):
    cards = listed(server)
    assert list(cards)[:3] == [BASE, *STARTED]
    assert "parent" not in cards[BASE]
    for name in STARTED:
        assert cards[name]["parent"] == BASE and cards[name]["root"] == str(adapter_dirs[name])
        assert cards[name]["max_model_len"] == cards[BASE]["max_model_len"]
        card = http_request(server.base_url, "GET", f"/v1/models/{name}").json()
        assert card == cards[name]


def test_an_unknown_adapter_is_a_404_naming_it(server, reference, tokenizer):
    body = {"model": "no-such-adapter", "prompt": "hi", "max_tokens": 2}
    for path, request in (("/v1/completions", body),
                          ("/v1/chat/completions", {**body, "messages": [{"role": "user", "content": "hi"}]}),
                          ("/v1/responses", {"model": "no-such-adapter", "input": "hi"})):
        error = check_error_body(http_request(server.base_url, "POST", path, request), 404, "model", "model_not_found")
        assert "'no-such-adapter'" in error["message"] and "'alpha'" in error["message"], error
    check_error_body(http_request(server.base_url, "GET", "/v1/models/no-such-adapter"), 404, "model",
                     "model_not_found")
    ids = ids_of(tokenizer, "Still serving?")
    assert complete(server, "alpha", ids, 4).choices[0].text == expected(reference, tokenizer, ids, 4, "alpha")


# -- loading and unloading at run time -------------------------------------------------------------------------

def test_load_use_and_unload_at_run_time(server, adapter_dirs, reference, tokenizer):
    ids = ids_of(tokenizer, "Runtime adapters:")
    loaded_gauge = f'llaisys_lora_adapters_loaded{{model="{BASE}"}}'
    assert metrics(server)[loaded_gauge] == len(STARTED)
    r = load(server, "gamma", adapter_dirs["gamma"])
    assert (r.status, r.text) == (200, "Success: LoRA adapter 'gamma' added successfully."), r.text
    assert listed(server)["gamma"]["root"] == str(adapter_dirs["gamma"])
    assert metrics(server)[loaded_gauge] == len(STARTED) + 1
    assert complete(server, "gamma", ids).choices[0].text == expected(reference, tokenizer, ids, 16, "gamma")

    error = check_error_body(load(server, "gamma", adapter_dirs["gamma"]), 409, "lora_name", "lora_name_taken")
    assert "already loaded" in error["message"]
    check_error_body(load(server, BASE, adapter_dirs["gamma"]), 409, "lora_name", "lora_name_taken")
    error = check_error_body(load(server, "bad", adapter_dirs["gamma"] / "nothing-here"), 400, "lora_path",
                             "invalid_lora_adapter")
    assert "\n" not in error["message"] and "'bad'" in error["message"]
    check_error_body(http_request(server.base_url, "POST", LOAD, {"lora_path": "x"}), 400, "lora_name",
                     "missing_required_parameter")

    r = unload(server, "gamma")
    assert (r.status, r.text) == (200, "Success: LoRA adapter 'gamma' removed successfully.")
    assert "gamma" not in listed(server)
    assert metrics(server)[loaded_gauge] == len(STARTED)
    with pytest.raises(openai.NotFoundError):
        complete(server, "gamma", ids)
    check_error_body(unload(server, "gamma"), 404, "lora_name", "lora_not_found")
    # loaded again, it answers as before (its prefix cache of the first load is not reused: a new load)
    assert load(server, "gamma", adapter_dirs["gamma"]).status == 200
    assert complete(server, "gamma", ids).choices[0].text == expected(reference, tokenizer, ids, 16, "gamma")
    assert unload(server, "gamma").status == 200


def test_unload_waits_for_a_stream_under_the_adapter(server, adapter_dirs, reference, tokenizer):
    """The stream ends whole; new requests naming the adapter get the 404 as soon as the unload is asked; the
    unload answers once the stream's request has ended."""
    assert load(server, "delta", adapter_dirs["delta"]).status == 200
    ids, n = ids_of(tokenizer, "A long story under delta:"), 1500
    arrivals: list[float] = []
    pieces: list[str] = []
    reasons: list[str | None] = []

    def read_stream():
        stream = client_of(server).completions.create(model="delta", prompt=ids, max_tokens=n, temperature=0,
                                                      stream=True)
        for chunk in stream:
            arrivals.append(time.monotonic())
            pieces.append(chunk.choices[0].text)
            reasons.append(chunk.choices[0].finish_reason)

    reader = threading.Thread(target=read_stream)
    reader.start()
    assert wait_until(lambda: len(arrivals) >= 5, 60), "the stream did not start"
    unloaded: dict = {}

    def ask_unload():
        unloaded["reply"] = unload(server, "delta")
        unloaded["at"] = time.monotonic()

    unloader = threading.Thread(target=ask_unload)
    unloader.start()
    assert wait_until(lambda: "delta" not in listed(server), 30), "the unload did not take the name away"
    with pytest.raises(openai.NotFoundError):
        complete(server, "delta", ids, 2)
    streaming = len(arrivals)
    assert reader.is_alive() and "at" not in unloaded, "the stream ended before the test could unload under it"
    reader.join(120)
    unloader.join(120)
    assert not reader.is_alive() and not unloader.is_alive()
    assert reasons[-1] == "length" and len(arrivals) > streaming + 10
    assert "".join(pieces) == expected(reference, tokenizer, ids, n, "delta")
    assert (unloaded["reply"].status, unloaded["reply"].text) == (200, "Success: LoRA adapter 'delta' removed "
                                                                       "successfully.")
    assert unloaded["at"] > arrivals[-10], "the unload answered while the stream was still running"
    with pytest.raises(openai.NotFoundError):
        complete(server, "delta", ids, 2)


def test_an_unload_that_outlasts_its_wait_answers_202(chat_model_dir, adapter_dirs, tokenizer, pytestconfig):
    """In-process: an unload whose adapter's stream runs past ``unload_wait`` answers 202; the adapter is freed
    when the stream ends."""
    from helpers.chat_server import ChatServer
    from llaisys_models.serve.engine import Engine
    from llaisys_models.serve.server import Server
    from llaisys_models.text.tokenizer import load_tokenizer

    model = llaisys_models.load(chat_model_dir, device=serve_device(pytestconfig))
    model.load_lora("alpha", adapter_dirs["alpha"])
    engine = Engine(model, load_tokenizer(chat_model_dir), max_running=4, kv_memory=16 << 20)
    with ChatServer(Server(engine, load_tokenizer(chat_model_dir), BASE, allow_runtime_lora=True)) as chat_server:
        assert chat_server.server.adapters is not None
        chat_server.server.adapters.unload_wait = 0.2
        stream = chat_server.client().completions.create(model="alpha", prompt=ids_of(tokenizer, "Long:"),
                                                         max_tokens=1200, temperature=0, stream=True)
        chunks = iter(stream)
        next(chunks)
        r = unload(chat_server, "alpha")
        assert r.status == 202 and r.text == ("LoRA adapter 'alpha' is being removed: 1 request still uses "
                                         "it; it is removed when it ends."), r.text
        assert "alpha" in model.loras  # (still in use)
        assert list(listed(chat_server)) == [BASE]  # (but no longer served)
        reasons = [chunk.choices[0].finish_reason for chunk in chunks]
        assert reasons[-1] == "length"
        assert wait_until(lambda: "alpha" not in model.loras, 30), "the adapter was not freed after its stream"


def test_without_the_flag_the_runtime_routes_are_absent(chat_model_dir, adapter_dirs, tmp_path, pytestconfig):
    with ServeProcess(tmp_path, "--model", str(chat_model_dir), "--served-model-name", BASE,
                      f"--lora=alpha={adapter_dirs['alpha']}", "--kv-memory", "8MiB",
                      *device_args(pytestconfig)) as process:
        assert list(listed(process)) == [BASE, "alpha"]
        for path, body in ((LOAD, {"lora_name": "beta", "lora_path": str(adapter_dirs["beta"])}),
                           (UNLOAD, {"lora_name": "alpha"})):
            error = check_error_body(http_request(process.base_url, "POST", path, body), 404, None, None)
            assert error["message"] == f"no route POST {path}"
        assert "alpha" in listed(process)


def test_adapters_on_a_tensor_parallel_server(chat_model_dir, adapter_dirs, reference, tokenizer, tmp_path,
                                              pytestconfig):
    """--tensor-parallel 2 with --lora and a runtime load: every rank holds its part of each adapter (rank 0 tells
    the other what to load), and concurrent requests under the base and two adapters get the one-device tokens."""
    device = serve_device(pytestconfig)
    if device is not None and not device.startswith("cpu"):
        pytest.skip("the two ranks here are CPU processes; an accelerator's group runs in tools/gpu_check.sh")
    with ServeProcess(tmp_path, "--model", str(chat_model_dir), "--served-model-name", BASE, "--kv-memory", "16MiB",
                      "--tensor-parallel", "2", f"--lora=alpha={adapter_dirs['alpha']}",
                      "--allow-runtime-lora") as process:
        assert load(process, "gamma", adapter_dirs["gamma"]).status == 200
        ids = [ids_of(tokenizer, f"Split over two ranks, request {i}:") for i in range(3)]
        names = [BASE, "alpha", "gamma"]
        texts = at_once([lambda i=i, n=n: complete(process, n, ids[i]).choices[0].text
                         for i, n in enumerate(names)])
        assert texts == [expected(reference, tokenizer, ids[i], 16, None if n == BASE else n)
                         for i, n in enumerate(names)]
        assert unload(process, "alpha").status == 200
        assert list(listed(process)) == [BASE, "gamma"]


# -- the prefix cache, the metrics, the access log ----------------------------------------------------------------

def test_the_prefix_cache_is_keyed_by_adapter(server, tokenizer):
    ids = ids_of(tokenizer, "The prefix cache keeps each adapter's keys apart: " * 2)  # > 2 blocks of 16
    whole = (len(ids) - 1) // 16 * 16

    def cached(model: str) -> int:
        return complete(server, model, ids, 1).usage.prompt_tokens_details.cached_tokens

    assert [cached("alpha"), cached("beta"), cached(BASE)] == [0, 0, 0]  # computed under each
    assert [cached("alpha"), cached("beta"), cached(BASE)] == [whole] * 3  # then each reuses its own


def metrics(server) -> dict[str, float]:
    return parse_metrics(http_request(server.base_url, "GET", "/metrics").text)


def test_metrics_count_requests_and_tokens_per_adapter(server, tokenizer):
    def counts(adapter: str) -> tuple[float, float]:
        m = metrics(server)
        labels = f'{{model="{BASE}",adapter="{adapter}"}}'
        return m.get("llaisys_lora_requests_total" + labels, 0), m.get("llaisys_lora_generation_tokens_total" + labels, 0)

    before = {name: counts(name) for name in ("alpha", "beta", "")}
    complete(server, "alpha", ids_of(tokenizer, "count me"), 7)
    complete(server, BASE, ids_of(tokenizer, "count me"), 3)
    assert counts("alpha") == (before["alpha"][0] + 1, before["alpha"][1] + 7)
    assert counts("") == (before[""][0] + 1, before[""][1] + 3)
    assert counts("beta") == before["beta"]


def test_the_access_log_names_the_adapter(server, tokenizer):
    complete(server, "beta", ids_of(tokenizer, "log me"), 2)
    complete(server, BASE, ids_of(tokenizer, "log me too"), 2)
    line = re.compile(r"POST /v1/completions 200 .* finish=length (adapter=(\S+) )?tenant=")
    log = server.wait_log(lambda text: " adapter=beta tenant=" in text)
    adapters = [m.group(2) for m in map(line.search, log.splitlines()) if m]
    assert "beta" in adapters and None in adapters  # (the base model's lines have no adapter field)


# -- start-up --------------------------------------------------------------------------------------------------

def test_a_bad_lora_option_fails_start_up_in_one_line(chat_model_dir, tmp_path):
    for option, reason in ((f"--lora=broken={tmp_path / 'nothing'}", f"--lora broken={tmp_path / 'nothing'}: "),
                           ("--lora=no-path", "--lora 'no-path': give NAME=PATH"),
                           (f"--lora={BASE}={tmp_path}", "is the served model's name")):
        result = subprocess.run([llaisys_command(), "serve", "--port", "0", "--model", str(chat_model_dir),
                                 "--served-model-name", BASE, option], capture_output=True, text=True, timeout=300)
        assert result.returncode == 2, result.stderr
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith("llaisys: error: ") and reason in last, result.stderr
        assert "Traceback" not in result.stderr


# -- the docs ---------------------------------------------------------------------------------------------------

def test_the_serving_guides_lora_block_runs(chat_model_dir, adapter_dirs, tmp_path, pytestconfig):
    """The blocks of docs/serving.md marked `run by tests/serve/test_lora_serving.py`: ``llaisys serve`` on the
    placeholders' stand-ins (the chat model, the adapters made here), then each curl against it."""
    ours = [b for b in blocks(ROOT / DOC)[0] if b.run_by == THIS]
    assert ours, f"{DOC} has no block marked `run by {THIS}`"
    stand_ins = {"path/to/model": chat_model_dir, "path/to/sql-adapter": adapter_dirs["alpha"],
                 "path/to/chat-adapter": adapter_dirs["beta"], "path/to/sql-adapter-v2": adapter_dirs["gamma"]}
    for block in ours:
        text = block.text
        for placeholder in sorted(stand_ins, key=len, reverse=True):
            text = text.replace(placeholder, str(stand_ins[placeholder]))
        commands = shell_commands(text)
        assert commands[0][:2] == ["llaisys", "serve"], block.where
        with ServeProcess(tmp_path, *commands[0][2:], *device_args(pytestconfig)) as process:
            for words in commands[1:]:
                assert words[0] == "curl", f"{block.where}: no rule runs {words}"
                words = [w.replace("http://127.0.0.1:8000", process.base_url) for w in words]
                done = subprocess.run(["curl", "--silent", "--show-error", "--fail-with-body", "--max-time", "120",
                                       *words[1:]], capture_output=True, text=True, timeout=180)
                assert done.returncode == 0, f"{block.where}: {' '.join(words)}:\n{done.stdout}{done.stderr}"
