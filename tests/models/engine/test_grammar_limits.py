"""Grammars that cannot harm another request (engine/grammar.py, engine/schema_check.py), on the tests' byte-level
tokenizer: a grammar compiles once and its sequences copy it; the schema limits hold at their boundary (the
limit passes, one more is refused, naming it); schemas without finite values are refused and legitimate
recursive ones pass; a grammar that cannot start on the vocabulary is refused; every failure of the grammar
library, a Rust panic included, is one short line without parser state, backtrace or paths."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("llguidance")

import llguidance  # noqa: E402

from helpers.tiny_models import write_tokenizer  # noqa: E402
from llaisys_models.engine import schema_check  # noqa: E402
from llaisys_models.engine.grammar import Grammar, GrammarError  # noqa: E402
from llaisys_models.engine.schema_check import SchemaError, check_schemas  # noqa: E402

LEAKS = ("panicked", "panic", "backtrace", "/home", "src/", ".rs:", "<non-verbose", "\n")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import PreTrainedTokenizerFast

    directory = tmp_path_factory.mktemp("byte_tokenizer")
    write_tokenizer(directory)
    return PreTrainedTokenizerFast.from_pretrained(directory)


@pytest.fixture(scope="module")
def letters_tokenizer():
    """A byte-level tokenizer whose only tokens are a-z, space and EOS: it cannot write the "{" of JSON."""
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    alphabet = bytes_to_unicode()
    vocab = {alphabet[b]: i for i, b in enumerate(b"abcdefghijklmnopqrstuvwxyz ")}
    core = Tokenizer(BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False, byte_fallback=False))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|endoftext|>")


def assert_clean(message: str) -> None:
    """One short line, nothing of the grammar library's insides."""
    assert len(message) < 400, message
    assert not any(leak in message.lower() for leak in LEAKS), message


def refusal(tokenizer, schema) -> str:
    with pytest.raises(GrammarError) as caught:
        Grammar.json_schema(tokenizer, schema)
    assert_clean(str(caught.value))
    return str(caught.value)


class CountingMatchers:
    """llguidance.LLMatcher with its constructions counted (its static methods pass through)."""

    def __init__(self, real) -> None:
        self.real = real
        self.made = 0

    def __call__(self, *args, **kwargs):
        self.made += 1
        return self.real(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.real, name)


@pytest.fixture
def counting(monkeypatch):
    counter = CountingMatchers(llguidance.LLMatcher)
    monkeypatch.setattr(llguidance, "LLMatcher", counter)
    return counter


def consume(matcher, tokenizer, text: str) -> None:
    for token in tokenizer.encode(text, add_special_tokens=False):
        matcher.accept(token)


# -- the review's findings -------------------------------------------------------------------------------------

