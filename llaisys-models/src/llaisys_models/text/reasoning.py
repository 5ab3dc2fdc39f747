"""A reasoning model's reply split into its thinking and its answer, and the engine's rule for the thinking.

Reasoning models write their chain of thought between ``<think>`` and ``</think>``, then the answer. Two
conventions exist, told apart by the chat template (``detect``):

    deepseek_r1   DeepSeek-R1 and its distills, QwQ, Qwen3 "Thinking-2507": the template opens ``<think>\\n`` at
                  the end of every prompt (older ones leave the model to write it), so the reply starts inside the
                  thinking with no opening tag of its own (vllm#12999); a reply that never closes it is all thinking.
    qwen3         Qwen3: the model opens ``<think>`` itself, unless ``enable_thinking`` is false, when the template
                  puts an empty ``<think>\\n\\n</think>\\n\\n`` in the prompt; a reply that opens no tag is all answer.

Either way the prompt's own tags come first: a prompt whose last ``<think>`` is open starts the reply inside the
thinking, one that ends with ``</think>`` (and blank space) has switched it off. The tags must be tokens of the
vocabulary (one each), so the engine sees the end of the thinking as a token and keeps the tags' text where they
are special tokens (``ReasoningParser.keep``).

    parser = load_parser(tokenizer, "auto")         # None: the model does not reason (or --reasoning-parser none)
    rule = parser.rule(prompt_ids, budget=512)      # the engine's ThinkingRule (SamplingParams.thinking)
    split = parser.splitter(prompt_ids)             # one per choice
    thought, answer = split.push(text)              # as the text streams (each part may be "")
    thought, answer = split.finish()                # what it held back
    thought, answer = parser.split(prompt_ids, whole_text)   # the same, at once (thought None: no thinking)

The split is the anchors' (vLLM's ``reasoning``, llama.cpp's ``reasoning_content``): the tags are left out, so is
the blank space around the thinking and at the start of the answer after it; a tag split between two pieces of
text is held back until it is whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from llaisys import LlaisysValueError

from ..engine.thinking import ThinkingRule

if TYPE_CHECKING:
    from .tokenizer import Tokenizer

START_TAG, END_TAG = "<think>", "</think>"
FORCED_END = "\n</think>\n\n"  # what ends the thinking when its budget is spent: the templates' own form
PARSERS = ("deepseek_r1", "qwen3")
CHOICES = ("auto", *PARSERS, "none")  # --reasoning-parser
_PROBE = [{"role": "user", "content": "1+1?"}]


def detect(tokenizer: Tokenizer) -> str:
    """The parser the chat template calls for: ``deepseek_r1`` where its generation prompt leaves ``<think>``
    open, ``qwen3`` where it reads ``enable_thinking``, else ``none`` (also where the tags are not tokens)."""
    template = getattr(tokenizer, "chat_template", None)
    if not template or not all(len(_tag_ids(tokenizer, tag)) == 1 for tag in (START_TAG, END_TAG)):
        return "none"
    try:
        prompt = tokenizer.apply_chat_template(_PROBE, tokenize=False, add_generation_prompt=True)
    except Exception:  # a template that wants other messages: it says nothing of its generation prompt
        prompt = ""
    if isinstance(prompt, str) and prompt.rfind(START_TAG) > prompt.rfind(END_TAG):
        return "deepseek_r1"
    sources = template.values() if isinstance(template, dict) else [template]
    return "qwen3" if any("enable_thinking" in str(source) for source in sources) else "none"


def load_parser(tokenizer: Tokenizer, name: str = "auto") -> ReasoningParser | None:
    """The parser ``name`` (one of CHOICES; ``auto``: ``detect``'s) for ``tokenizer``'s model, or None for
    ``none``. A LlaisysValueError names an unknown name, or a tokenizer without the tags as tokens."""
    if name not in CHOICES:
        raise LlaisysValueError(f"--reasoning-parser {name!r} is not a reasoning parser: use one of "
                                f"{', '.join(CHOICES)}")
    if name == "auto":
        name = detect(tokenizer)
    return None if name == "none" else ReasoningParser(name, tokenizer)


class ReasoningParser:
    """How one model's replies think: its tags' token ids, and per request the engine's rule and the text's split.

    ``always_thinks``: a reply whose prompt leaves the thinking neither open nor closed starts inside it
    (deepseek_r1), rather than only if it opens the tag itself (qwen3)."""

    def __init__(self, name: str, tokenizer: Tokenizer) -> None:
        if name not in PARSERS:
            raise LlaisysValueError(f"unknown reasoning parser {name!r}: use one of {', '.join(PARSERS)}")
        ids = {tag: _tag_ids(tokenizer, tag) for tag in (START_TAG, END_TAG)}
        for tag, tag_ids in ids.items():
            if len(tag_ids) != 1:
                raise LlaisysValueError(f"--reasoning-parser {name}: the tokenizer has no {tag} token ({tag!r} is "
                                        f"{len(tag_ids)} tokens), so the end of the thinking cannot be told")
        self.name = name
        self.always_thinks = name == "deepseek_r1"
        self.start_id, self.end_id = ids[START_TAG][0], ids[END_TAG][0]
        self.keep = frozenset((self.start_id, self.end_id))  # their text stays in the output, special or not
        self.forced_end = tuple(_tag_ids(tokenizer, FORCED_END))
        # how a prompt that switched the thinking off ends: the tag, then blank space (Qwen3's empty block)
        self._closings = {tuple(_tag_ids(tokenizer, END_TAG + blank)) for blank in ("", "\n", "\n\n")}

    def prompt_state(self, prompt: Sequence[int]) -> str:
        """``open``: the prompt's last ``<think>`` is not closed (the template opened it); ``closed``: it ends with
        ``</think>`` and blank space (thinking switched off); ``none``: neither."""
        start = end = -1
        for i in range(len(prompt) - 1, -1, -1):
            if prompt[i] == self.start_id:
                start = i
                break
            if prompt[i] == self.end_id and end < 0:
                end = i
        if start > end:
            return "open"
        tail = tuple(prompt[end:]) if end >= 0 else ()
        return "closed" if tail in self._closings else "none"

    def starts_inside(self, prompt: Sequence[int]) -> bool:
        """Whether the reply's text starts inside the thinking, before any tag of its own."""
        state = self.prompt_state(prompt)
        return state == "open" or (state == "none" and self.always_thinks)

    def rule(self, prompt: Sequence[int], budget: int | None = None) -> ThinkingRule:
        """The engine's rule for a reply to ``prompt``: thinking ends at ``</think>``, at most ``budget`` tokens of
        it (None: unbounded), after which ``FORCED_END`` is appended; where the model opens it itself (Qwen3, a
        prompt that neither opens nor closes it), its first token decides whether it thinks."""
        state = self.prompt_state(prompt)
        if state == "none" and not self.always_thinks:  # Qwen3: its first token opens the thinking, or answers
            return ThinkingRule(end_ids=(self.end_id,), forced_end=self.forced_end, budget=budget,
                                open_at_start=False, start_ids=(self.start_id,))
        return ThinkingRule(end_ids=(self.end_id,), forced_end=self.forced_end, budget=budget,
                            open_at_start=state != "closed")

    def splitter(self, prompt: Sequence[int], hold_from: Sequence[str] = ()) -> ReasoningSplitter:
        """A ``ReasoningSplitter`` for one reply to ``prompt`` (``hold_from``: see there)."""
        return ReasoningSplitter(self.starts_inside(prompt), hold_from)

    def split(self, prompt: Sequence[int], text: str, hold_from: Sequence[str] = ()) -> tuple[str | None, str]:
        """A whole reply's (thinking, answer); thinking None where there is none."""
        return self.splitter(prompt, hold_from).whole(text)


# the splitter's states: before the first non-blank text, in the thinking, blank space after it, in the answer
_START, _THINKING, _AFTER, _ANSWER = range(4)


class ReasoningSplitter:
    """One reply's text, split into thinking and answer as it streams.

    ``inside``: the reply starts in the thinking (else only if its text opens with ``<think>``). ``hold_from``:
    texts (a tool call's openers) from which the thinking is held back rather than sent: should the reply end
    without closing the thinking, that part is the answer (a call the model wrote before ``</think>``, which would
    otherwise be lost in the thinking, vllm#42021); if ``</think>`` comes, it was thinking after all.
    """

    def __init__(self, inside: bool, hold_from: Sequence[str] = ()) -> None:
        self.inside = inside
        self.hold_from = tuple(h for h in hold_from if h)
        self._state = _START
        self._pending = ""  # text read but not yet given out
        self._searched = 0  # in the thinking: how much of _pending was searched for the end tag and the openers
        self._call = -1  # in the thinking: where in _pending a held call begins
        self._fresh = True  # no thinking text given out yet (blank space before it is left out)

    def push(self, text: str) -> tuple[str, str]:
        """The (thinking, answer) text that ``text`` releases; a tail that may yet be a tag, or blank space whose
        place is not known yet, waits for the next push."""
        self._pending += text
        return self._run(final=False)

    def finish(self) -> tuple[str, str]:
        """What was held back, once the reply has ended."""
        return self._run(final=True)

    def whole(self, text: str) -> tuple[str | None, str]:
        """A whole reply's (thinking, answer); thinking None where there is none."""
        thought, answer = self.push(text)
        more_thought, more_answer = self.finish()
        return (thought + more_thought) or None, answer + more_answer

    def _run(self, final: bool) -> tuple[str, str]:
        thought = answer = ""
        while True:
            text = self._pending
            if self._state == _START:
                body = text.lstrip()
                if body.startswith(START_TAG):
                    self._state, self._pending = _THINKING, body[len(START_TAG):]
                elif not final and START_TAG.startswith(body):  # nothing yet, or maybe the tag: wait
                    return thought, answer
                elif self.inside:
                    self._state, self._pending = _THINKING, body
                else:
                    self._state = _ANSWER
            elif self._state == _THINKING:
                released, ended = self._thinking(final)
                thought += released
                if not ended:
                    return thought, answer
            elif self._state == _AFTER:
                body = text.lstrip()
                if not body and not final:
                    self._pending = ""
                    return thought, answer
                self._pending, self._state = body, _ANSWER
            else:
                self._pending = ""
                return thought, answer + text

    def _thinking(self, final: bool) -> tuple[str, bool]:
        """The thinking text released now, and whether the thinking ended (the state moved on)."""
        text = self._pending
        if self._fresh:
            text = self._pending = text.lstrip()
        end = text.find(END_TAG, max(0, self._searched - len(END_TAG) + 1))
        if end >= 0:  # (a held call was thinking after all)
            self._pending, self._state = text[end + len(END_TAG):], _AFTER
            return text[:end].rstrip(), True
        if self._call < 0:
            self._call = _first(text, self.hold_from, self._searched)
        if final:  # the reply ended in its thinking: a held call is its answer
            cut = len(text) if self._call < 0 else self._call
            self._pending, self._state = text[cut:], _ANSWER
            return text[:cut].rstrip(), True
        if self._call >= 0:
            cut = self._call
        else:  # hold a tail that may begin the end tag or an opener
            cut = len(text) - max(_partial(text, tag) for tag in (END_TAG, *self.hold_from))
        cut = len(text[:cut].rstrip())  # and blank space, which the end tag may follow
        self._pending = text[cut:]
        self._searched = len(self._pending)
        if self._call >= 0:
            self._call -= cut
        self._fresh = self._fresh and cut == 0
        return text[:cut], False


def _first(text: str, needles: Sequence[str], start: int) -> int:
    """Where the first of ``needles`` occurs in ``text`` (searching from about ``start``), or -1."""
    found = [i for needle in needles if (i := text.find(needle, max(0, start - len(needle) + 1))) >= 0]
    return min(found, default=-1)


def _partial(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that is a proper start of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def _tag_ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False).input_ids)
