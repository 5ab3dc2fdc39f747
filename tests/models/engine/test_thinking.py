"""A reasoning model's thinking in the engine (engine/thinking.py): the budget forces the end of the thinking after
exactly N sampled thinking tokens, the same alone, batched and under speculative decoding; the thinking tokens are
counted; the grammar sees nothing of the thinking and constrains every token after it."""

from __future__ import annotations

import dataclasses

import pytest

from helpers.tiny_models import SPECS, prompt
from llaisys_models.engine.sampling import SamplingParams
from llaisys_models.engine.scheduler import Scheduler
from llaisys_models.engine.speculative import NgramDrafter, Speculation
from llaisys_models.engine.thinking import ThinkingRule, ThinkingState

NAME = "f32_gqa2_hd32"
NEW = 12


@pytest.fixture
def model(loaded_models, device):
    return loaded_models(device, [NAME])[NAME]


def greedy(model, ids, n):
    return model.generate(ids, n, eos_token_ids=())[len(ids):]


def unused_tokens(model, ids, count):
    """Tokens that greedy decoding of ``ids`` does not produce in its first NEW + 4: ends that only forcing writes."""
    used = set(greedy(model, ids, NEW + 4))
    return [t for t in range(SPECS[NAME].vocab - 1, 0, -1) if t not in used][:count]


def run(model, jobs, **scheduler_args):
    """Each (prompt, params) to the end in one scheduler: their tokens and sequences."""
    scheduler = Scheduler(model, model.new_kv_pool(num_blocks=64, block_size=16), **scheduler_args)
    sequences = [scheduler.add(ids, params) for ids, params in jobs]
    while scheduler.has_work:
        scheduler.step()
        scheduler.raise_failed()
    return [s.tokens[s.prompt_len:] for s in sequences], sequences


def test_the_budget_forces_the_end_after_exactly_n_thinking_tokens(model):
    ids = prompt(NAME, 9, SPECS[NAME].vocab)
    newline, end = unused_tokens(model, ids, 2)
    rule = ThinkingRule(end_ids=(end,), forced_end=(newline, end), budget=3)
    params = SamplingParams(max_tokens=NEW, top_k=1, eos_token_ids=frozenset(), thinking=rule)
    (tokens,), (seq,) = run(model, [(ids, params)])
    thought = greedy(model, ids, 3)
    answer = greedy(model, ids + thought + [newline, end], NEW - 5)  # the model goes on after the forced end
    assert tokens == thought + [newline, end] + answer
    assert seq.thinking.tokens == 3 and not seq.thinking.open


def test_the_forced_end_is_the_same_batched_and_speculative(model):
    vocab = SPECS[NAME].vocab
    prompts = [prompt(NAME, n, vocab) for n in (5, 17, 30)]
    rules = [ThinkingRule(end_ids=(t,), forced_end=(t,), budget=b)
             for t, b in zip(unused_tokens(model, prompts[0], 3), (0, 2, 5))]
    base = [SamplingParams(max_tokens=NEW, top_k=1, eos_token_ids=frozenset(), thinking=r) for r in rules]
    alone = [run(model, [(p, params)])[0][0] for p, params in zip(prompts, base)]
    batched, _ = run(model, list(zip(prompts, base)), max_batch_tokens=16)
    assert batched == alone
    speculative = [dataclasses.replace(p, speculation=Speculation(NgramDrafter(), 4)) for p in base]
    drafted, sequences = run(model, list(zip(prompts, speculative)))
    assert drafted == alone
    assert [s.thinking.tokens for s in sequences] == [0, 2, 5]


def test_a_thinking_that_ends_by_itself_counts_the_tokens_before_its_end(model):
    ids = prompt(NAME, 11, SPECS[NAME].vocab)
    free = greedy(model, ids, NEW)
    at = next(i for i in range(1, NEW) if free[i] not in free[:i])  # the first token not seen before it ends it
    end = free[at]
    rule = ThinkingRule(end_ids=(end,), forced_end=(end,), budget=None)
    (tokens,), (seq,) = run(model, [(ids, SamplingParams(max_tokens=NEW, top_k=1, eos_token_ids=frozenset(),
                                                          thinking=rule))])
    assert tokens == free and seq.thinking.tokens == at and not seq.thinking.open


class RecordingMatcher:
    """A grammar that allows everything and records what it was asked to mask and accept."""

    def __init__(self) -> None:
        self.masked = 0
        self.accepted: list[int] = []
        self.done = False
        self.accepting = True

    def prepare(self) -> None:
        pass

    def mask(self, logits) -> None:
        self.masked += 1

    def also_allowing(self, tokens):
        self.also = tokens
        return self  # (it allows every token anyway)

    def accept(self, token: int) -> None:
        self.accepted.append(token)


