"""text/reasoning.py: a reasoning model's reply split into thinking and answer (streamed a character at a time,
in two pieces at every point, or whole: the same split), the parser chosen from the chat template, and the
engine's rule made from the prompt; text/template_kwargs.py: which chat template variables a request may set."""

from __future__ import annotations

import pytest

from helpers.reasoning_model import ANSWER, QWEN3_TEMPLATE, R1_TEMPLATE, THOUGHT, write_tokenizer
from llaisys import LlaisysValueError
from llaisys_models.text.reasoning import FORCED_END, ReasoningSplitter, detect, load_parser
from llaisys_models.text.template_kwargs import RESERVED, ReservedName, parse_kwargs, template_names, usable
from llaisys_models.text.tokenizer import encode, load_tokenizer

CALL = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
R1_REPLY = f"{THOUGHT}</think>\n\n{ANSWER}"
QWEN3_REPLY = f"<think>\n{THOUGHT}</think>\n\n{ANSWER}"

# (text, starts inside the thinking, hold_from, (thinking, answer))
CASES = [
    (R1_REPLY, True, (), (THOUGHT, ANSWER)),  # R1: no opening tag (the template opened it)
    (f"<think>\n{R1_REPLY}", True, (), (THOUGHT, ANSWER)),  # R1 writing the tag anyway
    (QWEN3_REPLY, False, (), (THOUGHT, ANSWER)),  # Qwen3 opens it itself
    (f"  \n{QWEN3_REPLY}", False, (), (THOUGHT, ANSWER)),  # blank space before the tag
    (f"\n {THOUGHT} \n</think>\n \n{ANSWER} ", True, (), (THOUGHT, ANSWER + " ")),  # blank space around
    (ANSWER, False, (), (None, ANSWER)),  # no thinking at all
    (f"  {ANSWER}", False, (), (None, f"  {ANSWER}")),  # ... whose text stays as it is
    (f"{THOUGHT}\n", True, (), (THOUGHT, "")),  # never closed (cut by max_tokens): all thinking
    (f"<think>{THOUGHT} </thi", False, (), (f"{THOUGHT} </thi", "")),  # cut inside the end tag
    ("<thi", False, (), (None, "<thi")),  # not a tag after all
    ("\n</think>\n\nA", True, (), (None, "A")),  # a budget of 0: the forced end straight away
    (f"{THOUGHT}</think>{ANSWER} <think>more</think>", True, (), (THOUGHT, f"{ANSWER} <think>more</think>")),
    # a call written before the thinking closed, then the reply ended: the call is the answer (vllm#42021) ...
    (f"{THOUGHT} {CALL}", True, ("<tool_call>",), (THOUGHT, CALL)),
    # ... one drafted in a thinking that then closes is thinking
    (f"{THOUGHT} {CALL} no.</think>\n\n{ANSWER}", True, ("<tool_call>",), (f"{THOUGHT} {CALL} no.", ANSWER)),
    (f"{THOUGHT} <tool_c", True, ("<tool_call>",), (f"{THOUGHT} <tool_c", "")),  # an opener's start is text
]


def streamed(text: str, inside: bool, hold_from: tuple[str, ...], pieces: list[str]) -> tuple[str | None, str]:
    split = ReasoningSplitter(inside, hold_from)
    thought = answer = ""
    order = []  # which part each non-empty release went to: thinking never comes after answer
    for piece in pieces:
        more_thought, more_answer = split.push(piece)
        order += ["t"] * bool(more_thought) + ["a"] * bool(more_answer)
        thought, answer = thought + more_thought, answer + more_answer
    more_thought, more_answer = split.finish()
    order += ["t"] * bool(more_thought) + ["a"] * bool(more_answer)
    assert order == sorted(order, reverse=True), order
    return thought + more_thought or None, answer + more_answer


@pytest.mark.parametrize("text, inside, hold_from, want", CASES)
def test_the_split_whole_and_a_character_at_a_time(text, inside, hold_from, want):
    assert ReasoningSplitter(inside, hold_from).whole(text) == want
    assert streamed(text, inside, hold_from, list(text)) == want


@pytest.mark.parametrize("text, inside, hold_from, want", CASES)
def test_the_split_of_two_pieces_cut_anywhere(text, inside, hold_from, want):
    for cut in range(len(text) + 1):
        assert streamed(text, inside, hold_from, [text[:cut], text[cut:]]) == want, cut


