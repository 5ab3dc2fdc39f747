"""``llaisys generate --speculative ngram|mtp|draft:PATH|off``: the same reply as without it, the drafts counted."""

from __future__ import annotations

import importlib.metadata
import re

import pytest

from llaisys.cli import main

F32 = "f32_gqa2_hd32"
PROMPT = "one two three one two three one two three one two"  # prompt lookup finds what to draft


@pytest.fixture(autouse=True)
def _commands_installed():
    names = {ep.name for ep in importlib.metadata.entry_points(group="llaisys.commands")}
    if "generate" not in names:
        pytest.skip("llaisys-models' commands are not registered (pip install ./llaisys-models)")


def _generate(capsys, *flags) -> tuple[str, str]:
    assert main(["generate", *flags]) == 0
    out, err = capsys.readouterr()
    return out, err


@pytest.mark.parametrize("sampling", [[], ["--temperature", "0.8", "--seed", "3"]], ids=["greedy", "seeded"])
def test_speculative_generate_gives_the_plain_reply(tiny_models, device, capsys, sampling):
    common = ["--model", str(tiny_models.path(F32)), "--device", str(device), "--raw", "--prompt", PROMPT,
              "--max-new-tokens", "24", *sampling]
    plain, plain_err = _generate(capsys, *common)
    assert "drafted" not in plain_err
    for method in (["--speculative", "ngram", "--num-speculative-tokens", "3"],
                   ["--speculative", f"draft:{tiny_models.path(F32)}"]):
        out, err = _generate(capsys, *common, *method)
        assert out == plain
        drafted, kept = map(int, re.search(r"drafted (\d+), kept (\d+)", err).groups())
        assert drafted > 0 and 0 <= kept <= drafted
    off, off_err = _generate(capsys, *common, "--speculative", "off")
    assert off == plain and "drafted" not in off_err


@pytest.mark.parametrize("flags, needle", [(["--speculative", "medusa"], "--speculative = 'medusa'"),
                                           (["--num-speculative-tokens", "3"], "needs --speculative")])
def test_bad_speculative_flags_are_one_line(tiny_models, device, capsys, flags, needle):
    assert main(["generate", "--model", str(tiny_models.path(F32)), "--device", str(device), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("llaisys: error: ") and needle in err and err.count("\n") == 1
