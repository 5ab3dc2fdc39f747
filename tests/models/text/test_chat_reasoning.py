"""``model.chat`` / ``stream_chat`` on a reasoning model: the thinking comes back apart from the answer (a
``ChatReply`` with ``.reasoning``, ``ReplyPiece``s marked ``.reasoning``), can be switched off
(``chat_template_kwargs``) and budgeted (``thinking_budget``, the engine's ThinkingRule through ``generate``);
a model that does not reason answers exactly as before.

The reasoning model is scripted (helpers/reasoning_model.py): its replies are known text, compared exactly.
"""

from __future__ import annotations

import copy
import pickle

import pytest

import llaisys_models
from helpers.reasoning_model import ANSWER, QWEN3_TEMPLATE, R1_TEMPLATE, THOUGHT, make_reasoning_model
from llaisys import LlaisysValueError
from llaisys_models.text.chat import ChatReply, ReplyPiece
from llaisys_models.text.reasoning import load_parser
from llaisys_models.text.tokenizer import encode, load_tokenizer

F32 = "f32_gqa2_hd32"  # a tiny model that does not reason (no <think> tokens, no thinking in its template)
QUESTION = "2+40?"
RAW = f"{THOUGHT}\n\n{ANSWER}"  # R1's reply without a parser: its (special) tags dropped, as ever
N = 40  # more than a whole reply


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("reasoning_models")
    return {"r1": make_reasoning_model(root / "r1", R1_TEMPLATE),
            "qwen3": make_reasoning_model(root / "qwen3", QWEN3_TEMPLATE)}


@pytest.fixture(scope="module")
def loaded(model_dirs):
    cache: dict = {}

    def load(name, device):
        if (name, device) not in cache:
            cache[name, device] = llaisys_models.load(model_dirs[name], device=device)
        return cache[name, device]
    return load


@pytest.fixture(params=["r1", "qwen3"])
def reasoner(request, loaded, device):
    return loaded(request.param, device)


@pytest.fixture
def r1(loaded, device):
    return loaded("r1", device)


@pytest.fixture
def qwen3(loaded, device):
    return loaded("qwen3", device)


@pytest.fixture
def plain(loaded_models, device):
    return loaded_models(device, [F32])[F32]


def parts(pieces):
    """(thinking, answer) of streamed pieces, each checked: ReplyPiece, non-empty, the thinking's first."""
    pieces = list(pieces)
    assert all(isinstance(p, ReplyPiece) and p for p in pieces), pieces
    flags = [p.reasoning for p in pieces]
    assert flags == sorted(flags, reverse=True), f"an answer's piece before a thinking's: {pieces}"
    return "".join(p for p in pieces if p.reasoning), "".join(p for p in pieces if not p.reasoning)


def test_chat_returns_the_answer_with_its_thinking_apart(reasoner):
    reply = reasoner.chat(QUESTION, max_new_tokens=N)
    assert isinstance(reply, ChatReply) and isinstance(reply, str)
    assert reply == ANSWER and reply.reasoning == THOUGHT
    assert repr(reply) == f"ChatReply({ANSWER!r}, reasoning={THOUGHT!r})"


def test_streamed_pieces_say_which_part_they_are(reasoner):
    pieces = list(reasoner.stream_chat(QUESTION, max_new_tokens=N))
    assert parts(pieces) == (THOUGHT, ANSWER)
    assert sum(p.reasoning for p in pieces) > 1, "the thinking came at once, not as it was generated"
    assert "".join(pieces) == THOUGHT + ANSWER  # print(piece, end="") still prints text
    assert list(reasoner.chat(QUESTION, stream=True, max_new_tokens=N)) == pieces


def test_thinking_switched_off_by_the_template(qwen3, model_dirs):
    off = {"enable_thinking": False}
    reply = qwen3.chat(QUESTION, max_new_tokens=N, chat_template_kwargs=off)
    assert reply == ANSWER and reply.reasoning is None
    assert parts(qwen3.stream_chat(QUESTION, max_new_tokens=N, chat_template_kwargs=off)) == ("", ANSWER)
    prompt = load_tokenizer(model_dirs["qwen3"]).decode(encode(qwen3.tokenizer, QUESTION, template_kwargs=off))
    assert prompt.endswith("<|assistant|><think>\n\n</think>\n\n")  # the variable reached the template


def test_a_variable_the_template_never_reads_is_dropped(r1):
    assert r1.chat(QUESTION, max_new_tokens=N, chat_template_kwargs={"enable_thinking": False, "x": 1}) == ANSWER


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_thinking_budget_closes_the_thinking(r1, stream):
    def chat(budget):
        if stream:
            thought, answer = parts(r1.stream_chat(QUESTION, max_new_tokens=N, thinking_budget=budget))
            return thought or None, answer
        reply = r1.chat(QUESTION, max_new_tokens=N, thinking_budget=budget)
        return reply.reasoning, str(reply)

    assert chat(2) == ("Hmm,", ANSWER)  # "Hmm" "," then the forced end, then the scripted answer
    assert chat(0) == (None, ANSWER)
    assert chat(50) == (THOUGHT, ANSWER)