OBJECT = {"type": "object"}
FINDINGS = {
    "object that requires itself": ({**OBJECT, "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
                                    "no finite instance"),
    "definition that is itself": ({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}, "no finite instance"),
    "5001 properties": ({**OBJECT, "properties": {f"p{i}": {} for i in range(5001)}, "required": [f"p{i}" for i in
                                                                                         range(5001)]},
                        "5000 object properties"),
    "5000 optional properties": ({**OBJECT, "properties": {f"p{i}": {} for i in range(5000)}},
                                 "500 optional properties"),
    "80,000-value enum": ({"enum": [f"v{i}" for i in range(80_000)]}, "more than"),
    "1001-value enum": ({"enum": list(range(1001))}, "1000 enum values"),
}


@pytest.mark.parametrize("name", FINDINGS)
def test_each_finding_is_refused_before_compiling_in_one_clean_line(tokenizer, counting, name):
    schema, words = FINDINGS[name]
    message = refusal(tokenizer, schema)
    assert words in message and message.startswith("json_schema"), message
    assert counting.made == 0  # refused before llguidance compiled anything


def test_a_recursion_names_its_path(tokenizer):
    schema = {**OBJECT, "properties": {"x": {"$ref": "#/$defs/node"}, "y": {"type": "integer"}},
              "$defs": {"node": {**OBJECT, "properties": {"next": {"$ref": "#/$defs/node"}}, "required": ["next"]}}}
    message = refusal(tokenizer, schema)  # (the root has values, {"y": 1}; "x" can be started but never ended)
    assert "no finite instance" in message and "#/properties/x" in message and "#/$defs/node" in message, message


# -- compile once ----------------------------------------------------------------------------------------------

def test_n_sequences_share_one_compile(tokenizer, counting):
    grammar = Grammar.json_schema(tokenizer, {**OBJECT, "properties": {"a": {"type": "integer"}}, "required": ["a"]})
    assert counting.made == 1
    matchers = [grammar.matcher(len(tokenizer)) for _ in range(64)]
    assert counting.made == 1 and len({id(m._matcher) for m in matchers}) == 64


def test_copies_advance_independently(tokenizer):
    grammar = Grammar.json_schema(tokenizer, {**OBJECT, "properties": {"a": {"type": "integer"}}, "required": ["a"],
                                              "additionalProperties": False})
    first, second = grammar.matcher(len(tokenizer)), grammar.matcher(len(tokenizer))
    consume(first, tokenizer, '{"a":12')
    assert not first.accepting and not first.done
    consume(first, tokenizer, "}")
    assert first.accepting and first.done
    assert not second.accepting and not second.done  # still at the start
    consume(second, tokenizer, '{"a":7}')
    assert second.accepting
    third = grammar.matcher(len(tokenizer))  # the compiled start never moved
    consume(third, tokenizer, '{"a":3}')
    assert third.accepting


def test_no_cache_keeps_a_grammar(tokenizer):
    """A grammar (its compiled matcher with it) goes with the last request, and matcher, that holds it."""
    import gc
    import weakref

    grammar = Grammar.json_schema(tokenizer, {"type": "integer"})
    matchers = [grammar.matcher(len(tokenizer)) for _ in range(4)]
    gone = weakref.ref(grammar)
    del grammar, matchers
    gc.collect()
    assert gone() is None


# -- limits at their boundary ----------------------------------------------------------------------------------

def properties(n: int) -> dict:
    names = [f"p{i}" for i in range(n)]
    return {**OBJECT, "properties": dict.fromkeys(names, {}), "required": names}


def nesting(n: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(n):
        schema = {**OBJECT, "properties": {"a": schema}, "required": ["a"]}
    return schema


def name_chars(n: int) -> dict:
    return {**OBJECT, "properties": {"x" * n: {}}, "required": ["x" * n]}


def large_enum_chars(n: int) -> dict:
    values = [f"{i:03d}" + "x" * 56 for i in range(250)]  # 250 values of 59 characters
    return {"enum": [*values, "y" * (n - 250 * 59)]}


def optional(n: int) -> dict:
    return {**OBJECT, "properties": {f"p{i}": {} for i in range(n)}}


def text_bytes(n: int) -> dict:
    empty = len(json.dumps({"type": "string", "description": ""}))
    return {"type": "string", "description": "d" * (n - empty)}


def subschemas(n: int) -> dict:
    return {"anyOf": [{} for _ in range(n - 1)]}


def json_nesting(n: int) -> dict:
    value: list = []
    for _ in range(n - 2):  # the schema object, then n - 1 lists
        value = [value]
    return {"type": "integer", "default": value}


LIMITS = {
    "object properties": (properties, schema_check.MAX_OBJECT_PROPERTIES, "object properties"),
    "nesting depth": (nesting, schema_check.MAX_NESTING_DEPTH, "levels of nesting"),
    "enum values": (lambda n: {"enum": list(range(n))}, schema_check.MAX_ENUM_VALUES, "enum values"),
    "names and values": (name_chars, schema_check.MAX_STRING_CHARS, "characters in property names"),
    "a large enum's characters": (large_enum_chars, schema_check.MAX_LARGE_ENUM_CHARS, "values of the enum"),
    "optional properties": (optional, schema_check.MAX_OPTIONAL_PROPERTIES, "optional properties"),
    "schema text": (text_bytes, schema_check.MAX_SCHEMA_BYTES, "bytes of JSON text"),
    "subschemas": (subschemas, schema_check.MAX_SUBSCHEMAS, "subschemas"),
    "JSON nesting": (json_nesting, schema_check.MAX_JSON_NESTING, "levels deep"),
}


@pytest.mark.parametrize("name", LIMITS)
def test_limit_passes_and_one_more_is_refused_naming_it(name):
    make, limit, words = LIMITS[name]
    check_schemas([(make(limit), "json_schema")])
    with pytest.raises(SchemaError, match=words) as caught:
        check_schemas([(make(limit + 1), "json_schema")])
    assert str(limit) in str(caught.value)
    assert_clean(str(caught.value))


def test_the_schemas_of_one_grammar_share_the_limits():
    """A forced tool call's grammar embeds every function's parameters: they count together."""
    half = schema_check.MAX_OBJECT_PROPERTIES // 2
    check_schemas([(properties(half), "f"), (properties(half), "g")])
    with pytest.raises(SchemaError, match="'g' has more than 5000 object properties"):
        check_schemas([(properties(half), "'f'"), (properties(half + 1), "'g'")])


def test_at_the_limits_it_compiles(tokenizer):
    """The largest schema the limits admit compiles, and its values go through."""
    names = [f"p{i}" for i in range(schema_check.MAX_OBJECT_PROPERTIES)]
    grammar = Grammar.json_schema(tokenizer, {**OBJECT, "properties": dict.fromkeys(names, {"type": "integer"}),
                                              "required": names, "additionalProperties": False})
    matcher = grammar.matcher(len(tokenizer))
    consume(matcher, tokenizer, "{" + ",".join(f'"{name}":{i}' for i, name in enumerate(names)) + "}")
    assert matcher.done


def test_wide_alternatives_within_the_limits_run(tokenizer):
    """An anyOf of 2001 objects (2001 properties, within the limits) is one row of 2001 items after "{":
    llguidance's default row limit (2000) would stop it there, mid-generation; PARSER_LIMITS admits it."""
    branches = [{**OBJECT, "properties": {f"q{i}": {"type": "integer"}}, "required": [f"q{i}"],
                 "additionalProperties": False} for i in range(2001)]
    matcher = Grammar.json_schema(tokenizer, {"anyOf": branches}).matcher(len(tokenizer))
    consume(matcher, tokenizer, '{"q2000":5}')
    assert matcher.done


# -- finite values ---------------------------------------------------------------------------------------------

TREE = {**OBJECT, "properties": {"value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#"}}},
        "required": ["value", "children"], "additionalProperties": False}
