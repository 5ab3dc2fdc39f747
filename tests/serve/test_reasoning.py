"""A reasoning model served: its thinking comes back apart from its answer (``reasoning_content`` and
``reasoning`` on chat, a ``reasoning`` item on /v1/responses), streamed or whole; it can be switched off
(``chat_template_kwargs``) and budgeted (``thinking_token_budget``), per request or by the server's options;
``--reasoning-parser none`` and /v1/completions give the raw text; bad switches are 400s and one-line errors.

The model is scripted (helpers/reasoning_model.py): its replies are known text, so each field is compared
exactly. Its ``<think>`` tags are special tokens, which the server must keep in the text to split it.
"""

from __future__ import annotations

import contextlib
import json

import pytest

from helpers.serve_helpers import check_error_body, http_request, require_serving

require_serving()

from helpers.chat_server import ChatServer, serve_device  # noqa: E402
from helpers.reasoning_model import ANSWER, QWEN3_TEMPLATE, R1_TEMPLATE, THOUGHT, make_reasoning_model  # noqa: E402

CHAT, RESPONSES = "/v1/chat/completions", "/v1/responses"
QUESTION = [{"role": "user", "content": "2+40?"}]
RAW = f"{THOUGHT}\n\n{ANSWER}"  # R1's reply with its (special) tags dropped, as the text is without a parser
THOUGHT_TOKENS = {"r1": 5, "qwen3": 6}  # Hmm , two plus forty (Qwen3's also the \n after its <think>; tags are not counted)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("reasoning_models")
    return {"r1": make_reasoning_model(root / "r1", R1_TEMPLATE),
            "qwen3": make_reasoning_model(root / "qwen3", QWEN3_TEMPLATE)}


@contextlib.contextmanager
def serving(path, *options, pytestconfig=None, script=False):
    """``llaisys serve``'s server for these ``options`` (through its own parser and ``load_server``), on a thread
    of this process; ``script``: its engine answers what ``server.scripted.reply`` says (helpers/tool_server.py)."""
    from helpers.tool_server import ScriptedEngine
    from llaisys.cli import build_parser
    from llaisys_models.serve.launch import load_server
    from llaisys_models.serve.tenancy import Tenants

    device = serve_device(pytestconfig) if pytestconfig is not None else None
    args = build_parser().parse_args(["serve", "--log-level", "warning", "--max-running", "4", *options,
                                      *(["--device", device] if device else [])])
    server = load_server(args, path, 4 << 20, Tenants(), 0)
    if script:
        scripted = ScriptedEngine(server.engine)
        server.engine.submit = scripted.submit
    with ChatServer(server) as running:
        running.scripted = scripted if script else None
        yield running


@pytest.fixture(scope="module")
def r1(model_dirs, pytestconfig):
    with serving(model_dirs["r1"], pytestconfig=pytestconfig) as server:
        yield server


@pytest.fixture(scope="module")
def qwen3(model_dirs, pytestconfig):
    with serving(model_dirs["qwen3"], pytestconfig=pytestconfig) as server:
        yield server


@pytest.fixture(scope="module")
def servers(r1, qwen3):
    return {"r1": r1, "qwen3": qwen3}


def chat(server, stream=False, **fields):
    """A chat request's reply: (reasoning_content, content, finish_reason, usage) whole, or joined from its
    chunks (each chunk checked: thinking and answer never in one, the thinking first, ``reasoning`` the same)."""
    body = {"messages": QUESTION, "temperature": 0, **fields}
    if not stream:
        r = http_request(server.base_url, "POST", CHAT, body)
        assert r.status == 200, r.text
        choice = r.json()["choices"][0]
        message = choice["message"]
        assert message.get("reasoning") == message.get("reasoning_content")
        return message.get("reasoning_content"), message["content"], choice["finish_reason"], r.json()["usage"]
    chunks = server.client().chat.completions.create(model=server.model_name, messages=QUESTION, temperature=0,
                                                     stream=True, stream_options={"include_usage": True},
                                                     extra_body=fields)
    thought, content, reason, usage, order = "", "", None, None, []
    for chunk in chunks:
        if not chunk.choices:
            usage = chunk.usage.model_dump()
            continue
        delta = chunk.choices[0].delta
        extra = delta.model_extra or {}
        assert extra.get("reasoning") == extra.get("reasoning_content")
        assert not (extra.get("reasoning_content") and delta.content)
        if extra.get("reasoning_content"):
            thought += extra["reasoning_content"]
            order.append("thinking")
        if delta.content:
            content += delta.content
            order.append("answer")
        reason = chunk.choices[0].finish_reason or reason
    assert order == sorted(order, reverse=True), order  # "thinking" before "answer"
    return thought or None, content, reason, usage


