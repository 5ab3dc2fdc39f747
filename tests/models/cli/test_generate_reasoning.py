"""``llaisys generate --chat`` on a reasoning model: the thinking printed apart from the answer (dimmed on a
terminal, under ``Thinking:`` / ``Answer:`` lines elsewhere, left out with --hide-reasoning), switched off
(--chat-template-kwargs) and budgeted (--thinking-budget); bad flags are one-line errors; a model that does not
reason, and generate without --chat, print as before.

The reasoning model is scripted (helpers/reasoning_model.py): its replies are known text, compared exactly.
"""

from __future__ import annotations

import importlib.metadata
import io

import pytest

import llaisys_models
from helpers.reasoning_model import ANSWER, QWEN3_TEMPLATE, R1_TEMPLATE, THOUGHT, make_reasoning_model
from llaisys.cli import main

F32 = "f32_gqa2_hd32"  # a tiny model that does not reason
MARKED = f"Thinking:\n{THOUGHT}\nAnswer:\n{ANSWER}\n"
DIMMED = f"\x1b[2m{THOUGHT}\x1b[0m\n\n{ANSWER}\n"


@pytest.fixture(autouse=True)
def _commands_installed():
    names = {ep.name for ep in importlib.metadata.entry_points(group="llaisys.commands")}
    if "generate" not in names:
        pytest.skip("llaisys-models' commands are not registered (pip install ./llaisys-models)")


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("reasoning_models")
    return {"r1": make_reasoning_model(root / "r1", R1_TEMPLATE),
            "qwen3": make_reasoning_model(root / "qwen3", QWEN3_TEMPLATE)}


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def chat(monkeypatch, capsys, path, device, *flags, lines=("2+40?",), stdout=None) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``generate --chat`` on ``path`` answering ``lines``."""
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(line + "\n" for line in lines)))
    stdout = io.StringIO() if stdout is None else stdout  # (not a terminal, unless a Terminal)
    monkeypatch.setattr("sys.stdout", stdout)
    rc = main(["generate", "--chat", "--model", str(path), "--device", str(device), "--max-new-tokens", "40",
               *flags])
    return rc, stdout.getvalue(), capsys.readouterr().err


@pytest.mark.parametrize("name", ["r1", "qwen3"])
def test_the_thinking_is_marked_when_stdout_is_not_a_terminal(model_dirs, device, monkeypatch, capsys, name):
    rc, out, err = chat(monkeypatch, capsys, model_dirs[name], device, lines=("2+40?", "and again?"))
    assert rc == 0, err
    assert out == MARKED * 2  # (the second turn's prompt holds the first answer, not its thinking)


def test_the_thinking_is_dimmed_on_a_terminal(model_dirs, device, monkeypatch, capsys):
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    rc, out, err = chat(monkeypatch, capsys, model_dirs["r1"], device, stdout=Terminal())
    assert rc == 0, err
    assert out == DIMMED
    monkeypatch.setenv("NO_COLOR", "1")  # https://no-color.org
    assert chat(monkeypatch, capsys, model_dirs["r1"], device, stdout=Terminal())[1] == MARKED


def test_a_reply_out_of_tokens_in_its_thinking(model_dirs, device, monkeypatch, capsys):
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    cut = ["--max-new-tokens", "3"]  # "Hmm" "," " two"
    assert chat(monkeypatch, capsys, model_dirs["r1"], device, *cut)[1] == "Thinking:\nHmm, two\nAnswer:\n\n"
    assert chat(monkeypatch, capsys, model_dirs["r1"], device, *cut, stdout=Terminal())[1] == \
        "\x1b[2mHmm, two\x1b[0m\n"  # (the terminal's style reset)
    assert chat(monkeypatch, capsys, model_dirs["r1"], device, *cut, "--hide-reasoning")[1] == "\n"


@pytest.mark.parametrize("terminal", [False, True], ids=["piped", "terminal"])
def test_hide_reasoning_prints_the_answer_alone(model_dirs, device, monkeypatch, capsys, terminal):
    monkeypatch.delenv("NO_COLOR", raising=False)
    rc, out, err = chat(monkeypatch, capsys, model_dirs["r1"], device, "--hide-reasoning",
                        stdout=Terminal() if terminal else None)
    assert rc == 0, err
    assert out == ANSWER + "\n"


def test_chat_template_kwargs_switch_the_thinking_off(model_dirs, device, monkeypatch, capsys):
    rc, out, err = chat(monkeypatch, capsys, model_dirs["qwen3"], device, "--chat-template-kwargs",
                        '{"enable_thinking": false, "effort": "low"}')
    assert rc == 0, err
    assert out == ANSWER + "\n"  # no thinking: no headers either
    assert "--chat-template-kwargs: the chat template of qwen3 reads no 'effort'; ignored\n" in err


@pytest.mark.parametrize("flag", ["--thinking-budget", "--thinking-token-budget"])
def test_a_thinking_budget_closes_the_thinking(model_dirs, device, monkeypatch, capsys, flag):
    rc, out, err = chat(monkeypatch, capsys, model_dirs["r1"], device, flag, "2")
    assert rc == 0, err
    assert out == f"Thinking:\nHmm,\nAnswer:\n{ANSWER}\n"
    assert chat(monkeypatch, capsys, model_dirs["r1"], device, flag, "0")[1] == ANSWER + "\n"


def test_reasoning_parser_none_prints_the_reply_as_it_comes(model_dirs, device, monkeypatch, capsys):
    rc, out, err = chat(monkeypatch, capsys, model_dirs["r1"], device, "--reasoning-parser", "none")
    assert rc == 0, err
    assert out == f"{THOUGHT}\n\n{ANSWER}\n"  # (the tags are special tokens: left out, as ever)


def test_generate_without_chat_is_unchanged(model_dirs, device, capsys):
    """The raw path prints the model's text as it comes, thinking and all (the decoded tokens)."""
    from llaisys_models.text.tokenizer import encode, load_tokenizer

    path = model_dirs["r1"]
    assert main(["generate", "--model", str(path), "--device", str(device), "--prompt", "2+40?"]) == 0
    tokenizer = load_tokenizer(path)
    ids = encode(tokenizer, "2+40?")
    model = llaisys_models.load(path, device=device)
    assert capsys.readouterr().out == tokenizer.decode(model.generate(ids, 40)[len(ids):],
                                                       skip_special_tokens=True) + "\n"


