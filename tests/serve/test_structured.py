"""``response_format``: structured outputs on the random tiny chat model (its unconstrained output is noise, so
only the grammar makes it parse). Seeded sampled replies to random small schemas all parse and match their
schema; json_object replies parse; a batch mixing constrained, unconstrained and n > 1 requests gives each
exactly what it gives alone (``model.generate`` with the same grammar); bad formats are 400s naming the field."""

from __future__ import annotations

import json
import queue
import random

import pytest

import llaisys
from helpers.random_schemas import matches, random_schema
from helpers.serve_helpers import CHAT_MODEL, TIMEOUT, chat_ids, generate_text, http_request, require_serving, user
from llaisys_models import Grammar
from llaisys_models.serve.engine import Delta, Finished, Request, SamplingParams, choice_seed

require_serving()

SAMPLING = dict(temperature=1.0, top_p=0.95)
MAX_TOKENS = 400  # room for the largest schema below (each string character may cost a \uXXXX escape)


@pytest.fixture(scope="module")
def client(chat_server):
    return chat_server.client()


def json_schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}


# -- tests ------------------------------------------------------------------------------------------

def test_the_model_alone_does_not_write_json(client):
    """What makes the tests below mean something: unconstrained, this model's reply is not JSON."""
    r = client.chat.completions.create(model=CHAT_MODEL, messages=user("JSON please"), max_tokens=40, seed=3,
                                       **SAMPLING)
    with pytest.raises(ValueError):
        json.loads(r.choices[0].message.content)


def test_json_schema_replies_always_parse_and_match(client):
    rng = random.Random(2026)
    for i in range(30):
        schema = random_schema(rng)
        r = client.chat.completions.create(model=CHAT_MODEL, messages=user(f"Answer {i}"), max_tokens=MAX_TOKENS,
                                           seed=i, response_format=json_schema_format(schema), **SAMPLING)
        (choice,) = r.choices
        assert choice.finish_reason == "stop", (schema, choice.message.content)
        value = json.loads(choice.message.content)
        assert matches(value, schema), (schema, value)


def test_json_object_replies_parse(client):
    """Any JSON object has no bound on its length, and from random weights one may never close: every reply that
    ends ("stop") is an object, and the others are cut objects."""
    ended = 0
    for seed in range(8):
        r = client.completions.create(model=CHAT_MODEL, prompt="hello", max_tokens=60, seed=seed, temperature=1.0,
                                      extra_body={"response_format": {"type": "json_object"}})
        (choice,) = r.choices
        if choice.finish_reason == "stop":
            ended += 1
            assert isinstance(json.loads(choice.text), dict), choice.text
        else:
            assert choice.text.startswith("{"), choice.text
    assert ended >= 2


def test_completions_and_streams_are_constrained_too(client):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    fmt = json_schema_format(schema)
    r = client.completions.create(model=CHAT_MODEL, prompt="Say", max_tokens=50, seed=1,
                                  extra_body={"response_format": fmt})
    assert json.loads(r.choices[0].text) in ({"ok": True}, {"ok": False}) and r.choices[0].finish_reason == "stop"
    stream = client.chat.completions.create(model=CHAT_MODEL, messages=user("Say"), max_tokens=50, seed=1, n=2,
                                            stream=True, response_format=fmt, **SAMPLING)
    texts = ["", ""]
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
    assert all(json.loads(t) in ({"ok": True}, {"ok": False}) for t in texts)


def run_at_once(engine, tokenizer, jobs: dict) -> dict:
    """Submit every job (name: (messages, grammar, n, seed, logprobs)) at once; per (name, choice): its text, finish
    reason and log-probabilities."""
    log = queue.Queue()
    for name, (messages, g, n, seed, logprobs) in jobs.items():
        params = SamplingParams(max_tokens=80, seed=seed, grammar=g, logprobs=logprobs, **SAMPLING)
        engine.submit(Request(chat_ids(tokenizer, messages), params, lambda e, k=name: log.put((k, e)), n=n))
    out, open_choices = {}, sum(job[2] for job in jobs.values())
    while open_choices:
        name, event = log.get(timeout=TIMEOUT)
        if isinstance(event, Delta):
            text, reason, logprobs = out.get((name, event.index), ("", None, ()))
            out[name, event.index] = (text + event.text, reason, logprobs + event.logprobs)
        else:
            assert isinstance(event, Finished), event
            text, _, logprobs = out.get((name, event.index), ("", None, ()))
            out[name, event.index] = (text, event.reason, logprobs)
            open_choices -= 1
    return out


