"""Checks a JSON schema before its grammar is compiled: its size, and whether every value it lets a model start
can be finished.

Why: a grammar is compiled once per request, off the engine thread, but its cost (compile time, the lexer's
memory, the work of each step's token mask) grows with the schema, and a schema whose values never end lets
the model write until max_tokens or until the grammar library gives up mid-step. Both are refused here, with a
message that names the limit or the path, before any work depends on the schema.

    check_schemas([(schema, "json_schema")])   # SchemaError, naming the limit or the path, or nothing

Size limits (``SchemaBudget``, ``check_nesting``, ``Subschemas``). Where OpenAI publishes a limit for
Structured Outputs, it is this one (its guide's "Supported schemas",
https://platform.openai.com/docs/guides/structured-outputs#supported-schemas, now also at
https://developers.openai.com/api/docs/guides/structured-outputs#supported-schemas; the openai-java SDK's
``JsonSchemaValidator`` measures them as here):

    MAX_OBJECT_PROPERTIES      5000     "A schema may have up to 5000 object properties total,
    MAX_NESTING_DEPTH            10      with up to 10 levels of nesting." (a subschema nests one level below
                                         the schema that holds it: a property's, an item's, an anyOf branch's,
                                         a definition's; the root is level 0)
    MAX_STRING_CHARS        120_000     "total string length of all property names, definition names, enum
                                         values, and const values cannot exceed 120,000 characters"
    MAX_ENUM_VALUES            1000     "up to 1000 enum values across all enum properties"
    LARGE_ENUM / MAX_LARGE_ENUM_CHARS   "For a single enum property with string values, the total string
               250 / 15_000              length of all enum values cannot exceed 15,000 characters when there
                                         are more than 250 enum values."

and four of llaisys' own, where OpenAI publishes none:

    MAX_SCHEMA_BYTES    256 KiB   the schema's JSON text: bounds this module's own pure-Python work (it holds
                                  the GIL) and llguidance's parse; OpenAI's limits above fit in well under it
    MAX_JSON_NESTING         64   JSON containers within one another anywhere in the schema (a ``default``, a
                                  ``$ref``'s target outside the schema keywords): keeps this module's recursion
                                  and llguidance's (a Rust stack) shallow
    MAX_SUBSCHEMAS       20_000   object subschemas (a property's, an item's, a branch's...): bounds the work
                                  of this module (pure Python, ~8 us each, holding the GIL beside the engine
                                  thread); 5000 properties of OpenAI's, each an anyOf of a type and null, are
                                  15_001
    MAX_OPTIONAL_PROPERTIES 500   properties of one object that are not ``required``: llguidance's work per
                                  token grows with the square of them (measured, 49k-token vocabulary, 2 cores:
                                  500 -> 6 ms, 1000 -> 16 ms, 2000 -> 60 ms, 5000 -> 350 ms for one mask, and
                                  2.6 s to compile); OpenAI's strict mode has none (every property is required)

A grammar that embeds several schemas (a forced tool call's, one per function) counts them together.

Finite instances (``check_finite``). A schema has a finite instance where the least fixpoint of "this subschema
has a finite value" holds for its root, computed over ``$ref`` (pointers into the schema itself), ``allOf``
(all), ``anyOf``/``oneOf`` (one), ``type`` (one of the types), required properties (each, through
``properties`` or ``additionalProperties``), the first ``minItems`` items, ``enum`` (not empty) and ``false``
(none). It mirrors llguidance's reading: a schema without ``type`` may be any type (its object keywords
constrain objects only), so ``{"properties": {"a": {"$ref": "#"}}, "required": ["a"]}`` has ``1`` and
``{"a": 1}`` and is fine, while the same with ``"type": "object"`` has none. llguidance cannot see such a
recursion: it lets the model start the value and then never lets it finish (or gives up mid-step: "Too many
items"). So the check also walks what a value may contain (properties, items, branches, references, for the
types a subschema allows) and refuses any subschema there without a finite value: once the model wrote its
first character, it could never end. A literal ``false`` is exempt there (llguidance leaves it out).

Only references into the schema itself ("#", "#/$defs/a", or the root's own ``$id`` followed by such a
fragment) are supported, and no ``$id`` below the root (it would change what "#" means): what this module
cannot resolve it cannot measure.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import deque
from urllib.parse import unquote

import llaisys

# OpenAI's published limits (see the module docstring)
MAX_OBJECT_PROPERTIES = 5000
MAX_NESTING_DEPTH = 10
MAX_STRING_CHARS = 120_000
MAX_ENUM_VALUES = 1000
LARGE_ENUM = 250
MAX_LARGE_ENUM_CHARS = 15_000
# llaisys' own (see the module docstring)
MAX_SCHEMA_BYTES = 256 << 10
MAX_JSON_NESTING = 64
MAX_OPTIONAL_PROPERTIES = 500
MAX_SUBSCHEMAS = 20_000

# keywords whose value is a subschema or a list of them, and those whose value maps names to subschemas
# (JSON Schema 2020-12 and draft 7)
_SUBSCHEMA_KEYWORDS = frozenset({
    "additionalProperties", "items", "additionalItems", "contains", "not", "if", "then", "else", "propertyNames",
    "unevaluatedProperties", "unevaluatedItems", "contentSchema", "allOf", "anyOf", "oneOf", "prefixItems"})
_SUBSCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
_ALL_TYPES = ("null", "boolean", "integer", "number", "string", "array", "object")


class SchemaError(llaisys.LlaisysValueError):
    """A JSON schema refused before compiling: over a size limit, or without finite values."""


def check_schemas(schemas: list[tuple[dict, str]]) -> None:
    """Check the JSON schemas that one grammar embeds, each (schema, where it is, for messages): their sizes
    together, then each one's finite values. SchemaError names the first failure."""
    budget = SchemaBudget()
    walked = []
    for schema, where in schemas:
        budget.add_text(schema, where)  # (first: json.dumps is C, and this bounds all the work below)
        walked.append(Subschemas(schema, where))
        budget.add(walked[-1])
    for subschemas in walked:
        check_finite(subschemas)