def test_a_tag_is_never_given_out_in_part():
    split = ReasoningSplitter(True)
    assert split.push("Hmm </th") == ("Hmm", "")  # the blank space and the tag's start wait
    assert split.push("ink>\n") == ("", "")  # blank space after it waits for the answer
    assert split.push("\nA") == ("", "A")


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    """Tokenizers with <think> and </think> as tokens, under the R1 and Qwen3 templates, and others."""
    from helpers.qwen_template import QWEN25_TEMPLATE
    from helpers.tiny_models import write_tokenizer as write_plain_tokenizer

    out = {}
    for name, template in (("r1", R1_TEMPLATE), ("qwen3", QWEN3_TEMPLATE), ("qwen25", QWEN25_TEMPLATE),
                           ("r1_text_opening", R1_TEMPLATE.replace("<think>", "<reflect>"))):
        path = tmp_path_factory.mktemp(name)
        write_tokenizer(path, template)
        out[name] = load_tokenizer(path)
    path = tmp_path_factory.mktemp("plain")  # no tag tokens, whatever its template says
    write_plain_tokenizer(path)
    out["plain"] = load_tokenizer(path)
    out["plain"].chat_template = QWEN3_TEMPLATE
    return out


def test_detection_from_the_chat_template(tokenizers):
    assert detect(tokenizers["r1"]) == "deepseek_r1"  # its generation prompt opens the thinking
    assert detect(tokenizers["qwen3"]) == "qwen3"  # it reads enable_thinking
    assert detect(tokenizers["qwen25"]) == "none"
    assert detect(tokenizers["r1_text_opening"]) == "none"
    assert detect(tokenizers["plain"]) == "none"  # the tags are not tokens
    assert load_parser(tokenizers["qwen25"], "auto") is None and load_parser(tokenizers["r1"], "none") is None
    assert load_parser(tokenizers["qwen25"], "deepseek_r1").name == "deepseek_r1"  # named: its tags are tokens


def test_a_parser_that_cannot_apply_is_an_error(tokenizers):
    with pytest.raises(LlaisysValueError, match="'bogus' is not a reasoning parser: use one of auto, deepseek_r1"):
        load_parser(tokenizers["r1"], "bogus")
    with pytest.raises(LlaisysValueError, match="--reasoning-parser qwen3: the tokenizer has no <think> token"):
        load_parser(tokenizers["plain"], "qwen3")


def test_the_rule_follows_the_prompt(tokenizers):
    r1, qwen3 = load_parser(tokenizers["r1"]), load_parser(tokenizers["qwen3"])
    question = [{"role": "user", "content": "2+40?"}]
    opened = encode(tokenizers["r1"], question)
    thinking = encode(tokenizers["qwen3"], question)
    closed = encode(tokenizers["qwen3"], question, template_kwargs={"enable_thinking": False})
    assert r1.prompt_state(opened) == "open" and qwen3.prompt_state(thinking) == "none"
    assert qwen3.prompt_state(closed) == "closed"
    rule = r1.rule(opened, budget=7)
    assert rule.open_at_start and rule.budget == 7 and rule.end_ids == (r1.end_id,)
    assert rule.forced_end == tuple(tokenizers["r1"](FORCED_END, add_special_tokens=False).input_ids)
    # Qwen3 thinking: the reply's first token decides (the opening tag, or the answer); switched off: no thinking
    may_open, off = qwen3.rule(thinking), qwen3.rule(closed)
    assert not may_open.open_at_start and may_open.start_ids == (qwen3.start_id,)
    assert not off.open_at_start and off.start_ids == ()
    # the text: R1's starts inside; Qwen3's only once the model opens the tag
    assert r1.starts_inside(opened) and not qwen3.starts_inside(thinking) and not qwen3.starts_inside(closed)
    assert r1.starts_inside(encode(tokenizers["r1"], "no generation prompt", chat=False))  # R1 always thinks
    assert qwen3.split(thinking, QWEN3_REPLY) == (THOUGHT, ANSWER) and qwen3.split(closed, ANSWER) == (None, ANSWER)
    # an earlier turn's closed thinking in the prompt switches nothing off
    history = question + [{"role": "assistant", "content": "<think>x</think>y"}, *question]
    assert qwen3.prompt_state(encode(tokenizers["qwen3"], history)) == "none"


def test_template_variables(tokenizers):
    names = template_names(tokenizers["qwen3"])
    assert "enable_thinking" in names
    assert usable({"enable_thinking": False, "unheard_of": 1}, names) == ({"enable_thinking": False}, ["unheard_of"])
    for name in ("chat_template", "messages", "add_generation_prompt", "bos_token", "raise_exception"):
        assert name in RESERVED
        with pytest.raises(ReservedName, match=f"'{name}' cannot be set"):
            usable({name: "x"}, names | {name})


def test_template_variables_from_the_command_line():
    assert parse_kwargs('{"enable_thinking": false}', "--chat-template-kwargs") == {"enable_thinking": False}
    assert parse_kwargs(None, "--x") == {}
    with pytest.raises(LlaisysValueError, match="^--chat-template-kwargs is not JSON: "):
        parse_kwargs("{enable_thinking: false}", "--chat-template-kwargs")
    with pytest.raises(LlaisysValueError, match="^--chat-template-kwargs must be a JSON object"):
        parse_kwargs("[1]", "--chat-template-kwargs")
    with pytest.raises(LlaisysValueError, match="^--chat-template-kwargs: 'tools' cannot be set"):
        parse_kwargs('{"tools": []}', "--chat-template-kwargs")