def test_mixed_batch_gives_each_request_what_it_gives_alone(chat_server, chat_reference, tokenizer):
    """Constrained (one and two choices, a forced tool call's grammar), unconstrained and log-probability requests
    submitted at once, seeded: each gives exactly what it gives alone (text, finish reason, log-probabilities), and
    its text is what ``model.generate`` gives for it."""
    from llaisys_models.serve.forced_calls import grammar_source
    from llaisys_models.serve.tool_calls import HERMES

    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 5},
                                               "n": {"type": "integer", "minimum": 0, "maximum": 999}},
              "required": ["name", "n"], "additionalProperties": False}
    grammar = Grammar.json_schema(tokenizer, schema)
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"k": {"enum": ["a", "b"]}}, "required": ["k"]}}}
    call = Grammar.lark(tokenizer, grammar_source(HERMES, [tool], False, {}))
    jobs = {"schema": (user("Constrained"), grammar, 1, 11, None),
            "plain": (user("Free text, longer prompt"), None, 1, 12, None),
            "object": (user("Two objects"), Grammar.json_object(tokenizer), 2, 13, None),
            "logprobs": (user("Log-probabilities"), None, 2, 14, 3),
            "call": (user("Call"), call, 1, 15, 0)}
    together = run_at_once(chat_server.engine, tokenizer, jobs)
    alone = {}
    for name, job in jobs.items():
        alone.update(run_at_once(chat_server.engine, tokenizer, {name: job}))
    assert together == alone
    want = {(name, i): generate_text(chat_reference, tokenizer, chat_ids(tokenizer, messages), 80, top_k=0,
                                     seed=choice_seed(seed, i), grammar=g, **SAMPLING)
            for name, (messages, g, n, seed, _) in jobs.items() for i in range(n)}
    assert {key: text for key, (text, _, _) in together.items()} == want
    assert together["plain", 0][1] == "length" and together["schema", 0][1] == "stop"
    assert matches(json.loads(together["schema", 0][0]), schema)
    assert together["call", 0][0] in ('<tool_call>\n{"name": "f", "arguments": {"k": "a"}}\n</tool_call>',
                                      '<tool_call>\n{"name": "f", "arguments": {"k": "b"}}\n</tool_call>')
    assert len(together["logprobs", 1][2]) == 80 and all(len(e.top) == 3 for e in together["logprobs", 1][2])
    assert len(together["call", 0][2]) > 0 and together["schema", 0][2] == ()
    assert chat_server.engine.pool.check()["used"] == 0


def test_grammar_view_is_built_at_start_up_and_only_constrained_requests_wait(chat_model_dir, monkeypatch):
    """The server builds llguidance's view of the vocabulary as it starts, before any request; while it is being
    built a plain request is answered and a constrained one waits for it."""
    import threading

    import llguidance

    from llaisys_models.serve.background import BackgroundServer
    from llaisys_models.serve.engine import Engine
    from llaisys_models.serve.server import Server
    from llaisys_models.text.tokenizer import load_tokenizer

    started, gate = threading.Event(), threading.Event()
    build = llguidance.LLTokenizer

    def slow_build(*args, **kwargs):
        started.set()
        gate.wait(TIMEOUT)
        return build(*args, **kwargs)

    monkeypatch.setattr(llguidance, "LLTokenizer", slow_build)
    import llaisys_models

    engine = Engine(llaisys_models.load(chat_model_dir), load_tokenizer(chat_model_dir), max_running=2,
                    kv_memory=8 << 20)
    with BackgroundServer(Server(engine, load_tokenizer(chat_model_dir), CHAT_MODEL)) as background:
        assert started.wait(TIMEOUT)  # no request has come yet
        body = {"messages": user("x"), "max_tokens": 3}
        assert http_request(background.base_url, "POST", "/v1/chat/completions", body).status == 200
        constrained = {**body, "max_tokens": 20, "response_format": {"type": "json_object"}}
        replies = []
        waiting = threading.Thread(target=lambda: replies.append(
            http_request(background.base_url, "POST", "/v1/chat/completions", constrained, timeout=TIMEOUT)))
        waiting.start()
        waiting.join(0.5)
        assert not replies  # it waits for the view
        gate.set()
        waiting.join(TIMEOUT)
        assert replies[0].status == 200 and replies[0].json()["choices"][0]["message"]["content"].startswith("{")


