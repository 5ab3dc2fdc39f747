"""``model.chat`` / ``model.complete``: text in, text out, the same as tokenizing by hand and calling generate."""

from __future__ import annotations

import io
import json
import shutil

import pytest

import llaisys_models
from llaisys import LlaisysValueError
from llaisys.cli import main
from llaisys_models.text.tokenizer import encode, load_tokenizer

F32 = "f32_gqa2_hd32"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me about llamas."}]
SAMPLED = dict(temperature=0.9, top_p=0.95, seed=11)


@pytest.fixture
def model(loaded_models, device):
    return loaded_models(device, [F32])[F32]


def by_hand(model, path, ids, n, **sampling):
    """(new tokens, their text) from generate on ``ids``, as a user without chat() would do it."""
    tokenizer = load_tokenizer(path)
    out = model.generate(ids, n, **sampling)[len(ids):]
    text = out[:-1] if out and out[-1] in model.eos_token_ids else out
    return out, tokenizer.decode(text, skip_special_tokens=True)


@pytest.mark.parametrize("sampling", [{}, SAMPLED], ids=["greedy", "sampled"])
def test_chat_equals_the_template_and_generate_by_hand(model, tiny_models, sampling):
    path = tiny_models.path(F32)
    ids = encode(load_tokenizer(path), MESSAGES)
    hand = {"top_k": 0, **SAMPLED} if sampling else {}
    tokens, text = by_hand(model, path, ids, 24, **hand)
    assert model.chat(MESSAGES, max_new_tokens=24, **sampling) == text and text
    assert model.last_stats.new_tokens == len(tokens)
    assert model.last_stats.prompt_tokens <= len(ids)
    if sampling:  # the sampling arguments reached generate
        assert text != by_hand(model, path, ids, 24)[1]


def test_a_str_is_one_user_message(model):
    one = [{"role": "user", "content": "hello"}]
    assert model.chat("hello", max_new_tokens=10) == model.chat(one, max_new_tokens=10)


@pytest.mark.parametrize("sampling", [{}, SAMPLED], ids=["greedy", "sampled"])
def test_streamed_pieces_join_to_the_reply(model, sampling):
    pieces = list(model.chat(MESSAGES, stream=True, max_new_tokens=24, **sampling))
    assert len(pieces) > 1 and all(pieces)
    assert "".join(pieces) == model.chat(MESSAGES, max_new_tokens=24, **sampling)
    assert list(model.stream_chat(MESSAGES, max_new_tokens=24, **sampling)) == pieces


def test_a_stop_string_ends_the_reply_before_it(model):
    full = model.chat(MESSAGES, max_new_tokens=24)
    stop = full[len(full) // 2:len(full) // 2 + 2]
    want = full[:full.index(stop)]
    assert model.chat(MESSAGES, max_new_tokens=24, stop=[stop, "\x00never"]) == want
    assert "".join(model.chat(MESSAGES, max_new_tokens=24, stop=stop, stream=True)) == want
    assert model.chat("x", max_new_tokens=4) is not None  # the stopped stream freed the model


def test_complete_continues_the_bare_text(model, tiny_models):
    path = tiny_models.path(F32)
    ids = encode(load_tokenizer(path), "Once upon a time", chat=False)
    _, text = by_hand(model, path, ids, 16)
    assert model.complete("Once upon a time", max_new_tokens=16) == text
    assert "".join(model.stream_complete("Once upon a time", max_new_tokens=16)) == text


def test_the_demo_answers_in_text():
    if not (llaisys_models.DEMO_MODEL_DIR / "config.json").is_file():
        pytest.skip("the demo model is not in this checkout")
    demo = llaisys_models.load(llaisys_models.DEMO_MODEL_DIR, device="cpu")
    assert demo.chat("12+34=") == "46"
    assert demo.chat([{"role": "user", "content": "7+8="}], max_new_tokens=8) == "15"


def test_a_model_without_a_chat_template_says_so(tiny_models, tmp_path, monkeypatch, capsys):
    path = tmp_path / "plain"
    shutil.copytree(tiny_models.path(F32), path)
    config = json.loads((path / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    (path / "chat_template.jinja").unlink(missing_ok=True)
    model = llaisys_models.load(path, device="cpu")
    with pytest.raises(LlaisysValueError, match=r"no chat template.*complete\(text\)"):
        model.chat("hello")
    assert model.complete("hello", max_new_tokens=4) is not None
    monkeypatch.setattr("sys.stdin", io.StringIO("hello\n"))  # the CLI's --chat: one line, no traceback
    assert main(["generate", "--model", str(path), "--device", "cpu", "--chat"]) == 2
    err = capsys.readouterr().err
    assert "--chat needs a chat template" in err and "Traceback" not in err


def test_bad_arguments_fail_before_generating(model):
    for messages in ([], [{"role": "user"}], ["hello"], 42, [{"role": "user", "content": 3}]):
        with pytest.raises(LlaisysValueError, match="messages must be"):
            model.chat(messages)
    with pytest.raises(LlaisysValueError, match="max_new_tokens 100000 need"):
        model.chat("hi", max_new_tokens=100_000, stream=True)  # raised by the call, not by the first next()
    with pytest.raises(LlaisysValueError, match="stop must be"):
        model.chat("hi", stop=[1])
    with pytest.raises(LlaisysValueError, match="top_p"):
        model.chat("hi", top_p=2.0)
    with pytest.raises(LlaisysValueError, match="complete.. takes the prompt as text"):
        model.complete([1, 2, 3])
