"""``llaisys generate`` (and its ``--chat``) with --repetition-penalty, --frequency-penalty, --presence-penalty."""

from __future__ import annotations

import importlib.metadata
import io

import pytest

import llaisys_models
from llaisys.cli import main

F32 = "f32_gqa2_hd32"
FLAGS = ["--repetition-penalty", "1.3", "--frequency-penalty", "0.5", "--presence-penalty", "0.2"]
KWARGS = dict(repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.2)


@pytest.fixture(autouse=True)
def _commands_installed():
    names = {ep.name for ep in importlib.metadata.entry_points(group="llaisys.commands")}
    if "generate" not in names:
        pytest.skip("llaisys-models' commands are not registered (pip install ./llaisys-models)")


def test_generate_applies_the_penalty_flags(tiny_models, device, capsys):
    from llaisys_models.text.tokenizer import encode, load_tokenizer

    path = tiny_models.path(F32)
    rc = main(["generate", "--model", str(path), "--device", str(device), "--prompt", "Hi there",
               "--max-new-tokens", "16", *FLAGS])
    out, err = capsys.readouterr()
    assert rc == 0, err
    tokenizer = load_tokenizer(path)
    ids = encode(tokenizer, "Hi there")
    model = llaisys_models.load(path, device=device)
    tokens = model.generate(ids, 16, **KWARGS)
    assert tokens != model.generate(ids, 16), "the flags changed nothing"
    assert out == tokenizer.decode(tokens[len(ids):], skip_special_tokens=True) + "\n"


def test_chat_applies_the_penalty_flags(tiny_models, device, capsys, monkeypatch):
    path = ["--model", str(tiny_models.path(F32)), "--device", str(device), "--max-new-tokens", "16", *FLAGS]
    assert main(["generate", "--prompt", "Hi there", *path]) == 0
    reply = capsys.readouterr().out
    monkeypatch.setattr("sys.stdin", io.StringIO("Hi there\n/exit\n"))
    assert main(["generate", "--chat", *path]) == 0
    assert capsys.readouterr().out == reply  # the first turn is the prompt through the same chat template


@pytest.mark.parametrize("flag, value, needle", [("--repetition-penalty", "0", "must be > 0.0"),
                                                 ("--repetition-penalty", "inf", "must be a finite number"),
                                                 ("--frequency-penalty", "2.5", "must be >= -2.0 and <= 2.0"),
                                                 ("--presence-penalty", "nan", "must be a finite number")])
def test_bad_penalty_flags_are_one_line_before_loading(capsys, flag, value, needle):
    assert main(["generate", flag, value]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"llaisys: error: {flag} {needle}") and err.count("\n") == 1 and "loaded" not in err