LEGITIMATE = {
    "tree (children: an array, may be empty)": (TREE, '{"value":1,"children":[{"value":2,"children":[]}]}'),
    "tree with optional children": ({**OBJECT, "properties": {"v": {"type": "integer"}, "kids": {
        "type": "array", "items": {"$ref": "#"}, "minItems": 1}}, "required": ["v"], "additionalProperties": False},
                                    '{"v":1,"kids":[{"v":2}]}'),
    "list, next nullable": ({**OBJECT, "properties": {"v": {"type": "integer"}, "next": {"anyOf": [
        {"$ref": "#"}, {"type": "null"}]}}, "required": ["v", "next"], "additionalProperties": False},
                            '{"v":1,"next":{"v":2,"next":null}}'),
    "list, next optional": ({**OBJECT, "properties": {"v": {"type": "integer"}, "next": {"$ref": "#/$defs/node"}},
                             "required": ["v"], "additionalProperties": False,
                             "$defs": {"node": {"$ref": "#"}}}, '{"v":1,"next":{"v":2}}'),
    "expression (definitions, anyOf)": ({"$ref": "#/definitions/e", "definitions": {"e": {"anyOf": [
        {"type": "integer"}, {**OBJECT, "properties": {"op": {"enum": ["+", "-"]}, "args": {
            "type": "array", "items": {"$ref": "#/definitions/e"}, "minItems": 2, "maxItems": 2}},
            "required": ["op", "args"], "additionalProperties": False}]}}}, '{"op":"+","args":[1,{"op":"-","args":[2,3]}]}'),
    # (no "type": llguidance lets it be any type, so 1 and {"a": 1} are values; the same as an object is not)
    "properties without a type": ({"properties": {"a": {"$ref": "#"}}, "required": ["a"]}, '{"a":{"a":1}}'),
}


