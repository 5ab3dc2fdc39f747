"""Random small JSON schemas and the tests' own validator of the subset of JSON Schema they use (no JSON Schema
library is a test dependency): structured outputs and forced tool calls must produce values they accept."""

from __future__ import annotations

import random


def leaf(rng: random.Random) -> dict:
    kind = rng.choice(["boolean", "integer", "string", "enum", "null"])
    if kind == "integer":
        low = rng.randint(-50, 50)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 100)}
    if kind == "string":
        return {"type": "string", "maxLength": rng.randint(1, 6)}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", "x y", "ünï"], rng.randint(1, 3))}
    return {"type": kind}


def random_schema(rng: random.Random) -> dict:
    props = {}
    for i in range(rng.randint(1, 3)):
        value = leaf(rng)
        if rng.random() < 0.3:
            value = {"type": "array", "items": value, "maxItems": 2}
        props[f"k{i}_{rng.choice('abc')}"] = value
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def matches(value, schema: dict) -> bool:
    if "enum" in schema:
        return value in schema["enum"]
    kind = schema["type"]
    if kind == "object":
        return (isinstance(value, dict) and set(value) == set(schema["properties"])
                and all(matches(value[k], s) for k, s in schema["properties"].items()))
    if kind == "array":
        return isinstance(value, list) and len(value) <= schema["maxItems"] and all(
            matches(v, schema["items"]) for v in value)
    if kind == "integer":
        return type(value) is int and schema["minimum"] <= value <= schema["maximum"]
    if kind == "string":
        return isinstance(value, str) and len(value) <= schema["maxLength"]
    return {"boolean": lambda v: isinstance(v, bool), "null": lambda v: v is None}[kind](value)