@pytest.mark.parametrize("fmt, words", [
    ({"type": "xml"}, "type"),
    ("json", "object"),
    ({"type": "json_schema"}, "json_schema"),
    ({"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}, "name"),
    ({"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "strng"}}}, "strng"),
    ({"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "string", "pattern": "(["}}}, "regex"),
    ({"type": "json_schema", "json_schema": {"name": "a", "schema": [1]}}, "schema"),
])
def test_bad_response_format_is_a_400_naming_it(chat_server, fmt, words):
    for path, body in (("/v1/chat/completions", {"messages": user("x")}), ("/v1/completions", {"prompt": "x"})):
        r = http_request(chat_server.base_url, "POST", path, {**body, "max_tokens": 4, "response_format": fmt})
        assert r.status == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "response_format" and words in error["message"], error


def test_text_format_and_speculation(client, chat_server):
    r = client.chat.completions.create(model=CHAT_MODEL, messages=user("x"), max_tokens=3, seed=1,
                                       response_format={"type": "text"})
    assert r.choices[0].finish_reason == "length"
    body = {"prompt": "x", "max_tokens": 4, "response_format": {"type": "json_object"}, "speculative": "ngram"}
    reply = http_request(chat_server.base_url, "POST", "/v1/completions", body)
    assert reply.status == 400 and reply.json()["error"]["param"] == "response_format"


def test_python_api_refuses_grammar_with_speculation_and_non_grammars(chat_reference, tokenizer):
    grammar = Grammar.json_object(tokenizer)
    with pytest.raises(llaisys.LlaisysValueError, match="speculative"):
        chat_reference.generate([1, 2, 3], 8, grammar=grammar, speculative="ngram")
    with pytest.raises(llaisys.LlaisysValueError, match="grammar"):
        chat_reference.generate([1, 2, 3], 8, grammar={"type": "json_object"})


def test_python_api_regex_and_lark_grammars(chat_reference, tokenizer):
    import re

    ids = chat_ids(tokenizer, user("Letters"))
    for grammar, pattern in ((Grammar.regex(tokenizer, "[ab]{3}-[0-9]{2}"), "[ab]{3}-[0-9]{2}"),
                             (Grammar.lark(tokenizer, 'start: "yes" | "no"'), "yes|no")):
        text = generate_text(chat_reference, tokenizer, ids, 20, top_k=0, seed=4, grammar=grammar, **SAMPLING)
        assert re.fullmatch(pattern, text), text


# -- grammars that cannot harm another request -----------------------------------------------------------------

LEAKS = ("panicked", "backtrace", "/home", "src/", ".rs:", "<non-verbose")
RECURSIVE = {"properties": {"a": {"$ref": "#"}}, "required": ["a"]}  # (no type: 1 and {"a": 1} are values)
HOSTILE = {
    "an object that requires itself": ({"type": "object", **RECURSIVE}, "no finite instance: each value must contain "
                                       "another without end (# -> #/properties/a -> #)"),
    "a definition that is itself": ({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}, "no finite instance"),
    "5001 properties": ({"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(5001)},
                         "required": [f"p{i}" for i in range(5001)]}, "more than 5000 object properties"),
    "an 80,000-value enum": ({"enum": [f"value{i}" for i in range(80_000)]}, "more than"),
    "1001 enum values": ({"enum": list(range(1001))}, "more than 1000 enum values"),
}


def assert_clean(message: str) -> None:
    assert "\n" not in message and not any(leak in message.lower() for leak in LEAKS), message


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_schemas_are_400s_naming_the_problem(chat_server, name):
    """Each of a hostile review's schemas, as response_format (chat, completions) and as text.format
    (responses): a 400 that names the parameter and the problem, in one clean line."""
    schema, words = HOSTILE[name]
    for path, body, param in (
            ("/v1/chat/completions", {"messages": user("x"), "response_format": json_schema_format(schema)},
             "response_format"),
            ("/v1/completions", {"prompt": "x", "response_format": json_schema_format(schema)}, "response_format"),
            ("/v1/responses", {"input": "x", "text": {"format": {"type": "json_schema", "name": "a",
                                                                  "schema": schema}}}, "text.format")):
        r = http_request(chat_server.base_url, "POST", path, {**body, "max_tokens": 4} if "responses" not in path
                         else {**body, "max_output_tokens": 4})
        assert r.status == 400, (path, r.text[:300])
        error = r.json()["error"]
        assert error["param"] == param and words in error["message"], (path, error)
        assert_clean(error["message"])


def test_forced_tool_calls_check_the_parameters_alike(tool_server):
    """A forcing tool_choice compiles each function's parameters into its grammar: the same checks, counted
    together, named by function."""
    tool_server.scripted.reply = None

    def forced(*parameters: dict) -> dict:
        tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": p}} for i, p in enumerate(parameters)]
        body = {"messages": user("x"), "max_tokens": 4, "tools": tools, "tool_choice": "required"}
        r = http_request(tool_server.base_url, "POST", "/v1/chat/completions", body)
        assert r.status == 400, r.text[:300]
        error = r.json()["error"]
        assert error["param"] == "tool_choice", error
        assert_clean(error["message"])
        return error["message"]

    # (a function's arguments are an object: the recursion that a typeless schema escapes has no value here)
    assert "'parameters' of function 'f0' has no finite instance" in forced(RECURSIVE)
    half = {"properties": {f"p{i}": {"type": "integer"} for i in range(2501)},
            "required": [f"p{i}" for i in range(2501)]}
    assert "'parameters' of function 'f1' has more than 5000 object properties" in forced(half, half)


def test_the_typeless_recursion_is_served_and_ends_in_json(client):
    """Without "type", ``RECURSIVE`` has finite values (llguidance reads it as any type): it is served, and every
    reply that stops is valid JSON; none fails."""
    for seed in range(4):
        r = client.chat.completions.create(model=CHAT_MODEL, messages=user("Nest"), max_tokens=60, seed=seed,
                                           response_format=json_schema_format(RECURSIVE), **SAMPLING)
        (choice,) = r.choices
        assert choice.finish_reason in ("stop", "length"), choice
        if choice.finish_reason == "stop":
            json.loads(choice.message.content)


def test_n_choices_share_one_compile(client, monkeypatch):
    """A request's grammar compiles once, off the engine thread; its n choices copy it."""
    import llguidance

    real, made = llguidance.LLMatcher, []

    class Counting:
        def __call__(self, *args, **kwargs):
            made.append(1)
            return real(*args, **kwargs)

        def __getattr__(self, name):
            return getattr(real, name)

    monkeypatch.setattr(llguidance, "LLMatcher", Counting())
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    r = client.chat.completions.create(model=CHAT_MODEL, messages=user("Say"), max_tokens=20, seed=5, n=8,
                                       response_format=json_schema_format(schema), **SAMPLING)
    assert len(made) == 1
    assert sorted(c.index for c in r.choices) == list(range(8))
    assert all(json.loads(c.message.content) in ({"ok": True}, {"ok": False}) for c in r.choices)


def test_json_object_on_a_vocabulary_that_cannot_write_it_is_a_400():
    """A vocabulary without "{": the grammar allows no first token, a 400 that says so (not a 500 with the
    parser's state)."""
    import asyncio

    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    from llaisys_models.serve.errors import APIError
    from llaisys_models.serve.structured import Grammars

    alphabet = bytes_to_unicode()
    core = Tokenizer(BPE(vocab={alphabet[b]: i for i, b in enumerate(b"abcdefghijklmnopqrstuvwxyz ")}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    letters = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|endoftext|>")
    with pytest.raises(APIError) as caught:
        asyncio.run(Grammars(letters).of({"response_format": {"type": "json_object"}}))
    assert caught.value.status == 400 and caught.value.param == "response_format"
    assert "allows no token of this model's vocabulary at its start" in caught.value.message
    assert_clean(caught.value.message)


def test_compiles_leave_the_event_loop_free(tokenizer, monkeypatch):
    """While a grammar compiles (here: held until released), the event loop goes on."""
    import asyncio
    import threading

    from llaisys_models.serve.structured import Grammars

    started, release = threading.Event(), threading.Event()
    compile_schema = Grammar.json_schema.__func__

    def held(cls, *args, **kwargs):
        started.set()
        release.wait(TIMEOUT)
        return compile_schema(cls, *args, **kwargs)

    monkeypatch.setattr(Grammar, "json_schema", classmethod(held))
    grammars = Grammars(tokenizer)

    async def request_and_tick():
        compiling = asyncio.ensure_future(grammars.of({"response_format": json_schema_format({"type": "integer"})}))
        ticks = 0
        while not started.is_set() or ticks < 10:  # the loop turns while the compile is held
            await asyncio.sleep(0.01)
            ticks += 1
        assert not compiling.done()
        release.set()
        return await compiling

    constraint = asyncio.run(request_and_tick())
    assert constraint is not None and constraint.grammar.what == "json_schema"