# -- the split ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["r1", "qwen3"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_the_thinking_and_the_answer_come_apart(servers, family, stream):
    thought, content, reason, usage = chat(servers[family], stream)
    assert (thought, content, reason) == (THOUGHT, ANSWER, "stop")
    assert usage["completion_tokens_details"]["reasoning_tokens"] == THOUGHT_TOKENS[family]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_reply_cut_short_while_thinking_is_all_thinking(r1, stream):
    assert chat(r1, stream, max_tokens=3)[:3] == ("Hmm, two", "", "length")


def test_each_choice_is_split_on_its_own(r1):
    r = http_request(r1.base_url, "POST", CHAT, {"messages": QUESTION, "n": 3})
    messages = [choice["message"] for choice in r.json()["choices"]]
    assert [(m["reasoning_content"], m["content"]) for m in messages] == [(THOUGHT, ANSWER)] * 3


def test_earlier_turns_thinking_is_dropped(r1):
    turn = [*QUESTION, {"role": "assistant", "content": ANSWER}, {"role": "user", "content": "Again?"}]
    with_thinking = [dict(m, reasoning_content=THOUGHT, reasoning=THOUGHT) if m["role"] == "assistant" else m
                     for m in turn]
    plain, dropped = (http_request(r1.base_url, "POST", CHAT, {"messages": m, "max_tokens": 1}).json()
                      for m in (turn, with_thinking))
    assert plain["usage"]["prompt_tokens"] == dropped["usage"]["prompt_tokens"]


def test_completions_are_raw_text(r1, model_dirs):
    from llaisys_models.text.tokenizer import load_tokenizer

    prompt = load_tokenizer(model_dirs["r1"]).apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    r = http_request(r1.base_url, "POST", "/v1/completions", {"prompt": prompt, "max_tokens": 20})
    assert r.json()["choices"][0]["text"] == RAW


def test_without_a_parser_the_text_is_as_it_was(model_dirs, pytestconfig):
    with serving(model_dirs["r1"], "--reasoning-parser", "none", pytestconfig=pytestconfig) as raw:
        r = http_request(raw.base_url, "POST", CHAT, {"messages": QUESTION})
        message = r.json()["choices"][0]["message"]
        assert message == {"role": "assistant", "content": RAW, "refusal": None}
        assert chat(raw, stream=True)[:2] == (None, RAW)
        r = http_request(raw.base_url, "POST", RESPONSES, {"input": "2+40?"})
        assert [item["type"] for item in r.json()["output"]] == ["message"]
        r = http_request(raw.base_url, "POST", CHAT, {"messages": QUESTION, "thinking_token_budget": 2})
        check_error_body(r, 400, "thinking_token_budget", "invalid_value")


# -- switching it off ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_enable_thinking_false_gives_no_thinking(qwen3, stream):
    thought, content, reason, usage = chat(qwen3, stream, chat_template_kwargs={"enable_thinking": False})
    assert (thought, content, reason) == (None, ANSWER, "stop")
    assert usage["completion_tokens_details"]["reasoning_tokens"] == 0


def test_the_server_s_template_variables_and_a_request_s_override(model_dirs, pytestconfig):
    with serving(model_dirs["qwen3"], "--chat-template-kwargs", '{"enable_thinking": false}',
                 pytestconfig=pytestconfig) as server:
        assert chat(server)[:2] == (None, ANSWER)
        assert chat(server, chat_template_kwargs={"enable_thinking": True})[:2] == (THOUGHT, ANSWER)
        assert chat(server, chat_template_kwargs={"unheard_of": 1})[:2] == (None, ANSWER)  # dropped, as in vLLM


# -- /v1/responses ---------------------------------------------------------------------------------------------