def test_the_budget_reaches_the_engine_through_generate(r1):
    """``generate(thinking=rule)``: the Python API's path for the engine's ThinkingRule (SamplingParams.thinking)."""
    tokenizer = r1.tokenizer
    parser = load_parser(tokenizer)
    ids = encode(tokenizer, QUESTION)
    out = r1.generate(ids, N, thinking=parser.rule(ids, 2))[len(ids):]
    want = tokenizer("Hmm,\n</think>\n\nForty-two.", add_special_tokens=False).input_ids
    assert out == want + list(r1.eos_token_ids)[:1]
    assert list(r1.stream_generate(ids, N, thinking=parser.rule(ids, 2))) == out
    assert r1.generate(ids, N, thinking=parser.rule(ids)) == r1.generate(ids, N)  # no budget: as without
    with pytest.raises(LlaisysValueError, match="thinking must be a .*ThinkingRule"):
        r1.generate(ids, N, thinking=2)


def test_a_reply_out_of_tokens_in_its_thinking_has_no_answer(r1):
    reply = r1.chat(QUESTION, max_new_tokens=3)  # "Hmm" "," " two"
    assert (reply, reply.reasoning) == ("", "Hmm, two")
    assert parts(r1.stream_chat(QUESTION, max_new_tokens=3)) == ("Hmm, two", "")


def test_reasoning_parser_none_gives_the_text_as_it_comes(r1):
    reply = r1.chat(QUESTION, max_new_tokens=N, reasoning_parser="none")
    assert reply == RAW and reply.reasoning is None
    assert parts(r1.stream_chat(QUESTION, max_new_tokens=N, reasoning_parser="none")) == ("", RAW)
    assert r1.chat(QUESTION, max_new_tokens=N, reasoning_parser="deepseek_r1").reasoning == THOUGHT


def test_earlier_thinking_is_left_out_of_the_prompt(r1, monkeypatch):
    first = r1.chat(QUESTION, max_new_tokens=N)
    history = [{"role": "user", "content": QUESTION},
               {"role": "assistant", "content": first, "reasoning_content": first.reasoning, "reasoning": "r"},
               {"role": "user", "content": "And 1+1?"}]
    seen = []
    render = r1.tokenizer.apply_chat_template

    def spy(messages, *args, **kwargs):
        seen.append(messages)
        return render(messages, *args, **kwargs)

    monkeypatch.setattr(r1.tokenizer, "apply_chat_template", spy)
    reply = r1.chat(history, max_new_tokens=N)
    assert (reply, reply.reasoning) == (ANSWER, THOUGHT)
    assert seen[-1][1] == {"role": "assistant", "content": ANSWER}
    assert history[1]["reasoning_content"] == THOUGHT  # the caller's messages are left as they were


def test_a_stream_closed_in_its_thinking_frees_the_model(r1):
    stream = r1.stream_chat(QUESTION, max_new_tokens=N)
    assert next(stream).reasoning
    stream.close()
    assert r1.chat(QUESTION, max_new_tokens=N) == ANSWER


def test_replies_and_pieces_copy_and_pickle_with_their_part():
    reply, piece = ChatReply(ANSWER, THOUGHT), ReplyPiece("Hmm", reasoning=True)
    for made in (copy.copy(reply), copy.deepcopy(reply), pickle.loads(pickle.dumps(reply))):
        assert (made, made.reasoning) == (ANSWER, THOUGHT)
    for made in (copy.copy(piece), pickle.loads(pickle.dumps(piece))):
        assert (made, made.reasoning) == ("Hmm", True)
    assert ChatReply("x").reasoning is None and ReplyPiece("x").reasoning is False


def test_a_model_that_does_not_reason_answers_as_before(plain, tiny_models):
    tokenizer = load_tokenizer(tiny_models.path(F32))
    assert load_parser(tokenizer) is None
    ids = encode(tokenizer, QUESTION)
    out = plain.generate(ids, 16)[len(ids):]
    text = tokenizer.decode([t for t in out if t not in plain.eos_token_ids], skip_special_tokens=True)
    reply = plain.chat(QUESTION, max_new_tokens=16)
    assert reply == text and reply.reasoning is None
    pieces = list(plain.stream_chat(QUESTION, max_new_tokens=16))
    assert "".join(pieces) == text and not any(p.reasoning for p in pieces)
    assert plain.chat(QUESTION, max_new_tokens=16, chat_template_kwargs={"enable_thinking": False}) == text
    assert plain.chat(QUESTION, max_new_tokens=16, reasoning_parser="none") == text


@pytest.mark.parametrize("kwargs, needle", [
    ({"thinking_budget": -1}, "thinking_budget must be a whole number >= 0"),
    ({"thinking_budget": 2.5}, "thinking_budget must be a whole number >= 0"),
    ({"thinking_budget": True}, "thinking_budget must be a whole number >= 0"),
    ({"reasoning_parser": "r1"}, "reasoning_parser 'r1' is not a reasoning parser: use one of auto, deepseek_r1"),
    ({"reasoning_parser": None}, "reasoning_parser must be a str"),
    ({"chat_template_kwargs": ["enable_thinking"]}, "chat_template_kwargs must be a JSON object"),
    ({"chat_template_kwargs": {"messages": []}}, "'messages' cannot be set"),
])
def test_bad_reasoning_arguments_raise_before_generating(r1, kwargs, needle):
    with pytest.raises(LlaisysValueError, match=needle.replace("(", r"\(")):
        r1.chat(QUESTION, stream=True, **kwargs)


def test_a_budget_or_a_parser_for_a_model_that_does_not_reason(plain):
    with pytest.raises(LlaisysValueError, match="thinking_budget needs a reasoning model"):
        plain.chat(QUESTION, thinking_budget=8)
    with pytest.raises(LlaisysValueError, match="reasoning_parser deepseek_r1: the tokenizer has no <think> token"):
        plain.chat(QUESTION, reasoning_parser="deepseek_r1")