def test_a_model_that_does_not_reason_chats_as_before(tiny_models, device, monkeypatch, capsys):
    path = tiny_models.path(F32)
    base = ["--model", str(path), "--device", str(device), "--max-new-tokens", "12"]
    assert main(["generate", "--prompt", "Hi there", *base]) == 0
    reply = capsys.readouterr().out
    for flags in ([], ["--hide-reasoning"], ["--reasoning-parser", "none"]):
        monkeypatch.setattr("sys.stdin", io.StringIO("Hi there\n"))
        assert main(["generate", "--chat", *base, *flags]) == 0
        assert capsys.readouterr().out == reply, flags


@pytest.mark.parametrize("flags, message", [
    (["--thinking-budget", "x"], "--thinking-budget must be a whole number >= 0, got 'x'"),
    (["--thinking-budget", "-1"], "--thinking-budget must be a whole number >= 0, got '-1'"),
    (["--reasoning-parser", "r1"], "--reasoning-parser 'r1' is not a reasoning parser: use one of auto, "
                                   "deepseek_r1, qwen3, none"),
    (["--chat-template-kwargs", "{"], "--chat-template-kwargs is not JSON: "),
    (["--chat-template-kwargs", "[1]"], "--chat-template-kwargs must be a JSON object of chat template variables"),
    (["--chat-template-kwargs", '{"tools": []}'], "--chat-template-kwargs: 'tools' cannot be set"),
])
def test_bad_reasoning_flags_are_one_line_before_loading(monkeypatch, capsys, flags, message):
    monkeypatch.setattr("sys.stdin", io.StringIO("2+40?\n"))
    assert main(["generate", "--chat", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"llaisys: error: {message}") and err.count("\n") == 1 and "loaded" not in err, err


@pytest.mark.parametrize("flags", [["--hide-reasoning"], ["--thinking-budget", "4"], ["--reasoning-parser", "none"],
                                   ["--chat-template-kwargs", "{}"]])
def test_reasoning_flags_need_chat(capsys, flags):
    assert main(["generate", "--prompt", "2+40?", *flags]) == 2
    err = capsys.readouterr().err
    assert err == f"llaisys: error: {flags[0]} applies to --chat replies (without --chat, generate prints the " \
                  f"model's text as it comes)\n"


def test_a_budget_or_a_parser_for_a_model_that_does_not_reason(tiny_models, device, monkeypatch, capsys):
    path = tiny_models.path(F32)
    for flags, message in [(["--thinking-budget", "4"], "--thinking-budget needs a reasoning model: the chat "
                                                        f"template of {path.name} has no thinking\n"),
                           (["--reasoning-parser", "qwen3"], "--reasoning-parser qwen3: the tokenizer has no <think> "
                                                             "token")]:
        rc, out, err = chat(monkeypatch, capsys, path, device, *flags)
        assert rc == 2 and out == ""
        last = err.splitlines(keepends=True)[-1]
        assert last.startswith("llaisys: error: " + message.rstrip("\n")) and last.endswith("\n"), err
