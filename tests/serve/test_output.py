"""Incremental text of a sequence: multi-byte characters are never split, stop strings never leak."""

from __future__ import annotations

import random

import pytest

from llaisys_models.text.stream import StopMatcher, TextStream

TEXT = "héllo, 世界! 🙂 done"


@pytest.fixture(scope="module")
def byte_tokenizer(tmp_path_factory):
    from helpers.tiny_models import write_tokenizer
    from llaisys_models.text.tokenizer import load_tokenizer

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


# -- stop strings: the same outputs as a direct search, at a cost linear in the text ----------------------

class QuadraticStopMatcher:
    """The former StopMatcher (every prefix of every stop string tried at each push): the reference."""

    def __init__(self, stops):
        self.stops = tuple(s for s in stops if s)
        self.held = ""

    def push(self, text):
        if not self.stops:
            return text, False
        pending = self.held + text
        hits = [i for i in (pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.held = ""
            return pending[:min(hits)], True
        keep = max((n for s in self.stops for n in range(min(len(s) - 1, len(pending)), 0, -1)
                    if pending.endswith(s[:n])), default=0)
        self.held = pending[len(pending) - keep:] if keep else ""
        return pending[:len(pending) - keep], False

    def flush(self):
        held, self.held = self.held, ""
        return held


def run_matcher(matcher, pieces) -> tuple[list, str]:
    """Every push's result until a hit, then what a flush releases."""
    out = []
    for piece in pieces:
        out.append(matcher.push(piece))
        if out[-1][1]:
            return out, ""
    return out, matcher.flush()


def one_char_pieces(text):
    return list(text)


@pytest.mark.parametrize("stops, pieces, released", [
    (["the end"], one_char_pieces("and so: the end of it"), "and so: "),  # split across 7 pushes
    (["aba", "aab"], one_char_pieces("xaaba"), "x"),  # overlapping stop strings: "aab" ends first
    (["abab"], one_char_pieces("abaabab!"), "aba"),  # a failed partial match that restarts inside itself
    (["ab", "abc"], ["xab", "c"], "x"),  # a stop string that is a prefix of another: the shorter ends first
    (["abc", "ab"], one_char_pieces("zabc"), "z"),
    (["世界", "🙂!"], ["héllo ", "世", "界"], "héllo "),  # characters beyond the BMP and multi-byte ones
    (["🙂!"], ["a🙂", "🙂", "!"], "a🙂"),
    (["e\u0301x"], one_char_pieces("cafe\u0301e\u0301x"), "cafe\u0301"),  # combining marks are characters too
])
def test_stop_string_edge_cases(stops, pieces, released):
    out, flushed = run_matcher(StopMatcher(stops), pieces)
    assert out[-1][1] and not flushed
    assert "".join(text for text, _ in out) == released


def test_no_stop_string_releases_everything_by_the_end():
    out, flushed = run_matcher(StopMatcher(["abc", "zz"]), one_char_pieces("ababz abz"))
    assert not any(stopped for _, stopped in out)
    assert "".join(text for text, _ in out) + flushed == "ababz abz"
    assert flushed == "z"  # "z" may still begin "zz"


def test_same_pushes_as_the_direct_search():
    """Random texts over a small alphabet (many partial matches), random stop strings and random splits:
    push by push, the same (released text, hit) as the former implementation."""
    rng = random.Random(27)
    for _ in range(3000):
        alphabet = rng.choice(["ab", "abc", "aé🙂"])
        stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6))) for _ in range(rng.randint(1, 4))]
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 8)))) if len(text) > 1 else []
        pieces = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)])]
        assert run_matcher(StopMatcher(stops), pieces) == run_matcher(QuadraticStopMatcher(stops), pieces), \
            (stops, pieces)


class CountingStr(str):
    """A stop string that counts the characters read out of it (indexing and slicing)."""
    reads = 0

    def __getitem__(self, key):
        piece = str.__getitem__(self, key)
        CountingStr.reads += len(piece)
        return piece


LONG_STOP = 2000


def extended_stops() -> list[CountingStr]:
    """Four 2000-character stop strings that an output of "x"s keeps spelling (it stalled every stream once)."""
    return [CountingStr("x" * (LONG_STOP - 1) + end) for end in "abcd"]


def test_the_read_count_sees_a_quadratic_search():
    """The counting itself: the former search reads each stop string's prefixes at every push."""
    stops = extended_stops()
    matcher, CountingStr.reads = QuadraticStopMatcher(stops), 0
    for _ in range(LONG_STOP // 4):
        matcher.push("x")
    assert CountingStr.reads > 100 * len(stops) * (LONG_STOP // 4)


def test_work_per_push_is_linear():
    """The characters of the stop strings read per push stay within a small multiple of the new text
    plus the longest stop string, and over the whole output within a small multiple of its length."""
    stops = extended_stops()
    pieces = ["x"] * (LONG_STOP + 500) + ["xxxxxa"]  # then the first stop string completes
    matcher, CountingStr.reads = StopMatcher(stops), 0
    worst, released = 0, []
    for piece in pieces:
        before = CountingStr.reads
        text, stopped = matcher.push(piece)
        worst = max(worst, CountingStr.reads - before)
        released.append(text)
    assert stopped and "".join(released) == "x" * (LONG_STOP + 505 - (LONG_STOP - 1))
    assert worst <= 4 * len(stops) * (len(pieces[-1]) + LONG_STOP)
    assert 0 < CountingStr.reads <= 10 * len(stops) * sum(map(len, pieces))


def test_work_stays_linear_on_periodic_stop_strings():
    """Stop strings whose partial matches fall back often (``abab...c``): still a bounded read per character."""
    rng = random.Random(5)
    stops = [CountingStr("ab" * 300 + "c"), CountingStr("a" * 600 + "b")]
    text = "".join(rng.choice(["ab", "a", "abab", "b"]) for _ in range(3000))
    matcher, CountingStr.reads = StopMatcher(stops), 0
    worst = 0
    for char in text:
        before = CountingStr.reads
        matcher.push(char)
        worst = max(worst, CountingStr.reads - before)
    assert worst <= 4 * len(stops) * (1 + 601)
    assert 0 < CountingStr.reads <= 10 * len(stops) * len(text)