# -- the subschemas --------------------------------------------------------------------------------------------

class Subschemas:
    """The object subschemas of one schema, each once: those under its keywords (depth first), then the
    targets of its references that lie elsewhere. Paths ("#/properties/a") are built only for messages."""

    def __init__(self, root: dict, where: str) -> None:
        check_nesting(root, where)  # (so nothing below can recurse deep)
        self.root = root
        self.where = where
        self.nodes: list[dict] = []
        self.depths: list[int] = []  # nesting depth (the root 0; a reference's target: its path's length)
        self._index: dict[int, int] = {}  # id(node) -> its place in ``nodes``
        self._parents: list[tuple[int, tuple]] = []  # (parent's place or -1, the path's parts from the parent)
        self._targets: dict[str, object] = {}  # $ref -> its value
        self._walk()

    def _walk(self) -> None:
        stack: list[tuple[object, int, tuple, int]] = [(self.root, -1, (), 0)]
        refs: list[str] = []
        while stack:
            node, parent, parts, depth = stack.pop()
            if not isinstance(node, dict) or id(node) in self._index:
                continue
            place = len(self.nodes)
            if place == MAX_SUBSCHEMAS:
                raise SchemaError(f"{self.where} has more than {MAX_SUBSCHEMAS} subschemas (llaisys' limit)")
            self._index[id(node)] = place
            self.nodes.append(node)
            self.depths.append(depth)
            self._parents.append((parent, parts))
            if place and "$id" in node:  # (its own "#" would be itself: this module reads "#" as the root)
                raise SchemaError(f"{self.where}: an '$id' inside the schema ({self.path(node)}) is not supported")
            for key, value in node.items():
                if key in _SUBSCHEMA_KEYWORDS:
                    if isinstance(value, dict):
                        stack.append((value, place, (key,), depth + 1))
                    elif isinstance(value, list):
                        stack.extend((item, place, (key, str(i)), depth + 1) for i, item in enumerate(value))
                elif key in _SUBSCHEMA_MAPS and isinstance(value, dict):
                    stack.extend((item, place, (key, name), depth + 1) for name, item in value.items())
                elif key == "$ref" and isinstance(value, str):
                    refs.append(value)
            if not stack:  # the keywords' subschemas are done: now the references' targets they did not reach
                for ref in refs:
                    target = self.target(ref)
                    if id(target) not in self._index:
                        keys = _pointer_keys(ref.partition("#")[2])
                        stack.append((target, -1, keys, len(keys)))
                refs = []

    def place(self, node: object) -> int | None:
        return self._index.get(id(node)) if isinstance(node, dict) else None

    def path(self, node: object) -> str:
        """``node``'s JSON pointer ("#/properties/a"), shortened for a message."""
        place = self.place(node)
        parts: list[str] = []
        while place is not None and place >= 0:
            parent, own = self._parents[place]
            parts[:0] = own
            place = parent
        return _short("#" + "".join("/" + part.replace("~", "~0").replace("/", "~1") for part in parts))

    def target(self, ref: str) -> object:
        """The value ``ref`` points to; SchemaError for a reference this module cannot follow."""
        if ref not in self._targets:
            self._targets[ref] = _resolve(self.root, ref, self.where)
        return self._targets[ref]