class RecordingGrammar:
    def __init__(self) -> None:
        self.matchers: list[RecordingMatcher] = []

    def matcher(self, vocab_size: int) -> RecordingMatcher:
        self.matchers.append(RecordingMatcher())
        return self.matchers[-1]


@pytest.mark.parametrize("open_at_start", [True, False])
def test_the_grammar_constrains_the_answer_only(model, open_at_start):
    ids = prompt(NAME, 7, SPECS[NAME].vocab)
    (end,) = unused_tokens(model, ids, 1)
    grammar = RecordingGrammar()
    rule = ThinkingRule(end_ids=(end,), forced_end=(end,), budget=2, open_at_start=open_at_start)
    (tokens,), _ = run(model, [(ids, SamplingParams(max_tokens=8, top_k=1, eos_token_ids=frozenset(),
                                                     grammar=grammar, thinking=rule))])
    (matcher,) = grammar.matchers
    answer = tokens[3:] if open_at_start else tokens  # after two thinking tokens and the forced end
    assert matcher.accepted == answer and matcher.masked == len(answer)


def test_the_state_counts_a_multi_token_end_once():
    state = ThinkingState(ThinkingRule(end_ids=(7, 8), forced_end=(5, 7, 8), budget=10))
    for token in (1, 2, 7, 3, 7):
        assert state.advance(token) == "thinking"
    assert state.advance(8) == "end" and state.tokens == 4  # 1 2 7 3 thinking; the final 7 8 is the end
    assert state.advance(9) == "answer"
    spent = ThinkingState(ThinkingRule(end_ids=(7, 8), forced_end=(5, 7, 8), budget=1))
    assert spent.forced is None and spent.advance(1) == "thinking"
    taken = []
    while spent.forced is not None:
        taken.append(spent.forced)
        spent.advance(taken[-1])
    assert taken == [5, 7, 8] and spent.tokens == 1 and not spent.open


def test_a_model_that_may_open_its_thinking_decides_with_its_first_token():
    rule = ThinkingRule(end_ids=(8,), forced_end=(8,), open_at_start=False, start_ids=(4,))
    opened = ThinkingState(rule)
    assert not opened.open and opened.may_open
    assert [opened.advance(t) for t in (4, 1, 2, 8, 3)] == ["thinking", "thinking", "thinking", "end", "answer"]
    assert opened.tokens == 2  # the tags are not thinking tokens
    answered = ThinkingState(rule)
    assert [answered.advance(t) for t in (5, 4, 8)] == ["answer"] * 3 and answered.tokens == 0


@pytest.mark.parametrize("opens", [True, False])
def test_a_grammar_allows_the_opening_tag_beside_its_own_first_tokens(model, opens):
    """Qwen3's case: a prompt that neither opens nor closes the thinking, and a grammar. The first token may be
    the opening tag (the grammar waits for the end of the thinking) or the grammar's (the answer starts)."""
    ids = prompt(NAME, 8, SPECS[NAME].vocab)
    free = greedy(model, ids, NEW)
    start = free[0] if opens else unused_tokens(model, ids, 1)[0]  # the model's first choice is the tag, or not
    end = next(t for t in unused_tokens(model, ids, 3) if t != start)
    grammar = RecordingGrammar()
    rule = ThinkingRule(end_ids=(end,), forced_end=(end,), budget=2, open_at_start=False, start_ids=(start,))
    (tokens,), (seq,) = run(model, [(ids, SamplingParams(max_tokens=8, top_k=1, eos_token_ids=frozenset(),
                                                          grammar=grammar, thinking=rule))])
    (matcher,) = grammar.matchers
    if opens:  # the tag, two thinking tokens, the forced end: the grammar reads what follows
        assert tokens[:1] == [start] and tokens[3] == end and seq.thinking.tokens == 2
        assert matcher.accepted == tokens[4:] and matcher.masked == len(tokens) - 3  # its first mask: the tag's
        assert matcher.also == (start,)
    else:
        assert tokens == free[:8] and matcher.accepted == tokens and seq.thinking.tokens == 0


@pytest.mark.parametrize("bad, message", [({"end_ids": ()}, "end"), ({"budget": -1}, ">= 0"),
                                          ({"forced_end": (1, 2)}, "contain"),
                                          ({"start_ids": (3,)}, "start_ids")])
def test_a_bad_rule_is_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        ThinkingRule(**{"end_ids": (9,), "forced_end": (9,), **bad})