def test_responses_put_the_thinking_in_a_reasoning_item(r1):
    r = http_request(r1.base_url, "POST", RESPONSES, {"input": "2+40?"}).json()
    thinking, message = r["output"]
    assert thinking == {"type": "reasoning", "id": thinking["id"], "status": "completed", "summary": [],
                        "content": [{"type": "reasoning_text", "text": THOUGHT}]}
    assert thinking["id"].startswith("rs_") and message["type"] == "message"
    assert message["content"][0]["text"] == ANSWER
    assert r["usage"]["output_tokens_details"]["reasoning_tokens"] == THOUGHT_TOKENS["r1"]
    off = http_request(r1.base_url, "POST", RESPONSES, {"input": "2+40?", "thinking_token_budget": 0}).json()
    assert [item["type"] for item in off["output"]] == ["message"]


def test_responses_stream_the_reasoning_item_first(r1):
    events = list(r1.client().responses.create(model=r1.model_name, input="2+40?", stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    thinking_done = kinds.index("response.reasoning_text.done")
    assert set(kinds[4:thinking_done]) == {"response.reasoning_text.delta"}
    assert kinds[thinking_done:thinking_done + 6] == [
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == THOUGHT
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == ANSWER
    added = [e for e in events if e.type == "response.output_item.added"]
    assert [(e.output_index, e.item.type) for e in added] == [(0, "reasoning"), (1, "message")]
    assert events[thinking_done].text == THOUGHT
    final = events[-1].response
    assert [item.type for item in final.output] == ["reasoning", "message"] and final.output_text == ANSWER
    assert final.output[0].content[0].text == THOUGHT


def test_responses_stream_through_the_client_s_accumulator(qwen3):
    with qwen3.client().responses.stream(model=qwen3.model_name, input="2+40?") as stream:
        response = stream.get_final_response()
    assert response.output[0].type == "reasoning" and response.output[0].content[0].text == THOUGHT
    assert response.output_text == ANSWER


def test_responses_take_earlier_reasoning_items_and_drop_them(r1):
    items = [*QUESTION, {"type": "reasoning", "id": "rs_1", "summary": [],
                         "content": [{"type": "reasoning_text", "text": THOUGHT}]},
             {"role": "assistant", "content": ANSWER}, {"role": "user", "content": "Again?"}]
    r = http_request(r1.base_url, "POST", RESPONSES, {"input": items})
    assert r.status == 200 and r.json()["output"][-1]["content"][0]["text"] == ANSWER


# -- bad switches ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", [CHAT, RESPONSES])
@pytest.mark.parametrize("fields, param, code, message", [
    ({"chat_template_kwargs": "enable_thinking=false"}, "chat_template_kwargs", "invalid_type",
     "'chat_template_kwargs' must be an object, got a string"),
    ({"chat_template_kwargs": {"chat_template": "{{ 1 }}"}}, "chat_template_kwargs", "invalid_value",
     "'chat_template_kwargs.chat_template' cannot be set: the server sets it when it renders the chat template"),
    ({"thinking_token_budget": -1}, "thinking_token_budget", "invalid_value",
     "'thinking_token_budget' must be >= 0, got -1"),
    ({"thinking_token_budget": 2.5}, "thinking_token_budget", "invalid_type",
     "'thinking_token_budget' must be an integer, got a number"),
])
def test_bad_switches_are_400s_naming_them(r1, path, fields, param, code, message):
    body = {"messages": QUESTION} if path == CHAT else {"input": "2+40?"}
    error = check_error_body(http_request(r1.base_url, "POST", path, {**body, **fields}), 400, param, code)
    assert error["message"] == message


@pytest.mark.parametrize("options, message", [
    (["--reasoning-parser", "r1"], "--reasoning-parser 'r1' is not a reasoning parser: use one of auto, "
                                   "deepseek_r1, qwen3, none"),
    (["--thinking-token-budget", "-1"], "--thinking-token-budget = -1 is out of range (at least 0)"),
    (["--chat-template-kwargs", "enable_thinking"], "--chat-template-kwargs is not JSON: "),
    (["--chat-template-kwargs", "[]"], "--chat-template-kwargs must be a JSON object of chat template variables"),
    (["--chat-template-kwargs", '{"messages": []}'], "--chat-template-kwargs: 'messages' cannot be set"),
])
def test_bad_options_are_one_line_errors(options, message):
    from llaisys import LlaisysValueError
    from llaisys.cli import build_parser
    from llaisys_models.serve.cli import checked_options

    args = build_parser().parse_args(["serve", *options])
    with pytest.raises(LlaisysValueError) as e:
        checked_options(args)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_a_bad_option_stops_the_command():
    import subprocess

    from helpers.serve_process import llaisys_command

    done = subprocess.run([llaisys_command(), "serve", "--reasoning-parser", "r1"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == ("llaisys: error: --reasoning-parser 'r1' is not a reasoning parser: use one of "
                                   "auto, deepseek_r1, qwen3, none")


@pytest.mark.parametrize("options, message", [
    (["--reasoning-parser", "deepseek_r1"], "--reasoning-parser deepseek_r1: the tokenizer has no <think> token"),
    (["--thinking-token-budget", "2"], "--thinking-token-budget needs a reasoning model"),
])
def test_options_the_model_cannot_honour_stop_the_server(chat_model_dir, options, message):
    """The serving tests' model: no think tokens, a template without thinking."""
    from llaisys import LlaisysValueError

    with pytest.raises(LlaisysValueError, match=message), serving(chat_model_dir, *options):
        pass


# -- the engine's part: the budget, the count, grammars after the thinking ------------------------------------

@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_thinking_budget_closes_the_thinking(r1, stream):
    thought, content, reason, usage = chat(r1, stream, thinking_token_budget=2)
    assert (thought, content, reason) == ("Hmm,", ANSWER, "stop")
    assert usage["completion_tokens_details"]["reasoning_tokens"] == 2
    assert chat(r1, stream, thinking_token_budget=0)[:2] == (None, ANSWER)
    assert chat(r1, stream, thinking_token_budget=50)[:2] == (THOUGHT, ANSWER)


def test_the_server_s_budget_and_a_request_s_override(model_dirs, pytestconfig):
    with serving(model_dirs["r1"], "--thinking-token-budget", "2", pytestconfig=pytestconfig) as server:
        assert chat(server)[:2] == ("Hmm,", ANSWER)
        assert chat(server, thinking_token_budget=10)[:2] == (THOUGHT, ANSWER)


@pytest.mark.parametrize("family", ["r1", "qwen3"])
def test_a_schema_constrains_the_answer_not_the_thinking(servers, family):
    """The answer the model would give ("Forty-two.") is not an integer: the grammar makes it "42" (the scripted
    model's choice where its own is forbidden), after the thinking it leaves alone."""
    schema = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer"}, "strict": True}}
    thought, content, reason, _ = chat(servers[family], response_format=schema, max_tokens=30)
    assert thought == THOUGHT and json.loads(content) == 42 and reason == "stop"


# -- tool calls read from the answer ---------------------------------------------------------------------------

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]
CALL = '<tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call>'


@pytest.fixture(scope="module")
def scripted(model_dirs):
    with serving(model_dirs["qwen3"], script=True) as server:
        yield server


@pytest.mark.parametrize("reply, thought, content, calls", [
    (f"<think>\nI add.\n</think>\n\n{CALL}", "I add.", None, 1),  # the usual
    (f"<think>\nI add. {CALL}", "I add.", None, 1),  # a call before the thinking closed: kept (vllm#42021)
    (f"<think>\nMaybe {CALL}? No.</think>\n\nNo call.", f"Maybe {CALL}? No.", "No call.", 0),  # only a draft
])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_tool_calls_are_read_from_the_answer(scripted, reply, thought, content, calls, stream):
    scripted.scripted.reply = reply
    client = scripted.client()
    if not stream:
        r = client.chat.completions.create(model=scripted.model_name, messages=QUESTION, tools=TOOLS)
        message = r.choices[0].message
        got = (message.model_extra["reasoning_content"], message.content, len(message.tool_calls or []))
        assert got == (thought, content, calls)
    else:
        chunks = list(client.chat.completions.create(model=scripted.model_name, messages=QUESTION, tools=TOOLS,
                                                     stream=True))
        deltas = [c.choices[0].delta for c in chunks]
        got = ("".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas),
               "".join(d.content or "" for d in deltas) or None, sum(len(d.tool_calls or []) for d in deltas) // 2)
        assert got == (thought, content, calls)
    assert (r.choices[0].finish_reason if not stream else chunks[-1].choices[0].finish_reason) == (
        "tool_calls" if calls else "stop")