def _resolve(root: dict, ref: str, where: str) -> object:
    base, hash_, fragment = ref.partition("#")
    if (base and base != root.get("$id")) or not hash_ or (fragment and not fragment.startswith("/")):
        raise SchemaError(f"{where}: the reference {ref[:100]!r} is not supported: only references into the "
                          f"schema itself are ('#', '#/$defs/name')")
    value: object = root
    for key in _pointer_keys(fragment):
        if isinstance(value, dict) and key in value:
            value = value[key]
        elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            raise SchemaError(f"{where}: the reference {ref[:100]!r} points to nothing")
    return value


def _pointer_keys(fragment: str) -> tuple[str, ...]:
    """The keys of a JSON pointer in a URI fragment ("/$defs/a~1b" -> ("$defs", "a/b"))."""
    return tuple(unquote(part).replace("~1", "/").replace("~0", "~") for part in fragment.split("/")[1:])


def _short(path: str, most: int = 80) -> str:
    """A path for a message: its end, where it is long."""
    return path if len(path) <= most else "…" + path[-most:]


def check_nesting(value: object, where: str) -> None:
    """Refuse JSON nested deeper than MAX_JSON_NESTING, without recursion (so it is safe on any input)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > MAX_JSON_NESTING:
                raise SchemaError(f"{where} nests JSON more than {MAX_JSON_NESTING} levels deep (llaisys' limit)")
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))


# -- size ------------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class SchemaBudget:
    """What the schemas of one grammar have used of the size limits so far; ``add`` each schema in turn."""

    properties: int = 0
    enum_values: int = 0
    string_chars: int = 0
    text_bytes: int = 0

    def add_text(self, schema: dict, where: str) -> None:
        """Count the JSON text of ``schema`` (at ``where``, for messages)."""
        self.text_bytes += len(_json_text(schema, where).encode())
        self._at_most(self.text_bytes, MAX_SCHEMA_BYTES, where, "bytes of JSON text", "llaisys' limit")

    def add(self, schema: Subschemas) -> None:
        """Count ``schema``'s subschemas and raise SchemaError at the first limit they pass, alone or with those
        counted before."""
        for node, depth in zip(schema.nodes, schema.depths):
            if depth > MAX_NESTING_DEPTH:
                self._at_most(depth, MAX_NESTING_DEPTH, schema.where, f"levels of nesting (at {schema.path(node)})")
            properties = node.get("properties")
            if isinstance(properties, dict):
                self._count_properties(node, properties, schema)
            for key in ("$defs", "definitions"):
                if isinstance(node.get(key), dict):
                    self.string_chars += sum(map(len, node[key]))
            if isinstance(node.get("enum"), list):
                self._count_enum(node, node["enum"], schema)
            if "const" in node:
                self.string_chars += _value_chars(node["const"])
        self._at_most(self.string_chars, MAX_STRING_CHARS, schema.where, "characters in property names, "
                      "definition names, enum and const values")

    def _count_properties(self, node: dict, properties: dict, schema: Subschemas) -> None:
        self.properties += len(properties)
        self.string_chars += sum(map(len, properties))
        self._at_most(self.properties, MAX_OBJECT_PROPERTIES, schema.where, "object properties")
        required = node.get("required")
        optional = len(properties.keys() - set(required if isinstance(required, list) else ()))
        self._at_most(optional, MAX_OPTIONAL_PROPERTIES, schema.where, f"optional properties in the object at "
                      f"{schema.path(node)}", "llaisys' limit: make them required, or split the object")

    def _count_enum(self, node: dict, values: list, schema: Subschemas) -> None:
        self.enum_values += len(values)
        self._at_most(self.enum_values, MAX_ENUM_VALUES, schema.where, "enum values")
        self.string_chars += sum(map(_value_chars, values))
        strings = [value for value in values if isinstance(value, str)]
        if len(strings) > LARGE_ENUM:
            self._at_most(sum(map(len, strings)), MAX_LARGE_ENUM_CHARS, schema.where, f"characters in the values "
                          f"of the enum at {schema.path(node)}", f"OpenAI's limit for more than {LARGE_ENUM} values")

    @staticmethod
    def _at_most(value: int, limit: int, where: str, what: str, whose: str = "OpenAI's limit") -> None:
        if value > limit:
            raise SchemaError(f"{where} has more than {limit} {what} ({whose})")


def _value_chars(value: object) -> int:
    """An enum or const value's length: a string's characters, another value's JSON text."""
    return len(value) if isinstance(value, str) else len(json.dumps(value))


