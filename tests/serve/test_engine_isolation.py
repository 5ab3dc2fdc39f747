"""One request's failure in a per-sequence stage of an engine step ends that request alone.

A failure is injected into each stage a step runs for one sequence at a time — choosing its token, masking its
logits with its grammar, advancing its grammar, detokenizing, the stop strings, its log-probabilities' text — for
one request (the "hostile" one) while two others stream beside it. The others must finish as if it had never been
there (their normal finish reason and the text they get alone), the hostile request gets one ``Failed`` that
carries its own error and nothing of the others', and the engine goes on serving.
"""

from __future__ import annotations

import queue

import pytest

import llaisys_models
from helpers.serve_helpers import chat_ids, events_until_done, generate_text, user
from llaisys_models.engine.grammar import GrammarError
from llaisys_models.serve.engine import Delta, Engine, Failed, Finished, Request, SamplingParams
from llaisys_models.text.tokenizer import load_tokenizer

MARKER = "injected failure 7f3a"  # the hostile request's own error text
HOSTILE_SEED = 4242  # how an injection recognises the hostile request's sequence
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def engine_model(chat_model_dir):
    return llaisys_models.load(chat_model_dir)  # the engine's own copy


class FailingMatcher:
    """A grammar matcher that allows every token but fails in ``stage`` ("mask" or "accept") at its 3rd token."""

    def __init__(self, stage: str) -> None:
        self.stage = stage
        self.tokens = 0
        self.done = False
        self.accepting = True

    def prepare(self) -> None:
        pass

    def mask(self, logits) -> None:
        if self.stage == "mask" and self.tokens == 2:
            raise GrammarError(MARKER)

    def accept(self, token: int) -> None:
        self.tokens += 1
        if self.stage == "accept" and self.tokens == 3:
            raise GrammarError(MARKER)


class FailingGrammar:
    def __init__(self, stage: str) -> None:
        self.stage = stage

    def matcher(self, vocab_size: int) -> FailingMatcher:
        return FailingMatcher(self.stage)


def inject(engine: Engine, stage: str) -> dict:
    """Make ``stage`` fail for the hostile request (its seed says which it is); the sampling parameters it needs."""
    if stage in ("mask", "accept"):
        return {"grammar": FailingGrammar(stage)}
    if stage == "choose":
        verifier = engine.scheduler.runner.verifier
        verify = verifier.verify

        def failing_verify(rows, drafts, params, seed, n, *args, **kwargs):
            if params.seed == HOSTILE_SEED and n == 2:
                raise RuntimeError(MARKER)
            return verify(rows, drafts, params, seed, n, *args, **kwargs)

        verifier.verify = failing_verify
        return {}
    if stage in ("detokenize", "stop"):
        make_stream = engine._text_stream

        def failing_stream(request):
            stream = make_stream(request)
            if request.params.seed == HOSTILE_SEED:
                method = "push" if stage == "detokenize" else "finish"
                original, calls = getattr(stream, method), []

                def failing(*args):
                    calls.append(1)
                    if stage == "stop" or len(calls) == 3:
                        raise RuntimeError(MARKER)
                    return original(*args)

                setattr(stream, method, failing)
            return stream

        engine._text_stream = failing_stream
        return {"stop": ["never"]} if stage == "stop" else {}
    assert stage == "logprob text"

    def failing_logprob_text(token, entry):
        raise RuntimeError(MARKER)

    engine._logprob_text = failing_logprob_text
    return {"logprobs": 2}  # the innocent requests ask for none, so only the hostile one reaches it


STAGES = ["choose", "mask", "accept", "detokenize", "stop", "logprob text"]


@pytest.mark.parametrize("stage", STAGES)
def test_a_failure_in_one_sequence_stage_ends_that_request_alone(stage, engine_model, chat_model_dir, tokenizer,
                                                                 chat_reference):
    engine = Engine(engine_model, load_tokenizer(chat_model_dir), max_running=4)
    try:
        log: queue.Queue = queue.Queue()
        innocent = {name: chat_ids(tokenizer, user(f"innocent {name} {stage}")) for name in ("a", "b")}
        hostile_params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, seed=HOSTILE_SEED,
                                        **inject(engine, stage))
        engine.submit(Request(innocent["a"], SamplingParams(max_tokens=MAX_TOKENS, temperature=0),
                              lambda e: log.put(("a", e)), cache_scope="tenant-a"))
        engine.submit(Request(chat_ids(tokenizer, user("hostile")), hostile_params, lambda e: log.put(("h", e)),
                              cache_scope="tenant-h"))
        engine.submit(Request(innocent["b"], SamplingParams(max_tokens=MAX_TOKENS, temperature=0),
                              lambda e: log.put(("b", e)), cache_scope="tenant-b"))
        engine.start()  # all three are admitted together and share every step
        events = events_until_done(log, 3)

        failed = [e for name, e in events if isinstance(e, Failed)]
        assert [name for name, e in events if isinstance(e, Failed)] == ["h"]
        assert MARKER in failed[0].message and not failed[0].shutdown
        for name, ids in innocent.items():
            text = "".join(e.text for n, e in events if n == name and isinstance(e, Delta))
            assert text == generate_text(chat_reference, tokenizer, ids, MAX_TOKENS)
            assert text not in failed[0].message  # no other request's data in the error
            finished = [e for n, e in events if n == name and isinstance(e, Finished)]
            assert [e.reason for e in finished] == ["length"]
        assert engine.alive and engine.metrics.finished["error"] == 1

        # and the engine goes on serving
        engine.submit(Request(innocent["a"], SamplingParams(max_tokens=2, temperature=0), lambda e: log.put(("c", e))))
        (_, last), = [x for x in events_until_done(log, 1) if not isinstance(x[1], Delta)]
        assert isinstance(last, Finished) and last.usage.completion_tokens == 2
    finally:
        engine.stop()


def test_a_choice_that_fails_ends_its_request_but_not_the_other_choices_requests(engine_model, chat_model_dir,
                                                                                  tokenizer, chat_reference):
    """n choices of one request: one of them failing ends that request (each of its choices) and no other."""
    engine = Engine(engine_model, load_tokenizer(chat_model_dir), max_running=6)
    try:
        log: queue.Queue = queue.Queue()
        ids = chat_ids(tokenizer, user("innocent n"))
        grammar = FailingGrammar("accept")
        engine.submit(Request(chat_ids(tokenizer, user("hostile n")),
                              SamplingParams(max_tokens=MAX_TOKENS, temperature=0, grammar=grammar),
                              lambda e: log.put(("h", e)), n=3, cache_scope="h"))
        engine.submit(Request(ids, SamplingParams(max_tokens=MAX_TOKENS, temperature=0), lambda e: log.put(("a", e)),
                              n=2, cache_scope="a"))
        engine.start()
        events = events_until_done(log, 3)  # the hostile request's one Failed, the innocent one's two Finished
        assert [type(e).__name__ for n, e in events if n == "h" and not isinstance(e, Delta)] == ["Failed"]
        expected = generate_text(chat_reference, tokenizer, ids, MAX_TOKENS)
        for index in range(2):
            assert "".join(e.text for n, e in events if n == "a" and isinstance(e, Delta) and e.index == index) \
                == expected
        assert sorted(e.reason for n, e in events if n == "a" and isinstance(e, Finished)) == ["length", "length"]
    finally:
        engine.stop()