@pytest.mark.parametrize("name", LEGITIMATE)
def test_legitimate_recursive_schemas_compile_and_end(tokenizer, name):
    schema, value = LEGITIMATE[name]
    matcher = Grammar.json_schema(tokenizer, schema).matcher(len(tokenizer))
    consume(matcher, tokenizer, value)
    assert matcher.accepting


INFINITE = {
    "object that requires itself": ({**OBJECT, "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
                                    "# -> #/properties/a -> #"),
    "typed union that requires itself": ({"type": ["object", "array"], "properties": {"a": {"$ref": "#"}},
                                          "required": ["a"], "items": {"$ref": "#"}, "minItems": 1},
                                         "#/properties/a"),
    "allOf of itself": ({"$ref": "#/$defs/a", "$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}]}}}, "#/$defs/a"),
    "array of at least one of itself": ({"type": "array", "items": {"$ref": "#"}, "minItems": 1}, "#/items"),
    "two definitions in a ring": ({"$ref": "#/$defs/a", "$defs": {
        "a": {**OBJECT, "properties": {"b": {"$ref": "#/$defs/b"}}, "required": ["b"]},
        "b": {"type": "array", "items": {"$ref": "#/$defs/a"}, "minItems": 1}}}, "#/$defs/b"),
    "required property false": ({**OBJECT, "properties": {"a": False}, "required": ["a"]}, "nothing matches"),
    "empty enum inside an optional property": ({**OBJECT, "properties": {"a": {"enum": []}}}, "#/properties/a"),
    "anyOf whose branches all recurse": ({"$ref": "#/$defs/n", "$defs": {"n": {"anyOf": [
        {**OBJECT, "properties": {"l": {"$ref": "#/$defs/n"}}, "required": ["l"]},
        {"type": "array", "items": {"$ref": "#/$defs/n"}, "minItems": 1}]}}}, "#/$defs/n"),
}


@pytest.mark.parametrize("name", INFINITE)
def test_schemas_without_finite_values_are_refused_naming_the_path(tokenizer, name):
    schema, path = INFINITE[name]
    message = refusal(tokenizer, schema)
    assert "has no finite instance" in message and path in message, message


def test_unused_definitions_and_false_branches_are_fine(tokenizer):
    """What no value can reach is not checked; a ``false`` that llguidance leaves out is no trap."""
    schema = {**OBJECT, "properties": {"a": {"type": "integer"}, "b": False}, "required": ["a"],
              "$defs": {"loop": {"$ref": "#/$defs/loop"}}}
    matcher = Grammar.json_schema(tokenizer, schema).matcher(len(tokenizer))
    consume(matcher, tokenizer, '{"a":1}')
    assert matcher.accepting


@pytest.mark.parametrize("ref, words", [("#foo", "not supported"), ("other.json#/a", "not supported"),
                                        ("#/$defs/missing", "points to nothing")])
def test_references_it_cannot_follow_are_refused(tokenizer, ref, words):
    assert words in refusal(tokenizer, {"$ref": ref, "$defs": {"a": {}}})


def test_references_by_the_roots_id_and_escaped_names_are_followed(tokenizer):
    schema = {"$id": "https://example.com/s", "$ref": "https://example.com/s#/$defs/a~1b",
              "$defs": {"a/b": {**OBJECT, "properties": {"n": {"$ref": "#/$defs/a~1b"}}, "required": ["n"]}}}
    assert "#/$defs/a~1b -> #/$defs/a~1b/properties/n -> #/$defs/a~1b" in refusal(tokenizer, schema)
    nested = {**OBJECT, "properties": {"x": {"$id": "https://example.com/x", **OBJECT}}}
    assert "'$id' inside the schema (#/properties/x) is not supported" in refusal(tokenizer, nested)


# -- the first token -------------------------------------------------------------------------------------------

def test_a_grammar_that_cannot_start_on_the_vocabulary_is_refused(letters_tokenizer):
    for make in (lambda: Grammar.json_object(letters_tokenizer), lambda: Grammar.lark(letters_tokenizer, 'start: ""')):
        with pytest.raises(GrammarError, match="allows no token of this model's vocabulary at its start") as caught:
            make()
        assert_clean(str(caught.value))
    assert Grammar.regex(letters_tokenizer, "[a-z]+") is not None  # (what it can write, it may)


# -- the grammar library's failures ----------------------------------------------------------------------------

PANIC_TEXT = ("panicked at /home/builder/.cargo/registry/src/llguidance-1.9.1/src/earley/grammar.rs:123:9:\n"
              "assertion failed: grammar.symbols.len() < u16::MAX as usize - 10\n<backtrace>\n   0: <unknown>\n")


class PanicException(BaseException):
    """What pyo3 raises for a Rust panic: a BaseException, which ``except Exception`` misses."""


class FailingMatchers(CountingMatchers):
    def __init__(self, real, how: str) -> None:
        super().__init__(real)
        self.how = how

    def __call__(self, *args, **kwargs):
        if self.how == "raises":
            raise PanicException(PANIC_TEXT)
        matcher = self.real(args[0], '%%% not a grammar', **kwargs)  # in its error state
        return ErrorState(matcher, PANIC_TEXT if self.how == "panic text" else "Parser Error: too many\n" * 40)


class ErrorState:
    def __init__(self, real, error: str) -> None:
        self.real, self.error = real, error

    def is_error(self) -> bool:
        return True

    def get_error(self) -> str:
        return self.error


@pytest.mark.parametrize("how", ["raises", "panic text", "long text"])
def test_library_failures_are_one_clean_line(tokenizer, monkeypatch, how):
    monkeypatch.setattr(llguidance, "LLMatcher", FailingMatchers(llguidance.LLMatcher, how))
    with pytest.raises(GrammarError) as caught:
        Grammar.json_schema(tokenizer, {"type": "integer"})
    assert_clean(str(caught.value))
    assert str(caught.value).startswith("json_schema: ")


def test_a_panic_while_a_mask_is_prepared_is_the_sequence_error(tokenizer, monkeypatch):
    """On the mask thread, a panic must come back to the engine as this sequence's GrammarError, not as a
    BaseException that would end the engine's thread."""
    import llguidance.numpy

    grammar = Grammar.json_schema(tokenizer, {"type": "integer"})
    matcher = grammar.matcher(len(tokenizer))

    def panic(*args, **kwargs):
        raise PanicException(PANIC_TEXT)

    monkeypatch.setattr(llguidance.numpy, "fill_next_token_bitmask", panic)
    matcher.prepare()
    with pytest.raises(GrammarError) as caught:
        matcher.accept(tokenizer.encode("1", add_special_tokens=False)[0])
    assert_clean(str(caught.value))


def test_interrupts_pass_through(tokenizer, monkeypatch):
    class Interrupting(CountingMatchers):
        def __call__(self, *args, **kwargs):
            raise KeyboardInterrupt

    monkeypatch.setattr(llguidance, "LLMatcher", Interrupting(llguidance.LLMatcher))
    with pytest.raises(KeyboardInterrupt):
        Grammar.json_schema(tokenizer, {"type": "integer"})


def test_a_token_against_the_grammar_is_one_clean_line(tokenizer):
    matcher = Grammar.json_schema(tokenizer, {"type": "integer"}).matcher(len(tokenizer))
    with pytest.raises(GrammarError, match="was chosen against the grammar") as caught:
        consume(matcher, tokenizer, '"')
    assert_clean(str(caught.value))


class NotFast:
    """A tokenizer without a Rust backend (a "slow" transformers tokenizer, as llguidance cannot read it)."""
    eos_token_id = 0
    pad_token_id = None


def test_a_tokenizer_llguidance_cannot_read_is_a_warning_at_start_and_a_clear_error(caplog):
    from llaisys_models.serve.structured import Grammars

    with caplog.at_level("WARNING", logger="llaisys.serve"):
        Grammars(NotFast()).warm_up().join()
    (record,) = [r for r in caplog.records if "structured outputs unavailable" in r.getMessage()]
    assert record.levelname == "WARNING" and "fast (tokenizers) tokenizer; this one is NotFast" in record.getMessage()
    with pytest.raises(GrammarError, match="fast \\(tokenizers\\) tokenizer; this one is NotFast"):
        Grammar.json_object(NotFast())
