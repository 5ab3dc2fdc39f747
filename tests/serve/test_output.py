"""Incremental text of a sequence: multi-byte characters are never split, stop strings never leak."""

from __future__ import annotations

import pytest

from llaisys_models.serve.output import StopMatcher, TextStream

TEXT = "héllo, 世界! 🙂 done"


@pytest.fixture(scope="module")
def byte_tokenizer(tmp_path_factory):
    from models.tiny_models import write_tokenizer

    from llaisys_models.tokenizer import load_tokenizer

    directory = tmp_path_factory.mktemp("byte_tokenizer")
    write_tokenizer(directory)
    return load_tokenizer(directory)


def test_multibyte_characters_arrive_whole(byte_tokenizer):
    tokens = list(TEXT.encode())  # the byte tokenizer: byte b is token b, so "世" is three tokens
    assert len(tokens) > len(TEXT)
    stream = TextStream(byte_tokenizer)
    pieces = [stream.push(t)[0] for t in tokens]
    pieces.append(stream.finish()[0])
    assert "".join(pieces) == TEXT
    assert all("\ufffd" not in p for p in pieces), pieces


def test_stop_string_across_tokens_is_cut_and_not_leaked(byte_tokenizer):
    stream = TextStream(byte_tokenizer, stops=["世界"])
    released, stopped_at = [], None
    for i, t in enumerate(TEXT.encode()):
        text, stopped = stream.push(t)
        released.append(text)
        if stopped:
            stopped_at = i
            break
    assert stopped_at == len("héllo, 世界".encode()) - 1  # the token that completes the stop string
    assert "".join(released) == "héllo, "


def test_held_back_prefix_is_released_when_it_does_not_complete():
    matcher = StopMatcher(["STOP"])
    assert matcher.push("abc ST") == ("abc ", False)  # "ST" may begin "STOP"
    assert matcher.push("O") == ("", False)
    assert matcher.push("P!") == ("", True)
    matcher = StopMatcher(["STOP"])
    assert matcher.push("xSTO") == ("x", False)
    assert matcher.push("RM") == ("STORM", False)
    assert matcher.push("ST") == ("", False)
    assert matcher.flush() == "ST"


def test_earliest_of_several_stop_strings_wins():
    matcher = StopMatcher(["world", "lo w"])
    assert matcher.push("hello world") == ("hel", True)


def test_stop_string_completed_by_the_final_flush(byte_tokenizer):
    stream = TextStream(byte_tokenizer, stops=["é!"])
    text = "caf" + "é!"
    out = [stream.push(t) for t in text.encode()[:-1]]
    out.append(stream.push(text.encode()[-1]))
    assert "".join(t for t, _ in out) == "caf" and out[-1][1]