def _json_text(schema: object, where: str) -> str:
    try:
        return json.dumps(schema, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:  # a Python caller's set, a NaN, a circular dict
        raise SchemaError(f"{where} is not JSON: {e}") from None
    except RecursionError:
        raise SchemaError(f"{where} nests JSON more than {MAX_JSON_NESTING} levels deep (llaisys' limit)") from None


# -- finite values ---------------------------------------------------------------------------------------------

# When a subschema has a finite value: ("all", (conditions...)), ("any", (conditions...)), or a subschema (a
# dict, or a bool schema: true has values, false has none)
Condition = tuple | dict | bool
_TRUE = ("all", ())
_FALSE = ("any", ())
# the keywords a subschema's condition depends on (without them, it has a value: a primitive one)
_CONDITION_KEYWORDS = frozenset({"$ref", "allOf", "anyOf", "oneOf", "enum", "const", "type"})
# the keywords that give a subschema's values contents of their own
_CONTENT_KEYWORDS = frozenset({"$ref", "allOf", "anyOf", "oneOf", "properties", "patternProperties",
                               "additionalProperties", "items", "prefixItems", "additionalItems"})


def _types(node: dict) -> tuple:
    """The types a subschema allows, as llguidance reads it (none named: any)."""
    kind = node.get("type", _ALL_TYPES)
    if isinstance(kind, str):
        return (kind,)
    return tuple(kind) if isinstance(kind, list) else _ALL_TYPES


def _items(node: dict) -> tuple[list, object]:
    """An array subschema's leading items (``prefixItems``, or draft 7's list ``items``) and the schema of the
    rest (None: anything)."""
    if isinstance(node.get("items"), list):
        return node["items"], node.get("additionalItems")
    prefix = node.get("prefixItems")
    return prefix if isinstance(prefix, list) else [], node.get("items")


def _number(node: dict, key: str, default: float) -> float:
    value = node.get(key)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def _condition(node: dict, schema: Subschemas) -> Condition:
    """When ``node`` has a finite value: its reference's target has, all its allOf have, one of each anyOf and
    oneOf has, and one of its types can (or its enum is not empty)."""
    if node.keys().isdisjoint(_CONDITION_KEYWORDS):
        return _TRUE  # (the common leaf: any type, or a string, a number...)
    parts: list[Condition] = []
    if isinstance(node.get("$ref"), str):
        parts.append(_as_schema(schema.target(node["$ref"])))
    if isinstance(node.get("allOf"), list):
        parts.extend(map(_as_schema, node["allOf"]))
    for key in ("anyOf", "oneOf"):
        if isinstance(node.get(key), list):
            parts.append(("any", tuple(map(_as_schema, node[key]))))
    if isinstance(node.get("enum"), list):
        parts.append(_TRUE if node["enum"] else _FALSE)
    elif "const" not in node:
        parts.append(_types_condition(node))
    return ("all", tuple(parts))


def _types_condition(node: dict) -> Condition:
    """When a value of one of ``node``'s types can be finite: always where it allows a type other than object
    and array; else an object's required properties, or an array's first minItems items."""
    kinds = _types(node)
    if any(kind not in ("object", "array") for kind in kinds):
        return _TRUE
    options: list[Condition] = []
    if "object" in kinds:
        required = node.get("required")
        names = required if isinstance(required, list) else ()
        options.append(("all", tuple(_required_property(node, name) for name in names if isinstance(name, str))))
    if "array" in kinds:
        prefix, rest = _items(node)
        least = _number(node, "minItems", 0)
        needed = [_as_schema(item) for item in prefix[:math.ceil(least)]]
        if least > len(prefix) and rest is not None:
            needed.append(_as_schema(rest))
        options.append(("all", tuple(needed)))
    return ("any", tuple(options))


def _required_property(node: dict, name: str) -> Condition:
    properties = node.get("properties")
    if isinstance(properties, dict) and name in properties:
        return _as_schema(properties[name])
    extra = node.get("additionalProperties", True)
    if extra is False and node.get("patternProperties"):
        return _TRUE  # (a pattern may admit it: llguidance decides)
    return _as_schema(extra)


def _as_schema(value: object) -> Condition:
    """A subschema as a condition: itself (a dict or a bool); anything else llguidance refuses on its own."""
    return value if isinstance(value, dict) or type(value) is bool else _TRUE


def _contents(node: dict, schema: Subschemas) -> list:
    """The subschemas a value of ``node`` may contain or be checked against, for the types it allows."""
    found: list = []
    if node.keys().isdisjoint(_CONTENT_KEYWORDS):
        return found
    if isinstance(node.get("$ref"), str):
        found.append(schema.target(node["$ref"]))
    for key in ("allOf", "anyOf", "oneOf"):
        if isinstance(node.get(key), list):
            found.extend(node[key])
    if "enum" in node or "const" in node:
        return found
    kinds = _types(node)
    if "object" in kinds:
        for key in ("properties", "patternProperties"):
            if isinstance(node.get(key), dict):
                found.extend(node[key].values())
        found.append(node.get("additionalProperties"))
    if "array" in kinds:
        prefix, rest = _items(node)
        most = _number(node, "maxItems", math.inf)
        found.extend(prefix[:int(min(most, len(prefix)))])
        if most > len(prefix):
            found.append(rest)
    return found


class _Fixpoint:
    """Which subschemas have a finite value: the least fixpoint of their conditions, computed as a context-free
    grammar's productive symbols are (a symbol holds once one of its rules does, a rule once all its symbols
    do), in time linear in the size of the conditions. Subschema i is symbol i."""

    def __init__(self, schema: Subschemas) -> None:
        self._schema = schema
        self._heads: list[int] = []
        self._bodies: list[tuple[int, ...]] = []
        self._count = len(schema.nodes)
        self._true = self._rule(self._new(), ())
        self._false = self._new()
        for place, node in enumerate(schema.nodes):
            self._rule(place, (self._symbol(_condition(node, schema)),))
        self._holds = self._solve()

    def has_value(self, subschema: object) -> bool:
        if type(subschema) is bool:
            return subschema
        place = self._schema.place(subschema)
        return place is None or self._holds[place]

    def holds(self, condition: Condition) -> bool:
        if type(condition) is not tuple:
            return self.has_value(condition)
        kind, parts = condition
        results = map(self.holds, parts)
        return all(results) if kind == "all" else any(results)

    def _new(self) -> int:
        self._count += 1
        return self._count - 1

    def _rule(self, head: int, body: tuple[int, ...]) -> int:
        self._heads.append(head)
        self._bodies.append(body)
        return head

    def _symbol(self, condition: Condition) -> int:
        if type(condition) is bool:
            return self._true if condition else self._false
        if isinstance(condition, dict):
            place = self._schema.place(condition)
            return self._true if place is None else place
        kind, parts = condition
        symbols = set(map(self._symbol, parts))
        if kind == "all":
            symbols.discard(self._true)
            if len(symbols) <= 1:
                return symbols.pop() if symbols else self._true
            return self._rule(self._new(), tuple(symbols))
        symbols.discard(self._false)
        if self._true in symbols or len(symbols) == 1:
            return self._true if self._true in symbols else next(iter(symbols))
        head = self._new()
        for alternative in symbols:
            self._rule(head, (alternative,))
        return head

    @property
    def everything_has_value(self) -> bool:
        return all(self._holds[:len(self._schema.nodes)])

    def _solve(self) -> list[bool]:
        holds = [False] * self._count
        waiting = [len(body) for body in self._bodies]  # (bodies hold distinct symbols)
        rules_of: list[list[int]] = [[] for _ in range(self._count)]
        for rule, body in enumerate(self._bodies):
            for symbol in body:
                rules_of[symbol].append(rule)
        ready = deque(head for head, count in zip(self._heads, waiting) if not count)
        while ready:
            symbol = ready.popleft()
            if holds[symbol]:
                continue
            holds[symbol] = True
            for rule in rules_of[symbol]:
                waiting[rule] -= 1
                if not waiting[rule]:
                    ready.append(self._heads[rule])
        return holds


def check_finite(schema: Subschemas) -> None:
    """Refuse a schema that has no finite value, or where a value of it may contain a subschema that has none
    (SchemaError naming the recursion's path)."""
    fixpoint = _Fixpoint(schema)
    if not fixpoint.has_value(schema.root):
        raise SchemaError(f"{schema.where} has no finite instance: {_explain(schema, fixpoint, schema.root)}")
    trap = None if fixpoint.everything_has_value else _first_without_value(schema, fixpoint)
    if trap is not None:
        raise SchemaError(f"{schema.where} has no finite instance where a value may start: "
                          f"{_explain(schema, fixpoint, trap)}")


def _first_without_value(schema: Subschemas, fixpoint: _Fixpoint) -> dict | None:
    """The first subschema (breadth first) that a value of the root may contain and that has no finite value
    (a literal ``false`` aside: llguidance leaves it out, no value starts there)."""
    seen = {id(schema.root)}
    queue = deque([schema.root])
    while queue:
        for child in _contents(queue.popleft(), schema):
            if not isinstance(child, dict) or id(child) in seen:
                continue
            if not fixpoint.has_value(child):
                return child
            seen.add(id(child))
            queue.append(child)
    return None


def _explain(schema: Subschemas, fixpoint: _Fixpoint, node: dict) -> str:
    """Why ``node`` has no finite value: the chain of subschemas that each needs the next, to a cycle or to
    one that nothing matches."""
    chain = [node]
    while True:
        culprit = _culprit(_condition(chain[-1], schema), fixpoint)
        if not isinstance(culprit, dict):
            reason = "nothing matches it"
            break
        seen = any(culprit is link for link in chain)
        chain.append(culprit)
        if seen:
            reason = "each value must contain another without end"
            break
    paths = [schema.path(link) for link in chain]
    if len(paths) > 8:
        paths = [*paths[:4], "…", *paths[-3:]]
    return f"{reason} ({' -> '.join(paths)})"


def _culprit(condition: Condition, fixpoint: _Fixpoint) -> object:
    """The subschema without a finite value that makes ``condition`` fail (None: the condition itself)."""
    if type(condition) is not tuple:
        return condition if isinstance(condition, dict) else None
    for part in condition[1]:  # all: the first that fails; any: they all fail, the first says why
        if not fixpoint.holds(part):
            return _culprit(part, fixpoint)
    return None
